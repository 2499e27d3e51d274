//! The node agent's trust gate (DESIGN.md "The trust boundary"): the one place that resolves a
//! name this agent derived into a runtime record or a registry artifact and decides whether the
//! pod may use it. The pure rules are in [`tenant`]; every lookup by name of a VM or snapshot,
//! every snapshot pull for a restore, wake or clone base, and every snapshot push goes through
//! these methods.
//!
//! * **Exact names.** The runtime resolves a reference by exact id, by name, or by an id
//!   prefix of at least 3 characters (`runtime.md` §4). [`Handler::snapshot_exact`] and
//!   [`Handler::vm_exact`] accept a record only when its name is exactly the requested one, so
//!   a name that happens to be an id or an id prefix never reaches another record.
//! * **Owned artifacts.** [`Handler::owned_artifact`] reads the manifest of `<repo>:<tag>`,
//!   applies [`tenant::check_artifact_owner`] and returns its digest; the pull then fetches
//!   that very digest, so the bytes imported are the ones whose owner was checked.
//! * **Owner on push.** [`Handler::push_owned`] records the pod as the owner of every snapshot
//!   artifact it pushes ([`tenant::owner_annotations`]).
//! * **Unmanaged ids.** [`Handler::runtime_knows_vm`] tells whether a pre-assigned id resolves
//!   to any VM the runtime knows (exact id, name, id prefix).

use cocoon_registry::{Manifest, Reference};
use cocoon_runtime::{RuntimeError, SnapshotRecord, VmRecord};
use k8s_openapi::api::core::v1::Pod;

use super::Handler;
use super::tenant::{self, ArtifactUse, Refusal};

/// The pod a snapshot belongs to: `<namespace>/<pod>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub pod: String,
}

impl Owner {
    /// The owner a pod's own snapshots record.
    pub fn of(pod: &Pod) -> Self {
        Owner {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            pod: pod.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// Why the gate did not hand out an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The artifact belongs to someone else.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The registry could not be read.
    #[error("{0}")]
    Failed(String),
}

/// A checked registry artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedArtifact {
    /// The manifest digest (`sha256:…`) to pull.
    pub digest: String,
    /// Its manifest annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl Handler {
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
        tenant::check_artifact_owner(
            what,
            &format!("{repo}:{tag}"),
            &annotations,
            &owner.namespace,
            &owner.pod,
        )?;
        Ok(Some(OwnedArtifact {
            digest: fetched.digest.to_string(),
            annotations,
        }))
    }

    /// Pushes the local snapshot `name` to `<repo>:<tag>` recording `base_image` and `owner`
    /// ([`tenant::owner_annotations`]).
    pub(crate) async fn push_owned(
        &self,
        name: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
        owner: &Owner,
    ) -> Result<(), String> {
        let extra = tenant::owner_annotations(&owner.namespace, &owner.pod);
        self.push_from(name, repo, tag, base_image, extra).await
    }
}
