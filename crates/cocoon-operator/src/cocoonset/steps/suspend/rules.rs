//! Pure rules of step 6 (suspend, and the release policy's seat release) of `cocoonset.md`;
//! the step's planner ([`super::plan`]) decides on them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::{ReclaimRecord, SuspendingSince};
use cocoon_api::crd::set::{CocoonSetPhase, CocoonSetStatus};
use k8s_openapi::api::core::v1::Pod;

use crate::cocoonset::pods::{self, Classified};

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
        .filter(|(_, p)| !pods::is_hibernate_annotated(p))
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

/// 6C.3, with one departure (issue #20): the status already reports `Suspending` at this
/// generation, so a pass that finds the gate still incomplete writes no status. What moves
/// while the pods hibernate (their VM ids, IPs, phases and readiness, and the counts and the
/// Ready condition's message built from them) is written once, with the `Suspended` (or
/// `Failed`) that ends the wait, instead of once for each pod's every step: a suspend of a
/// set of four pods made eight such writes. A status at another generation, in another
/// phase, or with other desired counts is written as the spec says.
pub fn suspending_reported(
    status: Option<&CocoonSetStatus>,
    generation: i64,
    desired: (i32, i32),
) -> bool {
    status.is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Suspending)
            && s.observed_generation == generation
            && (s.desired_agents, s.desired_toolboxes) == desired
    })
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
