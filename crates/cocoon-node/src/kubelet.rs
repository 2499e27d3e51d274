//! The kubelet HTTPS API and the metrics listener (`node.md` §13) live in the `cocoon-kubelet`
//! crate; this module re-exports it under its old path and plugs the node into it: the agent's
//! registry ([`NodeMetrics`] as [`MetricsText`]). The host's usage figures are
//! `cocoon-node-registration`'s `HostReader`, a [`NodeUsage`] there. The pod side is
//! [`PodBackend`], implemented by the agent.

pub use cocoon_kubelet::*;

use crate::metrics::NodeMetrics;

impl MetricsText for NodeMetrics {
    fn render(&self) -> String {
        NodeMetrics::render(self)
    }
}
