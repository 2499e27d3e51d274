//! Table tests of suspend (step 6), the release wake (step 9) and the unsuspend bookkeeping and
//! reclaim (step 10) of `cocoonset.md`.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::{ReclaimRecord, SuspendingSince, annotations as ann};
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, HibernationPhase,
    PodRef,
};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
};
use kube::ResourceExt;

use super::plan::{CreatePlan, TagRead};
use super::pods::{self, Classified};
use super::suspend::{self, Deadline, GateItem, WakeStep};

const NS: &str = "ns";

fn set() -> CocoonSet {
    let mut spec = CocoonSetSpec::with_image("img:1");
    spec.agent.replicas = 1;
    let mut cs = CocoonSet::new("demo", spec);
    cs.metadata.namespace = Some(NS.into());
    cs.metadata.uid = Some("uid-1".into());
    cs.metadata.generation = Some(3);
    cs
}

fn agent(slot: i32) -> Pod {
    let cs = set();
    let main_vm = pods::vm_name(&pods::build_agent_pod(&cs, NS, 0, "", None)).to_string();
    pods::build_agent_pod(&cs, NS, slot, &main_vm, Some("node-a"))
}

fn with(mut p: Pod, k: &str, v: &str) -> Pod {
    p.annotations_mut().insert(k.into(), v.into());
    p
}

fn hibernated(p: Pod, generation: i64) -> Pod {
    let p = with(p, ann::LIFECYCLE_STATE, "hibernated");
    with(
        p,
        ann::LIFECYCLE_OBSERVED_GENERATION,
        &generation.to_string(),
    )
}

fn live(mut p: Pod, generation: i64) -> Pod {
    p = with(p, ann::VM_ID, "vm-id");
    p = with(p, ann::LIFECYCLE_STATE, "ready");
    p = with(
        p,
        ann::LIFECYCLE_OBSERVED_GENERATION,
        &generation.to_string(),
    );
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.phase = Some("Running".into());
    st.container_statuses = Some(vec![ContainerStatus {
        name: "agent".into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    p
}

fn phase(mut p: Pod, ph: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).phase = Some(ph.into());
    p
}

fn unmanaged(p: Pod) -> Pod {
    with(p, ann::MANAGED, "false")
}

fn classify(pods: &[Pod]) -> Classified {
    Classified::from_owned(pods)
}

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
}

fn vm(slot: i32) -> String {
    pods::vm_name(&agent(slot)).to_string()
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
    let r = suspend::record_for_suspend(&earlier, &c);
    // Pod-name order (demo-0, demo-1), the unmanaged pod left out, earlier VMs kept.
    assert_eq!(r.vms, vec!["vk-old".to_string(), vm(0), vm(1)]);
    assert_eq!(r.suspended, vec![vm(0), vm(1)]);
    assert_eq!(r.generation, 1);
    // Idempotent: a second pass over the same pods changes nothing (no write).
    assert_eq!(suspend::record_for_suspend(&r, &c), r);
    // Only pods without the annotation are patched.
    let c = classify(&[with(agent(0), ann::HIBERNATE, "true"), agent(1)]);
    assert_eq!(suspend::hibernate_targets(&c), vec!["demo-1".to_string()]);
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
        assert_eq!(suspend::gate_item(&pod, g), want, "{what}");
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
            suspend::suspend_deadline(ph, since, at(now), d),
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
    assert!(!suspend::release_has_live_pod(&c));
    assert!(suspend::release_victims(&c).is_empty());
    let c = classify(&[agent(0), phase(agent(1), "Failed")]);
    assert!(suspend::release_has_live_pod(&c));
    assert_eq!(suspend::release_victims(&c), vec!["demo-0".to_string()]);
}

// ----- step 9 -------------------------------------------------------------------------------

fn restored(p: Pod) -> Pod {
    with(p, ann::RESTORE_FROM_HIBERNATE, "true")
}

fn unschedulable(mut p: Pod, msg: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(msg.into()),
        ..PodCondition::default()
    }]);
    p
}

fn on(mut p: Pod, node: &str) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.node_name = Some(node.into());
    }
    p
}

