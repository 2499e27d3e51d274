//! Seed step 6 — suspend (`spec.suspend == true`), including the release policy's seat release.
//!
//! Every managed VM of the owned pods goes into the reclaim record (and its suspended list)
//! before any hibernate annotation is written; then every owned pod is asked to hibernate,
//! and the set stays Suspending (polling every `suspend_poll`) until each managed VM reports
//! `hibernated` at this generation and its `:hibernate` manifest is in the registry (the
//! probes are a [`Read::Probe`] the executor answers). Phase-failed pods are skipped; a
//! `lifecycle-state=failed` alone is not. Then Suspended. Under `hibernatePolicy: release`
//! the gate is followed by the seat release: stash the VM names and the main's node, flag
//! each pod keep-snapshot-on-delete (best effort), delete it. The wait is bounded by the
//! `suspending-since` deadline: past it the set reports Failed with `SuspendTimedOut`, a
//! failing probe counting against it too. The pure rules are [`rules`].

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{
    AnnotationCodec, HibernatedOnNode, ReclaimRecord, SuspendingSince, annotations as ann,
    bool_delta, tags,
};
use cocoon_api::crd::set::{CocoonSetPhase, HibernatePolicy};
use cocoon_api::naming::Role;
use kube::ResourceExt;

use self::rules::{Deadline, GateItem};
use super::create::{self, Protocol};
use super::teardown::rules::stash_names;
use super::{Answers, Counter, Created, Next, Observed, Read, StepPlan, Write};
use crate::cocoonset::pods;

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The step's name in a registry error.
pub const STEP: &str = "suspend";
/// The gate's probes, in a registry error.
pub const GATE: &str = "suspend gate";

/// Step 6 on what the pass observed and the step's answers so far. `now` is fixed for the
/// pass, so the deadline decided before the record write is the one that goes out after.
pub fn plan(o: &Observed<'_>, answers: &Answers, now: DateTime<Utc>) -> StepPlan {
    if !o.cs.spec.suspend {
        return StepPlan::proceed();
    }
    let release = o.cs.spec.hibernate_policy == HibernatePolicy::Release;
    if release {
        // 6B.1: nothing live to snapshot (a set suspended before its first boot has no
        // snapshot, and needs none).
        if !rules::release_has_live_pod(o.classified) {
            return StepPlan::then(
                vec![
                    clear_suspending_since(o),
                    Write::Phase(Some(CocoonSetPhase::Suspended)),
                ],
                Next::AwaitChange,
            );
        }
    } else if o.classified.main.is_none() {
        return create_main(o, answers);
    }
    let phase = o.cs.status.as_ref().and_then(|s| s.phase);
    let deadline = rules::suspend_deadline(
        phase,
        SuspendingSince::from_meta(&o.cs.metadata),
        now,
        o.timing.suspend_deadline,
    );
    // 6A.2: the record first (durable), then the hibernate annotations, all at once. A pass
    // that asks for hibernates while (re-)entering Suspending writes `suspending-since` in
    // the same patch as the record: the deadline starts before any hibernate.
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let next = rules::record_for_suspend(&record, o.classified);
    let mut delta = next.delta(o.cs.annotations());
    let targets = rules::hibernate_targets(o.classified);
    if !targets.is_empty() {
        if let Deadline::Restart(stamp) = deadline {
            delta.extend(stamp.desired());
        }
        let asked = bool_delta(ann::HIBERNATE, true);
        let record = Write::SetAnnotations(delta);
        if deadline == Deadline::Exceeded {
            // Past the deadline the gate still decides this pass: ask, then plan again.
            let mark = Write::MarkPods {
                names: targets,
                delta: asked,
            };
            return StepPlan::read(vec![record, mark], Vec::new());
        }
        // A pod asked now cannot pass the gate on this pass: Suspending goes out with the
        // annotations, which nothing orders against it.
        let mark = Write::MarkPodsWithPhase {
            names: targets,
            delta: asked,
            phase: CocoonSetPhase::Suspending,
        };
        return StepPlan::requeue(vec![record, mark], o.timing.suspend_poll);
    }
    let mut writes = vec![Write::SetAnnotations(delta)];
    // 6A.3: no probe while a pod is still incomplete; then all go out together.
    let mut probes = Vec::new();
    let mut incomplete = false;
    for pod in o.classified.all_by_name.values() {
        match rules::gate_item(pod, o.generation()) {
            GateItem::Skip => {}
            GateItem::Incomplete => {
                incomplete = true;
                break;
            }
            GateItem::Probe(vm) => probes.push(vm),
        }
    }
    let complete = if incomplete {
        false
    } else if probes.is_empty() {
        true
    } else {
        match &answers.probed {
            None => {
                return StepPlan::read(
                    writes,
                    vec![Read::Probe {
                        vms: probes,
                        tag: tags::HIBERNATE,
                        fail: None,
                    }],
                );
            }
            Some(p) => p.all_exist(),
        }
    };
    if !complete {
        let probe_error = answers.probed.as_ref().and_then(|p| p.error.clone());
        writes.extend(not_complete(o, deadline, probe_error));
        let next = Next::RequeueAfter(o.timing.suspend_poll);
        return StepPlan::then(writes, next);
    }
    writes.push(clear_suspending_since(o));
    if release {
        writes.extend(release_seats(o));
        return StepPlan::requeue(writes, o.timing.suspend_poll);
    }
    writes.push(Write::Phase(Some(CocoonSetPhase::Suspended)));
    StepPlan::then(writes, Next::AwaitChange)
}

