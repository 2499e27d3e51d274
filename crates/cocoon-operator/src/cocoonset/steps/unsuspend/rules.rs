//! Pure rules of step 10's reclaim (10.6) of `cocoonset.md`; the step's planner
//! ([`super::reclaim`]) decides on them. The bookkeeping's rules (10.1–10.5) are
//! [`crate::cocoonset::shared::unsuspend::rules`].

use std::time::Duration;

use cocoon_api::contract::ReclaimRecord;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::cocoonset::pods::{self, Classified};

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
