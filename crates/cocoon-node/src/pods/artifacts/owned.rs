//! The node agent's trust gate (DESIGN.md "The trust boundary"): the one place that resolves a
//! name this agent derived into a runtime record or a registry artifact and decides whether the
//! pod may use it. The pure rules are in [`tenant`]; every lookup by name of a VM or snapshot,
//! every snapshot pull for a restore, wake or clone base, and every snapshot push goes through
//! these methods.
//!
//! * **Exact names.** The runtime resolves a reference by exact id, by name, or by an id
//!   prefix of at least 3 characters (`runtime.md` §4). [`Artifacts::snapshot_exact`] and
//!   [`Artifacts::vm_exact`] accept a record only when its name is exactly the requested one, so
//!   a name that happens to be an id or an id prefix never reaches another record.
//! * **Owned artifacts.** [`Artifacts::owned_artifact`] reads the manifest of `<repo>:<tag>`,
//!   applies [`tenant::check_artifact_owner`] and returns its digest; the pull then fetches
//!   that very digest, so the bytes imported are the ones whose owner was checked.
//! * **Owner on push.** [`Artifacts::push_owned`] records the pod as the owner of every snapshot
//!   artifact it pushes (`cocoon_api::contract::owner::owner_annotations`, with the
//!   namespace's UID when the agent may read it) and never replaces a tag that records
//!   another owner.
//! * **Unmanaged ids.** [`Artifacts::runtime_has_vm_id`] tells whether a pre-assigned id resolves
//!   to any VM the runtime knows (exact id, name, id prefix).

use cocoon_registry::{Manifest, Reference};
use cocoon_runtime::{RuntimeError, SnapshotRecord, VmRecord};
use k8s_openapi::api::core::v1::Pod;

use cocoon_api::contract::owner::{self as owner_rule, OwnerVerdict, RecordedOwner};

use super::Artifacts;
use crate::pods::api_writer::NamespaceUid;
use crate::pods::error::{ApiError, RegistryFailure};
use crate::pods::plan::transfer::{GateError, OwnedArtifact};
use crate::pods::tenant::{self, ArtifactUse, Owner};

impl Artifacts {
    /// `snapshot inspect <name>`, accepted only when the record's name is exactly `name`.
    pub(crate) async fn snapshot_exact(&self, name: &str) -> Result<SnapshotRecord, RuntimeError> {
        let s = self.rt.snapshot_inspect(name).await?;
        if s.name != name {
            return Err(RuntimeError::SnapshotNotFound(format!(
                "snapshot not found: {name:?} (the runtime resolved it to snapshot {:?}, id {})",
                s.name, s.id
            )));
        }
        Ok(s)
    }

    /// `vm inspect <name>`, accepted only when the record's name is exactly `name`.
    pub(crate) async fn vm_exact(&self, name: &str) -> Result<VmRecord, RuntimeError> {
        let v = self.rt.inspect(name).await?;
        if v.name() != name {
            return Err(RuntimeError::VmNotFound(format!(
                "VM not found: {name:?} (the runtime resolved it to VM {:?}, id {})",
                v.name(),
                v.id
            )));
        }
        Ok(v)
    }

