//! Pure rules of step 2 (teardown) of `cocoonset.md`: the pods to delete and the registry GC
//! over the stash ([`crate::cocoonset::shared::stash`]). The step's planner ([`super::plan`]) decides on them.

use std::collections::BTreeSet;

use cocoon_api::contract::DeleteVmNames;
use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Step 2.3: the owned pods (from the cache, terminating ones included) that teardown deletes,
/// in their order. Only what is still there and not yet going is deleted:
/// * a pod absent from the cache is not deleted (it is gone; another delete would answer
///   NotFound);
/// * a pod already terminating (a `deletionTimestamp`) is not deleted again: its deletion is
///   under way, and another DELETE changes nothing of it (its grace period stands);
/// * a pod this controller deleted a moment ago (`deleted`, by UID) that the cache still shows
///   as it was is not deleted again either: the cache has not caught up with that delete.
///
/// Every other owned pod is deleted. Whatever this leaves out still holds the registry GC and
/// the finalizer back until the cache no longer shows it (the planner waits on `owned`).
pub fn pods_to_delete<'a>(owned: &'a [Pod], deleted: &BTreeSet<String>) -> Vec<&'a Pod> {
    owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .uid
                .as_ref()
                .is_none_or(|uid| !deleted.contains(uid))
        })
        .collect()
}

/// One VM of the registry GC: always drop `:hibernate`; drop `:latest` unless kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcItem {
    pub vm: String,
    pub drop_latest: bool,
}

/// Step 2.4 over the stash, in the annotation's order: the VMs whose tags the GC deletes.
pub fn gc_items(cs: &CocoonSet, ns: &str, names: &DeleteVmNames) -> Vec<GcItem> {
    let cs_name = cs.name_any();
    names
        .names()
        .map(|vm| GcItem {
            vm: vm.to_string(),
            drop_latest: !naming::should_keep_latest_tag(cs.spec.snapshot_policy, ns, &cs_name, vm),
        })
        .collect()
}
