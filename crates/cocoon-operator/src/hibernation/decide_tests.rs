//! Table tests of the CocoonHibernation rules, phrased as `hibernation.md` phrases them.

use std::time::Duration;

use cocoon_api::contract::{Lifecycle, LifecycleState};
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, HibernationPhase,
    PodRef,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::decide::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).expect("time")
}

const GEN: i64 = 3;

fn cr(
    desire: Desire,
    phase: Option<HibernationPhase>,
    ready_since: Option<i64>,
) -> CocoonHibernation {
    let mut c = CocoonHibernation::new(
        "demo-0",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "demo-0".into(),
            },
            desire,
        },
    );
    c.metadata.namespace = Some("ns".into());
    c.metadata.generation = Some(GEN);
    c.metadata.uid = Some("uid-1".into());
    if let Some(p) = phase {
        let (status, reason) = match p {
            HibernationPhase::Hibernated | HibernationPhase::Active => ("True", "Done"),
            HibernationPhase::Failed => ("False", "Failed"),
            _ => ("False", "Pending"),
        };
        c.status = Some(CocoonHibernationStatus {
            observed_generation: GEN,
            phase: Some(p),
            vm_name: "vk-ns-demo-0-505043".into(),
            conditions: ready_since
                .map(|s| {
                    vec![Condition {
                        type_: READY.into(),
                        status: status.into(),
                        reason: reason.into(),
                        message: p.as_str().into(),
                        observed_generation: Some(GEN),
                        last_transition_time: Time(t(s)),
                    }]
                })
                .unwrap_or_default(),
        });
    }
    c
}

fn pod(
    hibernate: bool,
    state: Option<LifecycleState>,
    observed: i64,
    stamp: i64,
    live: bool,
) -> PodView {
    PodView::Present(PodFacts {
        vm_name: "vk-ns-demo-0-505043".into(),
        hibernate_annotated: hibernate,
        lifecycle: Lifecycle {
            state,
            observed_generation: observed,
            message: String::new(),
        },
        generation_stamp: stamp,
        vm_live: live,
        foreign_vm: false,
    })
}

fn pass(c: &CocoonHibernation, pod: PodView, probe: Probe, now: i64) -> Plan {
    plan_pass(
        &Observed {
            cr: c,
            pod,
            probe,
            last_announced: None,
            now: t(now),
        },
        &Timing::default(),
        true,
    )
}

fn phase_of(p: &Plan) -> Option<HibernationPhase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn ready_of(p: &Plan) -> Condition {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY).cloned())
        .expect("ready condition")
}

#[test]
fn first_pass_adds_the_finalizer_and_nothing_else() {
    let c = cr(Desire::Hibernate, None, None);
    let p = plan_pass(
        &Observed {
            cr: &c,
            pod: PodView::Missing,
            probe: Probe::NotAsked,
            last_announced: None,
            now: t(0),
        },
        &Timing::default(),
        false,
    );
    assert!(p.add_finalizer);
    assert_eq!(p.status, None);
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(1)));
}

#[test]
fn hibernate_requests_then_enters_hibernating_with_a_fresh_deadline() {
    let c = cr(Desire::Hibernate, None, None);
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
        Probe::NotAsked,
        0,
    );
    assert_eq!(
        p.set_hibernate,
        Some(true),
        "writes vm.cocoonstack.io/hibernate=true"
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Hibernating));
    let ready = ready_of(&p);
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        ("False", "Pending", "Hibernating")
    );
    assert_eq!(ready.last_transition_time.0, t(0));
    assert_eq!(
        p.status.as_ref().map(|s| s.vm_name.as_str()),
        Some("vk-ns-demo-0-505043")
    );
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));
}

#[test]
fn annotation_already_set_is_not_patched_again() {
    let c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernating),
        Some(0),
    );
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false),
        Probe::NotAsked,
        10,
    );
    assert_eq!(p.set_hibernate, None);
    assert_eq!(p.status, None, "no status write while nothing changed");
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));
}

