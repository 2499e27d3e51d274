//! The kubelet HTTPS API and the metrics listener (`node.md` §13) live in the `cocoon-kubelet`
//! crate; this module re-exports it under its old path. The node plugs into it through the
//! crate's traits: the agent's registry ([`NodeMetrics`](crate::metrics::NodeMetrics)) is a
//! [`MetricsText`] in `cocoon-node-metrics`, the host's usage figures are
//! `cocoon-node-registration`'s `HostReader`, a [`NodeUsage`] there, and the pod side is
//! [`PodBackend`], implemented by the agent.

pub use cocoon_kubelet::*;