/// (what, status phase, hint, main, expected step).
type WakeCase = (
    &'static str,
    Option<CocoonSetPhase>,
    &'static str,
    Option<Pod>,
    WakeStep,
);

#[test]
fn wake_step_table() {
    use CocoonSetPhase::*;
    let main = on(agent(0), "node-a");
    let cases: Vec<WakeCase> = vec![
        (
            "running, no hint: no registry call",
            Some(Running),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "pending, no hint",
            Some(Pending),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
        (
            "suspending, no hint",
            Some(Suspending),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "suspended, main gone",
            Some(Suspended),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "suspended retain set with no pods",
            Some(Suspended),
            "",
            None,
            WakeStep::Start,
        ),
        (
            "suspending with hint, gone",
            Some(Suspending),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, gone",
            Some(Waking),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, not live",
            Some(Waking),
            "node-a",
            Some(restored(agent(0))),
            WakeStep::WaitLive {
                unschedulable: None,
            },
        ),
        (
            "waking, unschedulable",
            Some(Waking),
            "node-a",
            Some(unschedulable(restored(agent(0)), "0/3 nodes are available")),
            WakeStep::WaitLive {
                unschedulable: Some("0/3 nodes are available".into()),
            },
        ),
        (
            "waking, live on the hint",
            Some(Waking),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "waking, live elsewhere",
            Some(Waking),
            "node-a",
            Some(live(restored(on(agent(0), "node-b")), 3)),
            WakeStep::Complete {
                placement: Some("pool"),
            },
        ),
        (
            "stale Waking without a hint does not score again",
            Some(Waking),
            "",
            Some(live(main.clone(), 3)),
            WakeStep::Complete { placement: None },
        ),
        (
            "cleanup pending after a stale pass overwrote Waking",
            Some(Running),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "restore-marked but still hibernating: not cleanup",
            Some(Running),
            "node-a",
            Some(with(restored(main.clone()), ann::HIBERNATE, "true")),
            WakeStep::HandOver,
        ),
        (
            "suspended, cache still shows the released main",
            Some(Suspended),
            "node-a",
            Some(main.clone()),
            WakeStep::ConfirmGone,
        ),
        (
            "suspended, kept terminal pod",
            Some(Suspended),
            "node-a",
            Some(phase(main.clone(), "Failed")),
            WakeStep::HandOver,
        ),
        (
            "retain placeholder",
            Some(Suspended),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
    ];
    for (what, ph, hint, main, want) in cases {
        assert_eq!(suspend::wake_step(ph, hint, main.as_ref()), want, "{what}");
    }
    let present = TagRead::Present {
        base_image: "img:1".into(),
    };
    assert!(suspend::wake_boots_fresh(
        &TagRead::Absent,
        &CreatePlan::default()
    ));
    assert!(!suspend::wake_boots_fresh(&present, &CreatePlan::default()));
    let dropped = CreatePlan {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    assert!(suspend::wake_boots_fresh(&present, &dropped));
}

// ----- step 10 ------------------------------------------------------------------------------

fn cr(pod: &str, desire: Desire, ph: Option<HibernationPhase>) -> CocoonHibernation {
    let mut h = CocoonHibernation::new(
        pod,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
        },
    );
    h.status = Some(CocoonHibernationStatus {
        phase: ph,
        ..CocoonHibernationStatus::default()
    });
    h
}

#[test]
fn unsuspend_skips_pods_a_hibernation_owns() {
    let crs = [
        cr(
            "demo-0",
            Desire::Hibernate,
            Some(HibernationPhase::Hibernated),
        ),
        cr("demo-1", Desire::Wake, Some(HibernationPhase::Hibernating)),
        cr("demo-2", Desire::Wake, Some(HibernationPhase::Waking)),
    ];
    let owned = suspend::hibernation_owned(&crs);
    assert_eq!(
        owned,
        BTreeSet::from(["demo-0".to_string(), "demo-1".to_string()])
    );
    let c = classify(&[
        with(agent(0), ann::HIBERNATE, "true"),
        with(agent(1), ann::HIBERNATE, "true"),
        with(agent(2), ann::HIBERNATE, "true"),
        agent(3),
    ]);
    let targets = suspend::unsuspend_targets(&c, &owned);
    assert_eq!(suspend::names(&targets), vec!["demo-2".to_string()]);
}

#[test]
fn unsuspend_looks_again_only_for_pods_the_set_did_not_suspend() {
    let record = |suspended: &[i32]| ReclaimRecord {
        suspended: suspended.iter().map(|s| vm(*s)).collect(),
        ..ReclaimRecord::default()
    };
    let annotated = |slot| with(agent(slot), ann::HIBERNATE, "true");
    // (suspended list, pods about to be cleared, a fresh list needed)
    let table: Vec<(&[i32], Vec<Pod>, bool)> = vec![
        (&[0, 1], vec![annotated(0), annotated(1)], false),
        (&[0, 1], vec![annotated(0)], false),
        (&[0], vec![annotated(0), annotated(1)], true),
        (&[], vec![annotated(0)], true),
        (&[], vec![], false),
    ];
    for (suspended, targets, fresh) in table {
        assert_eq!(
            suspend::unsuspend_needs_fresh_crs(&record(suspended), &targets),
            fresh,
            "suspended {suspended:?}, targets {:?}",
            suspend::names(&targets)
        );
    }
}

#[test]
fn unsuspend_first_write_table() {
    let record = ReclaimRecord {
        generation: 1,
        vms: vec!["vk-earlier".into(), vm(0), vm(1)],
        restore: vec![],
        suspended: vec![vm(0), vm(1)],
    };
    let annotated = with(agent(0), ann::HIBERNATE, "true");
    // demo-1 was deleted while suspended: owed a restore. The earlier cycle's VM is not.
    let present = BTreeSet::from([vm(0)]);
    let r = suspend::unsuspend_first_write(&record, std::slice::from_ref(&annotated), &present, 5);
    assert_eq!(r.generation, 5);
    assert_eq!(r.restore, vec![vm(1)]);
    assert!(!r.owes_restore("vk-earlier"));
    // Annotations to clear: `suspended` is cleared by the second write, not here.
    assert_eq!(r.suspended, record.suspended);
    // No annotated pod left (all cleared by an earlier pass that died before its second
    // write): the suspended list goes in this same write.
    let r = suspend::unsuspend_first_write(&record, &[], &present, 5);
    assert!(r.suspended.is_empty());
    assert_eq!(r.restore, vec![vm(1)]);
    // A pod annotated without a suspended list (an earlier operator, an abandoned quiesce)
    // is recorded.
    let bare = ReclaimRecord::default();
    let r = suspend::unsuspend_first_write(
        &bare,
        &[with(agent(2), ann::HIBERNATE, "true")],
        &present,
        5,
    );
    assert_eq!(r.vms, vec![vm(2)]);
    assert!(r.restore.is_empty());
}

#[test]
fn reclaim_waits_for_a_woken_pod() {
    let record = ReclaimRecord {
        generation: 4,
        vms: vec![vm(0), vm(1), vm(2), vm(3), vm(4)],
        ..ReclaimRecord::default()
    };
    let c = classify(&[
        live(agent(0), 4),                               // woken
        live(agent(1), 3),                               // ready at an older generation
        with(live(agent(2), 4), ann::HIBERNATE, "true"), // still annotated
        with(agent(3), ann::LIFECYCLE_STATE, "ready"),   // no live VM
                                                         // demo-4 missing: stays recorded.
    ]);
    assert_eq!(suspend::reclaimable(&record, &c), vec![vm(0)]);
    assert!(suspend::is_woken(&live(agent(0), 9), 4));
    // Nothing recorded: no registry call.
    assert!(suspend::reclaimable(&ReclaimRecord::default(), &c).is_empty());
}

#[test]
fn unschedulable_reads_the_scheduler_message() {
    assert_eq!(
        suspend::unschedulable_message(&unschedulable(agent(0), "0/2 nodes")),
        Some("0/2 nodes".into())
    );
    assert_eq!(suspend::unschedulable_message(&agent(0)), None);
}