#[test]
fn completion_gate_needs_state_generation_and_manifest() {
    let c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernating),
        Some(0),
    );
    // (case, pod, probe, completes)
    let cases = [
        (
            "hibernated at the stamp, tag present",
            pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
            Probe::Present,
            true,
        ),
        (
            "observed generation above the stamp",
            pod(true, Some(LifecycleState::Hibernated), GEN + 1, GEN, false),
            Probe::Present,
            true,
        ),
        (
            "stale round: observed below the stamp",
            pod(true, Some(LifecycleState::Hibernated), GEN - 1, GEN, false),
            Probe::Present,
            false,
        ),
        (
            "still hibernating",
            pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false),
            Probe::Present,
            false,
        ),
        (
            "tag not in the registry",
            pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
            Probe::Absent,
            false,
        ),
    ];
    for (name, pod, probe, completes) in cases {
        let p = pass(&c, pod, probe, 10);
        if completes {
            assert_eq!(phase_of(&p), Some(HibernationPhase::Hibernated), "{name}");
            let ready = ready_of(&p);
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("True", "Done"),
                "{name}"
            );
            let a = p.announce.clone().expect("announced");
            assert_eq!(a.event.reason, "Hibernated");
            assert_eq!(
                a.event.message,
                "snapshot vk-ns-demo-0-505043 pushed to the registry"
            );
            assert_eq!(a.metric, Some((PhaseMetric::Hibernate, "ok", 10.0)));
            assert_eq!(p.finish, Finish::Done, "{name}: no requeue");
        } else {
            assert_eq!(
                phase_of(&p),
                None,
                "{name}: stays Hibernating without a write"
            );
            assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)), "{name}");
        }
    }
}

#[test]
fn probe_is_asked_only_on_the_hibernate_path_after_the_node_reported() {
    let hib = pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false);
    let not_yet = pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false);
    assert!(probe_needed(&cr(Desire::Hibernate, None, None), &hib).is_some());
    assert!(probe_needed(&cr(Desire::Hibernate, None, None), &not_yet).is_none());
    assert!(probe_needed(&cr(Desire::Hibernate, None, None), &PodView::Missing).is_none());
    assert!(
        probe_needed(
            &cr(Desire::Wake, Some(HibernationPhase::Hibernating), Some(0)),
            &hib
        )
        .is_some()
    );
    assert!(
        probe_needed(
            &cr(Desire::Wake, Some(HibernationPhase::Hibernated), Some(0)),
            &hib
        )
        .is_none()
    );
    assert!(
        probe_needed(
            &cr(Desire::Hibernate, Some(HibernationPhase::Waking), Some(0)),
            &hib
        )
        .is_none()
    );
}

#[test]
fn hibernate_deadline_counts_failing_probes_and_ends_in_failed() {
    let c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernating),
        Some(0),
    );
    let reported = || pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false);
    // Within the deadline a failing probe is returned as the pass's error.
    let p = pass(&c, reported(), Probe::Failed("registry: 503".into()), 179);
    assert_eq!(p.finish, Finish::Error("registry: 503".into()));
    assert_eq!(p.status, None);
    // Past 3 minutes: Failed, a HibernateTimedOut Warning, and no error.
    let p = pass(&c, reported(), Probe::Failed("registry: 503".into()), 181);
    assert_eq!(phase_of(&p), Some(HibernationPhase::Failed));
    let ready = ready_of(&p);
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        ("False", "Failed", "hibernate not confirmed within 3m0s")
    );
    let a = p.announce.clone().expect("announced");
    assert!(a.event.warning);
    assert_eq!(a.event.reason, "HibernateTimedOut");
    assert_eq!(
        a.event.message,
        "snapshot vk-ns-demo-0-505043 not confirmed in the registry within 3m0s"
    );
    assert_eq!(a.metric, Some((PhaseMetric::Hibernate, "timeout", 181.0)));
    assert_eq!(p.finish, Finish::Done);
}

