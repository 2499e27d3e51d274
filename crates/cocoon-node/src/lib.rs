//! The node agent: Node + Lease, pod sync, runtime backends (filled by the node-agent issue).
