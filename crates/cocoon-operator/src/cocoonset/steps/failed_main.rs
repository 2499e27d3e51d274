//! Step 7 — the main's failed state.
//!
//! A main in a terminal state (`Pod.Phase=Failed`, or lifecycle `failed` from vk-cocoon while
//! still Running) that still matches its spec makes the set `Phase=Failed`, announced once by
//! `MainAgentFailed` / `PodLifecycleFailed`; a terminal main that has also drifted takes the
//! rebuild budget of step 11 instead. Before either, step 10's un-suspend clears a hibernate
//! annotation a prior suspend left (unless a migration is pending, whose quiesce it is). The
//! Failed phase is recoverable: a main Ready again is announced with `RecoveredFromFailure`
//! and the pass goes on.

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::operator as reasons;
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{Answers, Counter, Next, Observed, StepPlan, Write, triage, unsuspend};
use crate::cocoonset::plan::{self, FailedStep, Triage};
use crate::cocoonset::pods;

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

pub fn plan(o: &Observed<'_>) -> FailedMain {
    let Some(main) = &o.classified.main else {
        return FailedMain::Proceed(StepPlan::proceed());
    };
    let drifted = pods::agent_drift(o.cs, o.ns, 0, main).is_some();
    match plan::failed_step(o.cs, o.ns, Some(main), drifted) {
        FailedStep::Continue => FailedMain::Proceed(StepPlan::proceed()),
        FailedStep::Recovered { message } => FailedMain::Proceed(StepPlan::then(
            vec![Write::Event {
                warning: false,
                reason: reasons::RECOVERED_FROM_FAILURE,
                message,
            }],
            Next::Continue,
        )),
        FailedStep::Rebuild { reason } => FailedMain::ClearThenRebuild { reason },
        FailedStep::Fail(_) => FailedMain::ClearThenReport,
    }
}