#[test]
fn first_pass_starts_the_deadline_even_when_the_probe_fails() {
    let c = cr(Desire::Hibernate, Some(HibernationPhase::Pending), Some(0));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::Failed("timeout".into()),
        500,
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Hibernating));
    assert_eq!(ready_of(&p).last_transition_time.0, t(500));
    assert_eq!(p.finish, Finish::Error("timeout".into()));
}

#[test]
fn settled_hibernated_keeps_its_phase_on_a_probe_error() {
    let c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernated),
        Some(0),
    );
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::Failed("502".into()),
        5000,
    );
    assert_eq!(p.status, None);
    assert_eq!(p.finish, Finish::Error("502".into()));
    // Still confirmed: nothing to write, nothing announced (phase already Hibernated).
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::Present,
        5000,
    );
    assert_eq!(p.status, None);
    assert_eq!(p.announce, None);
    assert_eq!(p.finish, Finish::Done);
}

#[test]
fn failed_is_recoverable_with_a_retry_event_and_a_fresh_deadline() {
    for (desire, next) in [
        (Desire::Hibernate, HibernationPhase::Hibernating),
        (Desire::Wake, HibernationPhase::Waking),
    ] {
        let c = cr(desire, Some(HibernationPhase::Failed), Some(0));
        let hib = desire == Desire::Hibernate;
        let p = pass(
            &c,
            pod(!hib, Some(LifecycleState::Ready), GEN, GEN, false),
            Probe::NotAsked,
            1000,
        );
        let ev = p.retry_event.clone().expect("RetryRequested");
        assert_eq!(ev.reason, "RetryRequested");
        assert_eq!(
            ev.message,
            format!("retrying {} after prior failure", desire.as_str())
        );
        assert_eq!(phase_of(&p), Some(next));
        assert_eq!(
            ready_of(&p).last_transition_time.0,
            t(1000),
            "False -> False still refreshes the timestamp"
        );
    }
}

#[test]
fn wake_clears_the_annotation_waits_then_settles_active_and_drops_the_tag() {
    // Hibernated, desire flipped to Wake: clear the annotation, enter Waking.
    let c = cr(Desire::Wake, Some(HibernationPhase::Hibernated), Some(0));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::NotAsked,
        100,
    );
    assert_eq!(p.set_hibernate, Some(false));
    assert_eq!(phase_of(&p), Some(HibernationPhase::Waking));
    assert_eq!(ready_of(&p).last_transition_time.0, t(100));
    assert_eq!(p.drop_tag, None);
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));

    // Waking and the VM is live: Active, WokenActive, then the tag is dropped.
    let c = cr(Desire::Wake, Some(HibernationPhase::Waking), Some(100));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
        Probe::NotAsked,
        130,
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Active));
    let a = p.announce.clone().expect("announced");
    assert_eq!(
        (a.event.reason, a.event.message.as_str()),
        ("WokenActive", "pod ns/demo-0 is running")
    );
    assert_eq!(a.metric, Some((PhaseMetric::Wake, "ok", 30.0)));
    assert_eq!(p.drop_tag.as_deref(), Some("vk-ns-demo-0-505043"));
    assert_eq!(p.finish, Finish::Done);

    // Settled Active passes retry the tag delete (a failed delete is retried later).
    let c = cr(Desire::Wake, Some(HibernationPhase::Active), Some(130));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
        Probe::NotAsked,
        200,
    );
    assert_eq!(p.status, None);
    assert_eq!(p.announce, None);
    assert_eq!(p.drop_tag.as_deref(), Some("vk-ns-demo-0-505043"));
}

