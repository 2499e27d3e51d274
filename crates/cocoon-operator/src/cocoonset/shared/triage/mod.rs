//! Triage and the rebuild budget (`cocoonset.md` §6) applied to one pod (steps 7, 11, 12 and
//! 13 share it): the writes of the decision of [`rules::decide`] for an existing pod
//! ([`existing`]), and a missing pod's rebuild budget ([`may_recreate`]). The pure rules are
//! [`rules`].
//!
//! The rebuild history is durable before the delete it counts, so a crash cannot refund an
//! attempt; a dead-lettered pod is marked at this generation and left until the spec changes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{AnnotationCodec, DeadLetter, RebuildHistory};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use self::rules::Triage;
use crate::cocoonset::pods;
use crate::cocoonset::steps::{Counter, Effect, Note, Observed, Write, log};

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// One pod's triage: the decision, and what applying it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Triaged {
    pub decision: Triage,
    pub writes: Vec<Effect>,
    /// The writes change a pod (a delete).
    pub changed: bool,
    /// A backoff still running.
    pub backoff: Option<Duration>,
}

/// The history write: GC'd of entries outside the desired pod names, as an annotation delta.
pub fn history_write(o: &Observed<'_>, mut history: RebuildHistory) -> Write {
    history.retain_desired(&rules::desired_names(o.cs));
    Write::SetAnnotations(history.delta(o.cs.annotations()))
}

/// §6 for `pod`, rebuilt for `reason` (none: leave it).
pub fn existing(
    o: &Observed<'_>,
    pod: &Pod,
    reason: Option<String>,
    now: DateTime<Utc>,
) -> Triaged {
    let name = pod.name_any();
    let generation = o.generation();
    let mut history = RebuildHistory::from_meta(&o.cs.metadata);
    let decision = rules::decide(
        reason,
        pods::dead_letter(pod),
        history.get(&name),
        generation,
        now,
        o.timing,
    );
    let budget = o.timing.rebuild_budget;
    let (writes, changed, backoff) = match &decision {
        Triage::Leave { .. } => (Vec::new(), false, None),
        Triage::Wait(d) => (Vec::new(), false, Some(*d)),
        Triage::ResetAndDelete => {
            history.reset(&name);
            let writes = vec![
                history_write(o, history).into(),
                Write::DeletePod(name.clone()).into(),
            ];
            (writes, true, None)
        }
        Triage::DeadLetter { reason } => {
            rules::mark_exhausted(&mut history, &name, generation);
            let writes = vec![
                Write::PatchPod {
                    name: name.clone(),
                    delta: DeadLetter(Some(generation)).desired(),
                }
                .into(),
                history_write(o, history).into(),
                Note::Count(Counter::SubagentDeadLetter).into(),
                Note::Event {
                    warning: true,
                    reason: reasons::SUB_AGENT_DEAD_LETTER,
                    message: ev::dead_letter_message(&name, budget, reason),
                }
                .into(),
            ];
            (writes, false, None)
        }
        Triage::Rebuild { attempt, reason } => {
            history.record_delete(&name, now, generation);
            let attempt = u32::try_from(*attempt).unwrap_or(u32::MAX);
            let writes = vec![
                history_write(o, history).into(),
                Write::DeletePod(name.clone()).into(),
                Note::Count(Counter::SubagentRebuild).into(),
                Note::Event {
                    warning: false,
                    reason: reasons::SUB_AGENT_REBUILDING,
                    message: ev::rebuilding_message(&name, attempt, budget, reason),
                }
                .into(),
            ];
            (writes, true, None)
        }
    };
    Triaged {
        decision,
        writes,
        changed,
        backoff,
    }
}

impl Triaged {
    /// Everything applying the decision takes, in order: its log line, its writes, then the
    /// pass's bookkeeping (a backoff still running, a change made).
    pub fn into_effects(self, o: &Observed<'_>, pod: &str) -> Vec<Effect> {
        let mut out = Vec::new();
        match &self.decision {
            Triage::DeadLetter { reason } => out.push(Note::Log {
                warn: true,
                message: format!(
                    "pod {pod}: rebuild budget spent at generation {}: dead-lettered until the spec changes ({reason})",
                    o.generation()
                ),
            }
            .into()),
            Triage::Rebuild { attempt, reason } => out.push(log(format!(
                "rebuilding pod {pod}: attempt {attempt} ({reason})"
            )).into()),
            _ => {}
        }
        out.extend(self.writes);
        out.extend(self.backoff.map(|d| Note::Backoff(d).into()));
        if self.changed {
            out.push(Note::Changed.into());
        }
        out
    }
}

