//! Seed step 7 — the main's failed state.
//!
//! A main in a terminal state (`Pod.Phase=Failed`, or lifecycle `failed` from vk-cocoon while
//! still Running) that still matches its spec makes the set `Phase=Failed`, announced once by
//! `MainAgentFailed` / `PodLifecycleFailed`; a terminal main that has also drifted takes the
//! rebuild budget of step 11 instead. Before either, step 10's un-suspend clears a hibernate
//! annotation a prior suspend left (unless a migration is pending, whose quiesce it is). The
//! Failed phase is recoverable: a main Ready again is announced with `RecoveredFromFailure`
//! and the pass goes on. The pure rules are [`rules`].

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::operator as reasons;
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use self::rules::Verdict;
use super::{Answers, Counter, Effect, Next, Note, Observed, StepPlan, Write, effects};
use crate::cocoonset::pods;
use crate::cocoonset::shared::status::build_status;
use crate::cocoonset::shared::triage::{self, rules::Triage};
use crate::cocoonset::shared::unsuspend;

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The step's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum FailedMain {
    /// Nothing failed (or a recovery to announce): these writes, then the next step.
    Proceed(StepPlan),
    /// A terminal main: clear a leftover hibernate intent first, then [`report`] it.
    ClearThenReport,
    /// A terminal, drifted main: clear a leftover hibernate intent first, then triage it
    /// for `reason` and go on by [`after_triage`].
    ClearThenRebuild { reason: String },
}

/// The step's decision on the main as the pass observed it.
pub fn decide(o: &Observed<'_>) -> FailedMain {
    let Some(main) = &o.classified.main else {
        return FailedMain::Proceed(StepPlan::proceed());
    };
    let drifted = pods::agent_drift(o.cs, o.ns, 0, main).is_some();
    match rules::verdict(o.cs, o.ns, Some(main), drifted) {
        Verdict::Continue => FailedMain::Proceed(StepPlan::proceed()),
        Verdict::Recovered { message } => FailedMain::Proceed(StepPlan::of(
            effects![Note::Event {
                warning: false,
                reason: reasons::RECOVERED_FROM_FAILURE,
                message,
            }],
            Next::Continue,
        )),
        Verdict::Rebuild { reason } => FailedMain::ClearThenRebuild { reason },
        Verdict::Fail(_) => FailedMain::ClearThenReport,
    }
}

/// Step 7 on the pass's view and the step's answers so far: [`decide`], then for a terminal
/// main first step 10's bookkeeping (its reads, then its writes, each round planned again on
/// the view they leave) unless a migration is pending, then [`report`] or the rebuild triage
/// and [`after_triage`].
pub fn plan(
    o: &Observed<'_>,
    answers: &Answers,
    now: DateTime<Utc>,
    status_time: Timestamp,
) -> StepPlan {
    let rebuild = match decide(o) {
        FailedMain::Proceed(p) => return p,
        FailedMain::ClearThenReport => None,
        FailedMain::ClearThenRebuild { reason } => Some(reason),
    };
    let Some(main) = &o.classified.main else {
        return StepPlan::proceed();
    };
    if clears_leftover_hibernate(o, main) {
        let bookkeeping = unsuspend::bookkeeping(o, answers);
        if !bookkeeping.effects().is_empty() || bookkeeping.next != Next::Continue {
            return StepPlan {
                next: Next::Replan,
                ..bookkeeping
            };
        }
    }
    let Some(reason) = rebuild else {
        return report(o, main, status_time);
    };
    let triaged = triage::existing(o, main, Some(reason), now);
    let decision = triaged.decision.clone();
    let mut writes = triaged.into_effects(o, &main.name_any());
    let after = after_triage(o, &decision, main, status_time);
    writes.extend(after.effects());
    StepPlan::of(writes, after.next)
}

/// 7.1: a terminal main first loses a leftover hibernate intent, unless a migration is
/// pending (the main is bound off the node `spec.nodeName` names), whose quiesce that
/// annotation is.
fn clears_leftover_hibernate(o: &Observed<'_>, main: &Pod) -> bool {
    let desired = o.cs.spec.node_name.as_str();
    let bound = pods::bound_node(main);
    desired.is_empty() || bound.is_empty() || bound == desired
}