#[test]
fn settled_active_leaves_a_foreign_hibernate_annotation_alone() {
    let c = cr(Desire::Wake, Some(HibernationPhase::Active), Some(0));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false),
        Probe::NotAsked,
        50,
    );
    assert_eq!(p.set_hibernate, None);
    assert_eq!(p.status, None);
    assert_eq!(p.drop_tag, None);
    assert_eq!(p.finish, Finish::Done);
}

#[test]
fn wake_deadline_is_five_minutes() {
    let c = cr(Desire::Wake, Some(HibernationPhase::Waking), Some(0));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Creating), GEN, GEN, false),
        Probe::NotAsked,
        299,
    );
    assert_eq!(p.status, None);
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Creating), GEN, GEN, false),
        Probe::NotAsked,
        301,
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Failed));
    assert_eq!(
        ready_of(&p).message,
        "wake timed out after 5m0s; vk-cocoon never reported the container running"
    );
    let a = p.announce.clone().expect("announced");
    assert!(a.event.warning);
    assert_eq!(a.event.reason, "WakeTimedOut");
    assert_eq!(
        a.event.message,
        "vk-cocoon did not report the container running within 5m0s"
    );
    assert_eq!(a.metric, Some((PhaseMetric::Wake, "timeout", 301.0)));
    assert_eq!(p.finish, Finish::Done);
}

#[test]
fn reverse_desires_finish_the_in_flight_transition_first() {
    // Wake while Hibernating: still the hibernate path (keeps the annotation, no clear).
    let c = cr(Desire::Wake, Some(HibernationPhase::Hibernating), Some(0));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false),
        Probe::NotAsked,
        10,
    );
    assert_eq!(
        p.set_hibernate, None,
        "the hibernate annotation stays until Hibernated"
    );
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::Present,
        20,
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Hibernated));
    // Then the reversal starts on the next pass.
    let c = cr(Desire::Wake, Some(HibernationPhase::Hibernated), Some(20));
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false),
        Probe::NotAsked,
        30,
    );
    assert_eq!(p.set_hibernate, Some(false));

    // Hibernate while Waking: the wake path runs until Active.
    let c = cr(Desire::Hibernate, Some(HibernationPhase::Waking), Some(0));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Creating), GEN, GEN, false),
        Probe::NotAsked,
        10,
    );
    assert_eq!(
        p.set_hibernate, None,
        "no hibernate request while the wake is in flight"
    );
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
        Probe::NotAsked,
        20,
    );
    assert_eq!(phase_of(&p), Some(HibernationPhase::Active));
    let c = cr(Desire::Hibernate, Some(HibernationPhase::Active), Some(20));
    let p = pass(
        &c,
        pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
        Probe::NotAsked,
        30,
    );
    assert_eq!(p.set_hibernate, Some(true));
}

#[test]
fn pending_for_a_missing_pod_or_vm_name_but_never_demoting_restore_intent() {
    let missing = cr(Desire::Hibernate, None, None);
    let p = pass(&missing, PodView::Missing, Probe::NotAsked, 0);
    assert_eq!(phase_of(&p), Some(HibernationPhase::Pending));
    assert_eq!(ready_of(&p).message, "pod ns/demo-0 not yet present");
    assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));

    let no_vm = PodView::Present(PodFacts::default());
    let p = pass(&missing, no_vm, Probe::NotAsked, 0);
    assert_eq!(
        ready_of(&p).message,
        "pod ns/demo-0 has no vm.cocoonstack.io/name annotation yet"
    );

    for keep in [HibernationPhase::Hibernated, HibernationPhase::Waking] {
        let c = cr(Desire::Hibernate, Some(keep), Some(0));
        let p = pass(&c, PodView::Missing, Probe::NotAsked, 10);
        assert_eq!(p.status, None, "{keep:?} carries restore intent");
        assert_eq!(p.finish, Finish::Requeue(Duration::from_secs(5)));
    }
    // Already Pending with the same message at this generation: no write.
    let mut c = cr(Desire::Hibernate, Some(HibernationPhase::Pending), Some(0));
    if let Some(s) = c.status.as_mut() {
        s.conditions[0].message = "pod ns/demo-0 not yet present".into();
    }
    assert_eq!(pass(&c, PodView::Missing, Probe::NotAsked, 10).status, None);
}

