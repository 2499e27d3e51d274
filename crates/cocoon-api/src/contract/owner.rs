//! The artifact owner rule (issue 35 item 2): whether an object may destroy or overwrite a
//! snapshot artifact, decided from the owner the artifact records, never from its name alone.
//!
//! VM names are `VMNameForPod(ns, pod)` (`contract.md` §2.2), which keeps 26 + 26 characters
//! and a 24-bit hash for long names, so two pods of two namespaces can get one VM name (a
//! collision is found in a fraction of a second). The name gates of the operator and the node
//! prove that a name is *computed from* an object's pods, not that the artifact under that
//! name is that pod's. So before the operator deletes a tag, `kubectl cocoon registry gc`
//! deletes one, a node agent replaces a tag with a push, or a node drops a local copy, the
//! artifact's manifest annotations are read and [`owner_verdict`] decides:
//!
//! * [`OwnerVerdict::NoOwnerRecorded`]: the artifact records no
//!   [`ANNOTATION_OWNER_NAMESPACE`] (pushed by the Go components, cocoon-common v0.3.0, or by
//!   an agent before the owner annotations existed). Nothing better than the name gate exists
//!   for it: the caller acts on its name gate, as before.
//! * [`OwnerVerdict::Owned`]: the recorded namespace is the actor's, the recorded pod (where
//!   recorded) is the actor's pod, and the recorded namespace UID (where recorded) is the
//!   actor's namespace UID (where the actor knows it).
//! * [`OwnerVerdict::Foreign`]: anything else, including a recorded pod or namespace UID
//!   without a namespace. The caller leaves the artifact and reports a Warning Event
//!   [`FOREIGN_SNAPSHOT_IGNORED`] naming both ([`foreign_snapshot_message`]).
//!
//! The namespace UID ([`ANNOTATION_OWNER_NAMESPACE_UID`], additive) is compared only where
//! both sides know it: the operator does not read namespaces, and artifacts pushed before the
//! key existed do not carry it. The node agent's pull check is stricter (an artifact recording
//! a UID is refused when the pod's namespace UID cannot be read), see `cocoon-node`'s
//! `tenant::check_artifact_owner`.

use std::collections::BTreeMap;
use std::fmt;

use super::oci::{
    ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_NAMESPACE_UID, ANNOTATION_OWNER_POD,
};

/// Warning Event reason (operator, node agent; not in the spec's table, chosen here): a
/// destructive or overwriting action on a snapshot artifact was skipped because the artifact
/// records another owner. Message: [`foreign_snapshot_message`]. The operator emits it once
/// per object and artifact.
pub const FOREIGN_SNAPSHOT_IGNORED: &str = "ForeignSnapshotIgnored";

/// The object acting on an artifact: the pod whose VM the artifact would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The namespace's UID, when the actor knows it.
    pub namespace_uid: Option<&'a str>,
    /// The pod's name.
    pub pod: &'a str,
}

impl fmt::Display for Actor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {}/{}", self.namespace, self.pod)
    }
}

/// The owner an artifact records in its manifest annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordedOwner {
    /// [`ANNOTATION_OWNER_NAMESPACE`] (empty when absent).
    pub namespace: String,
    /// [`ANNOTATION_OWNER_NAMESPACE_UID`], when recorded.
    pub namespace_uid: Option<String>,
    /// [`ANNOTATION_OWNER_POD`], when recorded.
    pub pod: Option<String>,
}

impl RecordedOwner {
    /// The owner `annotations` record; `None` when they record none of the three keys.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<RecordedOwner> {
        let get = |k: &str| annotations.get(k).filter(|v| !v.is_empty()).cloned();
        let owner = RecordedOwner {
            namespace: get(ANNOTATION_OWNER_NAMESPACE).unwrap_or_default(),
            namespace_uid: get(ANNOTATION_OWNER_NAMESPACE_UID),
            pod: get(ANNOTATION_OWNER_POD),
        };
        (owner != RecordedOwner::default()).then_some(owner)
    }
}

