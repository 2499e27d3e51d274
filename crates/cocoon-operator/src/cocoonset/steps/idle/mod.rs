//! The idle step (issue 39), between step 5 and the suspend of step 6: the set suspends by
//! itself once every member has been idle for `spec.idle.suspendAfter`, an exec's wake
//! request wakes an idle-suspended set, and a wake or a user's resume restarts the idle
//! clock. The rules are in [`rules`]; this planner gathers their facts from the set and its
//! member pods and turns the verdict into writes:
//!
//! * the idle suspend is [`idle::idle_suspend_patch`] with the field manager
//!   [`idle::IDLE_FIELD_MANAGER`], and the exec wake [`idle::wake_patch`] with
//!   [`idle::ACTIVATOR_FIELD_MANAGER`], both under the set's resourceVersion (a conflict is a
//!   user's write in between: the pass ends and the next one decides again); either ends the
//!   pass, and its generation change brings the next;
//! * the condition `Idle` and `status.idle` go out in one status write; the Event and the
//!   metric of a suspend or a wake go with the status that first says it;
//! * each member pod carries the set's `suspendAfter` ([`idle::SUSPEND_AFTER`]), so its node
//!   publishes activity often enough.

use chrono::{DateTime, Utc};
use cocoon_api::contract::idle;
use cocoon_api::contract::timefmt::{parse_rfc3339, rfc3339_seconds};
use cocoon_api::crd::set::{CocoonSetStatus, IdleStatus, WakeOn};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use self::rules::{Act, Facts, IdleCondition, Member, Tick, Trigger};
use super::{Counter, Effect, Next, Note, Observed, StepPlan, Write, log};
use crate::conditions::{NewCondition, find, set_condition};

pub mod rules;
#[cfg(test)]
mod rules_tests;

pub fn plan(o: &Observed<'_>, now: DateTime<Utc>, status_time: Timestamp) -> StepPlan {
    let facts = facts(o);
    let verdict = rules::decide(&facts, now);
    let mut effects: Vec<Effect> = verdict
        .marks
        .iter()
        .map(|(name, value)| {
            Write::PatchPod {
                name: name.clone(),
                delta: [(idle::SUSPEND_AFTER.to_owned(), value.clone())].into(),
            }
            .into()
        })
        .collect();
    let rv = o.cs.resource_version().unwrap_or_default();
    let mut status = Status::new(o, verdict.last.clone(), status_time);
    let mut next = Next::Continue;
    match verdict.act {
        Act::Nothing => {}
        Act::AnnounceWake(trigger) => {
            status.clock(Tick::new(now, rules::CLOCK_WOKEN));
            status.condition(
                false,
                trigger.reason(),
                format!(
                    "woken by {}; the idle clock restarts",
                    match trigger {
                        Trigger::Connection => "a connection",
                        Trigger::Exec => "an exec",
                    }
                ),
            );
            effects.extend(status.write());
            effects.push(
                Note::Event {
                    warning: false,
                    reason: trigger.reason(),
                    message: format!("{} woke the idle-suspended set", trigger.as_str()),
                }
                .into(),
            );
            effects.push(
                Note::Count(Counter::IdleWake {
                    trigger: trigger.as_str(),
                })
                .into(),
            );
            effects.push(Write::SetAnnotations([(idle::WOKEN_BY.to_owned(), None)].into()).into());
        }
        Act::DropWokenBy => {
            effects.push(
                log(format!(
                    "ignoring {}={:?}: neither connection nor exec",
                    idle::WOKEN_BY,
                    facts.woken_by.as_deref().unwrap_or("")
                ))
                .into(),
            );
            effects.push(Write::SetAnnotations([(idle::WOKEN_BY.to_owned(), None)].into()).into());
        }
        Act::AnnounceSuspend => {
            let limit = facts.suspend_after_text.as_deref().unwrap_or("its limit");
            let message = match &verdict.last {
                Some(t) => format!(
                    "every member idle for {limit} (last activity: {} at {})",
                    t.kind,
                    rfc3339_seconds(t.at)
                ),
                None => format!("every member idle for {limit}"),
            };
            status.condition(true, idle::reasons::IDLE_SUSPENDED, message.clone());
            effects.extend(status.write());
            effects.push(
                Note::Event {
                    warning: false,
                    reason: idle::reasons::IDLE_SUSPENDED,
                    message,
                }
                .into(),
            );
            effects.push(Note::Count(Counter::IdleSuspend).into());
        }
        Act::WakeByExec { pod, at } => {
            effects.push(
                log(format!(
                    "an exec to {pod} asked for a wake: resuming the set"
                ))
                .into(),
            );
            // The request is handled with the wake, in the same write.
            let mut patch = idle::wake_patch(idle::WOKEN_BY_EXEC, &rv);
            patch["metadata"]["annotations"][idle::WAKE_HANDLED] = rfc3339_seconds(at).into();
            effects.push(
                Write::SpecPatch {
                    patch,
                    field_manager: idle::ACTIVATOR_FIELD_MANAGER,
                }
                .into(),
            );
            next = Next::RequeueAfter(o.timing.requeue_after_write);
        }
        Act::RefuseWake { pod, at, why } => {
            effects.push(
                Note::Event {
                    warning: true,
                    reason: idle::reasons::WAKE_IGNORED,
                    message: why.message(&pod),
                }
                .into(),
            );
            effects.push(
                Write::SetAnnotations(
                    [(idle::WAKE_HANDLED.to_owned(), Some(rfc3339_seconds(at)))].into(),
                )
                .into(),
            );
        }
        Act::Resumed {
            drop_idle_suspended,
        } => {
            status.clock(Tick::new(now, rules::CLOCK_RESUMED));
            status.condition(
                false,
                idle::reasons::ACTIVE,
                "resumed by a user; the idle clock restarts".to_owned(),
            );
            effects.extend(status.write());
            if drop_idle_suspended {
                effects.push(
                    Write::SetAnnotations([(idle::IDLE_SUSPENDED.to_owned(), None)].into()).into(),
                );
            }
        }
        Act::DropIdleSuspended => {
            effects.push(
                Write::SetAnnotations([(idle::IDLE_SUSPENDED.to_owned(), None)].into()).into(),
            );
        }
        Act::Suspend { last } => {
            effects.push(
                log(format!(
                    "every member idle for {} (last activity: {} at {}): suspending",
                    facts.suspend_after_text.as_deref().unwrap_or(""),
                    last.kind,
                    rfc3339_seconds(last.at)
                ))
                .into(),
            );
            effects.push(
                Write::SpecPatch {
                    patch: idle::idle_suspend_patch(now, &rv),
                    field_manager: idle::IDLE_FIELD_MANAGER,
                }
                .into(),
            );
            next = Next::RequeueAfter(o.timing.requeue_after_write);
        }
    }
    if next == Next::Continue {
        effects.extend(status.write());
        if let Some(d) = verdict.check_in {
            effects.push(Note::Backoff(d).into());
        }
    }
    StepPlan::of(effects, next)
}

