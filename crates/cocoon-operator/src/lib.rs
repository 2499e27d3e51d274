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
pub mod shell;
pub mod stripes;
pub mod user_agent;