#[test]
fn empty_pod_ref_fails() {
    let mut c = cr(Desire::Hibernate, None, None);
    c.spec.pod_ref.name.clear();
    let p = pass(&c, PodView::Missing, Probe::NotAsked, 0);
    assert_eq!(phase_of(&p), Some(HibernationPhase::Failed));
    assert_eq!(ready_of(&p).message, "spec.podRef.name is required");
}

#[test]
fn announcements_are_not_repeated_for_the_same_transition() {
    let c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernating),
        Some(0),
    );
    let reported = pod(true, Some(LifecycleState::Hibernated), GEN, GEN, false);
    let p = plan_pass(
        &Observed {
            cr: &c,
            pod: reported,
            probe: Probe::Present,
            last_announced: Some(Announced {
                transition: t(0),
                phase: Some(HibernationPhase::Hibernating),
            }),
            now: t(40),
        },
        &Timing::default(),
        true,
    );
    assert_eq!(p.announce, None, "a lagging cache must not announce twice");
    assert_eq!(phase_of(&p), Some(HibernationPhase::Hibernated));
}

#[test]
fn two_exits_within_one_second_are_both_announced() {
    // Hibernated was announced for the Hibernating exit at t(0); the wake entered Waking in the
    // same second (timestamps are stored to the second), and now the VM is live.
    let c = cr(Desire::Wake, Some(HibernationPhase::Waking), Some(0));
    let p = plan_pass(
        &Observed {
            cr: &c,
            pod: pod(false, Some(LifecycleState::Ready), GEN, GEN, true),
            probe: Probe::NotAsked,
            last_announced: Some(Announced {
                transition: t(0),
                phase: Some(HibernationPhase::Hibernating),
            }),
            now: t(0),
        },
        &Timing::default(),
        true,
    );
    let a = p.announce.expect("WokenActive announced");
    assert_eq!(a.event.reason, "WokenActive");
    assert_eq!(a.announced.phase, Some(HibernationPhase::Waking));
}

#[test]
fn a_new_generation_is_recorded_even_on_an_unchanged_phase() {
    let mut c = cr(
        Desire::Hibernate,
        Some(HibernationPhase::Hibernating),
        Some(0),
    );
    c.metadata.generation = Some(GEN + 1);
    let p = pass(
        &c,
        pod(true, Some(LifecycleState::Hibernating), GEN, GEN, false),
        Probe::NotAsked,
        10,
    );
    let s = p.status.expect("status written");
    assert_eq!(s.observed_generation, GEN + 1);
    assert_eq!(
        s.conditions[0].last_transition_time.0,
        t(0),
        "same phase keeps the deadline"
    );
}

#[test]
fn duplicate_guard_matches_vm_name_or_pod_ref() {
    let me = {
        let mut c = cr(
            Desire::Hibernate,
            Some(HibernationPhase::Hibernated),
            Some(0),
        );
        c.metadata.uid = Some("me".into());
        c
    };
    let other = |uid: &str, pod: &str, vm: Option<&str>, deleting: bool| {
        let mut c = cr(Desire::Hibernate, None, None);
        c.metadata.uid = Some(uid.into());
        c.spec.pod_ref.name = pod.into();
        if let Some(vm) = vm {
            c.status = Some(CocoonHibernationStatus {
                vm_name: vm.into(),
                ..Default::default()
            });
        }
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(t(0)));
        }
        c
    };
    assert!(
        another_holder(&me, &[other("b", "demo-0", None, false)]),
        "same podRef, never reconciled"
    );
    assert!(
        another_holder(
            &me,
            &[other("b", "elsewhere", Some("vk-ns-demo-0-505043"), false)]
        ),
        "same VM"
    );
    assert!(!another_holder(
        &me,
        &[other("b", "demo-1", Some("vk-ns-demo-1-d239dc"), false)]
    ));
    assert!(
        !another_holder(&me, &[other("b", "demo-0", None, true)]),
        "a deleting CR holds nothing"
    );
    assert!(
        !another_holder(&me, std::slice::from_ref(&me)),
        "not itself"
    );
}