/// 7.3: `Phase=Failed`, announced (event and metric) only on entering it; then wait for a
/// change of the main.
pub fn report(o: &Observed<'_>, main: &Pod, status_time: Timestamp) -> StepPlan {
    let report = rules::failed_report(o.cs, o.ns, main);
    let mut writes: Vec<Effect> = Vec::new();
    if report.announce {
        writes.push(
            Note::Event {
                warning: true,
                reason: report.reason,
                message: report.message,
            }
            .into(),
        );
        if let Some(phase) = report.lifecycle_metric_phase {
            writes.push(Note::Count(Counter::LifecycleStateFailed { phase }).into());
        }
    }
    writes.push(
        Write::Status(build_status(
            o.cs,
            o.classified,
            Some(CocoonSetPhase::Failed),
            status_time,
        ))
        .into(),
    );
    StepPlan::of(writes, Next::AwaitChange)
}

/// After the rebuild triage of a terminal, drifted main: a main dead-lettered at this
/// generation reports Failed as 7.3 does (the set does not sit in Pending with a dead main);
/// a backoff waits; a delete ends the pass.
pub fn after_triage(
    o: &Observed<'_>,
    decision: &Triage,
    main: &Pod,
    status_time: Timestamp,
) -> StepPlan {
    match decision {
        Triage::Leave { .. } | Triage::DeadLetter { .. } => report(o, main, status_time),
        Triage::Wait(d) => StepPlan::then(Vec::new(), Next::RequeueAfter(*d)),
        Triage::ResetAndDelete | Triage::Rebuild { .. } => {
            StepPlan::then(Vec::new(), Next::RequeueAfter(o.timing.requeue_after_write))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::CocoonSet;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, classify, observe, phase, ready, set, with};

    fn decided(cs: &CocoonSet, main: Option<&Pod>) -> FailedMain {
        let c = classify(main);
        let t = Timing::default();
        decide(&observe(cs, &c, &t))
    }

    #[test]
    fn a_terminal_main_matching_its_spec_fails_a_drifted_one_is_rebuilt_a_ready_one_recovers() {
        let cs = set()
            .at_generation(2)
            .in_phase(Some(CocoonSetPhase::Running));
        let built = pods::build_agent_pod(&cs, NS, 0, "", None);
        let failed = phase(built.clone(), "Failed");
        let lifecycle_failed = with(
            phase(built.clone(), "Running"),
            ann::LIFECYCLE_STATE,
            "failed",
        );
        let healthy = ready(built.clone());
        let mut drifted_set = cs.clone();
        drifted_set.spec.agent.image = "img:2".into();

        assert_eq!(decided(&cs, None), FailedMain::Proceed(StepPlan::proceed()));
        assert_eq!(
            decided(&cs, Some(&healthy)),
            FailedMain::Proceed(StepPlan::proceed())
        );
        assert_eq!(decided(&cs, Some(&failed)), FailedMain::ClearThenReport);
        assert_eq!(
            decided(&cs, Some(&lifecycle_failed)),
            FailedMain::ClearThenReport
        );
        assert!(matches!(
            decided(&drifted_set, Some(&failed)),
            FailedMain::ClearThenRebuild { .. }
        ));
        let was_failed = cs.clone().in_phase(Some(CocoonSetPhase::Failed));
        match decided(&was_failed, Some(&healthy)) {
            FailedMain::Proceed(p) => {
                assert!(matches!(
                    &p.effects()[..],
                    [Effect::Note(Note::Event {
                        reason: reasons::RECOVERED_FROM_FAILURE,
                        warning: false,
                        ..
                    })]
                ));
                assert_eq!(p.next, Next::Continue);
            }
            other => panic!("recovered, got {other:?}"),
        }
    }

    #[test]
    fn failed_is_announced_on_entry_only_and_waits_for_a_change() {
        let t = Timing::default();
        for (before, announced) in [
            (Some(CocoonSetPhase::Running), true),
            (Some(CocoonSetPhase::Failed), false),
        ] {
            let cs = set().at_generation(2).in_phase(before);
            let main = phase(pods::build_agent_pod(&cs, NS, 0, "", None), "Failed");
            let c = classify([&main]);
            let p = report(&observe(&cs, &c, &t), &main, Timestamp::UNIX_EPOCH);
            let events = p
                .notes()
                .filter(|w| matches!(w, Note::Event { warning: true, .. }))
                .count();
            assert_eq!(events, usize::from(announced), "from {before:?}");
            assert!(
                matches!(p.writes.last(), Some(Write::Status(s)) if s.phase == Some(CocoonSetPhase::Failed))
            );
            assert_eq!(p.next, Next::AwaitChange);
        }
    }

    #[test]
    fn a_drifted_failed_main_dead_lettered_reports_failed_otherwise_the_rebuild_decides() {
        let t = Timing::default();
        let cs = set()
            .at_generation(2)
            .in_phase(Some(CocoonSetPhase::Running));
        let main = phase(pods::build_agent_pod(&cs, NS, 0, "", None), "Failed");
        let c = classify([&main]);
        let o = observe(&cs, &c, &t);
        let now = Timestamp::UNIX_EPOCH;
        let dead = after_triage(
            &o,
            &Triage::Leave {
                dead_lettered: true,
            },
            &main,
            now,
        );
        assert_eq!(dead, report(&o, &main, now));
        let d = Duration::from_secs(2);
        assert_eq!(
            after_triage(&o, &Triage::Wait(d), &main, now).next,
            Next::RequeueAfter(d)
        );
        assert_eq!(
            after_triage(&o, &Triage::ResetAndDelete, &main, now).next,
            Next::RequeueAfter(t.requeue_after_write)
        );
    }

    #[test]
    fn before_either_the_unsuspend_clears_a_leftover_hibernate_unless_a_migration_is_pending() {
        let t = Timing::default();
        let cs = set()
            .at_generation(2)
            .in_phase(Some(CocoonSetPhase::Running));
        let mut main = phase(pods::build_agent_pod(&cs, NS, 0, "", None), "Failed");
        main.spec.get_or_insert_default().node_name = Some("node-a".into());
        let annotated = with(main.clone(), ann::HIBERNATE, "true");
        let (now, st) = (Utc::now(), Timestamp::UNIX_EPOCH);
        let run = |cs: &CocoonSet, main: &Pod, a: &Answers| {
            let c = classify([main]);
            plan(&observe(cs, &c, &t), a, now, st)
        };
        let reported = |cs: &CocoonSet, main: &Pod| {
            let c = classify([main]);
            report(&observe(cs, &c, &t), main, st)
        };
        // The bookkeeping's read, then its writes, and the step plans again.
        let p = run(&cs, &annotated, &Answers::default());
        assert_eq!(
            (p.reads, p.next),
            (vec![super::super::Read::CachedHibernations], Next::Replan)
        );
        // (A hibernate annotation the set did not record asks for a fresh list too.)
        let crs = Answers {
            cached_hibernations: Some(Vec::new()),
            fresh_hibernations: Some(Vec::new()),
            ..Answers::default()
        };
        let p = run(&cs, &annotated, &crs);
        assert!(
            p.writes
                .iter()
                .any(|w| matches!(w, Write::MarkPods { names, .. } if names == &["demo-0"])),
            "{p:?}"
        );
        assert_eq!(p.next, Next::Replan);
        // On the view the clear leaves: the report.
        assert_eq!(run(&cs, &main, &crs), reported(&cs, &main));
        // A migration pending (pinned elsewhere): no clear, the report at once.
        let mut pinned = cs.clone();
        pinned.spec.node_name = "node-b".into();
        assert_eq!(
            run(&pinned, &annotated, &Answers::default()),
            reported(&pinned, &annotated)
        );
        // Terminal and drifted: the rebuild budget, then the requeue.
        let mut drifted = cs.clone();
        drifted.spec.agent.image = "img:2".into();
        let p = run(&drifted, &main, &Answers::default());
        assert!(p.writes.contains(&Write::DeletePod("demo-0".into())));
        assert_eq!(p.next, Next::RequeueAfter(t.requeue_after_write));
    }
}
