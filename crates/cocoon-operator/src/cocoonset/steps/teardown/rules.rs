//! Pure rules of step 2 (teardown) of `cocoonset.md`: the delete stash, the pods to delete
//! and the registry GC over the stash. The step's planner ([`super::plan`]) decides on them.

use std::collections::BTreeSet;

use cocoon_api::contract::{AnnotationCodec, DeleteVmNames, ReclaimRecord};
use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::cocoonset::pods;

/// The delete-vm-names union (step 2.2): the previous value, status VM names, the given
/// pods' VM names and the record's VMs. Teardown stashes every owned pod so; so does every
/// other delete of a pod that leaves the spec (a scale-down in step 12, a toolbox removal
/// in step 13, the seat release of step 6B).
pub fn stash_names<'a>(cs: &CocoonSet, pods: impl IntoIterator<Item = &'a Pod>) -> DeleteVmNames {
    let mut names = DeleteVmNames::from_meta(&cs.metadata);
    if let Some(s) = &cs.status {
        names.union(s.agents.iter().map(|a| a.vm_name.as_str()));
        names.union(s.toolboxes.iter().map(|t| t.vm_name.as_str()));
    }
    names.union(pods.into_iter().map(pods::vm_name));
    names.union(ReclaimRecord::from_meta(&cs.metadata).vms.iter());
    names
}

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
