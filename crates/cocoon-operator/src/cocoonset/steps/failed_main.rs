//! Step 7 — the main's failed state.
//!
//! A main in a terminal state (`Pod.Phase=Failed`, or lifecycle `failed` from vk-cocoon while
//! still Running) that still matches its spec makes the set `Phase=Failed`, announced once by
//! `MainAgentFailed` / `PodLifecycleFailed`; a terminal main that has also drifted takes the
//! rebuild budget of step 11 instead. Before either, step 10's un-suspend clears a hibernate
//! annotation a prior suspend left (unless a migration is pending, whose quiesce it is). The
//! Failed phase is recoverable: a main Ready again is announced with `RecoveredFromFailure`
//! and the pass goes on.

use cocoon_api::contract::events::operator as reasons;
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{Counter, Next, Observed, StepPlan, Write};
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
}
