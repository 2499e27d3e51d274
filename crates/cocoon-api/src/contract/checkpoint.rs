//! CocoonCheckpoint artifacts (issue 38): where a checkpoint's snapshot goes in the registry,
//! whom it records as its owner, and the request the operator hands to the node agent.
//!
//! **Naming, owner-derived.** [`checkpoint_artifact`] derives the repository from the
//! checkpoint's namespace, name and UID, nothing else: `ckpt-<M>-<12 hex>` where `M` is
//! `<ns>-<name>` made safe as in [`crate::naming::vm_name_for_pod`] (and cut to 22 + `-` + 22
//! characters when longer than 45), and the hash is the first 12 hex of
//! `sha256("<ns>/<name>/<uid>")`. So
//! * two checkpoints of two namespaces never share a repository, however their names are
//!   crafted (`team-a`/`x` and `team`/`a-x` give one `M` but two hashes);
//! * a checkpoint deleted and created again under its name gets a new repository (its UID
//!   changed), so nothing left of the old one is ever taken for the new one;
//! * the prefix `ckpt-` keeps every checkpoint repository apart from every VM repository
//!   (`vk-…`, `contract.md` §2.2), so no VM-name gate accepts one;
//! * the result is at most 63 characters and a valid OCI path component.
//!
//! The tag is always [`CHECKPOINT_TAG`].
//!
//! **Owner.** The artifact records the owner annotations of [`super::owner`] with the
//! checkpoint's namespace and the pod field [`owner_pod`] (`cocooncheckpoint/<name>`, which no
//! pod name can be: `/` is not allowed in one), so the owner rule ([`super::owner::owner_verdict`])
//! keeps pods from deleting it and it from deleting theirs.
//!
//! **Hand-off.** The operator writes [`REQUEST_ANNOTATION`] on the source pod, a JSON
//! [`CheckpointRequest`]; see docs/checkpoints.md for what the node agent checks before it acts.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::owner::{Actor, owner_annotations};
use crate::naming::{MAX_NAME_LEN, is_valid_oci_component, sha256_hex};

/// Prefix of every checkpoint repository (no VM repository starts with it).
pub const REPOSITORY_PREFIX: &str = "ckpt-";
/// The tag of every checkpoint artifact.
pub const CHECKPOINT_TAG: &str = "checkpoint";
/// Hex characters of the repository hash.
pub const REPOSITORY_HASH_HEX_LEN: usize = 12;
/// Longest `M` kept whole: 63 − `ckpt-` − `-<12 hex>`.
const MIDDLE_MAX: usize = MAX_NAME_LEN - REPOSITORY_PREFIX.len() - 1 - REPOSITORY_HASH_HEX_LEN;
/// Characters kept from each end of a longer `M` (22 + `-` + 22 = 45).
const MIDDLE_KEEP: usize = (MIDDLE_MAX - 1) / 2;
/// Prefix of the owner "pod" a checkpoint artifact records.
pub const OWNER_POD_PREFIX: &str = "cocooncheckpoint/";
/// Pod annotation: the operator's request to the node agent to checkpoint the pod's VM
/// (JSON [`CheckpointRequest`]). Written and cleared by the operator only.
pub const REQUEST_ANNOTATION: &str = "cocoonset.cocoonstack.io/checkpoint-request";
/// Longest request value accepted by [`CheckpointRequest::parse`].
pub const REQUEST_MAX_BYTES: usize = 1024;
/// Pod annotation: the main agent of a set with `spec.agent.fromCheckpoint` starts from the
/// named CocoonCheckpoint of the pod's own namespace. Written by the operator at create; the
/// node agent reads the CocoonCheckpoint itself and derives the artifact from it (the value is
/// a name, never a repository).
pub const FROM_CHECKPOINT_ANNOTATION: &str = "cocoonset.cocoonstack.io/from-checkpoint";
/// The operator's finalizer on a CocoonCheckpoint (deletes the artifact).
pub const FINALIZER: &str = "cocooncheckpoint.cocoonset.cocoonstack.io/finalizer";

/// Where a checkpoint's artifact lives: `<OCI_REGISTRY>/<repository>:<tag>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointArtifact {
    /// Registry-relative repository.
    pub repository: String,
    /// Tag (always [`CHECKPOINT_TAG`]).
    pub tag: String,
}

