//! Seed step 14 — patch `/status` from the classification taken in step 4 (a structural diff makes
//! an unchanged status no write).
//!
//! A pass that changed something ends without a status: the change's own watch event brings
//! the pass that reports it. An invalid spec (step 13.1) turns `Ready` False with a reason
//! naming the field (and `Progressing` False: nothing moves until the spec does), and is
//! announced once by a Warning Event with the status that first carries it; the set then
//! waits for a spec change.

use std::time::Duration;

use cocoon_api::crd::set::CocoonSetStatus;
use k8s_openapi::jiff::Timestamp;

use super::toolboxes::InvalidSpec;
use super::{Effect, Next, Note, Observed, StepPlan, Write};
use crate::cocoonset::shared::status::{self as rules, held};
use crate::conditions::{NewCondition, find, set_condition};

/// What steps 11–13 left for step 14.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Some write of the pass changed a pod.
    pub changed: bool,
    /// The smallest pending rebuild backoff of a triaged pod.
    pub min_backoff: Option<Duration>,
    /// The spec could not be acted on.
    pub invalid: Option<InvalidSpec>,
}

pub fn plan(o: &Observed<'_>, progress: &Progress, now: Timestamp) -> StepPlan {
    if progress.changed {
        return StepPlan::then(Vec::new(), Next::RequeueAfter(o.timing.requeue_after_write));
    }
    let mut status = rules::build_status(o.cs, o.classified, None, now);
    let mut writes: Vec<Effect> = Vec::new();
    let mut event = None;
    if let Some(invalid) = &progress.invalid {
        let message = invalid.condition_message();
        let already =
            o.cs.status
                .as_ref()
                .and_then(|s| find(&s.conditions, "Ready"))
                .is_some_and(|c| {
                    c.reason == invalid.reason
                        && c.message == message
                        && c.observed_generation == Some(o.generation())
                });
        if !already {
            event = Some(Note::Event {
                warning: true,
                reason: invalid.reason,
                message: message.clone(),
            });
        }
        mark_invalid(&mut status, invalid.reason, message, o.generation(), now);
    }
    // (An equal status still goes out as a write: the executor makes no call for it.)
    if event.is_some() || !held(o, &status) {
        writes.push(Write::Status(status).into());
    }
    writes.extend(event.map(Effect::from));
    let next = progress
        .min_backoff
        .map_or(Next::AwaitChange, Next::RequeueAfter);
    StepPlan::of(writes, next)
}

fn mark_invalid(
    status: &mut CocoonSetStatus,
    reason: &str,
    message: String,
    generation: i64,
    now: Timestamp,
) {
    for type_ in ["Ready", "Progressing"] {
        set_condition(
            &mut status.conditions,
            NewCondition {
                type_,
                status: "False",
                reason,
                message: message.clone(),
                observed_generation: generation,
            },
            now,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase};

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, classify, observe, set};
    use crate::cocoonset::pods;
    use crate::cocoonset::steps::toolboxes::INVALID_TOOLBOXES;

    fn run(cs: &CocoonSet, progress: &Progress) -> StepPlan {
        let main = pods::build_agent_pod(cs, NS, 0, "", None);
        let (classified, timing) = (classify(&[main]), Timing::default());
        plan(
            &observe(cs, &classified, &timing),
            progress,
            Timestamp::UNIX_EPOCH,
        )
    }

    fn status_of(p: &StepPlan) -> CocoonSetStatus {
        match &p.writes[0] {
            Write::Status(s) => s.clone(),
            other => panic!("first write is the status, got {other:?}"),
        }
    }

    fn invalid() -> InvalidSpec {
        super::super::toolboxes::validate(&[cocoon_api::crd::set::ToolboxSpec {
            name: "7".into(),
            ..Default::default()
        }])
        .expect_err("an integer name is invalid")
    }

    #[test]
    fn a_pass_that_changed_something_leaves_the_status_to_the_next() {
        let p = run(
            &set().at_generation(2),
            &Progress {
                changed: true,
                ..Progress::default()
            },
        );
        assert_eq!(
            p,
            StepPlan::then(
                Vec::new(),
                Next::RequeueAfter(Timing::default().requeue_after_write)
            )
        );
    }

    #[test]
    fn status_from_the_classification_then_wait_for_a_change_or_the_backoff() {
        let p = run(&set().at_generation(2), &Progress::default());
        assert_eq!(p.effects().len(), 1);
        let s = status_of(&p);
        assert_eq!(
            (s.phase, s.observed_generation),
            (Some(CocoonSetPhase::Scaling), 2)
        );
        assert_eq!(p.next, Next::AwaitChange);
        let d = Duration::from_secs(3);
        let p = run(
            &set().at_generation(2),
            &Progress {
                min_backoff: Some(d),
                ..Progress::default()
            },
        );
        assert_eq!(p.next, Next::RequeueAfter(d));
    }

    #[test]
    fn an_invalid_spec_is_ready_false_naming_the_field_announced_once() {
        let progress = Progress {
            invalid: Some(invalid()),
            ..Progress::default()
        };
        let mut cs = set().at_generation(2);
        let p = run(&cs, &progress);
        let s = status_of(&p);
        let ready = find(&s.conditions, "Ready").expect("a Ready condition");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", INVALID_TOOLBOXES)
        );
        assert!(
            ready
                .message
                .starts_with("spec.toolboxes: toolbox name \"7\"")
        );
        assert_eq!(
            p.effects()[1],
            Effect::Note(Note::Event {
                warning: true,
                reason: INVALID_TOOLBOXES,
                message: ready.message.clone(),
            })
        );
        assert_eq!(
            p.next,
            Next::AwaitChange,
            "no retry: it waits for a spec change"
        );
        // The next pass finds it reported: the same status, no second Event.
        cs.status = Some(s.clone());
        let again = run(&cs, &progress);
        assert_eq!(again.effects(), [Write::Status(s).into()]);
    }

    #[test]
    fn a_pass_whose_status_moved_only_in_entries_writes_nothing() {
        let mut cs = set().at_generation(2);
        let first = status_of(&run(&cs, &Progress::default()));
        cs.status = Some(first.clone());
        // The same classification again: the equal status (which the executor skips).
        let again = run(&cs, &Progress::default());
        assert_eq!(again.effects(), [Write::Status(first.clone()).into()]);
        // An entry that differs only in its VM id is held while Scaling.
        let mut stale = first.clone();
        stale.agents[0].vm_id = "an-old-id".into();
        cs.status = Some(stale);
        let held = run(&cs, &Progress::default());
        assert!(held.effects().is_empty(), "{:?}", held.effects());
        assert_eq!(held.next, Next::AwaitChange);
    }
}