/// Whether a missing pod may be created: `None` when its budget is spent at this generation;
/// else the writes first (an exhaustion mark of an older generation is cleared: the spec
/// changed, so the budget is fresh).
pub fn may_recreate(o: &Observed<'_>, pod_name: &str) -> Option<Vec<Write>> {
    let mut history = RebuildHistory::from_meta(&o.cs.metadata);
    let generation = o.generation();
    if rules::exhausted(&history, pod_name, generation) {
        return None;
    }
    if rules::exhausted_earlier(&history, pod_name, generation) {
        history.reset(pod_name);
        return Some(vec![history_write(o, history)]);
    }
    Some(Vec::new())
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::CocoonSet;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, observe, set};
    use crate::cocoonset::pods::Classified;

    /// A set of two sub-agents with this rebuild history (none when empty).
    fn with_history(history: &str) -> CocoonSet {
        let cs = set().with_replicas(2);
        if history.is_empty() {
            return cs;
        }
        cs.with_annotation(ann::REBUILD_HISTORY, history)
    }

    fn timing() -> Timing {
        Timing {
            rebuild_budget: 2,
            rebuild_backoff: vec![Duration::ZERO, Duration::from_secs(10)],
            ..Timing::default()
        }
    }

    fn kinds(writes: &[Effect]) -> Vec<&'static str> {
        writes
            .iter()
            .map(|w| match w {
                Effect::Write(Write::SetAnnotations(d)) if d.contains_key(ann::REBUILD_HISTORY) => {
                    "history"
                }
                Effect::Write(Write::DeletePod(_)) => "delete",
                Effect::Write(Write::PatchPod { delta, .. })
                    if delta.contains_key(ann::DEAD_LETTER) =>
                {
                    "dead-letter"
                }
                Effect::Note(Note::Count(Counter::SubagentRebuild)) => "count rebuild",
                Effect::Note(Note::Count(Counter::SubagentDeadLetter)) => "count dead-letter",
                Effect::Note(Note::Event { reason, .. }) => reason,
                other => panic!("unexpected write {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_rebuild_history_is_durable_before_the_delete_and_the_budget_ends_in_dead_letter() {
        let now = DateTime::<Utc>::from_timestamp(1_000, 0).unwrap_or_default();
        let (c, t) = (Classified::default(), timing());
        let (empty, one, spent) = (
            with_history(""),
            with_history(
                r#"{"demo-1":{"count":1,"lastDeleted":"1970-01-01T00:16:35Z","generation":3}}"#,
            ),
            with_history(
                r#"{"demo-1":{"count":2,"lastDeleted":"1970-01-01T00:00:00Z","generation":3}}"#,
            ),
        );
        let drifted = Some(ev::REASON_SPEC_DRIFTED.to_string());
        // (what, set, reason, writes, changed, backoff)
        type Case<'a> = (
            &'a str,
            &'a CocoonSet,
            Option<String>,
            Vec<&'a str>,
            bool,
            Option<Duration>,
        );
        let cases: Vec<Case<'_>> = vec![
            ("healthy: left alone", &empty, None, vec![], false, None),
            (
                "first rebuild: history, delete, count, event",
                &empty,
                drifted.clone(),
                vec![
                    "history",
                    "delete",
                    "count rebuild",
                    reasons::SUB_AGENT_REBUILDING,
                ],
                true,
                None,
            ),
            (
                "backoff still running",
                &one,
                drifted.clone(),
                vec![],
                false,
                Some(Duration::from_secs(5)),
            ),
            (
                "budget spent: dead-letter at this generation, no change counted",
                &spent,
                drifted.clone(),
                vec![
                    "dead-letter",
                    "history",
                    "count dead-letter",
                    reasons::SUB_AGENT_DEAD_LETTER,
                ],
                false,
                None,
            ),
        ];
        for (what, cs, reason, want, changed, backoff) in cases {
            let pod = pods::build_agent_pod(cs, NS, 1, "vm", Some("n"));
            let p = existing(&observe(cs, &c, &t), &pod, reason, now);
            assert_eq!(kinds(&p.writes), want, "{what}");
            assert_eq!((p.changed, p.backoff), (changed, backoff), "{what}");
        }
    }

    #[test]
    fn a_pod_dead_lettered_at_an_older_generation_is_reset_and_deleted() {
        let cs = with_history(r#"{"demo-1":{"count":2,"generation":2}}"#);
        let mut pod = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
        pod.annotations_mut()
            .insert(ann::DEAD_LETTER.into(), "2".into());
        let (c, t) = (Classified::default(), timing());
        let p = existing(
            &observe(&cs, &c, &t),
            &pod,
            Some(ev::REASON_SPEC_DRIFTED.into()),
            Utc::now(),
        );
        assert_eq!(p.decision, Triage::ResetAndDelete);
        assert_eq!(kinds(&p.writes), ["history", "delete"]);
    }

    #[test]
    fn a_missing_pod_spent_at_this_generation_is_not_recreated_an_older_mark_is_cleared() {
        let (c, t) = (Classified::default(), timing());
        let mark =
            |g: i64| with_history(&format!(r#"{{"demo-1":{{"count":2,"exhaustedAt":{g}}}}}"#));
        let cs = mark(3);
        assert_eq!(may_recreate(&observe(&cs, &c, &t), "demo-1"), None);
        let cs = mark(2);
        let writes = may_recreate(&observe(&cs, &c, &t), "demo-1").expect("recreated");
        let writes: Vec<Effect> = writes.into_iter().map(Effect::from).collect();
        assert_eq!(kinds(&writes), ["history"]);
        let cs = with_history("");
        assert_eq!(may_recreate(&observe(&cs, &c, &t), "demo-1"), Some(vec![]));
    }
}
