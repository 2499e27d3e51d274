//! CocoonHibernation: asks for one pod's VM to be hibernated (snapshot pushed, VM removed,
//! pod kept) or woken.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

/// CEL rule on `spec.podRef`.
pub const RULE_POD_REF_IMMUTABLE: &str = "self == oldSelf";
/// Message of the `spec.podRef` rule.
pub const MSG_POD_REF_IMMUTABLE: &str = "spec.podRef is immutable";

/// Hibernate or wake one pod's VM.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1",
    kind = "CocoonHibernation",
    plural = "cocoonhibernations",
    singular = "cocoonhibernation",
    namespaced,
    status = "CocoonHibernationStatus",
    shortname = "ch",
    shortname = "cocoonhibernations",
    category = "cocoon",
    cel,
    doc = "Hibernates or wakes the VM of one pod.",
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.podRef.name"}"#,
    printcolumn = r#"{"name":"Desire","type":"string","jsonPath":".spec.desire"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationSpec {
    /// The target pod, in the CR's own namespace. Immutable.
    #[x_kube(validation = Rule::new(RULE_POD_REF_IMMUTABLE).message(MSG_POD_REF_IMMUTABLE))]
    pub pod_ref: PodRef,
    /// Desired state.
    pub desire: Desire,
}

/// Names the target pod.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    /// Name of the pod whose VM is hibernated or woken.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Desired state of the pod's VM.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Desire {
    Hibernate,
    Wake,
}

impl Desire {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hibernate => "Hibernate",
            Self::Wake => "Wake",
        }
    }
}

impl std::fmt::Display for Desire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// CocoonHibernation phase.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HibernationPhase {
    Pending,
    Hibernating,
    Hibernated,
    Waking,
    Active,
    Failed,
}

impl HibernationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Hibernating => "Hibernating",
            Self::Hibernated => "Hibernated",
            Self::Waking => "Waking",
            Self::Active => "Active",
            Self::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for HibernationPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of a CocoonHibernation.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
    /// Where the hibernate or wake stands; `Failed` is retried on the next pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<HibernationPhase>,
    /// The VM this CR tracks, written on every phase change; deletion uses it, not the pod's
    /// current annotation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vm_name: String,
    /// Only `Ready` is used: `True` once `Hibernated` or `Active`, `False` while in flight or
    /// `Failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
