//! The CocoonSet and CocoonHibernation custom resources and the cocoonstack wire contract.
//! Domain types only: nothing here talks to the API server.

pub mod contract;
pub mod crd;
pub mod naming;
#[cfg(test)]
mod naming_tests;
#[cfg(feature = "process-metrics")]
pub mod process;
pub mod procfs;
pub mod user_agent;

pub use crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus};
pub use crd::set::{CocoonSet, CocoonSetSpec, CocoonSetStatus, IdleSpec, IdleStatus, WakeOn};
