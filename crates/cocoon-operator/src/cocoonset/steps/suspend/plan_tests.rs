//! Tests of the step-6 planner ([`super::plan`]): the order of its writes, the gate, the
//! deadline and the release policy's seat release.

use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::operator as reasons;
use cocoon_api::contract::{
    AnnotationCodec, ReclaimRecord, SuspendingSince, annotations as ann, tags,
};
use cocoon_api::crd::set::{CocoonSetPhase, HibernatePolicy};

use super::{GATE, STEP, plan};
use crate::cocoonset::Timing;
use crate::cocoonset::fixtures::{
    self, NS, SetFixture, at, classify, observe, on, phase, set, vm, with,
};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::rules::TagRead;
use crate::cocoonset::steps::Probed;
use crate::cocoonset::steps::{
    Answers, Counter, Created, Effect, Next, Note, Observed, Read, StepPlan, Write,
};

/// The set suspended (under the release policy with `release`), in `phase`.
fn suspended(release: bool, phase: Option<CocoonSetPhase>) -> CocoonSet {
    let mut cs = set().in_phase(phase);
    cs.spec.suspend = true;
    if release {
        cs.spec.hibernate_policy = HibernatePolicy::Release;
    }
    cs
}

fn main(cs: &CocoonSet) -> Pod {
    on(
        phase(pods::build_agent_pod(cs, NS, 0, "", None), "Running"),
        "node-a",
    )
}

/// Asked, and vk-cocoon reports it hibernated at generation 3.
fn hibernated(p: Pod) -> Pod {
    fixtures::hibernated(with(p, ann::HIBERNATE, "true"), 3)
}

fn run(cs: &CocoonSet, owned: &[Pod], answers: &Answers, now: DateTime<Utc>) -> StepPlan {
    let c = classify(owned);
    let t = Timing::default();
    plan(
        &Observed {
            owned,
            ..observe(cs, &c, &t)
        },
        answers,
        now,
    )
}

fn probed(exists: bool, error: Option<&str>) -> Answers {
    let vm = vm(0);
    Answers {
        probed: Some(Probed {
            exists: [(vm, exists)].into(),
            error: error.map(str::to_string),
        }),
        ..Answers::default()
    }
}

fn position(p: &StepPlan, f: impl Fn(&Write) -> bool) -> usize {
    p.writes.iter().position(f).expect("the write is planned")
}

#[test]
fn the_record_is_written_before_any_hibernate_annotation_so_a_restart_mid_suspend_keeps_it() {
    let cs = suspended(false, Some(CocoonSetPhase::Running));
    let p = run(&cs, &[main(&cs)], &Answers::default(), at(0));
    let Write::SetAnnotations(record) = &p.writes[0] else {
        panic!("the record first: {p:?}");
    };
    let written = ReclaimRecord::decode(
        record
            .get(ann::HIBERNATE_RECLAIM)
            .and_then(|v| v.as_deref())
            .unwrap_or_default(),
    );
    assert_eq!(written.vms, vec![vm(0)]);
    assert_eq!(written.suspended, vec![vm(0)], "listed as suspended");
    assert!(
        record.contains_key(ann::SUSPENDING_SINCE),
        "the deadline starts with the record, before any hibernate"
    );
    assert!(matches!(
        &p.writes[1],
        Write::MarkPodsWithPhase { names, delta, phase: CocoonSetPhase::Suspending }
            if names.len() == 1 && delta.get(ann::HIBERNATE) == Some(&Some("true".into()))
    ));
    assert_eq!(p.next, Next::RequeueAfter(Timing::default().suspend_poll));
}