fn clear_suspending_since(o: &Observed<'_>) -> Write {
    Write::SetAnnotations(SuspendingSince(None).delta(o.cs.annotations()))
}

/// 6A.1: a missing main is created with unconditional restore intent, so a main deleted
/// while suspended comes back from its snapshot (and hibernates again on the next pass).
fn create_main(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    match answers.created.last() {
        Some(Created::Yes) => return StepPlan::requeue(Vec::new(), o.timing.requeue_after_write),
        Some(Created::AlreadyExists) => {
            return StepPlan::requeue(Vec::new(), o.timing.wait_for_main);
        }
        None => {}
    }
    let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
    // Created a moment ago and not in the cache yet: as if the post found it.
    if o.classified.pending_creates.contains_key(&pod.name_any()) {
        return StepPlan::requeue(Vec::new(), o.timing.wait_for_main);
    }
    let facts = create::facts(o, &pod, Role::Main, &BTreeSet::new(), true);
    match create::protocol(answers, pod, facts, STEP) {
        Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
        Protocol::Decided {
            pod, mut writes, ..
        } => {
            writes.push(Write::PostPod(pod));
            StepPlan::read(writes, Vec::new())
        }
    }
}

/// 6C on a pass whose gate is not complete, with the deadline decided before the record
/// write (a restart's stamp may have gone out with it; writing it again is then no call).
/// A probe error fails the pass after the status, so the registry gets backoff; the
/// deadline still counts it.
fn not_complete(o: &Observed<'_>, deadline: Deadline, probe_error: Option<String>) -> Vec<Write> {
    let mut writes = Vec::new();
    match deadline {
        Deadline::Restart(stamp) => writes.push(Write::SetAnnotations(stamp.desired())),
        Deadline::Running => {}
        Deadline::Exceeded => {
            let msg =
                ev::suspend_timed_out_message(o.timing.suspend_deadline, probe_error.as_deref());
            writes.push(Write::Log {
                warn: true,
                message: format!("suspend timed out: {msg}"),
            });
            writes.push(Write::Event {
                warning: true,
                reason: reasons::SUSPEND_TIMED_OUT,
                message: msg,
            });
            writes.push(Write::Phase(Some(CocoonSetPhase::Failed)));
            return writes;
        }
    }
    let desired = (
        o.cs.spec.desired_agents(),
        i32::try_from(o.cs.spec.toolboxes.len()).unwrap_or(i32::MAX),
    );
    if !rules::suspending_reported(o.cs.status.as_ref(), o.generation(), desired) {
        writes.push(Write::Phase(Some(CocoonSetPhase::Suspending)));
    }
    if probe_error.is_some() {
        writes.push(Write::FailProbe { step: GATE });
    }
    writes
}

/// 6B.3: free the seats once every snapshot is in the registry: the VM names and the main's
/// node first, then each pod flagged keep-snapshot-on-delete (best effort: a missing flag
/// costs the wake a registry pull, while blocking the delete would keep the seat the policy
/// exists to free) and deleted, then Suspended.
fn release_seats(o: &Observed<'_>) -> Vec<Write> {
    let mut writes = vec![Write::SetAnnotations(
        stash_names(o.cs, o.classified.all_by_name.values()).delta(o.cs.annotations()),
    )];
    if let Some(node) = o
        .classified
        .main
        .as_ref()
        .map(|m| pods::bound_node(m).to_string())
        .filter(|n| !n.is_empty())
    {
        writes.push(Write::SetAnnotations(
            HibernatedOnNode(node).delta(o.cs.annotations()),
        ));
    }
    for name in rules::release_victims(o.classified) {
        writes.push(Write::FlagPod {
            name: name.clone(),
            delta: bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, true),
        });
        writes.push(Write::DeletePod(name.clone()));
        writes.push(Write::Count(Counter::SlotReleasePodsDeleted));
        writes.push(super::log(format!(
            "released the seat of hibernated pod {name}"
        )));
    }
    writes.push(Write::Phase(Some(CocoonSetPhase::Suspended)));
    writes
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::CocoonSet;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{
        self, NS, SetFixture, at, classify, observe, on, phase, set, vm, with,
    };
    use crate::cocoonset::steps::Probed;
    use crate::cocoonset::steps::create::rules::TagRead;

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
        assert!(p.writes.iter().any(|w| matches!(
            w,
            Write::Event { warning: true, reason: reasons::SUSPEND_TIMED_OUT, message }
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
            &p.writes[..],
            [Write::PostPod(pod)] if pods::is_restore_marked(pod)
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
            p.writes
                .contains(&Write::Count(Counter::SlotReleasePodsDeleted))
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
}
