//! Table tests of step 11, the main agent (`cocoonset.md` §11), and its
//! `spec.agent.fromCheckpoint` gate.

use cocoon_api::contract::{annotations as ann, labels};
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;

use super::main_agent::*;
use super::{Answers, Created, Effect, Next, Note, Read, StepPlan, Write};
use crate::cocoonset::Timing;
use crate::cocoonset::fixtures::{NS, SetFixture, classify, observe, ready, set};
use crate::cocoonset::pods;
use crate::cocoonset::pods::Classified;
use crate::cocoonset::shared::create::rules::TagRead;
use crate::cocoonset::shared::status::build_status;
use chrono::Utc;
use cocoon_api::crd::set::CocoonSetPhase;
use cocoon_api::naming;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

fn run(cs: &CocoonSet, main: Option<Pod>) -> StepPlan {
    run_with(cs, main, &Answers::default())
}

fn run_with(cs: &CocoonSet, main: Option<Pod>, answers: &Answers) -> StepPlan {
    let c = classify(main.iter());
    let t = Timing::default();
    plan(
        &observe(cs, &c, &t),
        answers,
        Utc::now(),
        Timestamp::UNIX_EPOCH,
    )
}

fn phase_written(p: &StepPlan) -> Option<CocoonSetPhase> {
    p.writes.iter().find_map(|w| match w {
        Write::Status(s) => s.phase,
        _ => None,
    })
}

#[test]
fn a_main_not_ready_reports_pending_and_requeues_in_5s_but_a_recovering_set_stays_failed() {
    let t = Timing::default();
    let cases = [
        (None, CocoonSetPhase::Pending),
        (Some(CocoonSetPhase::Running), CocoonSetPhase::Pending),
        (Some(CocoonSetPhase::Failed), CocoonSetPhase::Failed),
    ];
    for (before, want) in cases {
        let cs = set().at_generation(4).in_phase(before);
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let p = run(&cs, Some(main));
        assert_eq!(phase_written(&p), Some(want), "from {before:?}");
        assert_eq!(
            p.next,
            Next::RequeueAfter(t.wait_for_main),
            "from {before:?}"
        );
    }
}

#[test]
fn while_pending_a_main_coming_up_writes_its_readiness_not_each_step_of_its_entry() {
    let pending = |cs: &CocoonSet, main: &Pod| {
        let mut cs = cs.clone();
        let c = Classified::from_owned([main]);
        cs.status = Some(build_status(
            &cs,
            &c,
            Some(CocoonSetPhase::Pending),
            Timestamp::UNIX_EPOCH,
        ));
        cs
    };
    let cs = set().at_generation(4);
    let main = pods::build_agent_pod(&cs, NS, 0, "", None);
    let reported = pending(&cs, &main);
    // The main's VM id arrives while it is not Ready: nothing to write, still waiting.
    let mut booted = main.clone();
    booted
        .annotations_mut()
        .insert(ann::VM_ID.into(), "vm-1".into());
    let p = run(&reported, Some(booted.clone()));
    assert_eq!(
        p,
        StepPlan::then(vec![], Next::RequeueAfter(Timing::default().wait_for_main))
    );
    // The first Pending (no status yet, or another phase before) is written.
    assert_eq!(
        phase_written(&run(&cs, Some(booted.clone()))),
        Some(CocoonSetPhase::Pending)
    );
    let running = set()
        .at_generation(4)
        .in_phase(Some(CocoonSetPhase::Running));
    assert_eq!(
        phase_written(&run(&running, Some(booted))),
        Some(CocoonSetPhase::Pending)
    );
    // A recovering set keeps Failed and writes what moved.
    let mut failed = reported.clone();
    if let Some(s) = failed.status.as_mut() {
        s.phase = Some(CocoonSetPhase::Failed);
    }
    let mut moved = main;
    moved
        .annotations_mut()
        .insert(ann::VM_ID.into(), "vm-2".into());
    assert_eq!(
        phase_written(&run(&failed, Some(moved))),
        Some(CocoonSetPhase::Failed)
    );
}

