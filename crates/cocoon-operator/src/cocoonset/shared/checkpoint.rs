//! `spec.agent.fromCheckpoint` (issue 38, docs/checkpoints.md §"Forks"): may a set's main
//! agent start from the named CocoonCheckpoint now, and if not, what the set says while it
//! waits.
//!
//! The rule, for a main the walk is about to create fresh (a restore-marked main wakes from
//! its own `:hibernate` tag and never consults the checkpoint, so deleting the checkpoint
//! later never blocks a wake):
//! * the checkpoint is looked up in the set's own namespace only (the name is all the set
//!   gives; no namespace can be named);
//! * absent, or being deleted → wait, `CheckpointNotFound`;
//! * not `Ready` → wait, `CheckpointNotReady` with its phase;
//! * `Ready` but its status does not name the artifact the operator derives for it
//!   (`checkpoint_artifact(ns, name, uid)`) or carries no digest → wait, `CheckpointNotReady`
//!   (the status is not trusted);
//! * otherwise → start: the main pod is marked with
//!   [`FROM_CHECKPOINT_ANNOTATION`](cocoon_api::contract::checkpoint::FROM_CHECKPOINT_ANNOTATION)
//!   and the node agent resolves (and owner- and digest-checks) the artifact itself.
//!
//! While waiting the set's `Ready` condition is `False` with the reason and a message naming
//! `spec.agent.fromCheckpoint`; the Warning Event of the same reason is published once, when
//! the condition's reason is not already that one.

use cocoon_api::contract::checkpoint::{NotStartable, ready_artifact};
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::set::CocoonSet;

/// The set field that names the checkpoint, for messages.
pub const FIELD: &str = "spec.agent.fromCheckpoint";
/// Condition reason and Warning Event: no such checkpoint in the set's namespace.
pub const REASON_NOT_FOUND: &str = "CheckpointNotFound";
/// Condition reason and Warning Event: the checkpoint is not `Ready` (yet).
pub const REASON_NOT_READY: &str = "CheckpointNotReady";

/// The gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// The checkpoint is Ready: create the main from it.
    Start,
    /// Create nothing; say why.
    Wait {
        reason: &'static str,
        message: String,
    },
}

/// The gate for checkpoint `name` of namespace `ns`, `found` being the cache's object of that
/// namespace and name (if any): [`ready_artifact`], the rule the node agent applies too.
pub fn gate(ns: &str, name: &str, found: Option<&CocoonCheckpoint>) -> Gate {
    let e = match ready_artifact(ns, name, found) {
        Ok(_) => return Gate::Start,
        Err(e) => e,
    };
    let reason = match e {
        NotStartable::NotFound(_) => REASON_NOT_FOUND,
        NotStartable::NotReady(..) | NotStartable::StatusMismatch(_) => REASON_NOT_READY,
    };
    Gate::Wait {
        reason,
        message: format!("{FIELD}: {e}; the main agent waits for it"),
    }
}

/// Whether a wait with `reason` is news: the set's `Ready` condition does not carry it yet
/// (so the Warning Event goes out once per wait, not once per pass).
pub fn announce(cs: &CocoonSet, reason: &str) -> bool {
    !cs.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == reason)
    })
}

#[cfg(test)]
mod tests {
    use cocoon_api::crd::checkpoint::{
        CheckpointSource, CocoonCheckpointSpec, CocoonCheckpointStatus,
    };
    use cocoon_api::crd::set::CocoonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::cocoonset::fixtures::set;
    use cocoon_api::contract::checkpoint::checkpoint_artifact;
    use cocoon_api::crd::checkpoint::CheckpointPhase;

    const NS: &str = "team-a";
    const UID: &str = "uid-1";

