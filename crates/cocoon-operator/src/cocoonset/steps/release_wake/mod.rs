//! Seed step 9 — the release-policy wake (`reconcileWake`).
//!
//! It engages while the set is Waking or Suspended, while it is Suspending with a node hint
//! stashed, or whenever a restore-marked main that is not hibernating still carries a hint
//! ([`rules::wake_step`]). Once the released main is gone it recreates the main from its
//! snapshot near the hinted node (9.1, through the create protocol: its tag read is a
//! [`Read::Manifest`] the executor answers);
//! while the recreated main has no live VM it stays Waking, reporting `WakeNoCapacity` when it
//! is Unschedulable (9.2); once it runs, the snapshot tag is dropped, the placement scored
//! and the hint cleared (9.3). While the cache still shows the released main, it is read
//! past the cache ([`Read::Pod`]) before the normal flow takes over (9.4).

use std::collections::BTreeSet;

use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{AnnotationCodec, HibernatedOnNode, placement, tags};
use cocoon_api::crd::set::CocoonSetPhase;
use cocoon_api::naming::{self, Role};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use self::rules::WakeStep;
use super::{Answers, Counter, Effect, Next, Note, Observed, Read, StepPlan, Write, effects, log};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::{self, Protocol, rules::wake_boots_fresh};
use crate::cocoonset::shared::status::build_status;

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The step's name in a registry error.
pub const STEP: &str = "wake";

pub fn plan(o: &Observed<'_>, answers: &Answers, status_time: Timestamp) -> StepPlan {
    let hint = HibernatedOnNode::from_meta(&o.cs.metadata).0;
    let main = o.classified.main.as_ref();
    let phase = o.cs.status.as_ref().and_then(|s| s.phase);
    let status = |phase| Write::Status(build_status(o.cs, o.classified, phase, status_time));
    let poll = Next::RequeueAfter(o.timing.migrate_poll);
    match rules::wake_step(phase, &hint, main) {
        WakeStep::HandOver => StepPlan::proceed(),
        WakeStep::Start => start(o, answers, &hint),
        WakeStep::ConfirmGone => {
            let name = naming::pod_name_for_agent(&o.cs.name_any(), 0);
            match answers.pods.get(&name) {
                None => StepPlan::read(Vec::new(), vec![Read::Pod(name)]),
                // Gone, or still being deleted: wait for it.
                Some(None) => StepPlan::then(Vec::new(), poll),
                Some(Some(p)) if p.metadata.deletion_timestamp.is_some() => {
                    StepPlan::then(Vec::new(), poll)
                }
                // Live and undeleted: the normal flow.
                Some(Some(_)) => StepPlan::proceed(),
            }
        }
        WakeStep::WaitLive { unschedulable } => {
            let mut writes: Vec<Effect> = Vec::new();
            if let (Some(msg), Some(m)) = (unschedulable, main) {
                writes.push(Note::Count(Counter::SlotReleaseWakeUnschedulable).into());
                writes.push(
                    Note::Event {
                        warning: true,
                        reason: reasons::WAKE_NO_CAPACITY,
                        message: ev::main_unschedulable_message(&m.name_any(), &msg),
                    }
                    .into(),
                );
            }
            writes.push(status(Some(CocoonSetPhase::Waking)).into());
            StepPlan::of(writes, poll)
        }
        WakeStep::Complete { placement } => {
            let vm = naming::vm_name_for_agent(o.ns, &o.cs.name_any(), 0);
            let mut writes = effects![Write::DropTag {
                vm,
                tag: tags::HIBERNATE,
                step: STEP,
            }];
            if let Some(p) = placement {
                writes.push(
                    Note::Count(Counter::SlotReleaseWake {
                        placement: p.to_string(),
                    })
                    .into(),
                );
            }
            writes.push(
                Write::SetAnnotations(HibernatedOnNode::default().delta(o.cs.annotations())).into(),
            );
            writes.push(status(None).into());
            writes.push(log("released main woken").into());
            StepPlan::of(writes, Next::RequeueAfter(o.timing.requeue_after_write))
        }
    }
}

