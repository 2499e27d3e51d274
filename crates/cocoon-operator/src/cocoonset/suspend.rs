//! Pure rules of suspend (step 6), the release-policy wake (step 9) and the unsuspend
//! bookkeeping and reclaim (step 10) of `cocoonset.md`. The planners `steps/suspend.rs`,
//! `steps/release_wake.rs` and `steps/unsuspend.rs` decide on them.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, ReclaimRecord, SuspendingSince};
use cocoon_api::crd::hibernation::{CocoonHibernation, Desire, HibernationPhase};
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::plan::{CreatePlan, TagRead};
use super::pods::{self, Classified};

/// `vm.cocoonstack.io/hibernate=true` on the pod.
pub fn is_hibernate_annotated(pod: &Pod) -> bool {
    HibernateFlags::from_meta(&pod.metadata).hibernate
}

/// `vm.cocoonstack.io/restore-from-hibernate=true` on the pod.
pub fn is_restore_marked(pod: &Pod) -> bool {
    HibernateFlags::from_meta(&pod.metadata).restore_from_hibernate
}

/// Unschedulable(pod): `PodScheduled=False` with reason `Unschedulable`; the scheduler's
/// message when so.
pub fn unschedulable_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.message.clone().unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Step 6
// ---------------------------------------------------------------------------------------------

/// 6A.2: the record with every managed VM of the classified pods (pod-name order) added to
/// both `vms` and `suspended`, merged with what it already holds.
pub fn record_for_suspend(record: &ReclaimRecord, c: &Classified) -> ReclaimRecord {
    let mut r = record.clone();
    for p in c.all_by_name.values() {
        let vm = pods::vm_name(p);
        if pods::is_managed(p) && !vm.is_empty() {
            r.add_vm(vm);
            r.add_suspended(vm);
        }
    }
    r
}

/// 6A.2: the classified pods that still need the hibernate annotation, in name order.
pub fn hibernate_targets(c: &Classified) -> Vec<String> {
    c.all_by_name
        .iter()
        .filter(|(_, p)| !is_hibernate_annotated(p))
        .map(|(n, _)| n.clone())
        .collect()
}

/// One pod's verdict at the completion gate (6A.3), before any registry call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateItem {
    /// Unmanaged or phase-failed: not waited for.
    Skip,
    /// Not hibernated at this generation (or no VM name yet).
    Incomplete,
    /// Hibernated at this generation: complete once `<vm>:hibernate` is in the registry.
    Probe(String),
}

/// 6A.3 for one pod. A pod carrying only `lifecycle-state=failed` is not skipped: its VM may
/// still be live, so the suspend keeps waiting for it.
pub fn gate_item(pod: &Pod, generation: i64) -> GateItem {
    if !pods::is_managed(pod) || pods::is_phase_failed(pod) {
        return GateItem::Skip;
    }
    let vm = pods::vm_name(pod);
    if vm.is_empty() || !pods::lifecycle(pod).is_hibernated_at(generation) {
        return GateItem::Incomplete;
    }
    GateItem::Probe(vm.to_string())
}

/// 6C: what the suspend deadline says on a pass whose gate is not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// (Re-)entering Suspending: write this stamp; not exceeded.
    Restart(SuspendingSince),
    /// Within the deadline.
    Running,
    /// Past the deadline: SuspendTimedOut and Failed.
    Exceeded,
}

/// 6C.1–6C.2.
pub fn suspend_deadline(
    phase: Option<CocoonSetPhase>,
    since: SuspendingSince,
    now: DateTime<Utc>,
    deadline: Duration,
) -> Deadline {
    if phase != Some(CocoonSetPhase::Suspending) || since.0.is_none() {
        return Deadline::Restart(SuspendingSince::at(now));
    }
    if since.exceeded(now, deadline) {
        Deadline::Exceeded
    } else {
        Deadline::Running
    }
}

/// 6B.1: a release-policy set with no pod outside phase Failed is Suspended at once.
pub fn release_has_live_pod(c: &Classified) -> bool {
    c.all_by_name.values().any(|p| !pods::is_phase_failed(p))
}

/// 6B.3.4: the pods a seat release deletes (phase-failed ones are kept for triage).
pub fn release_victims(c: &Classified) -> Vec<String> {
    c.all_by_name
        .iter()
        .filter(|(_, p)| !pods::is_phase_failed(p))
        .map(|(n, _)| n.clone())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Step 9
// ---------------------------------------------------------------------------------------------

/// Step 9's verdict before any registry call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WakeStep {
    /// Not engaged, or the normal flow owns the main: no registry call.
    HandOver,
    /// 9.1: the released main is gone; read its tag and recreate it from the snapshot.
    Start,
    /// 9.2: the recreated main has no live VM yet; `Some(msg)` when it is Unschedulable.
    WaitLive { unschedulable: Option<String> },
    /// 9.3: the recreated main runs; drop the tag, score (when a hint is set), clear the hint.
    Complete { placement: Option<&'static str> },
    /// 9.4: the cache still shows the released main; confirm with an uncached GET.
    ConfirmGone,
}

/// Step 9 over the phase, the hint and the main.
pub fn wake_step(phase: Option<CocoonSetPhase>, hint: &str, main: Option<&Pod>) -> WakeStep {
    let cleanup_pending = main
        .is_some_and(|m| is_restore_marked(m) && !is_hibernate_annotated(m) && !hint.is_empty());
    let waking = phase == Some(CocoonSetPhase::Waking) || cleanup_pending;
    let suspended = phase == Some(CocoonSetPhase::Suspended);
    let suspending = phase == Some(CocoonSetPhase::Suspending) && !hint.is_empty();
    if !(waking || suspended || suspending) {
        return WakeStep::HandOver;
    }
    let Some(main) = main else {
        return WakeStep::Start;
    };
    if waking {
        if !pods::is_vm_live(main) {
            return WakeStep::WaitLive {
                unschedulable: unschedulable_message(main),
            };
        }
        let placement = (!hint.is_empty()).then(|| {
            if hint == pods::bound_node(main) {
                cocoon_api::contract::metrics::operator::PLACEMENT_HINT_NODE
            } else {
                cocoon_api::contract::metrics::operator::PLACEMENT_POOL
            }
        });
        return WakeStep::Complete { placement };
    }
    if !hint.is_empty() && !pods::is_terminal(main) {
        return WakeStep::ConfirmGone;
    }
    WakeStep::HandOver
}

/// 9.1.2–9.1.3: the wake has no snapshot to restore (no tag, or the image rule dropped it);
/// the hint is cleared and the normal flow boots the main fresh.
pub fn wake_boots_fresh(tag: &TagRead, plan: &CreatePlan) -> bool {
    !matches!(tag, TagRead::Present { .. }) || plan.drop_tag
}

// ---------------------------------------------------------------------------------------------
// Step 10
// ---------------------------------------------------------------------------------------------

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
        .filter(|(n, p)| is_hibernate_annotated(p) && !owned_by_cr.contains(*n))
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
    !is_hibernate_annotated(pod)
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