/// A checkpoint's identity is incomplete, so no artifact name can be derived from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointNameError {
    /// The namespace, name or UID (named) is empty.
    #[error("checkpoint {0} is empty: no artifact name can be derived")]
    Empty(&'static str),
}

/// The repository and tag of checkpoint `<ns>/<name>` with UID `uid` (module docs).
pub fn checkpoint_artifact(
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<CheckpointArtifact, CheckpointNameError> {
    for (what, value) in [("namespace", ns), ("name", name), ("uid", uid)] {
        if value.is_empty() {
            return Err(CheckpointNameError::Empty(what));
        }
    }
    let hash = sha256_hex(&format!("{ns}/{name}/{uid}"));
    let hash = &hash[..REPOSITORY_HASH_HEX_LEN];
    let middle: String = format!("{ns}-{name}")
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    // `middle` is ASCII: byte offsets are character offsets.
    let middle = if middle.len() <= MIDDLE_MAX {
        middle
    } else {
        format!(
            "{}-{}",
            &middle[..MIDDLE_KEEP],
            &middle[middle.len() - MIDDLE_KEEP..]
        )
    };
    Ok(CheckpointArtifact {
        repository: format!("{REPOSITORY_PREFIX}{middle}-{hash}"),
        tag: CHECKPOINT_TAG.to_owned(),
    })
}

/// Whether `repository` is in the checkpoint name space (`ckpt-…`, a valid component).
pub fn is_checkpoint_repository(repository: &str) -> bool {
    repository.starts_with(REPOSITORY_PREFIX) && is_valid_oci_component(repository)
}

/// The owner "pod" a checkpoint artifact records: `cocooncheckpoint/<name>`.
pub fn owner_pod(name: &str) -> String {
    format!("{OWNER_POD_PREFIX}{name}")
}

/// The manifest annotations that record checkpoint `<ns>/<name>` as the artifact's owner.
pub fn checkpoint_owner_annotations(ns: &str, name: &str) -> BTreeMap<String, String> {
    owner_annotations(ns, None, &owner_pod(name))
}

/// The actor of the owner rule for checkpoint `<ns>/<name>`; `pod` must be [`owner_pod`]'s
/// value (the caller keeps it alive).
pub fn checkpoint_actor<'a>(ns: &'a str, pod: &'a str) -> Actor<'a> {
    Actor {
        namespace: ns,
        namespace_uid: None,
        pod,
    }
}

/// The operator's request on a source pod: checkpoint this pod's VM for this CR into this
/// artifact. The node agent acts on it only after reading the named CR itself (same
/// namespace as the pod, same UID) and deriving the same artifact from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointRequest {
    /// The CocoonCheckpoint's name (its namespace is the pod's).
    pub name: String,
    /// The CocoonCheckpoint's UID.
    pub uid: String,
    /// The VM the operator saw on the pod (`vm.cocoonstack.io/name`).
    pub vm_name: String,
    /// The derived repository.
    pub repository: String,
    /// The derived tag.
    pub tag: String,
}

/// A request value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("annotation {REQUEST_ANNOTATION}: {0} bytes, more than {REQUEST_MAX_BYTES}")]
    TooLong(usize),
    #[error("annotation {REQUEST_ANNOTATION}: not a checkpoint request: {0}")]
    Malformed(String),
}

impl CheckpointRequest {
    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value, bounded.
    pub fn parse(value: &str) -> Result<Self, RequestError> {
        if value.len() > REQUEST_MAX_BYTES {
            return Err(RequestError::TooLong(value.len()));
        }
        serde_json::from_str(value).map_err(|e| RequestError::Malformed(e.to_string()))
    }

    /// Whether this request is exactly what the operator derives for checkpoint
    /// `<ns>/<name>` of UID `uid`: the node agent's check before it acts.
    pub fn matches_checkpoint(&self, ns: &str, name: &str, uid: &str) -> bool {
        self.name == name
            && self.uid == uid
            && checkpoint_artifact(ns, name, uid)
                .is_ok_and(|a| a.repository == self.repository && a.tag == self.tag)
    }
}

/// Why checkpoint `<ns>/<name>` cannot be started from (yet); the `String` is `<ns>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotStartable {
    #[error("checkpoint {0} does not exist")]
    NotFound(String),
    #[error("checkpoint {0} is not Ready ({1})")]
    NotReady(String, String),
    #[error(
        "checkpoint {0} is Ready but its status does not name its derived artifact with a digest"
    )]
    StatusMismatch(String),
}

