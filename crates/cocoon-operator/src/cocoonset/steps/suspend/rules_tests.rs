//! Table tests of the rules of step 6 (suspend) of `cocoonset.md`.

use std::time::Duration;

use cocoon_api::contract::{ReclaimRecord, SuspendingSince, annotations as ann};
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;

use super::rules::{self, Deadline, GateItem};
use crate::cocoonset::fixtures::{agent, at, classify, hibernated, live, phase, vm, with};

fn unmanaged(p: Pod) -> Pod {
    with(p, ann::MANAGED, "false")
}

// ----- 6A.2 record, then hibernate ----------------------------------------------------------

#[test]
fn suspend_record_merges_every_managed_vm() {
    let earlier = ReclaimRecord {
        generation: 1,
        vms: vec!["vk-old".into()],
        ..ReclaimRecord::default()
    };
    let c = classify(&[
        agent(1),
        agent(0),
        unmanaged(with(agent(2), ann::VM_NAME, "vk-x")),
    ]);
    let r = rules::record_for_suspend(&earlier, &c);
    // Pod-name order (demo-0, demo-1), the unmanaged pod left out, earlier VMs kept.
    assert_eq!(r.vms, vec!["vk-old".to_string(), vm(0), vm(1)]);
    assert_eq!(r.suspended, vec![vm(0), vm(1)]);
    assert_eq!(r.generation, 1);
    // Idempotent: a second pass over the same pods changes nothing (no write).
    assert_eq!(rules::record_for_suspend(&r, &c), r);
    // Only pods without the annotation are patched.
    let c = classify(&[with(agent(0), ann::HIBERNATE, "true"), agent(1)]);
    assert_eq!(rules::hibernate_targets(&c), vec!["demo-1".to_string()]);
}

// ----- 6A.3 completion gate -----------------------------------------------------------------

#[test]
fn suspend_gate_table() {
    let g = 3;
    let cases: Vec<(&str, Pod, GateItem)> = vec![
        ("unmanaged skipped", unmanaged(agent(0)), GateItem::Skip),
        (
            "phase-failed skipped",
            phase(agent(0), "Failed"),
            GateItem::Skip,
        ),
        (
            "lifecycle-failed still waited for",
            with(agent(0), ann::LIFECYCLE_STATE, "failed"),
            GateItem::Incomplete,
        ),
        ("not hibernated", live(agent(0), g), GateItem::Incomplete),
        (
            "hibernated at an older generation (stale round)",
            hibernated(agent(0), g - 1),
            GateItem::Incomplete,
        ),
        (
            "no VM name",
            hibernated(with(agent(0), ann::VM_NAME, ""), g),
            GateItem::Incomplete,
        ),
        (
            "hibernated at g",
            hibernated(agent(0), g),
            GateItem::Probe(vm(0)),
        ),
        (
            "hibernated later",
            hibernated(agent(0), g + 1),
            GateItem::Probe(vm(0)),
        ),
    ];
    for (what, pod, want) in cases {
        assert_eq!(rules::gate_item(&pod, g), want, "{what}");
    }
}

// ----- 6C deadline --------------------------------------------------------------------------

#[test]
fn suspend_deadline_table() {
    let d = Duration::from_secs(180);
    let since = SuspendingSince(Some(at(0)));
    let restart = Deadline::Restart(SuspendingSince::at(at(500)));
    let cases = [
        ("first entry", None, SuspendingSince(None), 500, restart),
        (
            "Failed re-enters with a fresh deadline",
            Some(CocoonSetPhase::Failed),
            since,
            500,
            restart,
        ),
        (
            "Suspending without a stamp",
            Some(CocoonSetPhase::Suspending),
            SuspendingSince(None),
            500,
            restart,
        ),
        (
            "within",
            Some(CocoonSetPhase::Suspending),
            since,
            180,
            Deadline::Running,
        ),
        (
            "past",
            Some(CocoonSetPhase::Suspending),
            since,
            181,
            Deadline::Exceeded,
        ),
    ];
    for (what, ph, since, now, want) in cases {
        assert_eq!(
            rules::suspend_deadline(ph, since, at(now), d),
            want,
            "{what}"
        );
    }
    assert_eq!(
        cocoon_api::contract::events::suspend_timed_out_message(d, Some("registry down")),
        "not every managed VM was hibernated with its snapshot in the registry within 3m0s: registry down"
    );
}

// ----- 6B release ---------------------------------------------------------------------------

#[test]
fn release_keeps_failed_pods_and_needs_a_live_one() {
    let c = classify(&[phase(agent(0), "Failed")]);
    assert!(!rules::release_has_live_pod(&c));
    assert!(rules::release_victims(&c).is_empty());
    let c = classify(&[agent(0), phase(agent(1), "Failed")]);
    assert!(rules::release_has_live_pod(&c));
    assert_eq!(rules::release_victims(&c), vec!["demo-0".to_string()]);
}

#[test]
fn a_suspending_status_at_this_generation_is_not_rewritten_while_pods_hibernate() {
    use cocoon_api::crd::set::CocoonSetStatus;
    let status = |phase: Option<CocoonSetPhase>, generation: i64, desired: (i32, i32)| {
        Some(CocoonSetStatus {
            phase,
            observed_generation: generation,
            desired_agents: desired.0,
            desired_toolboxes: desired.1,
            ..CocoonSetStatus::default()
        })
    };
    let s = Some(CocoonSetPhase::Suspending);
    // (current status, generation, desired counts) -> already reported (no write)
    type Row = (Option<CocoonSetStatus>, i64, (i32, i32), bool);
    let table: &[Row] = &[
        (status(s, 3, (2, 1)), 3, (2, 1), true),
        // A new generation (the spec changed while suspending) is reported.
        (status(s, 2, (2, 1)), 3, (2, 1), false),
        // Other desired counts are reported.
        (status(s, 3, (1, 1)), 3, (2, 1), false),
        (status(s, 3, (2, 0)), 3, (2, 1), false),
        // Entering Suspending from any other phase, or no status at all, is reported.
        (
            status(Some(CocoonSetPhase::Running), 3, (2, 1)),
            3,
            (2, 1),
            false,
        ),
        (
            status(Some(CocoonSetPhase::Failed), 3, (2, 1)),
            3,
            (2, 1),
            false,
        ),
        (status(None, 3, (2, 1)), 3, (2, 1), false),
        (None, 3, (2, 1), false),
    ];
    for (current, generation, desired, want) in table {
        assert_eq!(
            rules::suspending_reported(current.as_ref(), *generation, *desired),
            *want,
            "{current:?} at generation {generation}, desired {desired:?}"
        );
    }
}
