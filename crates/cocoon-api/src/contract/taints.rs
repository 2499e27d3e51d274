//! Taint and toleration strings of `contract.md` §4.
//! The typed constructors built from them live in [`super::placement`].

/// Key of the node taint (and of pod toleration 1) marking a virtual-kubelet provider node.
pub const PROVIDER_KEY: &str = "virtual-kubelet.io/provider";
/// Value of the provider taint written by the node agent.
pub const PROVIDER_VALUE: &str = "cocoon";
/// Key of the not-ready taint; tolerated forever so a flapping node never evicts the VM pod.
pub const NOT_READY_KEY: &str = "node.kubernetes.io/not-ready";
/// Key of the unreachable taint; tolerated forever like [`NOT_READY_KEY`].
pub const UNREACHABLE_KEY: &str = "node.kubernetes.io/unreachable";
/// Taint effect of the provider taint.
pub const EFFECT_NO_SCHEDULE: &str = "NoSchedule";
/// Taint effect of the not-ready and unreachable tolerations.
pub const EFFECT_NO_EXECUTE: &str = "NoExecute";
/// Toleration operator used by all three pod tolerations.
pub const OPERATOR_EXISTS: &str = "Exists";