#[test]
fn suspended_once_every_managed_vm_reports_hibernated_at_this_generation_and_its_tag_is_in_the_registry()
 {
    let cs = suspended(false, Some(CocoonSetPhase::Suspending));
    let owned = [hibernated(main(&cs))];
    let p = run(&cs, &owned, &Answers::default(), at(0));
    assert_eq!(
        p.reads,
        vec![Read::Probe {
            vms: vec![vm(0)],
            tag: tags::HIBERNATE,
            fail: None
        }],
        "the tag is probed"
    );
    assert_eq!(p.next, Next::Replan);
    let p = run(&cs, &owned, &probed(true, None), at(0));
    assert_eq!(
        p.writes.last(),
        Some(&Write::Phase(Some(CocoonSetPhase::Suspended)))
    );
    assert_eq!(p.next, Next::AwaitChange);
    // The tag is not there yet: stay Suspending, polling.
    let p = run(&cs, &owned, &probed(false, None), at(0));
    assert!(
        p.writes
            .contains(&Write::Phase(Some(CocoonSetPhase::Suspending)))
    );
    assert_eq!(p.next, Next::RequeueAfter(Timing::default().suspend_poll));
    // Not hibernated at this generation: no probe at all.
    let mut stale = owned[0].clone();
    stale
        .annotations_mut()
        .insert(ann::LIFECYCLE_OBSERVED_GENERATION.into(), "2".into());
    let p = run(&cs, &[stale], &Answers::default(), at(0));
    assert!(p.reads.is_empty());
    assert_eq!(p.next, Next::RequeueAfter(Timing::default().suspend_poll));
}

#[test]
fn a_suspending_status_reported_at_this_generation_is_not_written_again_while_pods_hibernate() {
    let mut cs = suspended(false, Some(CocoonSetPhase::Suspending));
    cs.annotations_mut().insert(
        ann::SUSPENDING_SINCE.into(),
        SuspendingSince::at(at(0)).desired()[ann::SUSPENDING_SINCE]
            .clone()
            .unwrap_or_default(),
    );
    let asked = {
        let mut p = main(&cs);
        p.annotations_mut()
            .insert(ann::HIBERNATE.into(), "true".into());
        p
    };
    let status_writes = |p: &StepPlan| {
        p.writes
            .iter()
            .filter(|w| matches!(w, Write::Phase(_) | Write::Status(_)))
            .count()
    };
    // Reported at an older generation: written.
    let p = run(
        &cs,
        std::slice::from_ref(&asked),
        &Answers::default(),
        at(0),
    );
    assert!(
        p.writes
            .contains(&Write::Phase(Some(CocoonSetPhase::Suspending))),
        "{p:?}"
    );
    // Reported at this generation: the pod's progress is no status write.
    if let Some(s) = cs.status.as_mut() {
        s.observed_generation = 3;
        s.desired_agents = 1;
    }
    let p = run(
        &cs,
        std::slice::from_ref(&asked),
        &Answers::default(),
        at(0),
    );
    assert_eq!(status_writes(&p), 0, "{p:?}");
    assert_eq!(p.next, Next::RequeueAfter(Timing::default().suspend_poll));
    // The end of the wait is written.
    let owned = [hibernated(main(&cs))];
    let p = run(&cs, &owned, &probed(true, None), at(0));
    assert_eq!(
        p.writes.last(),
        Some(&Write::Phase(Some(CocoonSetPhase::Suspended)))
    );
}

#[test]
fn a_registry_probe_that_keeps_failing_counts_against_the_deadline() {
    let mut cs = suspended(false, Some(CocoonSetPhase::Suspending));
    let since = SuspendingSince::at(at(0));
    cs.annotations_mut().extend(
        since
            .desired()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v))),
    );
    let owned = [hibernated(main(&cs))];
    let refused = probed(false, Some("registry down"));
    // Within the deadline: Suspending, then the error fails the pass (backoff).
    let p = run(&cs, &owned, &refused, at(0));
    let suspending = position(&p, |w| *w == Write::Phase(Some(CocoonSetPhase::Suspending)));
    let fail = position(&p, |w| matches!(w, Write::FailProbe { step: GATE, .. }));
    assert!(suspending < fail);
    // Past it: Failed with SuspendTimedOut naming the error, and no error (requeue).
    let late = at(0) + chrono::Duration::minutes(4);
    let p = run(&cs, &owned, &refused, late);
    assert!(p.notes().any(|w| matches!(
        w,
        Note::Event { warning: true, reason: reasons::SUSPEND_TIMED_OUT, message }
            if message.contains("registry down")
    )));
    assert!(
        p.writes
            .contains(&Write::Phase(Some(CocoonSetPhase::Failed)))
    );
    assert!(
        !p.writes
            .iter()
            .any(|w| matches!(w, Write::FailProbe { .. }))
    );
    assert_eq!(p.next, Next::RequeueAfter(Timing::default().suspend_poll));
}

