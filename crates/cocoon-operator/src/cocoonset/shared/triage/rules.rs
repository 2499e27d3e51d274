//! Pure rules of triage and the rebuild budget (`cocoonset.md` §6), which steps 7, 11, 12 and
//! 13 share; [`super::existing`] turns a decision into writes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events as ev;
use cocoon_api::contract::{DeadLetter, RebuildEntry, RebuildHistory};
use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use crate::cocoonset::Timing;
use crate::cocoonset::pods;

/// Extra field of a rebuild-history entry (ignored by the Go operator): the generation at
/// which the entry's pod was dead-lettered, so a pod that then vanished is not recreated
/// until the spec changes (§6 "budget exhausted for a missing pod").
pub const EXHAUSTED_FIELD: &str = "exhaustedAt";

/// The triage reason of a pod: `terminal (...)` when terminal and terminal counts, else
/// `spec drifted` when drifted, else none (leave it alone).
pub fn rebuild_reason(pod: &Pod, terminal_counts: bool, drifted: bool) -> Option<String> {
    if terminal_counts && pods::is_terminal(pod) {
        Some(ev::reason_terminal(
            pods::pod_phase(pod),
            pods::lifecycle_state_str(pod),
        ))
    } else if drifted {
        Some(ev::REASON_SPEC_DRIFTED.to_string())
    } else {
        None
    }
}

/// What triage does with one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Triage {
    /// Healthy, or dead-lettered at this generation: leave it.
    Leave { dead_lettered: bool },
    /// Dead-lettered at an older generation: reset its history entry and delete it.
    ResetAndDelete,
    /// Budget spent: mark dead-letter at this generation (no change counted).
    DeadLetter { reason: String },
    /// Backoff still running.
    Wait(Duration),
    /// Persist `attempt` to the history, then delete.
    Rebuild { attempt: i64, reason: String },
}

/// §6 for one existing pod: what its reason, its dead-letter mark and its history entry
/// decide at this generation.
pub fn decide(
    reason: Option<String>,
    dead_letter: DeadLetter,
    entry: Option<&RebuildEntry>,
    generation: i64,
    now: DateTime<Utc>,
    timing: &Timing,
) -> Triage {
    let Some(reason) = reason else {
        return Triage::Leave {
            dead_lettered: false,
        };
    };
    if dead_letter.is_marked() {
        return if dead_letter.is_dead_at(generation) {
            Triage::Leave {
                dead_lettered: true,
            }
        } else {
            Triage::ResetAndDelete
        };
    }
    let count = entry.map_or(0, |e| e.count);
    if count >= i64::from(timing.rebuild_budget) {
        return Triage::DeadLetter { reason };
    }
    let backoff = timing.backoff(count);
    if let Some(last) = entry.and_then(|e| e.last_deleted) {
        let elapsed = now
            .signed_duration_since(last)
            .to_std()
            .unwrap_or(Duration::ZERO);
        if backoff > elapsed {
            return Triage::Wait(backoff - elapsed);
        }
    }
    Triage::Rebuild {
        attempt: count + 1,
        reason,
    }
}

/// Whether a missing pod's budget was spent at this generation (do not recreate).
pub fn exhausted(history: &RebuildHistory, pod: &str, generation: i64) -> bool {
    history
        .get(pod)
        .and_then(|e| e.extra.get(EXHAUSTED_FIELD))
        .and_then(Value::as_i64)
        == Some(generation)
}

/// Whether a missing pod carries an exhaustion mark of an older generation: the spec has
/// changed since, so its entry is reset before it is recreated with a fresh budget.
pub fn exhausted_earlier(history: &RebuildHistory, pod: &str, generation: i64) -> bool {
    history
        .get(pod)
        .and_then(|e| e.extra.get(EXHAUSTED_FIELD))
        .and_then(Value::as_i64)
        .is_some_and(|g| g != generation)
}

/// Marks `pod`'s entry exhausted at `generation`.
pub fn mark_exhausted(history: &mut RebuildHistory, pod: &str, generation: i64) {
    history
        .0
        .entry(pod.to_string())
        .or_default()
        .extra
        .insert(EXHAUSTED_FIELD.into(), Value::from(generation));
}

/// The pod names whose history entries survive GC (§6.4).
pub fn desired_names(cs: &CocoonSet) -> std::collections::BTreeSet<String> {
    naming::desired_pod_names(
        &cs.name_any(),
        cs.spec.agent.replicas,
        cs.spec.toolboxes.iter().map(|t| t.name.as_str()),
    )
}
