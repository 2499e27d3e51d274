//! The cocoon operator: the CocoonHibernation and CocoonSet controllers, their metrics and
//! admin server. `main.rs` is a thin CLI over this library.

pub mod admin;
pub mod cocoonset;
pub mod conditions;
pub mod config;
pub mod hibernation;
pub mod leader;
pub mod metrics;
pub mod registry;
pub mod user_agent;
pub mod vm_lock;
pub mod watch_retry;

/// The old names of [`watch_retry`] and [`vm_lock`], kept until the CocoonHibernation
/// controller (`hibernation/`) is moved over to the new ones.
pub use vm_lock as stripes;
pub use watch_retry as shell;