/// The artifact a Ready checkpoint holds, pinned: `<repository>@<digest>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyArtifact {
    /// The repository [`checkpoint_artifact`] derives for the checkpoint.
    pub repository: String,
    /// `status.digest`.
    pub digest: String,
}

/// What a set (the operator) or a pod (the node agent) of namespace `ns` may start from when
/// it names checkpoint `name`: `found` is the CocoonCheckpoint `<ns>/<name>` as read. Absent
/// or being deleted: not found; a phase other than `Ready`: not ready; a status whose
/// repository and tag are not the ones derived from the object's own namespace, name and UID,
/// or without a digest: refused (the status is never trusted for where to pull from).
pub fn ready_artifact(
    ns: &str,
    name: &str,
    found: Option<&crate::crd::checkpoint::CocoonCheckpoint>,
) -> Result<ReadyArtifact, NotStartable> {
    use crate::crd::checkpoint::CheckpointPhase;
    let named = format!("{ns}/{name}");
    let Some(ckpt) = found.filter(|c| c.metadata.deletion_timestamp.is_none()) else {
        return Err(NotStartable::NotFound(named));
    };
    let status = ckpt.status.clone().unwrap_or_default();
    if status.phase != Some(CheckpointPhase::Ready) {
        let phase = status.phase.map_or("no phase yet", CheckpointPhase::as_str);
        return Err(NotStartable::NotReady(named, phase.to_owned()));
    }
    let uid = ckpt.metadata.uid.as_deref().unwrap_or_default();
    let derived = checkpoint_artifact(ns, name, uid);
    let same = derived.is_ok_and(|a| a.repository == status.repository && a.tag == status.tag);
    if !same || ckpt.metadata.name.as_deref() != Some(name) || !status.digest.starts_with("sha256:")
    {
        return Err(NotStartable::StatusMismatch(named));
    }
    Ok(ReadyArtifact {
        repository: status.repository,
        digest: status.digest,
    })
}

/// The VM spec of a pod (`spec`) of namespace `ns` whose
/// [`FROM_CHECKPOINT_ANNOTATION`] names `name`, `found` being that checkpoint as the node agent
/// read it: a clone (mode `clone`) of `<repository>:<digest>` (the registry-relative form
/// `parse_ref` splits into the repository and the digest, so the pull fetches exactly the
/// pinned manifest and the local clone-base name never holds an `@`). The error names the
/// annotation.
pub fn clone_spec_from(
    ns: &str,
    name: &str,
    found: Option<&crate::crd::checkpoint::CocoonCheckpoint>,
    spec: &crate::contract::VmSpec,
) -> Result<crate::contract::VmSpec, String> {
    let base = ready_artifact(ns, name, found)
        .map_err(|e| format!("annotation {FROM_CHECKPOINT_ANNOTATION}: {e}"))?;
    Ok(crate::contract::VmSpec {
        image: format!("{}:{}", base.repository, base.digest),
        mode: Some(crate::contract::Mode::Clone),
        ..spec.clone()
    })
}

