//! The cocoon operator: the CocoonHibernation and CocoonSet controllers, their metrics and
//! admin server. The `cocoon-operator` binary (crates/cocoon-bin) is a thin CLI over it.

pub mod activator;
pub mod admin;
pub mod checkpoint;
pub mod cocoonset;
pub mod conditions;
pub mod config;
pub mod controller;
pub mod hibernation;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod ownership;
pub mod registry;
pub mod registry_token;
pub mod user_agent;
pub mod vm_lock;
pub mod watch_retry;