/// The set's status with the idle step's changes: written once, when anything changed.
struct Status {
    current: Option<CocoonSetStatus>,
    new: Option<CocoonSetStatus>,
    generation: i64,
    now: Timestamp,
}

impl Status {
    fn new(o: &Observed<'_>, last: Option<Tick>, now: Timestamp) -> Self {
        // A set without a status yet gets one from step 14 first.
        let current = o.cs.status.clone();
        let new = current.clone().map(|mut s| {
            s.idle = last.map(|t| IdleStatus {
                last_activity: rfc3339_seconds(t.at),
                last_activity_kind: t.kind,
            });
            s
        });
        Status {
            current,
            new,
            generation: o.generation(),
            now,
        }
    }

    fn clock(&mut self, tick: Tick) {
        if let Some(s) = self.new.as_mut() {
            s.idle = Some(IdleStatus {
                last_activity: rfc3339_seconds(tick.at),
                last_activity_kind: tick.kind,
            });
        }
    }

    fn condition(&mut self, status: bool, reason: &str, message: String) {
        if let Some(s) = self.new.as_mut() {
            set_condition(
                &mut s.conditions,
                NewCondition {
                    type_: idle::CONDITION_IDLE,
                    status: if status { "True" } else { "False" },
                    reason,
                    message,
                    observed_generation: self.generation,
                },
                self.now,
                false,
            );
        }
    }

    /// The status write, once (nothing when it changed nothing).
    fn write(&mut self) -> Option<Effect> {
        let new = self.new.take()?;
        (self.current.as_ref() != Some(&new)).then(|| Write::Status(new).into())
    }
}