impl fmt::Display for RecordedOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod {}/{}",
            self.namespace,
            self.pod.as_deref().unwrap_or("<any>")
        )?;
        if let Some(uid) = &self.namespace_uid {
            write!(f, " (namespace uid {uid})")?;
        }
        Ok(())
    }
}

/// What [`owner_verdict`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerVerdict {
    /// The artifact records the actor as its owner: act.
    Owned,
    /// The artifact records no owner (Go components, older pushes): act on the name gate.
    NoOwnerRecorded,
    /// The artifact records another owner: leave it and report.
    Foreign {
        /// The recorded owner.
        owner: RecordedOwner,
    },
}

impl OwnerVerdict {
    /// Whether the destructive action may proceed (the name gate having passed already).
    pub fn may_act(&self) -> bool {
        !matches!(self, OwnerVerdict::Foreign { .. })
    }
}

/// May `actor` destroy or overwrite the artifact whose manifest annotations are
/// `annotations`? See the module docs for the rule.
pub fn owner_verdict(annotations: &BTreeMap<String, String>, actor: &Actor<'_>) -> OwnerVerdict {
    let Some(owner) = RecordedOwner::from_annotations(annotations) else {
        return OwnerVerdict::NoOwnerRecorded;
    };
    let namespace_differs = owner.namespace.is_empty() || owner.namespace != actor.namespace;
    let pod_differs = owner.pod.as_deref().is_some_and(|p| p != actor.pod);
    let uid_differs = matches!(
        (owner.namespace_uid.as_deref(), actor.namespace_uid),
        (Some(recorded), Some(current)) if recorded != current
    );
    if namespace_differs || pod_differs || uid_differs {
        OwnerVerdict::Foreign { owner }
    } else {
        OwnerVerdict::Owned
    }
}

/// The manifest annotations that record pod `<ns>/<pod>` (of namespace UID `ns_uid`, when
/// known) as the owner of a pushed snapshot.
pub fn owner_annotations(ns: &str, ns_uid: Option<&str>, pod: &str) -> BTreeMap<String, String> {
    let mut a: BTreeMap<String, String> = [
        (ANNOTATION_OWNER_NAMESPACE.to_owned(), ns.to_owned()),
        (ANNOTATION_OWNER_POD.to_owned(), pod.to_owned()),
    ]
    .into();
    if let Some(uid) = ns_uid.filter(|u| !u.is_empty()) {
        a.insert(ANNOTATION_OWNER_NAMESPACE_UID.to_owned(), uid.to_owned());
    }
    a
}