#[test]
fn pods_in_phase_failed_are_skipped_a_lifecycle_failed_one_is_waited_for() {
    let cs = suspended(false, Some(CocoonSetPhase::Suspending));
    let failed = phase(with(main(&cs), ann::HIBERNATE, "true"), "Failed");
    let p = run(&cs, &[failed], &Answers::default(), at(0));
    assert!(p.reads.is_empty(), "nothing to probe");
    assert!(
        p.writes
            .contains(&Write::Phase(Some(CocoonSetPhase::Suspended)))
    );
    let lifecycle_failed = with(
        with(main(&cs), ann::HIBERNATE, "true"),
        ann::LIFECYCLE_STATE,
        "failed",
    );
    let p = run(&cs, &[lifecycle_failed], &Answers::default(), at(0));
    assert!(
        p.writes
            .contains(&Write::Phase(Some(CocoonSetPhase::Suspending)))
    );
}

#[test]
fn a_main_deleted_while_suspended_is_created_from_its_snapshot() {
    let cs = suspended(false, Some(CocoonSetPhase::Suspended));
    // §7.1: the manifest read first, then the post of a pod restore-marked on the tag.
    let p = run(&cs, &[], &Answers::default(), at(0));
    let vm = vm(0);
    assert_eq!(
        p,
        StepPlan::read(
            Vec::new(),
            vec![Read::Manifest {
                vm: vm.clone(),
                step: STEP
            }]
        )
    );
    let mut a = Answers::default();
    a.manifests.insert(
        vm,
        TagRead::Present {
            base_image: String::new(),
        },
    );
    let p = run(&cs, &[], &a, at(0));
    assert!(matches!(
        &p.effects()[..],
        [Effect::Write(Write::PostPod(pod))] if pods::is_restore_marked(pod)
    ));
    assert_eq!(p.next, Next::Replan);
    let t = Timing::default();
    for (c, d) in [
        (Created::Yes, t.requeue_after_write),
        (Created::AlreadyExists, t.wait_for_main),
    ] {
        let a = Answers {
            created: vec![c],
            ..Answers::default()
        };
        assert_eq!(run(&cs, &[], &a, at(0)).next, Next::RequeueAfter(d));
    }
}

#[test]
fn with_release_the_gate_is_followed_by_a_slot_release_flagged_keep_snapshot_then_deleted() {
    let cs = suspended(true, Some(CocoonSetPhase::Suspending));
    let owned = [hibernated(main(&cs))];
    let p = run(&cs, &owned, &probed(true, None), at(0));
    let name = owned[0].name_any();
    let stash = position(
        &p,
        |w| matches!(w, Write::SetAnnotations(d) if d.contains_key(ann::DELETE_VM_NAMES)),
    );
    let hint = position(&p, |w| {
        matches!(w, Write::SetAnnotations(d)
                if d.get(ann::HIBERNATED_ON_NODE) == Some(&Some("node-a".into())))
    });
    let flag = position(&p, |w| {
        matches!(w, Write::FlagPod { name: n, delta }
                if *n == name && delta.contains_key(ann::KEEP_SNAPSHOT_ON_DELETE))
    });
    let delete = position(&p, |w| *w == Write::DeletePod(name.clone()));
    assert!(stash < delete && hint < delete && flag < delete);
    assert!(
        p.notes()
            .any(|n| *n == Note::Count(Counter::SlotReleasePodsDeleted))
    );
    assert_eq!(
        p.writes.last(),
        Some(&Write::Phase(Some(CocoonSetPhase::Suspended)))
    );
    // Nothing live to snapshot: Suspended at once.
    let p = run(&cs, &[], &Answers::default(), at(0));
    assert_eq!(
        p.writes.last(),
        Some(&Write::Phase(Some(CocoonSetPhase::Suspended)))
    );
    assert_eq!(p.next, Next::AwaitChange);
}
