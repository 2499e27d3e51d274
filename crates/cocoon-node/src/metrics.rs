//! The `cocoon_vk_*` Prometheus families (`contract.md` §11.2) live in the
//! `cocoon-node-metrics` crate; this module re-exports it under its old path.

pub use cocoon_node_metrics::*;
