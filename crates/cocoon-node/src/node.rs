//! The virtual Node (`node.md` §2): registration, the Lease and status heartbeats, the identity
//! check and capacity live in the `cocoon-node-registration` crate; this module re-exports it
//! under its old path and feeds it the agent's configuration ([`NodeConfig`] converts into its
//! [`RegistrationConfig`] and [`CapacityConfig`]).

pub use cocoon_node_registration::*;

use crate::config::NodeConfig;

impl From<&NodeConfig> for RegistrationConfig {
    fn from(cfg: &NodeConfig) -> Self {
        RegistrationConfig {
            node_name: cfg.node_name.clone(),
            pool: cfg.pool.clone(),
            node_ip: cfg.node_ip,
            provider_id: cfg.provider_id.clone(),
            snapshot_cpu_class: cfg.snapshot_cpu_class.clone(),
            timings: cfg.timings.clone(),
        }
    }
}

impl From<&NodeConfig> for CapacityConfig {
    fn from(cfg: &NodeConfig) -> Self {
        CapacityConfig {
            cocoon_root_dir: cfg.cocoon_root_dir.clone(),
            overrides: cfg.overrides.clone(),
            reserve_percent: cfg.reserve_percent,
            pods: cfg.pods,
        }
    }
}
