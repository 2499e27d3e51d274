//! Pure rules of step 10's unsuspend bookkeeping (10.1–10.5) of `cocoonset.md`, shared by
//! steps 7 and 10; the planner ([`super::bookkeeping`]) decides on them.

use std::collections::BTreeSet;

use cocoon_api::contract::ReclaimRecord;
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire, HibernationPhase};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::cocoonset::pods::{self, Classified};

/// 10.1: pods a CocoonHibernation owns (desire Hibernate, or still Hibernating); the set's
/// unsuspend leaves their hibernate annotation to that reconciler.
pub fn hibernation_owned(crs: &[CocoonHibernation]) -> BTreeSet<String> {
    crs.iter()
        .filter(|h| {
            h.spec.desire == Desire::Hibernate
                || h.status.as_ref().and_then(|s| s.phase) == Some(HibernationPhase::Hibernating)
        })
        .map(|h| h.spec.pod_ref.name.clone())
        .collect()
}

/// 10.1: hibernate-annotated classified pods, in name order, minus CR-owned ones.
pub fn unsuspend_targets(c: &Classified, owned_by_cr: &BTreeSet<String>) -> Vec<Pod> {
    c.all_by_name
        .iter()
        .filter(|(n, p)| pods::is_hibernate_annotated(p) && !owned_by_cr.contains(*n))
        .map(|(_, p)| p.clone())
        .collect()
}

/// Whether an unsuspend decided on the cached CocoonHibernations must look again with a
/// fresh list: it would clear the annotation of a pod whose VM the set's own suspended list
/// does not name (a leftover, or the target of a CocoonHibernation the cache may not show
/// yet). Clearing what the set itself suspended needs no second look.
pub fn unsuspend_needs_fresh_crs(record: &ReclaimRecord, targets: &[Pod]) -> bool {
    targets
        .iter()
        .any(|p| !record.suspended.iter().any(|vm| vm == pods::vm_name(p)))
}

/// 10.3: the first write. `present_vms` are the VMs of the current non-terminating pods.
pub fn unsuspend_first_write(
    record: &ReclaimRecord,
    hibernated: &[Pod],
    present_vms: &BTreeSet<String>,
    generation: i64,
) -> ReclaimRecord {
    let mut r = record.clone();
    r.generation = generation;
    for p in hibernated {
        if pods::is_managed(p) {
            r.add_vm(pods::vm_name(p));
        }
    }
    let owed: Vec<String> = r
        .suspended
        .iter()
        .filter(|vm| !present_vms.contains(*vm))
        .cloned()
        .collect();
    for vm in owed {
        r.add_restore(&vm);
    }
    if hibernated.is_empty() {
        r.suspended.clear();
    }
    r
}

/// The VMs of the classified pods.
pub fn present_vms(c: &Classified) -> BTreeSet<String> {
    c.all_by_name
        .values()
        .map(|p| pods::vm_name(p).to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The name of a pod, for logs.
pub fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| p.name_any()).collect()
}
