//! The kubelet HTTPS API and the metrics listener (`node.md` §13) live in the `cocoon-kubelet`
//! crate; this module re-exports it under its old path and plugs the node into it: the host's
//! usage figures ([`HostReader`] as [`NodeUsage`]) and the agent's registry ([`NodeMetrics`] as
//! [`MetricsText`]). The pod side is [`PodBackend`], implemented by the agent.

pub use cocoon_kubelet::*;

use crate::metrics::NodeMetrics;
use crate::node::capacity::HostReader;

impl NodeUsage for HostReader {
    fn node_cpu_seconds(&self) -> Option<f64> {
        HostReader::node_cpu_seconds(self)
    }

    fn memory_used_bytes(&self) -> Option<u64> {
        HostReader::memory_used_bytes(self)
    }
}

impl MetricsText for NodeMetrics {
    fn render(&self) -> String {
        NodeMetrics::render(self)
    }
}
