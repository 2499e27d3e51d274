//! Step 14 — patch `/status` from the classification taken in step 4 (a structural diff makes
//! an unchanged status no write).
//!
//! A pass that changed something ends without a status: the change's own watch event brings
//! the pass that reports it. An invalid spec (step 13.1) turns `Ready` False with a reason
//! naming the field (and `Progressing` False: nothing moves until the spec does), and is
//! announced once by a Warning Event with the status that first carries it; the set then
//! waits for a spec change.

use std::collections::BTreeSet;
use std::time::Duration;

use cocoon_api::crd::set::CocoonSetStatus;
use k8s_openapi::jiff::Timestamp;

use super::toolboxes::InvalidSpec;
use super::{Next, Observed, StepPlan, Write};
use crate::cocoonset::{plan, pods};
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
    let mut status = plan::build_status(o.cs, o.classified, None, now);
    let mut writes = Vec::new();
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
            event = Some(Write::Event {
                warning: true,
                reason: invalid.reason,
                message: message.clone(),
            });
        }
        mark_invalid(&mut status, invalid.reason, message, o.generation(), now);
    }
    // (An equal status still goes out as a write: the executor makes no call for it.)
    if event.is_some() || !held(o, &status) {
        writes.push(Write::Status(status));
    }
    writes.extend(event);
    let next = progress
        .min_backoff
        .map_or(Next::AwaitChange, Next::RequeueAfter);
    StepPlan::then(writes, next)
}

/// Whether `status` differs from the set's only in what [`progress_only`] holds back, on the
/// pass's classification: such a status is not written (steps 11 and 14).
pub fn held(o: &Observed<'_>, status: &CocoonSetStatus) -> bool {
    let not_ready: BTreeSet<&str> = o
        .classified
        .all_by_name
        .iter()
        .filter(|(_, pod)| !pods::is_ready(pod))
        .map(|(name, _)| name.as_str())
        .collect();
    o.cs.status.as_ref() != Some(status) && progress_only(o.cs.status.as_ref(), status, &not_ready)
}

