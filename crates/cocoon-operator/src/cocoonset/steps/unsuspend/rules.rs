//! Pure rules of step 10 (unsuspend bookkeeping and reclaim) of `cocoonset.md`; the step's
//! planners ([`super::bookkeeping`], [`super::reclaim`]) decide on them.

use std::collections::BTreeSet;
use std::time::Duration;

use cocoon_api::contract::ReclaimRecord;
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire, HibernationPhase};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
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

/// 10.6: a woken pod: not hibernate-annotated, VMLive, lifecycle ready at `generation` or later.
pub fn is_woken(pod: &Pod, generation: i64) -> bool {
    !pods::is_hibernate_annotated(pod)
        && pods::is_vm_live(pod)
        && pods::lifecycle(pod).is_ready_at(generation)
}

/// 10.6: the recorded VMs whose pod is present and woken, in record order.
pub fn reclaimable(record: &ReclaimRecord, c: &Classified) -> Vec<String> {
    record
        .vms
        .iter()
        .filter(|vm| {
            c.all_by_name
                .values()
                .any(|p| pods::vm_name(p) == vm.as_str() && is_woken(p, record.generation))
        })
        .cloned()
        .collect()
}

/// How long the reclaim of woken VMs waits at most for the set's other recorded VMs that are
/// still coming up, counted from the Ready transition of the first woken pod.
pub const RECLAIM_HOLD: Duration = Duration::from_secs(3);

/// What 10.6 does on this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reclaim {
    /// No recorded VM has woken.
    Nothing,
    /// Drop the tags of these woken VMs (record order) and write the record once.
    Now(Vec<String>),
    /// Another recorded VM's pod is still coming up: look again after this long, unless its
    /// own wake brings the pass first.
    Hold(Duration),
}

/// 10.6 with a hold (a departure for issue #20): the pods of a resumed set wake a few
/// milliseconds apart, and reclaiming each on the pass that saw it wake cost one record write
/// per pod. The woken VMs are reclaimed together on the pass where no other recorded VM's pod
/// is still coming up — present, not being deleted, not hibernate-annotated, not terminal,
/// not woken yet — or once [`RECLAIM_HOLD`] has passed since the first of them became Ready
/// (a pod stuck coming up does not keep the others' tags for longer). A woken pod without a
/// Ready transition time is reclaimed at once.
pub fn reclaim_decision(record: &ReclaimRecord, c: &Classified, now: Timestamp) -> Reclaim {
    let woken = reclaimable(record, c);
    if woken.is_empty() {
        return Reclaim::Nothing;
    }
    let coming_up = record
        .vms
        .iter()
        .filter(|vm| !woken.contains(vm))
        .any(|vm| {
            c.all_by_name
                .values()
                .any(|p| pods::vm_name(p) == vm.as_str() && is_coming_up(p))
        });
    if !coming_up {
        return Reclaim::Now(woken);
    }
    let first_ready = c
        .all_by_name
        .values()
        .filter(|p| woken.iter().any(|vm| vm == pods::vm_name(p)))
        .map(ready_since)
        .min();
    let Some(Some(since)) = first_ready else {
        return Reclaim::Now(woken);
    };
    let waited = now.duration_since(since).unsigned_abs();
    match RECLAIM_HOLD.checked_sub(waited) {
        Some(left) if !left.is_zero() => Reclaim::Hold(left),
        _ => Reclaim::Now(woken),
    }
}

/// A pod of a recorded VM on its way to waking.
fn is_coming_up(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !pods::is_hibernate_annotated(p)
        && !pods::is_terminal(p)
}

/// When the pod's Ready condition last turned (`None` when it does not say).
fn ready_since(p: &Pod) -> Option<Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
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