    fn ckpt(
        phase: Option<CheckpointPhase>,
        f: impl FnOnce(&mut CocoonCheckpointStatus),
    ) -> CocoonCheckpoint {
        let mut c = CocoonCheckpoint::new(
            "golden",
            CocoonCheckpointSpec {
                source: CheckpointSource::default(),
            },
        );
        c.metadata.namespace = Some(NS.into());
        c.metadata.uid = Some(UID.into());
        let a = checkpoint_artifact(NS, "golden", UID).expect("derivable");
        let mut s = CocoonCheckpointStatus {
            phase,
            repository: a.repository,
            tag: a.tag,
            digest: "sha256:abc".into(),
            ..CocoonCheckpointStatus::default()
        };
        f(&mut s);
        c.status = Some(s);
        c
    }

    #[test]
    fn a_set_starts_only_from_a_ready_checkpoint_naming_its_derived_artifact() {
        let ready = ckpt(Some(CheckpointPhase::Ready), |_| {});
        let mut deleting = ready.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let cases: Vec<(&str, Option<CocoonCheckpoint>, Option<&str>, &str)> = vec![
            ("absent", None, Some(REASON_NOT_FOUND), "does not exist"),
            (
                "being deleted",
                Some(deleting),
                Some(REASON_NOT_FOUND),
                "does not exist",
            ),
            (
                "no phase yet",
                Some(ckpt(None, |_| {})),
                Some(REASON_NOT_READY),
                "no phase yet",
            ),
            (
                "pending",
                Some(ckpt(Some(CheckpointPhase::Pending), |_| {})),
                Some(REASON_NOT_READY),
                "(Pending)",
            ),
            (
                "pushing",
                Some(ckpt(Some(CheckpointPhase::Pushing), |_| {})),
                Some(REASON_NOT_READY),
                "(Pushing)",
            ),
            (
                "failed",
                Some(ckpt(Some(CheckpointPhase::Failed), |_| {})),
                Some(REASON_NOT_READY),
                "(Failed)",
            ),
            (
                "ready, another namespace's repository in its status",
                Some(ckpt(Some(CheckpointPhase::Ready), |s| {
                    s.repository = "ckpt-team-b-golden-000000000000".into()
                })),
                Some(REASON_NOT_READY),
                "derived artifact",
            ),
            (
                "ready, a VM repository in its status",
                Some(ckpt(Some(CheckpointPhase::Ready), |s| {
                    s.repository = "vk-team-a-x-0".into()
                })),
                Some(REASON_NOT_READY),
                "derived artifact",
            ),
            (
                "ready, no digest",
                Some(ckpt(Some(CheckpointPhase::Ready), |s| s.digest.clear())),
                Some(REASON_NOT_READY),
                "derived artifact",
            ),
            ("ready", Some(ready), None, ""),
        ];
        for (what, found, reason, says) in cases {
            match (gate(NS, "golden", found.as_ref()), reason) {
                (Gate::Start, None) => {}
                (
                    Gate::Wait {
                        reason: got,
                        message,
                    },
                    Some(want),
                ) => {
                    assert_eq!(got, want, "{what}");
                    assert!(
                        message.starts_with("spec.agent.fromCheckpoint: checkpoint team-a/golden "),
                        "{what}: {message}"
                    );
                    assert!(message.contains(says), "{what}: {message}");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_warning_is_announced_once_per_wait_reason() {
        let mut cs = set();
        assert!(announce(&cs, REASON_NOT_FOUND), "no status yet");
        let cond = |reason: &str, status: &str| Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        };
        cs.status = Some(CocoonSetStatus {
            conditions: vec![cond(REASON_NOT_FOUND, "False")],
            ..CocoonSetStatus::default()
        });
        assert!(!announce(&cs, REASON_NOT_FOUND), "already said");
        assert!(announce(&cs, REASON_NOT_READY), "a new reason is news");
        cs.status = Some(CocoonSetStatus {
            conditions: vec![cond("AgentsNotReady", "False")],
            ..CocoonSetStatus::default()
        });
        assert!(announce(&cs, REASON_NOT_FOUND));
    }
}