/// Step 7 on the pass's view and the step's answers so far: [`plan`], then for a terminal
/// main first step 10's bookkeeping (its reads, then its writes, each round planned again on
/// the view they leave) unless a migration is pending, then [`report`] or the rebuild triage
/// and [`after_triage`].
pub fn step(
    o: &Observed<'_>,
    answers: &Answers,
    now: DateTime<Utc>,
    status_time: Timestamp,
) -> StepPlan {
    let rebuild = match plan(o) {
        FailedMain::Proceed(p) => return p,
        FailedMain::ClearThenReport => None,
        FailedMain::ClearThenRebuild { reason } => Some(reason),
    };
    let Some(main) = &o.classified.main else {
        return StepPlan::proceed();
    };
    if clears_leftover_hibernate(o, main) {
        let bookkeeping = unsuspend::bookkeeping(o, answers);
        if !bookkeeping.writes.is_empty() || bookkeeping.next != Next::Continue {
            return StepPlan {
                next: Next::Replan,
                ..bookkeeping
            };
        }
    }
    let Some(reason) = rebuild else {
        return report(o, main, status_time);
    };
    let triaged = triage::plan(o, main, Some(reason), now);
    let decision = triaged.decision.clone();
    let mut writes = triaged.into_writes(o, &main.name_any());
    let after = after_triage(o, &decision, main, status_time);
    writes.extend(after.writes);
    StepPlan::then(writes, after.next)
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
    let report = plan::failed_report(o.cs, o.ns, main);
    let mut writes = Vec::new();
    if report.announce {
        writes.push(Write::Event {
            warning: true,
            reason: report.reason,
            message: report.message,
        });
        if let Some(phase) = report.lifecycle_metric_phase {
            writes.push(Write::Count(Counter::LifecycleStateFailed { phase }));
        }
    }
    writes.push(Write::Status(plan::build_status(
        o.cs,
        o.classified,
        Some(CocoonSetPhase::Failed),
        status_time,
    )));
    StepPlan::then(writes, Next::AwaitChange)
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
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec, CocoonSetStatus};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use kube::ResourceExt;

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::Classified;

    const NS: &str = "ns";

    fn set(phase: Option<CocoonSetPhase>) -> CocoonSet {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.namespace = Some(NS.into());
        cs.metadata.uid = Some("uid".into());
        cs.metadata.generation = Some(2);
        cs.status = phase.map(|p| CocoonSetStatus {
            phase: Some(p),
            ..CocoonSetStatus::default()
        });
        cs
    }

    fn status(p: &mut Pod, phase: &str, ready: bool) {
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
    }

    fn decide(cs: &CocoonSet, main: Option<&Pod>) -> FailedMain {
        let c = Classified::from_owned(main);
        let t = Timing::default();
        plan(&Observed {
            cs,
            ns: NS,
            owned: &[],
            classified: &c,
            timing: &t,
        })
    }

    #[test]
    fn a_terminal_main_matching_its_spec_fails_a_drifted_one_is_rebuilt_a_ready_one_recovers() {
        let cs = set(Some(CocoonSetPhase::Running));
        let built = pods::build_agent_pod(&cs, NS, 0, "", None);
        let mut failed = built.clone();
        status(&mut failed, "Failed", false);
        let mut lifecycle_failed = built.clone();
        status(&mut lifecycle_failed, "Running", false);
        lifecycle_failed
            .annotations_mut()
            .insert(ann::LIFECYCLE_STATE.into(), "failed".into());
        let mut healthy = built.clone();
        status(&mut healthy, "Running", true);
        let mut drifted_set = cs.clone();
        drifted_set.spec.agent.image = "img:2".into();

        assert_eq!(decide(&cs, None), FailedMain::Proceed(StepPlan::proceed()));
        assert_eq!(
            decide(&cs, Some(&healthy)),
            FailedMain::Proceed(StepPlan::proceed())
        );
        assert_eq!(decide(&cs, Some(&failed)), FailedMain::ClearThenReport);
        assert_eq!(
            decide(&cs, Some(&lifecycle_failed)),
            FailedMain::ClearThenReport
        );
        assert!(matches!(
            decide(&drifted_set, Some(&failed)),
            FailedMain::ClearThenRebuild { .. }
        ));
        match decide(&set(Some(CocoonSetPhase::Failed)), Some(&healthy)) {
            FailedMain::Proceed(p) => {
                assert!(matches!(
                    &p.writes[..],
                    [Write::Event {
                        reason: reasons::RECOVERED_FROM_FAILURE,
                        warning: false,
                        ..
                    }]
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
            let cs = set(before);
            let mut main = pods::build_agent_pod(&cs, NS, 0, "", None);
            status(&mut main, "Failed", false);
            let c = Classified::from_owned([&main]);
            let o = Observed {
                cs: &cs,
                ns: NS,
                owned: &[],
                classified: &c,
                timing: &t,
            };
            let p = report(&o, &main, Timestamp::UNIX_EPOCH);
            let events = p
                .writes
                .iter()
                .filter(|w| matches!(w, Write::Event { warning: true, .. }))
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
        let cs = set(Some(CocoonSetPhase::Running));
        let mut main = pods::build_agent_pod(&cs, NS, 0, "", None);
        status(&mut main, "Failed", false);
        let c = Classified::from_owned([&main]);
        let o = Observed {
            cs: &cs,
            ns: NS,
            owned: &[],
            classified: &c,
            timing: &t,
        };
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
        let cs = set(Some(CocoonSetPhase::Running));
        let mut main = pods::build_agent_pod(&cs, NS, 0, "", None);
        status(&mut main, "Failed", false);
        main.spec.get_or_insert_default().node_name = Some("node-a".into());
        let mut annotated = main.clone();
        annotated
            .annotations_mut()
            .insert(ann::HIBERNATE.into(), "true".into());
        let (now, st) = (Utc::now(), Timestamp::UNIX_EPOCH);
        let run = |cs: &CocoonSet, main: &Pod, a: &Answers| {
            let c = Classified::from_owned([main]);
            step(
                &Observed {
                    cs,
                    ns: NS,
                    owned: &[],
                    classified: &c,
                    timing: &t,
                },
                a,
                now,
                st,
            )
        };
        let reported = |cs: &CocoonSet, main: &Pod| {
            let c = Classified::from_owned([main]);
            let o = Observed {
                cs,
                ns: NS,
                owned: &[],
                classified: &c,
                timing: &t,
            };
            report(&o, main, st)
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