    /// Is `id` exactly the id of a VM the runtime knows? (The runtime also resolves names
    /// and id prefixes; those answers are not taken, so the caller's refusal is never an
    /// oracle for what some VM's id starts with.)
    pub(crate) async fn runtime_has_vm_id(&self, id: &str) -> Result<bool, RuntimeError> {
        if id.is_empty() {
            return Ok(false);
        }
        match self.rt.inspect(id).await {
            Ok(v) => Ok(v.id == id),
            Err(e) if e.is_vm_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The manifest of `<repo>:<tag>` if `owner` may use it as `what`; `None` when absent.
    pub(crate) async fn owned_artifact(
        &self,
        what: ArtifactUse,
        repo: &str,
        tag: &str,
        owner: &Owner,
    ) -> Result<Option<OwnedArtifact>, GateError> {
        let Some(reg) = &self.registry else {
            return Ok(None);
        };
        let reference = Reference::parse(tag).map_err(|e| GateError::Failed(e.to_string()))?;
        let fetched = match reg.get_manifest(repo, &reference).await {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(GateError::Failed(format!("get manifest {repo}:{tag}: {e}"))),
        };
        let annotations = Manifest::parse(&fetched.bytes)
            .map_err(|e| GateError::Failed(format!("parse manifest {repo}:{tag}: {e}")))?
            .annotations;
        tenant::check_artifact_owner(what, &format!("{repo}:{tag}"), &annotations, owner)?;
        Ok(Some(OwnedArtifact {
            digest: fetched.digest.to_string(),
            annotations,
        }))
    }

    /// Pushes the local snapshot `name` to `<repo>:<tag>` recording `base_image` and `owner`
    /// (`cocoon_api::contract::owner::owner_annotations`); a tag that exists and records
    /// another owner is never replaced ([`PushRefusal::Foreign`]).
    pub(crate) async fn push_owned(
        &self,
        name: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
        owner: &Owner,
    ) -> Result<(), PushRefusal> {
        if let Some(recorded) = self.foreign_tag(repo, tag, owner).await? {
            return Err(PushRefusal::Foreign(recorded));
        }
        let extra = owner_rule::owner_annotations(
            &owner.namespace,
            owner.namespace_uid.as_deref(),
            &owner.pod,
        );
        self.push_from(name, repo, tag, base_image, extra)
            .await
            .map_err(PushRefusal::Failed)
    }

    /// The owner recorded by `<repo>:<tag>` when it is not `owner` ([`owner_rule`]): a push
    /// must not replace it. An absent tag, one recording no owner (Go components) and one
    /// recording `owner` answer `None`; a manifest that cannot be read fails the push (the
    /// VM keeps running, nothing is lost).
    async fn foreign_tag(
        &self,
        repo: &str,
        tag: &str,
        owner: &Owner,
    ) -> Result<Option<RecordedOwner>, PushRefusal> {
        let Some(reg) = &self.registry else {
            return Ok(None);
        };
        match reg.manifest_annotations(repo, tag).await {
            Ok(a) => Ok(match owner_rule::owner_verdict(&a, &owner.actor()) {
                OwnerVerdict::Foreign { owner } => Some(owner),
                OwnerVerdict::Owned | OwnerVerdict::NoOwnerRecorded => None,
            }),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(PushRefusal::Failed(RegistryFailure::during(
                format!("read the owner of {repo}:{tag} before replacing it"),
                e,
            ))),
        }
    }

    /// Deletes `<repo>:<tag>` when it records `owner` or no owner (the name gates already
    /// passed); one recording another owner is kept and logged. Errors are logged.
    pub(crate) async fn delete_owned_tag(&self, repo: &str, tag: &str, owner: &Owner) {
        let Some(reg) = &self.registry else {
            return;
        };
        let actor = owner.actor();
        let res = reg
            .delete_tag_checked(repo, tag, |a| {
                owner_rule::owner_verdict(a, &actor).may_act()
            })
            .await;
        match res {
            Ok(cocoon_registry::CheckedDelete::Kept(a)) => {
                let recorded = RecordedOwner::from_annotations(&a).unwrap_or_default();
                tracing::warn!(vm = repo, tag, owner = %recorded, actor = %actor, "tag kept: it records another owner");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(vm = repo, tag, error = %e, "compensating tag delete failed"),
        }
    }

    /// The owner of `pod`'s snapshots with its namespace's current UID, read from the API on
    /// every call (pushes and pulls of VM snapshots are rare and heavy; a cached UID could
    /// outlive a namespace re-created under the same name). A 403 (an identity without the
    /// `get namespaces` grant, see `manifests/node/rbac.yaml`) gives no UID.
    pub(crate) async fn owner_of(&self, pod: &Pod) -> Result<Owner, ApiError> {
        let mut owner = Owner::of(pod);
        if self.registry.is_none() {
            // No registry, no artifact: the UID is only ever compared with one.
            return Ok(owner);
        }
        owner.namespace_uid = match self.api.namespace_uid(&owner.namespace).await? {
            NamespaceUid::Known(uid) => Some(uid),
            NamespaceUid::Forbidden => None,
        };
        Ok(owner)
    }
}

/// Why a snapshot push did not happen.
#[derive(Debug)]
pub enum PushRefusal {
    /// The tag exists and records another owner: it is left as it is.
    Foreign(RecordedOwner),
    /// The push (or the read before it) failed.
    Failed(RegistryFailure),
}

impl std::fmt::Display for PushRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushRefusal::Foreign(o) => write!(
                f,
                "the tag belongs to {o} (manifest annotation {}); not replaced",
                cocoon_api::contract::oci::ANNOTATION_OWNER_NAMESPACE
            ),
            PushRefusal::Failed(e) => write!(f, "{e}"),
        }
    }
}
