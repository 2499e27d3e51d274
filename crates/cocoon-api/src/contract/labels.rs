//! Label keys and values of `contract.md` §3: managed-pod labels (op), node labels (node agent)
//! and the pod placement keys read from `nodeSelector`.

use std::collections::BTreeMap;

use crate::naming::Role;

// ---- §3.1 managed pods (written by op at create) ----

/// CocoonSet name on a managed pod; the owned-pod list selector.
pub const COCOONSET_NAME: &str = "cocoonset.cocoonstack.io/name";
/// Pod role: `main`, `sub-agent` or `toolbox` (see [`Role::as_str`]).
pub const ROLE: &str = "cocoonset.cocoonstack.io/role";
/// Agent slot as decimal; for toolboxes the toolbox name.
pub const SLOT: &str = "cocoonset.cocoonstack.io/slot";
/// Standard app name label; carries the CocoonSet name.
pub const APP_NAME: &str = "app.kubernetes.io/name";

// ---- §3.2 nodes (written by node agent) ----

/// Node pool of a node (value of `VK_NODE_POOL`); also a pod nodeSelector key (§3.3).
pub const POOL: &str = "cocoonstack.io/pool";
/// Pool used when none is configured or found.
pub const DEFAULT_POOL: &str = "default";
/// Marks a node as a cocoon VM host; value is the empty string.
pub const NODE_ROLE_COCOON_VM: &str = "node-role.kubernetes.io/cocoon-vm";
/// Standard hostname label (= node name); pins, migration and wake affinities match on it.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Recommended node label key `type` (virtual-kubelet convention; nothing reads it).
pub const NODE_TYPE: &str = "type";
/// Value of [`NODE_TYPE`].
pub const NODE_TYPE_VIRTUAL_KUBELET: &str = "virtual-kubelet";
/// Recommended node label key `kubernetes.io/role` (nothing reads it).
pub const KUBERNETES_ROLE: &str = "kubernetes.io/role";
/// Value of [`KUBERNETES_ROLE`].
pub const KUBERNETES_ROLE_AGENT: &str = "agent";
/// Snapshot CPU class of a node (beyond); also a pod nodeSelector key (§3.3, §6.2).
pub const SNAPSHOT_CPU_CLASS: &str = "cocoonstack.io/snapshot-cpu-class";

/// The four labels every managed pod carries (§3.1). `slot` is the decimal agent slot, or the
/// toolbox name for toolboxes.
pub fn pod_labels(cs: &str, role: Role, slot: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (COCOONSET_NAME.to_owned(), cs.to_owned()),
        (ROLE.to_owned(), role.as_str().to_owned()),
        (SLOT.to_owned(), slot.to_owned()),
        (APP_NAME.to_owned(), cs.to_owned()),
    ])
}

/// The owned-pod list selector for a CocoonSet, e.g. `cocoonset.cocoonstack.io/name=demo`.
pub fn owned_pods_selector(cs: &str) -> String {
    format!("{COCOONSET_NAME}={cs}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_labels_carry_the_four_keys() {
        let l = pod_labels("demo", Role::SubAgent, "2");
        assert_eq!(l.len(), 4);
        assert_eq!(l[COCOONSET_NAME], "demo");
        assert_eq!(l[ROLE], "sub-agent");
        assert_eq!(l[SLOT], "2");
        assert_eq!(l[APP_NAME], "demo");
        assert_eq!(
            owned_pods_selector("demo"),
            "cocoonset.cocoonstack.io/name=demo"
        );
    }
}