/// [`FOREIGN_SNAPSHOT_IGNORED`]'s message: `<action> <repo>:<tag> skipped: the artifact
/// belongs to <owner>, not to <actor>`.
pub fn foreign_snapshot_message(
    action: &str,
    artifact: &str,
    owner: &RecordedOwner,
    actor: &str,
) -> String {
    format!("{action} {artifact} skipped: the artifact belongs to {owner}, not to {actor}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// (what, annotations, actor, Some(owned) / Some(false) foreign / None no owner).
    type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Actor<'a>, Option<bool>);

    #[test]
    fn the_owner_rule_reads_like_the_issue() {
        const NS: &str = ANNOTATION_OWNER_NAMESPACE;
        const POD: &str = ANNOTATION_OWNER_POD;
        const UID: &str = ANNOTATION_OWNER_NAMESPACE_UID;
        let a = |uid: Option<&'static str>| Actor {
            namespace: "eu1",
            namespace_uid: uid,
            pod: "p-0",
        };
        let owned = Some(true);
        let foreign = Some(false);
        let none = None;
        #[rustfmt::skip]
        let cases: Vec<Row<'_>> = vec![
            ("Go artifact: no owner", vec![("cocoonstack.snapshot.baseimage", "img")], a(None), none),
            ("no annotations at all", vec![], a(Some("u1")), none),
            ("same namespace and pod", vec![(NS, "eu1"), (POD, "p-0")], a(None), owned),
            ("same, uid on both sides", vec![(NS, "eu1"), (POD, "p-0"), (UID, "u1")], a(Some("u1")), owned),
            ("uid recorded, actor does not know it", vec![(NS, "eu1"), (POD, "p-0"), (UID, "u1")], a(None), owned),
            ("actor knows a uid, artifact records none", vec![(NS, "eu1"), (POD, "p-0")], a(Some("u1")), owned),
            ("namespace only (pod not recorded)", vec![(NS, "eu1")], a(None), owned),
            ("the collision: another namespace", vec![(NS, "eu2"), (POD, "x15aba-lytics-0")], a(None), foreign),
            ("same namespace, another pod", vec![(NS, "eu1"), (POD, "p-1")], a(None), foreign),
            ("re-created namespace: uid differs", vec![(NS, "eu1"), (POD, "p-0"), (UID, "old")], a(Some("new")), foreign),
            ("pod recorded without a namespace", vec![(POD, "p-0")], a(None), foreign),
            ("uid recorded without a namespace", vec![(UID, "u1")], a(Some("u1")), foreign),
            ("empty namespace value is no owner", vec![(NS, "")], a(None), none),
        ];
        for (what, annotations, actor, want) in cases {
            let got = owner_verdict(&ann(&annotations), &actor);
            let got_kind = match &got {
                OwnerVerdict::Owned => Some(true),
                OwnerVerdict::Foreign { .. } => Some(false),
                OwnerVerdict::NoOwnerRecorded => None,
            };
            assert_eq!(got_kind, want, "{what}: {got:?}");
            assert_eq!(got.may_act(), want != Some(false), "{what}");
        }
    }

    #[test]
    fn the_issues_pair_collides_so_names_never_prove_ownership() {
        let a = crate::naming::vm_name_for_pod(
            "customer-acme-production-eu1",
            "analytics-warehouse-primary-0",
        );
        let b = crate::naming::vm_name_for_pod(
            "customer-acme-production-eu2",
            "x15aba-lytics-warehouse-primary-0",
        );
        assert_eq!(a, b);
        let victim = owner_annotations(
            "customer-acme-production-eu1",
            None,
            "analytics-warehouse-primary-0",
        );
        let attacker = Actor {
            namespace: "customer-acme-production-eu2",
            namespace_uid: None,
            pod: "x15aba-lytics-warehouse-primary-0",
        };
        assert!(!owner_verdict(&victim, &attacker).may_act());
    }

    #[test]
    fn the_foreign_verdict_names_the_recorded_owner() {
        let annotations = owner_annotations("eu1", Some("u1"), "analytics-0");
        let actor = Actor {
            namespace: "eu2",
            namespace_uid: None,
            pod: "x15aba-lytics-0",
        };
        let OwnerVerdict::Foreign { owner } = owner_verdict(&annotations, &actor) else {
            panic!("foreign expected");
        };
        let msg = foreign_snapshot_message("delete", "vk-x:hibernate", &owner, &actor.to_string());
        assert_eq!(
            msg,
            "delete vk-x:hibernate skipped: the artifact belongs to pod eu1/analytics-0 \
             (namespace uid u1), not to pod eu2/x15aba-lytics-0"
        );
    }

    #[test]
    fn owner_annotations_add_the_uid_only_when_known() {
        assert_eq!(owner_annotations("n", None, "p").len(), 2);
        assert_eq!(owner_annotations("n", Some(""), "p").len(), 2);
        let a = owner_annotations("n", Some("u"), "p");
        assert_eq!(
            a.get(ANNOTATION_OWNER_NAMESPACE_UID).map(String::as_str),
            Some("u")
        );
        assert_eq!(
            RecordedOwner::from_annotations(&a),
            Some(RecordedOwner {
                namespace: "n".into(),
                namespace_uid: Some("u".into()),
                pod: Some("p".into()),
            })
        );
    }
}
