//! Annotation deltas and the `{"metadata":{"annotations":{...}}}` merge patch of `contract.md` §1.
//! A delta holds only the keys that change, so a patch that would change nothing is never sent.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};

/// Annotation changes: `Some(v)` sets the key to `v`, `None` removes it (`null` in a merge
/// patch). Keys not present are left alone.
pub type AnnotationDelta = BTreeMap<String, Option<String>>;

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

/// The annotations of an object, or an empty map; saves every caller the `Option` dance.
pub fn meta_annotations(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.annotations.as_ref().unwrap_or(&EMPTY)
}

/// The labels of an object, or an empty map.
pub fn meta_labels(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&EMPTY)
}

/// The entries of `desired` that would change `current`: a set to a different (or missing)
/// value, or a removal of a present key. Empty when `current` already matches.
pub fn diff_annotations(
    current: &BTreeMap<String, String>,
    desired: &AnnotationDelta,
) -> AnnotationDelta {
    desired
        .iter()
        .filter(|(key, want)| current.get(*key) != want.as_ref())
        .map(|(key, want)| (key.clone(), want.clone()))
        .collect()
}

/// The JSON merge patch `{"metadata":{"annotations":{k: v | null}}}` of a delta, or `None`
/// when the delta is empty, so callers can skip the API call.
pub fn annotations_merge_patch(delta: &AnnotationDelta) -> Option<Value> {
    if delta.is_empty() {
        return None;
    }
    let annotations: Map<String, Value> = delta
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    Some(json!({ "metadata": { "annotations": annotations } }))
}

/// A one-key boolean delta: `true` sets the key to `true`, `false` removes it. For single-flag
/// writes (e.g. the hibernate request) that must not touch neighbouring flags.
pub fn bool_delta(key: &str, value: bool) -> AnnotationDelta {
    AnnotationDelta::from([(key.to_owned(), super::parse::bool_value(value))])
}

/// Applies a delta to an in-memory annotation map, mirroring what the API server does with the
/// merge patch (used to keep a cached copy current after a successful patch).
pub fn apply_delta(annotations: &mut BTreeMap<String, String>, delta: &AnnotationDelta) {
    for (key, value) in delta {
        match value {
            Some(v) => {
                annotations.insert(key.clone(), v.clone());
            }
            None => {
                annotations.remove(key);
            }
        }
    }
}

/// A typed view over a group of annotation keys.
///
/// Decoding never fails (malformed values read as the documented defaults). Writing is
/// read-modify-write: decode the current map, change fields, then call [`delta`](Self::delta)
/// against the same map; untouched fields produce no change, and the delta is empty when
/// nothing changed.
pub trait AnnotationCodec: Sized {
    /// Decodes the keys this codec owns; never fails, never panics.
    fn from_annotations(annotations: &BTreeMap<String, String>) -> Self;

    /// The state of every key this value wants to control: `Some` = must hold this value,
    /// `None` = must be absent. Keys it leaves out are never touched (e.g. empty spec values,
    /// since the spec writer cannot clear).
    fn desired(&self) -> AnnotationDelta;

    /// Decodes from an object's metadata (missing annotations read as empty).
    fn from_meta(meta: &ObjectMeta) -> Self {
        Self::from_annotations(meta_annotations(meta))
    }

    /// Only the changes needed to bring `current` to [`desired`](Self::desired).
    fn delta(&self, current: &BTreeMap<String, String>) -> AnnotationDelta {
        diff_annotations(current, &self.desired())
    }

    /// The merge patch for [`delta`](Self::delta), or `None` when nothing changes.
    fn merge_patch(&self, current: &BTreeMap<String, String>) -> Option<Value> {
        annotations_merge_patch(&self.delta(current))
    }

    /// The annotations this value writes (the `Some` entries of [`desired`](Self::desired)),
    /// e.g. to fill a pod under construction.
    fn to_annotations(&self) -> BTreeMap<String, String> {
        self.desired()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }

    /// Writes [`desired`](Self::desired) into a map without clobbering other keys.
    fn apply_to(&self, annotations: &mut BTreeMap<String, String>) {
        apply_delta(annotations, &self.desired());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn delta(pairs: &[(&str, Option<&str>)]) -> AnnotationDelta {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn diff_keeps_only_changes() {
        let current = map(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let desired = delta(&[
            ("a", Some("1")), // unchanged
            ("b", Some("x")), // changed
            ("c", None),      // removed
            ("d", None),      // already absent
            ("e", Some("5")), // added
        ]);
        assert_eq!(
            diff_annotations(&current, &desired),
            delta(&[("b", Some("x")), ("c", None), ("e", Some("5"))])
        );
    }

    #[test]
    fn no_op_produces_no_patch() {
        let current = map(&[("a", "1")]);
        let d = diff_annotations(&current, &delta(&[("a", Some("1")), ("z", None)]));
        assert!(d.is_empty());
        assert_eq!(annotations_merge_patch(&d), None);
    }

    #[test]
    fn merge_patch_shape() {
        let p = annotations_merge_patch(&delta(&[("a", Some("1")), ("b", None)]));
        assert_eq!(
            p,
            Some(json!({"metadata": {"annotations": {"a": "1", "b": null}}}))
        );
    }

    #[test]
    fn bool_delta_sets_true_or_removes() {
        assert_eq!(bool_delta("k", true), delta(&[("k", Some("true"))]));
        assert_eq!(bool_delta("k", false), delta(&[("k", None)]));
        let current = map(&[("k", "true")]);
        assert!(diff_annotations(&current, &bool_delta("k", true)).is_empty());
    }

    #[test]
    fn apply_mirrors_the_patch() {
        let mut m = map(&[("a", "1"), ("b", "2")]);
        apply_delta(
            &mut m,
            &delta(&[("a", Some("9")), ("b", None), ("c", Some("3"))]),
        );
        assert_eq!(m, map(&[("a", "9"), ("c", "3")]));
    }

    #[test]
    fn meta_helpers_default_to_empty() {
        let meta = ObjectMeta::default();
        assert!(meta_annotations(&meta).is_empty());
        assert!(meta_labels(&meta).is_empty());
    }
}