/// A departure from §9's patch rule (issue #20): while the set is `Pending` or `Scaling`
/// at this generation, a new status that keeps the phase, the generation, every ready and
/// desired count and the conditions' statuses and reasons is not written for what else
/// moved in the entries of pods that are not ready (`not_ready`, by pod name): their VM id,
/// IP or pod phase (and the Ready condition's message, which only repeats the counts). The
/// entry of a ready pod is always written as it changes; a not-ready pod's entry goes out
/// with its readiness change, or with the phase that ends the wait (`Running`): a resume of
/// a set of four pods made a write for each pod's VM id and another for its readiness.
pub fn progress_only(
    current: Option<&CocoonSetStatus>,
    new: &CocoonSetStatus,
    not_ready: &BTreeSet<&str>,
) -> bool {
    use cocoon_api::crd::set::CocoonSetPhase::{Pending, Scaling};
    let Some(cur) = current else {
        return false;
    };
    let waiting = matches!(cur.phase, Some(Pending | Scaling));
    let conditions = |s: &CocoonSetStatus| {
        s.conditions
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.observed_generation,
                )
            })
            .collect::<Vec<_>>()
    };
    waiting
        && cur.phase == new.phase
        && cur.observed_generation == new.observed_generation
        && (
            cur.ready_agents,
            cur.desired_agents,
            cur.ready_toolboxes,
            cur.desired_toolboxes,
        ) == (
            new.ready_agents,
            new.desired_agents,
            new.ready_toolboxes,
            new.desired_toolboxes,
        )
        && cur.agents.len() == new.agents.len()
        && cur.toolboxes.len() == new.toolboxes.len()
        && conditions(cur) == conditions(new)
        && cur.agents.iter().zip(&new.agents).all(|(a, b)| {
            a == b || (a.pod_name == b.pod_name && not_ready.contains(b.pod_name.as_str()))
        })
        && cur.toolboxes.iter().zip(&new.toolboxes).all(|(a, b)| {
            a == b || (a.pod_name == b.pod_name && not_ready.contains(b.pod_name.as_str()))
        })
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
    use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec};

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::{self, Classified};
    use crate::cocoonset::steps::toolboxes::INVALID_TOOLBOXES;

    const NS: &str = "ns";

    fn set() -> CocoonSet {
        let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
        cs.metadata.namespace = Some(NS.into());
        cs.metadata.uid = Some("uid-1".into());
        cs.metadata.generation = Some(2);
        cs
    }

    fn run(cs: &CocoonSet, progress: &Progress) -> StepPlan {
        let main = pods::build_agent_pod(cs, NS, 0, "", None);
        let classified = Classified::from_owned([&main]);
        let timing = Timing::default();
        plan(
            &Observed {
                cs,
                ns: NS,
                owned: &[],
                classified: &classified,
                timing: &timing,
            },
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
            &set(),
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
        let p = run(&set(), &Progress::default());
        assert_eq!(p.writes.len(), 1);
        let s = status_of(&p);
        assert_eq!(
            (s.phase, s.observed_generation),
            (Some(CocoonSetPhase::Scaling), 2)
        );
        assert_eq!(p.next, Next::AwaitChange);
        let d = Duration::from_secs(3);
        let p = run(
            &set(),
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
        let mut cs = set();
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
            p.writes[1],
            Write::Event {
                warning: true,
                reason: INVALID_TOOLBOXES,
                message: ready.message.clone(),
            }
        );
        assert_eq!(
            p.next,
            Next::AwaitChange,
            "no retry: it waits for a spec change"
        );
        // The next pass finds it reported: the same status, no second Event.
        cs.status = Some(s.clone());
        let again = run(&cs, &progress);
        assert_eq!(again.writes, [Write::Status(s)]);
    }

    #[test]
    fn while_pending_or_scaling_only_entry_changes_are_not_written() {
        use cocoon_api::crd::set::AgentStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let cond = |status: &str, reason: &str, message: &str| Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(2),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        let entry = |vm_id: &str, ip: &str, phase: &str| AgentStatus {
            slot: 0,
            role: "main".into(),
            pod_name: "demo-0".into(),
            vm_id: vm_id.into(),
            ip: ip.into(),
            phase: phase.into(),
            ..AgentStatus::default()
        };
        let base = CocoonSetStatus {
            observed_generation: 2,
            phase: Some(CocoonSetPhase::Scaling),
            ready_agents: 0,
            desired_agents: 1,
            agents: vec![entry("", "", "Running")],
            conditions: vec![cond("False", "AgentsNotReady", "0/1 agents ready")],
            ..CocoonSetStatus::default()
        };
        let with = |f: &dyn Fn(&mut CocoonSetStatus)| {
            let mut s = base.clone();
            f(&mut s);
            s
        };
        // (current, new) -> only entries moved (no write)
        type Row = (&'static str, Option<CocoonSetStatus>, CocoonSetStatus, bool);
        let table: Vec<Row> = vec![
            (
                "a VM id and IP in an entry",
                Some(base.clone()),
                with(&|s| s.agents[0] = entry("vm-1", "10.0.0.2", "Running")),
                true,
            ),
            (
                "a pod phase in an entry",
                Some(base.clone()),
                with(&|s| s.agents[0].phase = "Pending".into()),
                true,
            ),
            (
                "the same while Pending",
                Some(with(&|s| s.phase = Some(CocoonSetPhase::Pending))),
                with(&|s| {
                    s.phase = Some(CocoonSetPhase::Pending);
                    s.agents[0].vm_id = "vm-1".into();
                }),
                true,
            ),
            (
                "a readiness change",
                Some(base.clone()),
                with(&|s| s.ready_agents = 1),
                false,
            ),
            (
                "a Ready condition flip",
                Some(base.clone()),
                with(&|s| s.conditions = vec![cond("True", "AllAgentsReady", "1/1 agents ready")]),
                false,
            ),
            (
                "a new entry (a pod created)",
                Some(base.clone()),
                with(&|s| s.agents.push(entry("", "", "Pending"))),
                false,
            ),
            (
                "a new generation",
                Some(base.clone()),
                with(&|s| s.observed_generation = 3),
                false,
            ),
            (
                "a phase change (Running ends the wait)",
                Some(base.clone()),
                with(&|s| s.phase = Some(CocoonSetPhase::Running)),
                false,
            ),
            (
                "an entry change while Running",
                Some(with(&|s| s.phase = Some(CocoonSetPhase::Running))),
                with(&|s| {
                    s.phase = Some(CocoonSetPhase::Running);
                    s.agents[0].vm_id = "vm-1".into();
                }),
                false,
            ),
            (
                "an entry change while Suspended",
                Some(with(&|s| s.phase = Some(CocoonSetPhase::Suspended))),
                with(&|s| {
                    s.phase = Some(CocoonSetPhase::Suspended);
                    s.agents[0].vm_id = "vm-1".into();
                }),
                false,
            ),
            ("no status yet", None, base.clone(), false),
        ];
        let not_ready = BTreeSet::from(["demo-0"]);
        for (what, current, new, want) in table {
            assert_eq!(
                progress_only(current.as_ref(), &new, &not_ready),
                want,
                "{what}"
            );
        }
        // The entry of a ready pod is written as it changes: a user may reach it by its IP.
        let moved = with(&|s| s.agents[0] = entry("vm-1", "10.0.0.2", "Running"));
        assert!(
            !progress_only(Some(&base), &moved, &BTreeSet::new()),
            "a ready pod's new VM id and IP"
        );
        // An entry that now names another pod is no progress of the same pod.
        let renamed = with(&|s| s.agents[0].pod_name = "demo-9".into());
        assert!(
            !progress_only(Some(&base), &renamed, &BTreeSet::from(["demo-0", "demo-9"])),
            "an entry of another pod"
        );
    }

    #[test]
    fn a_pass_whose_status_moved_only_in_entries_writes_nothing() {
        let mut cs = set();
        let first = status_of(&run(&cs, &Progress::default()));
        cs.status = Some(first.clone());
        // The same classification again: the equal status (which the executor skips).
        let again = run(&cs, &Progress::default());
        assert_eq!(again.writes, [Write::Status(first.clone())]);
        // An entry that differs only in its VM id is held while Scaling.
        let mut stale = first.clone();
        stale.agents[0].vm_id = "an-old-id".into();
        cs.status = Some(stale);
        let held = run(&cs, &Progress::default());
        assert!(held.writes.is_empty(), "{:?}", held.writes);
        assert_eq!(held.next, Next::AwaitChange);
    }
}