/// 9.1: recreate the released main from its snapshot, near its old node when it has room.
/// With no snapshot to restore (never booted, or dropped by the image rule) the hint is
/// cleared and the normal flow boots the main fresh. `Waking` is the durable marker of a
/// wake in flight: written before the create.
fn start(o: &Observed<'_>, answers: &Answers, hint: &str) -> StepPlan {
    let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
    let facts = create::facts(o, &pod, Role::Main, &BTreeSet::new(), true);
    match create::protocol(answers, pod, facts, STEP) {
        Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
        Protocol::Decided {
            mut pod,
            mut writes,
            tag,
            decision,
        } => {
            if wake_boots_fresh(&tag, &decision) {
                writes.push(
                    Write::SetAnnotations(HibernatedOnNode::default().delta(o.cs.annotations()))
                        .into(),
                );
                return StepPlan::of(writes, Next::Continue);
            }
            if !hint.is_empty()
                && let Some(ps) = pod.spec.as_mut()
                && ps.affinity.is_none()
            {
                ps.affinity = Some(placement::preferred_hostname_affinity(hint));
            }
            writes.push(Write::Phase(Some(CocoonSetPhase::Waking)).into());
            writes.push(Write::PostPod(pod).into());
            writes.push(Note::Changed.into());
            StepPlan::of(writes, Next::RequeueAfter(o.timing.migrate_poll))
        }
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::{CocoonSet, HibernatePolicy};
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, classify, live, observe, on, ready, set};
    use crate::cocoonset::shared::create::rules::TagRead;

    /// A release-policy set at generation 2 in `phase`, its main's node stashed as `hint`
    /// (none when empty).
    fn released(phase: Option<CocoonSetPhase>, hint: &str) -> CocoonSet {
        let mut cs = set().at_generation(2).in_phase(phase);
        cs.spec.hibernate_policy = HibernatePolicy::Release;
        if hint.is_empty() {
            return cs;
        }
        cs.with_annotation(ann::HIBERNATED_ON_NODE, hint)
    }

    fn decide(cs: &CocoonSet, main: Option<&Pod>) -> StepPlan {
        decide_on(cs, main, &Answers::default())
    }

    fn decide_on(cs: &CocoonSet, main: Option<&Pod>, answers: &Answers) -> StepPlan {
        let c = classify(main);
        let t = Timing::default();
        plan(&observe(cs, &c, &t), answers, Timestamp::UNIX_EPOCH)
    }

    fn with_tag(tag: TagRead) -> Answers {
        let mut a = Answers::default();
        a.manifests
            .insert(naming::vm_name_for_agent(NS, "demo", 0), tag);
        a
    }

    fn posted(p: &StepPlan) -> Option<&Pod> {
        p.writes.iter().find_map(|w| match w {
            Write::PostPod(pod) => Some(&**pod),
            _ => None,
        })
    }

    fn restored_main(cs: &CocoonSet, node: &str, is_live: bool) -> Pod {
        let mut p = pods::build_agent_pod(cs, NS, 0, "", None);
        pods::mark_restore(&mut p);
        let p = on(p, node);
        if is_live { ready(live(p, 2)) } else { p }
    }

    #[test]
    fn once_the_released_main_is_gone_the_wake_takes_over_and_recreates_it() {
        let cs = released(Some(CocoonSetPhase::Suspended), "node-a");
        let vm = naming::vm_name_for_agent(NS, "demo", 0);
        assert_eq!(
            decide(&cs, None),
            StepPlan::read(Vec::new(), vec![Read::Manifest { vm, step: STEP }]),
            "the tag is read first"
        );
        let p = decide_on(
            &cs,
            None,
            &with_tag(TagRead::Present {
                base_image: String::new(),
            }),
        );
        let pod = posted(&p).expect("the main is recreated");
        assert!(pods::is_restore_marked(pod), "from the snapshot");
        let waking = p
            .writes
            .iter()
            .position(|w| *w == Write::Phase(Some(CocoonSetPhase::Waking)));
        let post = p.writes.iter().position(|w| matches!(w, Write::PostPod(_)));
        assert!(waking < post && waking.is_some(), "Waking is durable first");
        let affinity = serde_json::to_string(&pod.spec.as_ref().unwrap().affinity).unwrap();
        assert!(affinity.contains("node-a"), "near its old node: {affinity}");
        assert!(affinity.contains("preferred"), "preferred only: {affinity}");
        assert_eq!(p.next, Next::RequeueAfter(Timing::default().migrate_poll));
        assert_eq!(
            decide(&released(Some(CocoonSetPhase::Running), ""), None),
            StepPlan::proceed(),
            "not engaged: the normal flow"
        );
    }

    #[test]
    fn when_no_snapshot_is_left_to_restore_it_clears_the_hint_and_the_normal_flow_boots_the_main_fresh()
     {
        let cs = released(Some(CocoonSetPhase::Suspended), "node-a");
        let vm = naming::vm_name_for_agent(NS, "demo", 0);
        // Never booted: no tag.
        let p = decide_on(&cs, None, &with_tag(TagRead::Absent));
        assert!(posted(&p).is_none());
        assert_eq!(p.next, Next::Continue);
        assert!(p.writes.iter().any(|w| matches!(
            w,
            Write::SetAnnotations(d) if d.get(ann::HIBERNATED_ON_NODE) == Some(&None)
        )));
        // The snapshot image rule: pushed from another image, dropped first.
        let p = decide_on(
            &cs,
            None,
            &with_tag(TagRead::Present {
                base_image: "img:0".into(),
            }),
        );
        assert!(posted(&p).is_none());
        assert_eq!(
            p.writes[0],
            Write::DropTag {
                vm,
                tag: tags::HIBERNATE,
                step: STEP
            }
        );
        assert_eq!(p.next, Next::Continue);
    }

    #[test]
    fn while_the_original_main_is_still_being_deleted_it_waits_and_only_a_live_undeleted_main_falls_through()
     {
        let cs = released(Some(CocoonSetPhase::Suspended), "node-a");
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let name = main.name_any();
        assert_eq!(
            decide(&cs, Some(&main)),
            StepPlan::read(Vec::new(), vec![Read::Pod(name.clone())]),
            "the cache still shows it: read past the cache"
        );
        let poll = Next::RequeueAfter(Timing::default().migrate_poll);
        let mut deleting = main.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        for (now, next) in [
            (None, poll),
            (Some(deleting), poll),
            (Some(main.clone()), Next::Continue),
        ] {
            let mut a = Answers::default();
            a.pods.insert(name.clone(), now.clone());
            assert_eq!(
                decide_on(&cs, Some(&main), &a),
                StepPlan::then(Vec::new(), next),
                "{:?}",
                now.map(|p| p.metadata.deletion_timestamp)
            );
        }
    }

    #[test]
    fn keeps_the_reconcile_while_the_recreated_main_comes_up() {
        let cs = released(Some(CocoonSetPhase::Waking), "node-a");
        let main = restored_main(&cs, "node-b", false);
        let p = decide(&cs, Some(&main));
        assert!(matches!(
            p.writes.last(),
            Some(Write::Status(s)) if s.phase == Some(CocoonSetPhase::Waking)
        ));
        assert_eq!(p.next, Next::RequeueAfter(Timing::default().migrate_poll));
    }

    #[test]
    fn clears_the_hint_on_completion_after_dropping_the_snapshot() {
        let cs = released(Some(CocoonSetPhase::Waking), "node-a");
        let main = restored_main(&cs, "node-a", true);
        let p = decide(&cs, Some(&main));
        let vm = naming::vm_name_for_agent(NS, "demo", 0);
        assert_eq!(
            p.writes[0],
            Write::DropTag {
                vm,
                tag: tags::HIBERNATE,
                step: STEP
            },
            "the snapshot goes first"
        );
        assert!(p.notes().any(|n| *n
            == Note::Count(Counter::SlotReleaseWake {
                placement: cocoon_api::contract::metrics::operator::PLACEMENT_HINT_NODE.into()
            })));
        assert!(p.writes.iter().any(|w| matches!(
            w,
            Write::SetAnnotations(d) if d.get(ann::HIBERNATED_ON_NODE) == Some(&None)
        )));
        assert!(p.writes.iter().any(|w| matches!(w, Write::Status(_))));
        assert_eq!(
            p.next,
            Next::RequeueAfter(Timing::default().requeue_after_write)
        );
    }
}
