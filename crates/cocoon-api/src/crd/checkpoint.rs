//! CocoonCheckpoint: a named, registry-held live snapshot of one running agent VM (issue 38),
//! taken while the source keeps running, from which any number of CocoonSets can start
//! (`spec.agent.fromCheckpoint`).
//!
//! The operator validates the source and derives where the artifact goes
//! ([`crate::naming::checkpoint_artifact`]); the node agent of the source's node saves and
//! pushes it. The hand-off between the two is described in docs/checkpoints.md.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

/// CEL rule on `spec`: nothing of it changes after create.
pub const RULE_SPEC_IMMUTABLE: &str = "self == oldSelf";
/// Message of [`RULE_SPEC_IMMUTABLE`].
pub const MSG_SPEC_IMMUTABLE: &str =
    "spec is immutable: the spec of a checkpoint cannot change (delete it and create a new one)";
/// CEL rule on `spec.source`: exactly one of the two references.
pub const RULE_ONE_SOURCE: &str = "has(self.podRef) != has(self.cocoonSetRef)";
/// Message of [`RULE_ONE_SOURCE`].
pub const MSG_ONE_SOURCE: &str =
    "spec.source: exactly one of spec.source.podRef or spec.source.cocoonSetRef must be set";
/// Pattern of an object name (a DNS-1123 subdomain), as `fromCheckpoint` and the references
/// carry them.
pub const OBJECT_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A live snapshot of one running agent VM, kept in the registry under a name.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1",
    kind = "CocoonCheckpoint",
    plural = "cocooncheckpoints",
    singular = "cocooncheckpoint",
    namespaced,
    status = "CocoonCheckpointStatus",
    shortname = "ckpt",
    category = "cocoon",
    cel,
    doc = "A live snapshot of a running agent VM, kept in the registry; CocoonSets start from it with spec.agent.fromCheckpoint.",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".status.source"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","format":"int64","jsonPath":".status.bytesOnWire"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(RULE_SPEC_IMMUTABLE).message(MSG_SPEC_IMMUTABLE))]
#[serde(rename_all = "camelCase")]
pub struct CocoonCheckpointSpec {
    /// What to checkpoint: one managed pod, or a CocoonSet's main agent, of this namespace.
    pub source: CheckpointSource,
}

/// Exactly one of `podRef` and `cocoonSetRef`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(validation = Rule::new(RULE_ONE_SOURCE).message(MSG_ONE_SOURCE))]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSource {
    /// A Running managed pod of this namespace (a CocoonSet member or a raw managed pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ref: Option<NameRef>,
    /// A CocoonSet of this namespace: its main agent (slot 0) is checkpointed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cocoon_set_ref: Option<NameRef>,
}

/// Names an object of the checkpoint's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct NameRef {
    /// The object's name.
    #[schemars(length(min = 1, max = 253), pattern(OBJECT_NAME_PATTERN))]
    pub name: String,
}

/// The source a spec names, in one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// `spec.source.podRef.name`.
    Pod(&'a str),
    /// `spec.source.cocoonSetRef.name`.
    CocoonSet(&'a str),
}

impl Source<'_> {
    /// The spec field that names it, for messages.
    pub fn field(&self) -> &'static str {
        match self {
            Source::Pod(_) => "spec.source.podRef.name",
            Source::CocoonSet(_) => "spec.source.cocoonSetRef.name",
        }
    }

    /// `pod/<name>` or `cocoonset/<name>`, as `status.source` and the plugin print it.
    pub fn display(&self) -> String {
        match self {
            Source::Pod(n) => format!("pod/{n}"),
            Source::CocoonSet(n) => format!("cocoonset/{n}"),
        }
    }
}

impl CheckpointSource {
    /// The one source named, or `None` when none or both are (the CRD's CEL rule refuses both
    /// on the server; objects built in code may still carry them).
    pub fn one(&self) -> Option<Source<'_>> {
        match (&self.pod_ref, &self.cocoon_set_ref) {
            (Some(p), None) => Some(Source::Pod(&p.name)),
            (None, Some(s)) => Some(Source::CocoonSet(&s.name)),
            _ => None,
        }
    }
}

/// CocoonCheckpoint phase.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckpointPhase {
    /// Accepted by the operator; the request is on the source pod for its node agent.
    Pending,
    /// The node agent is taking the live snapshot (pause, save, resume).
    Saving,
    /// The node agent is pushing the snapshot to the registry.
    Pushing,
    /// The artifact is in the registry, verified; sets can start from it.
    Ready,
    /// Refused or failed; the `Ready` condition says why.
    Failed,
}

impl CheckpointPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Saving => "Saving",
            Self::Pushing => "Pushing",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
        }
    }

    /// `Ready` and `Failed` end a checkpoint's life (until it is deleted).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Ready | Self::Failed)
    }
}

impl std::fmt::Display for CheckpointPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of a CocoonCheckpoint.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CocoonCheckpointStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
    /// Where the checkpoint stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CheckpointPhase>,
    /// The source as `pod/<name>` or `cocoonset/<name>` (the Source column).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The pod whose VM is checkpointed (the set's main agent for a `cocoonSetRef`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    /// The source VM's name, from its pod's `vm.cocoonstack.io/name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vm_name: String,
    /// The node the source VM ran on when the checkpoint was taken.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The artifact's registry-relative repository, derived by the operator from this
    /// checkpoint's namespace, name and UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repository: String,
    /// The artifact's tag.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tag: String,
    /// The pushed manifest's digest (`sha256:…`), once `Ready`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// Bytes sent to the registry for this checkpoint (compressed, new blobs only).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub bytes_on_wire: i64,
    /// Bytes of snapshot data the artifact holds (uncompressed).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub data_bytes: i64,
    /// How long the source VM was paused for the live snapshot, in milliseconds.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub source_pause_millis: i64,
    /// When the snapshot was taken (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub taken_at: String,
    /// `Ready`: `True` once the artifact is pushed and verified; `False` with the reason
    /// while in flight or when `Failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl CocoonCheckpoint {
    /// The phase, `None` before the operator's first status write.
    pub fn phase(&self) -> Option<CheckpointPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }
}