#[test]
fn a_ready_main_matching_the_spec_hands_over_without_a_write() {
    let cs = set()
        .at_generation(4)
        .in_phase(Some(CocoonSetPhase::Running));
    let main = ready(pods::build_agent_pod(&cs, NS, 0, "", None));
    assert_eq!(run(&cs, Some(main)), StepPlan::then(vec![], Next::Continue));
}

#[test]
fn a_drifted_main_takes_the_rebuild_budget() {
    let mut cs = set()
        .at_generation(4)
        .in_phase(Some(CocoonSetPhase::Running));
    let main = ready(pods::build_agent_pod(&cs, NS, 0, "", None));
    cs.spec.agent.image = "img:2".into();
    let p = run(&cs, Some(main));
    assert!(p.writes.contains(&Write::DeletePod("demo-0".into())));
    assert_eq!(
        p.next,
        Next::RequeueAfter(Timing::default().requeue_after_write)
    );
}

#[test]
fn a_missing_main_is_created_through_the_create_protocol() {
    let cs = set().at_generation(4);
    // §8: the CocoonHibernation list (from the cache), then §7.1: the manifest read.
    assert_eq!(
        run(&cs, None),
        StepPlan::read(Vec::new(), vec![Read::CachedHibernations])
    );
    let mut a = Answers {
        cached_hibernations: Some(Vec::new()),
        ..Answers::default()
    };
    let vm = naming::vm_name_for_agent(NS, "demo", 0);
    assert_eq!(
        run_with(&cs, None, &a),
        StepPlan::read(
            Vec::new(),
            vec![Read::Manifest {
                vm: vm.clone(),
                step: STEP
            }]
        )
    );
    a.manifests.insert(vm, TagRead::Absent);
    let p = run_with(&cs, None, &a);
    match &p.effects()[..] {
        [Effect::Write(Write::PostPod(pod))] => {
            assert_eq!(pod.name_any(), "demo-0");
            assert_eq!(
                pod.labels().get(labels::ROLE).map(String::as_str),
                Some("main")
            );
            assert!(!pods::is_restore_marked(pod), "no tag, no restore");
        }
        other => panic!("one post, got {other:?}"),
    }
    assert_eq!(p.next, Next::Replan);
    let t = Timing::default();
    for (c, d) in [
        (Created::Yes, t.requeue_after_write),
        // An old main still terminating is waited for.
        (Created::AlreadyExists, t.wait_for_main),
    ] {
        a.created = vec![c];
        assert_eq!(
            run_with(&cs, None, &a),
            StepPlan::requeue(Vec::new(), d),
            "{c:?}"
        );
    }
}

#[test]
fn a_main_created_a_moment_ago_and_not_cached_yet_is_waited_for_not_posted_again() {
    let cs = set().at_generation(4);
    let mut c = Classified::default();
    c.pending_creates
        .insert("demo-0".into(), std::time::Duration::from_secs(20));
    let t = Timing::default();
    let o = observe(&cs, &c, &t);
    let p = plan(&o, &Answers::default(), Utc::now(), Timestamp::UNIX_EPOCH);
    assert_eq!(p, StepPlan::requeue(Vec::new(), t.wait_for_main));
}

#[test]
fn a_missing_main_whose_budget_is_spent_reports_failed_until_the_spec_changes() {
    let mut cs = set().at_generation(4);
    cs.annotations_mut().insert(
        ann::REBUILD_HISTORY.into(),
        r#"{"demo-0":{"count":3,"exhaustedAt":4}}"#.into(),
    );
    let p = run(&cs, None);
    assert_eq!(phase_written(&p), Some(CocoonSetPhase::Failed));
    assert_eq!(p.effects().len(), 1);
    assert_eq!(p.next, Next::AwaitChange);
}