/// The rules' facts from the set and its classified member pods.
fn facts(o: &Observed<'_>) -> Facts {
    let cs = o.cs;
    let spec = cs.spec.idle.as_ref();
    let annotations = cs.annotations();
    let time = |key: &str| annotations.get(key).and_then(|v| parse_rfc3339(v));
    let status = cs.status.as_ref();
    Facts {
        suspend_after_text: spec
            .filter(|s| s.suspend_after().is_some())
            .and_then(|s| s.suspend_after.clone()),
        suspend_after: spec.and_then(|s| s.suspend_after()),
        wakes_on_exec: spec.is_none_or(|s| s.wakes_on(WakeOn::Exec)),
        suspend: cs.spec.suspend,
        generation: o.generation(),
        created: cs
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0)),
        phase: status.and_then(|s| s.phase),
        idle_suspended: annotations
            .get(idle::IDLE_SUSPENDED)
            .map(|v| parse_rfc3339(v)),
        woken_by: annotations.get(idle::WOKEN_BY).cloned(),
        wake_handled: time(idle::WAKE_HANDLED),
        clock: status.and_then(|s| s.idle.as_ref()).and_then(|i| {
            Some(Tick::new(
                parse_rfc3339(&i.last_activity)?,
                &i.last_activity_kind,
            ))
        }),
        condition: status
            .and_then(|s| find(&s.conditions, idle::CONDITION_IDLE))
            .map(|c| IdleCondition {
                status: c.status == "True",
                reason: c.reason.clone(),
                observed_generation: c.observed_generation,
            }),
        members: o.classified.all_by_name.values().map(member).collect(),
    }
}

fn member(p: &Pod) -> Member {
    let a = p.annotations();
    let ready_since = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0));
    Member {
        name: p.name_any(),
        activity: idle::LastActivity::from_annotations(a),
        ready_since,
        wake_request: a.get(idle::WAKE_REQUEST).and_then(|v| parse_rfc3339(v)),
        suspend_after: a.get(idle::SUSPEND_AFTER).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, IdleSpec};

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, at, classify, observe, ready, set};
    use crate::cocoonset::pods;

    fn idle_set() -> CocoonSet {
        let mut cs = set().in_phase(Some(CocoonSetPhase::Running));
        cs.spec.idle = Some(IdleSpec {
            suspend_after: Some("10s".into()),
            ..IdleSpec::default()
        });
        cs.metadata.resource_version = Some("41".into());
        cs
    }

    fn run(cs: &CocoonSet, now: i64) -> StepPlan {
        let main = ready(pods::build_agent_pod(cs, NS, 0, "", None));
        let (classified, timing) = (classify(&[main]), Timing::default());
        plan(
            &observe(cs, &classified, &timing),
            at(now),
            Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn the_idle_suspend_is_the_idle_managers_patch_under_the_resource_version() {
        let mut cs = idle_set();
        cs.status.as_mut().unwrap().idle = Some(IdleStatus {
            last_activity: rfc3339_seconds(at(0)),
            last_activity_kind: "traffic".into(),
        });
        let p = run(&cs, 10);
        assert_eq!(
            p.writes,
            [Write::SpecPatch {
                patch: idle::idle_suspend_patch(at(10), "41"),
                field_manager: idle::IDLE_FIELD_MANAGER,
            }]
        );
        assert_eq!(
            p.next,
            Next::RequeueAfter(Timing::default().requeue_after_write)
        );
        // A second earlier: the clock in the status, and a look again when it runs out.
        let p = run(&cs, 9);
        assert_eq!(p.next, Next::Continue);
        assert!(
            p.notes()
                .any(|n| *n == Note::Backoff(std::time::Duration::from_secs(1)))
        );
    }

    #[test]
    fn a_wake_is_said_by_the_status_then_an_event_and_a_count_then_woken_by_goes() {
        let cs = idle_set()
            .in_phase(Some(CocoonSetPhase::Suspended))
            .with_annotation(idle::WOKEN_BY, "connection");
        let p = run(&cs, 100);
        let Write::Status(status) = &p.writes[0] else {
            panic!("the status first: {:?}", p.writes);
        };
        let idle_status = status.idle.clone().expect("status.idle");
        assert_eq!(idle_status.last_activity_kind, rules::CLOCK_WOKEN);
        let c = find(&status.conditions, idle::CONDITION_IDLE).expect("Idle condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "WokenByConnection")
        );
        assert_eq!(
            p.writes[1],
            Write::SetAnnotations([(idle::WOKEN_BY.to_owned(), None)].into())
        );
        let notes: Vec<&Note> = p.notes().collect();
        assert!(matches!(
            notes[0],
            Note::Event {
                reason: "WokenByConnection",
                ..
            }
        ));
        assert_eq!(
            *notes[1],
            Note::Count(Counter::IdleWake {
                trigger: "connection"
            })
        );
    }
}
