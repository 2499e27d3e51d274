//! The cocoon node agent: one per VM host, exposing the host to Kubernetes as a virtual Node
//! and driving its VMs through the runtime layer: [`cocoon_runtime::Runtime`]
//! (`runtime.md`), with the real `cocoon` CLI backend and the in-process simulated backend used
//! by demos and end-to-end tests. That trait is the agent's only way to its VMs.
//!
//! Modules:
//! * [`config`]: the node agent's environment configuration (`contract.md` §12.2).
//! * [`metrics`]: the `cocoon_vk_*` Prometheus families (`contract.md` §11.2), in the
//!   `cocoon-node-metrics` crate.
//! * [`node`]: Node registration, Lease and status heartbeats, capacity (`node.md` §2), in
//!   the `cocoon-node-registration` crate.
//! * [`pods`]: the pod lifecycle (`node.md` §3–§12): create, delete, hibernate and wake,
//!   startup reconcile, the VM event watcher, probes and status.
//! * [`agent`]: composes the startup order of `node.md` §1 and runs the agent.
//! * [`kubelet`]: the kubelet HTTPS API and the metrics listener (`node.md` §13).
//! * [`settings`]: the table of every setting (environment variable / `--config` key).
//! * [`systemd`]: `Type=notify` readiness and the watchdog fed by the main loops' heartbeats.

pub mod agent;
/// The VM activity rules of idle suspend (issue 39), in the `cocoon-node-activity` crate.
pub use cocoon_node_activity as activity;
pub mod config;
#[cfg(test)]
mod config_tests;
pub mod kubelet;
pub mod metrics;
pub mod node;
pub mod pods;
pub mod settings;
#[cfg(test)]
mod settings_tests;
pub mod systemd;
#[cfg(test)]
mod systemd_tests;
pub mod user_agent;