#[test]
fn vm_live_needs_a_running_container_an_id_and_no_hibernate_in_flight() {
    let annotations = |id: &str, state: &str| {
        [
            ("vm.cocoonstack.io/name", "vk-ns-demo-0-505043"),
            ("vm.cocoonstack.io/id", id),
            ("vm.cocoonstack.io/lifecycle-state", state),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<std::collections::BTreeMap<_, _>>()
    };
    let cases = [
        ("woken: fresh id, ready", "vm-2", "ready", true, true),
        (
            "booting: id written, not ready yet",
            "vm-2",
            "creating",
            true,
            true,
        ),
        (
            "no id: hibernated or wake not started",
            "",
            "hibernated",
            true,
            false,
        ),
        ("container not running", "vm-2", "ready", false, false),
        // Saved and maybe pushed; the id is the one of the VM about to be removed.
        ("hibernate in flight", "vm-1", "hibernating", true, false),
    ];
    for (what, id, state, running, want) in cases {
        let facts = PodFacts::from_pod(&annotations(id, state), running);
        assert_eq!(facts.vm_live, want, "{what}");
    }
}

/// Issue 26 item 3: a decoy pod naming another namespace's VM. The shell's ownership gate
/// marks the facts; the rules then probe nothing, drop nothing, leave the pod alone and fail
/// the CR once with `ForeignVMNameIgnored`.
#[test]
fn a_pod_naming_a_foreign_vm_is_refused_once_without_registry_work() {
    let foreign = |live: bool| match pod(true, Some(LifecycleState::Hibernated), GEN, GEN, live) {
        PodView::Present(mut f) => {
            f.vm_name = "vk-victim-demo-0-abcdef".into();
            f.foreign_vm = true;
            PodView::Present(f)
        }
        PodView::Missing => unreachable!(),
    };
    for (desire, phase, live) in [
        (Desire::Hibernate, None, false),
        (Desire::Wake, Some(HibernationPhase::Hibernated), true),
        (Desire::Wake, Some(HibernationPhase::Active), true),
    ] {
        let c = cr(desire, phase, Some(0));
        assert_eq!(
            probe_needed(&c, &foreign(live)),
            None,
            "{desire:?}: no probe"
        );
        let p = pass(&c, foreign(live), Probe::NotAsked, 10);
        assert_eq!(p.drop_tag, None, "{desire:?}: no tag drop");
        assert_eq!(p.set_hibernate, None, "{desire:?}: the pod is left alone");
        assert_eq!(phase_of(&p), Some(HibernationPhase::Failed));
        let msg = ready_of(&p).message;
        assert!(
            msg.starts_with("vm.cocoonstack.io/name: VM \"vk-victim-demo-0-abcdef\" is not a VM of pod ns/demo-0"),
            "{msg}"
        );
        let ev = p.foreign.clone().expect("a Warning");
        assert!(ev.warning && ev.reason == "ForeignVMNameIgnored" && ev.message == msg);
        // The status the pass wrote brings a pass that reports nothing new.
        let mut settled = c.clone();
        settled.status = p.status.clone();
        let again = pass(&settled, foreign(live), Probe::NotAsked, 20);
        assert_eq!(again.status, None, "{desire:?}: nothing to write");
        assert_eq!(again.foreign, None, "{desire:?}: reported once");
        assert_eq!(again.drop_tag, None);
    }
}