impl fmt::Display for CheckpointArtifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.repository, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::owner::{OwnerVerdict, owner_verdict};
    use crate::naming::{is_valid_vm_name, vm_name_for_pod};

    const UID: &str = "6f1c2a70-0b7e-4c9e-9d2a-2b1f0c3d4e5f";

    #[test]
    fn the_repository_is_prefix_safe_middle_and_hash() {
        let cases = [
            // (ns, name, repository without the hash)
            ("ns", "good", "ckpt-ns-good-"),
            ("team-a", "before.refactor", "ckpt-team-a-before-refactor-"),
            (
                "a-namespace-that-is-quite-long",
                "and-a-checkpoint-name-that-is-long-too",
                "ckpt-a-namespace-that-is-qu--name-that-is-long-too-",
            ),
        ];
        for (ns, name, head) in cases {
            let a = checkpoint_artifact(ns, name, UID).expect("derive");
            let hash = &sha256_hex(&format!("{ns}/{name}/{UID}"))[..12];
            assert_eq!(a.repository, format!("{head}{hash}"), "{ns}/{name}");
            assert_eq!(a.tag, CHECKPOINT_TAG);
            assert!(a.repository.len() <= MAX_NAME_LEN, "{}", a.repository);
            assert!(is_checkpoint_repository(&a.repository), "{}", a.repository);
            assert!(is_valid_vm_name(&a.repository));
        }
    }

    #[test]
    fn names_crafted_to_collide_across_namespaces_get_two_repositories() {
        // One `M` (`team-a-x`), two owners.
        let victim = checkpoint_artifact("team-a", "x", UID).expect("derive");
        let attacker = checkpoint_artifact("team", "a-x", UID).expect("derive");
        assert_ne!(victim.repository, attacker.repository);
        // Same for names that only meet after the cut of long middles.
        let long = "x".repeat(40);
        let a = checkpoint_artifact("ns1", &format!("{long}-tail"), UID).expect("derive");
        let b = checkpoint_artifact("ns2", &format!("{long}-tail"), UID).expect("derive");
        assert_ne!(a.repository, b.repository);
        // Namespaces that share the kept head, one long name, even one UID (UIDs are unique in
        // a cluster, but the namespace is bound by the hash, not by luck): one `M`, two
        // repositories.
        let name = format!("{}-checkpoint", "n".repeat(40));
        let one = checkpoint_artifact(&format!("{}-one", "t".repeat(24)), &name, UID);
        let two = checkpoint_artifact(&format!("{}-two", "t".repeat(24)), &name, UID);
        let (one, two) = (one.expect("derive"), two.expect("derive"));
        assert_eq!(
            one.repository[..one.repository.len() - 12],
            two.repository[..two.repository.len() - 12],
            "the crafted names share their cut middle"
        );
        assert_ne!(one.repository, two.repository);
        // A checkpoint created again under its name gets a fresh repository.
        let again = checkpoint_artifact("team-a", "x", "another-uid").expect("derive");
        assert_ne!(victim.repository, again.repository);
        // And no checkpoint repository is ever a VM repository.
        assert_ne!(victim.repository, vm_name_for_pod("team-a", "x"));
        assert!(!is_checkpoint_repository(&vm_name_for_pod("ckpt", "x")));
    }

    #[test]
    fn an_incomplete_identity_is_refused_by_name() {
        for (ns, name, uid, what) in [
            ("", "n", UID, "namespace"),
            ("ns", "", UID, "name"),
            ("ns", "n", "", "uid"),
        ] {
            assert_eq!(
                checkpoint_artifact(ns, name, uid),
                Err(CheckpointNameError::Empty(what))
            );
        }
    }

    #[test]
    fn the_owner_record_is_no_pods_and_no_pod_is_it() {
        let recorded = checkpoint_owner_annotations("ns", "good");
        let pod = owner_pod("good");
        assert_eq!(
            owner_verdict(&recorded, &checkpoint_actor("ns", &pod)),
            OwnerVerdict::Owned
        );
        // A pod named like the checkpoint, or another namespace's checkpoint of that name,
        // may not delete it.
        for actor in [
            checkpoint_actor("ns", "good"),
            checkpoint_actor("other", &pod),
        ] {
            assert!(!owner_verdict(&recorded, &actor).may_act(), "{actor}");
        }
    }

    #[test]
    fn the_request_round_trips_and_is_checked_against_the_cr() {
        let a = checkpoint_artifact("ns", "good", UID).expect("derive");
        let req = CheckpointRequest {
            name: "good".into(),
            uid: UID.into(),
            vm_name: vm_name_for_pod("ns", "demo-0"),
            repository: a.repository.clone(),
            tag: a.tag.clone(),
        };
        let back = CheckpointRequest::parse(&req.to_annotation()).expect("parse");
        assert_eq!(back, req);
        assert!(req.matches_checkpoint("ns", "good", UID));
        // A request a tenant wrote by hand, pointing at someone else's repository, or naming
        // another CR or UID, does not match what the node derives from the CR.
        let victim = checkpoint_artifact("victim", "good", UID).expect("derive");
        let forged = CheckpointRequest {
            repository: victim.repository,
            ..req.clone()
        };
        assert!(!forged.matches_checkpoint("ns", "good", UID));
        assert!(!req.matches_checkpoint("other", "good", UID));
        assert!(!req.matches_checkpoint("ns", "good", "another-uid"));
        assert!(matches!(
            CheckpointRequest::parse(&"x".repeat(REQUEST_MAX_BYTES + 1)),
            Err(RequestError::TooLong(_))
        ));
        assert!(matches!(
            CheckpointRequest::parse(r#"{"name":"good"}"#),
            Err(RequestError::Malformed(_))
        ));
    }
}