#[test]
fn a_main_from_a_checkpoint_waits_for_it_saying_why_then_starts_marked() {
    use crate::cocoonset::shared::checkpoint::{REASON_NOT_FOUND, REASON_NOT_READY};
    use cocoon_api::contract::checkpoint::{FROM_CHECKPOINT_ANNOTATION, checkpoint_artifact};
    use cocoon_api::crd::checkpoint::*;
    let mut cs = set().at_generation(4);
    cs.spec.agent.from_checkpoint = Some("golden".into());
    let vm = naming::vm_name_for_agent(NS, "demo", 0);
    let mut a = Answers {
        cached_hibernations: Some(Vec::new()),
        ..Answers::default()
    };
    a.manifests.insert(vm.clone(), TagRead::Absent);
    // The checkpoint is read from the cache before anything is posted.
    assert_eq!(
        run_with(&cs, None, &a),
        StepPlan::read(Vec::new(), vec![Read::CachedCheckpoint("golden".into())])
    );
    let mut ckpt = CocoonCheckpoint::new(
        "golden",
        CocoonCheckpointSpec {
            source: CheckpointSource::default(),
        },
    );
    ckpt.metadata.uid = Some("u1".into());
    let art = checkpoint_artifact(NS, "golden", "u1").expect("derivable");
    let pending = CocoonCheckpointStatus {
        phase: Some(CheckpointPhase::Pending),
        repository: art.repository,
        tag: art.tag,
        ..CocoonCheckpointStatus::default()
    };
    let mut ready = ckpt.clone();
    ready.status = Some(CocoonCheckpointStatus {
        phase: Some(CheckpointPhase::Ready),
        digest: "sha256:abc".into(),
        ..pending.clone()
    });
    ckpt.status = Some(pending);
    for (found, reason) in [(None, REASON_NOT_FOUND), (Some(ckpt), REASON_NOT_READY)] {
        a.checkpoint = Some(found);
        let p = run_with(&cs, None, &a);
        assert_eq!(p.next, Next::AwaitChange, "{reason}");
        assert!(
            !p.effects()
                .iter()
                .any(|e| matches!(e, Effect::Write(Write::PostPod(_))))
        );
        let Some(Effect::Note(Note::Event {
            warning: true,
            reason: r,
            message,
        })) = p.effects().first().cloned()
        else {
            panic!("a Warning Event first: {p:?}");
        };
        assert_eq!(r, reason);
        assert!(message.contains("spec.agent.fromCheckpoint"), "{message}");
        let status = p.effects().iter().find_map(|e| match e {
            Effect::Write(Write::Status(s)) => Some(s.clone()),
            _ => None,
        });
        let status = status.expect("a status write");
        assert_eq!(status.phase, Some(CocoonSetPhase::Pending));
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
        assert!(
            c.message.contains("spec.agent.fromCheckpoint"),
            "{}",
            c.message
        );
        // Said once: the next pass, on the written status, publishes no Event again.
        let mut said = cs.clone();
        said.status = Some(status);
        let again = run_with(&said, None, &a);
        assert!(again.effects().is_empty(), "{again:?}");
        assert_eq!(again.next, Next::AwaitChange);
    }
    a.checkpoint = Some(Some(ready));
    let p = run_with(&cs, None, &a);
    match &p.effects()[..] {
        [Effect::Write(Write::PostPod(pod))] => assert_eq!(
            pod.annotations()
                .get(FROM_CHECKPOINT_ANNOTATION)
                .map(String::as_str),
            Some("golden")
        ),
        other => panic!("one post, got {other:?}"),
    }
    // A main coming back from its own hibernation restores; the checkpoint (maybe gone by
    // now) is not consulted.
    use cocoon_api::crd::hibernation::*;
    let mut hib = CocoonHibernation::new(
        "demo-0",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "demo-0".into(),
            },
            desire: Desire::Wake,
        },
    );
    hib.status = Some(CocoonHibernationStatus {
        phase: Some(HibernationPhase::Hibernated),
        ..CocoonHibernationStatus::default()
    });
    a.cached_hibernations = Some(vec![hib]);
    a.checkpoint = None;
    a.manifests.insert(
        vm,
        TagRead::Present {
            base_image: cs.spec.agent.image.clone(),
        },
    );
    let p = run_with(&cs, None, &a);
    match &p.effects()[..] {
        [.., Effect::Write(Write::PostPod(pod))] => {
            assert!(pods::is_restore_marked(pod));
            assert!(!pod.annotations().contains_key(FROM_CHECKPOINT_ANNOTATION));
        }
        other => panic!("a restore post, got {other:?}"),
    }
}
