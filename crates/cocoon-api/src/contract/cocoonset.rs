//! The operator's bookkeeping annotations on a CocoonSet (`contract.md` §7): the teardown GC
//! stash, the rebuild ledger, the wake hint, the suspend clock and the reclaim record.
//!
//! Every decoder is lenient (corrupt or `null` JSON reads as empty), and every encoder is
//! byte-identical to what the Go operator writes, so an unchanged value is never rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::annotations as ann;
use super::parse::{get_str, non_empty, parse_list};
use super::patch::{AnnotationCodec, AnnotationDelta};
use super::timefmt::{parse_rfc3339, rfc3339_nano, rfc3339_seconds};

/// `cocoonset.cocoonstack.io/delete-vm-names`: the VM names stashed for teardown registry GC.
/// Kept as a set, so the encoding is always sorted (byte order, like Go's `sort.Strings`) and
/// de-duplicated. An empty stash writes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteVmNames(pub BTreeSet<String>);

impl DeleteVmNames {
    /// Adds names (trimmed; empty ones skipped) — the union of §7.
    pub fn union<I, S>(&mut self, names: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.0.extend(
            names
                .into_iter()
                .map(|n| n.as_ref().trim().to_owned())
                .filter(|n| !n.is_empty()),
        );
    }

    /// The comma-joined, sorted, de-duplicated value.
    pub fn encode(&self) -> String {
        self.0
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The names in annotation (sorted) order, the order teardown GC walks them.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// True when nothing is stashed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl AnnotationCodec for DeleteVmNames {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        DeleteVmNames(
            parse_list(a.get(ann::DELETE_VM_NAMES).map(String::as_str))
                .into_iter()
                .collect(),
        )
    }

    fn desired(&self) -> AnnotationDelta {
        non_empty(&self.encode())
            .map(|v| AnnotationDelta::from([(ann::DELETE_VM_NAMES.to_owned(), Some(v))]))
            .unwrap_or_default()
    }
}

/// One pod's entry in the rebuild ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebuildEntry {
    /// Budgeted rebuild deletes so far (`count`); non-integer reads as 0.
    pub count: i64,
    /// Time of the last budgeted delete (`lastDeleted`); `None` when missing or unparsable,
    /// which behaves like Go's zero time (any backoff has elapsed).
    pub last_deleted: Option<DateTime<Utc>>,
    /// Beyond the Go format (Go ignores extra fields): the CocoonSet generation at which this
    /// entry was last written, so the operator can tell "budget exhausted at this generation".
    pub generation: Option<i64>,
    /// Any other fields, kept so a rewrite does not drop data written by another version.
    pub extra: Map<String, Value>,
}

impl RebuildEntry {
    fn from_value(value: &Value) -> Option<Self> {
        let obj = value.as_object()?;
        let mut extra = obj.clone();
        let count = extra.remove("count").and_then(|v| v.as_i64()).unwrap_or(0);
        let last_deleted = extra
            .remove("lastDeleted")
            .and_then(|v| v.as_str().and_then(parse_rfc3339));
        let generation = extra.remove("generation").and_then(|v| v.as_i64());
        Some(RebuildEntry {
            count,
            last_deleted,
            generation,
            extra,
        })
    }

    fn to_value(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("count".to_owned(), Value::from(self.count));
        if let Some(t) = self.last_deleted {
            obj.insert("lastDeleted".to_owned(), Value::String(rfc3339_nano(t)));
        }
        if let Some(g) = self.generation {
            obj.insert("generation".to_owned(), Value::from(g));
        }
        for (k, v) in &self.extra {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Value::Object(obj)
    }
}

/// `cocoonset.cocoonstack.io/rebuild-history`: pod name → [`RebuildEntry`].
///
/// Corrupt JSON, `null` or a non-object reads as empty; an entry that is not an object is
/// dropped. An empty ledger is written as a removal of the key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebuildHistory(pub BTreeMap<String, RebuildEntry>);

impl RebuildHistory {
    /// Lenient decode of the annotation value.
    pub fn decode(value: &str) -> Self {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(value) else {
            return RebuildHistory::default();
        };
        RebuildHistory(
            obj.iter()
                .filter_map(|(pod, v)| RebuildEntry::from_value(v).map(|e| (pod.clone(), e)))
                .collect(),
        )
    }

    /// The JSON value (`{"<pod>":{"count":1,"lastDeleted":"..."}}`), or `None` when empty.
    pub fn encode(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let obj: Map<String, Value> = self
            .0
            .iter()
            .map(|(pod, e)| (pod.clone(), e.to_value()))
            .collect();
        Some(Value::Object(obj).to_string())
    }

    /// The pod's entry.
    pub fn get(&self, pod: &str) -> Option<&RebuildEntry> {
        self.0.get(pod)
    }

    /// The pod's rebuild count (0 without an entry).
    pub fn count(&self, pod: &str) -> i64 {
        self.get(pod).map_or(0, |e| e.count)
    }

    /// Records a budgeted delete: `count + 1`, `lastDeleted = now`, `generation`. Returns the
    /// new count.
    pub fn record_delete(&mut self, pod: &str, now: DateTime<Utc>, generation: i64) -> i64 {
        let entry = self.0.entry(pod.to_owned()).or_default();
        entry.count = entry.count.saturating_add(1);
        entry.last_deleted = Some(now);
        entry.generation = Some(generation);
        entry.count
    }

    /// Forgets a pod (its dead-letter was lifted by a spec edit).
    pub fn reset(&mut self, pod: &str) {
        self.0.remove(pod);
    }

    /// History GC: drops entries for pod names outside the desired set
    /// (see [`crate::naming::desired_pod_names`]).
    pub fn retain_desired(&mut self, desired: &BTreeSet<String>) {
        self.0.retain(|pod, _| desired.contains(pod));
    }
}

impl AnnotationCodec for RebuildHistory {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        RebuildHistory::decode(get_str(a, ann::REBUILD_HISTORY))
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([(ann::REBUILD_HISTORY.to_owned(), self.encode())])
    }
}

/// `cocoonset.cocoonstack.io/hibernated-on-node`: the main's node at a release-policy seat
/// release. Empty means absent, and writing an empty value removes the key (wake completed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HibernatedOnNode(pub String);

impl AnnotationCodec for HibernatedOnNode {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        HibernatedOnNode(get_str(a, ann::HIBERNATED_ON_NODE).to_owned())
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([(ann::HIBERNATED_ON_NODE.to_owned(), non_empty(&self.0))])
    }
}

/// `cocoonset.cocoonstack.io/suspending-since`: start of the current `Suspending` phase, whole
/// seconds UTC. Missing or unparsable reads as `None`; `None` removes the key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SuspendingSince(pub Option<DateTime<Utc>>);

impl SuspendingSince {
    /// A stamp for `now`, truncated to whole seconds as it will be written.
    pub fn at(now: DateTime<Utc>) -> Self {
        SuspendingSince(Some(now.with_nanosecond(0).unwrap_or(now)))
    }

    /// True when a stamp exists and `now − since > deadline` (strictly greater, as the spec).
    pub fn exceeded(&self, now: DateTime<Utc>, deadline: Duration) -> bool {
        let Some(since) = self.0 else { return false };
        let Ok(deadline) = chrono::Duration::from_std(deadline) else {
            return false;
        };
        now.signed_duration_since(since) > deadline
    }
}

impl AnnotationCodec for SuspendingSince {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        SuspendingSince(a.get(ann::SUSPENDING_SINCE).and_then(|v| parse_rfc3339(v)))
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([(
            ann::SUSPENDING_SINCE.to_owned(),
            self.0.map(rfc3339_seconds),
        )])
    }
}

/// Accepts `null` wherever a list or number is expected, like Go's decoder does for slices.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `cocoonset.cocoonstack.io/hibernate-reclaim`: the reclaim record (`cocoonset.md` §10).
///
/// Corrupt JSON or `null` reads as empty. The encoding is Go's:
/// `{"generation":7,"vms":[...],"restore":[...],"suspended":[...]}` with `restore` and
/// `suspended` omitted when empty; an empty `vms` removes the annotation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimRecord {
    /// The set's generation at the unsuspend bookkeeping.
    #[serde(default, deserialize_with = "null_as_default")]
    pub generation: i64,
    /// VMs whose `:hibernate` tag this set owes a reclaim.
    #[serde(default, deserialize_with = "null_as_default")]
    pub vms: Vec<String>,
    /// VMs owed a restore (pod missing at unsuspend).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub restore: Vec<String>,
    /// VMs this suspend cycle recorded.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub suspended: Vec<String>,
}

impl ReclaimRecord {
    /// Lenient decode: corrupt JSON or `null` is the empty record.
    pub fn decode(value: &str) -> Self {
        serde_json::from_str::<Option<ReclaimRecord>>(value)
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// The JSON value, or `None` (remove the key) when `vms` is empty.
    pub fn encode(&self) -> Option<String> {
        if self.vms.is_empty() {
            return None;
        }
        // Serialising plain strings and integers cannot fail.
        serde_json::to_string(self).ok()
    }

    /// True when no VM is owed a reclaim.
    pub fn is_empty(&self) -> bool {
        self.vms.is_empty()
    }

    /// True when `vm` is in `vms`.
    pub fn contains_vm(&self, vm: &str) -> bool {
        self.vms.iter().any(|v| v == vm)
    }

    /// True when `vm` is owed a restore.
    pub fn owes_restore(&self, vm: &str) -> bool {
        self.restore.iter().any(|v| v == vm)
    }

    /// Adds `vm` to `vms` unless present.
    pub fn add_vm(&mut self, vm: &str) {
        push_unique(&mut self.vms, vm);
    }

    /// Adds `vm` to `restore` unless present.
    pub fn add_restore(&mut self, vm: &str) {
        push_unique(&mut self.restore, vm);
    }

    /// Adds `vm` to `suspended` unless present.
    pub fn add_suspended(&mut self, vm: &str) {
        push_unique(&mut self.suspended, vm);
    }

    /// Removes `vm` from `vms`, `restore` and `suspended` (reclaimed, image rule, pre-create drop).
    pub fn remove_vm(&mut self, vm: &str) {
        self.vms.retain(|v| v != vm);
        self.restore.retain(|v| v != vm);
        self.suspended.retain(|v| v != vm);
    }
}

fn push_unique(list: &mut Vec<String>, vm: &str) {
    if !vm.is_empty() && !list.iter().any(|v| v == vm) {
        list.push(vm.to_owned());
    }
}

impl AnnotationCodec for ReclaimRecord {
    fn from_annotations(a: &BTreeMap<String, String>) -> Self {
        ReclaimRecord::decode(get_str(a, ann::HIBERNATE_RECLAIM))
    }

    fn desired(&self) -> AnnotationDelta {
        AnnotationDelta::from([(ann::HIBERNATE_RECLAIM.to_owned(), self.encode())])
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

    fn ts(s: &str) -> DateTime<Utc> {
        parse_rfc3339(s).expect("valid test timestamp")
    }

    #[test]
    fn delete_vm_names_sorted_deduplicated_union() {
        let current = map(&[(ann::DELETE_VM_NAMES, "vk-b, vk-a,,vk-b")]);
        let mut names = DeleteVmNames::from_annotations(&current);
        assert_eq!(names.encode(), "vk-a,vk-b");
        names.union(["vk-c", "", "  ", "vk-a", " vk-0 "]);
        assert_eq!(names.encode(), "vk-0,vk-a,vk-b,vk-c");
        assert_eq!(names.names().next(), Some("vk-0"));

        // Unchanged joined string → no patch; a different spelling of the same set is
        // normalised once.
        let stable = map(&[(ann::DELETE_VM_NAMES, "vk-0,vk-a,vk-b,vk-c")]);
        assert!(names.delta(&stable).is_empty());
        assert_eq!(
            names.delta(&current),
            AnnotationDelta::from([(
                ann::DELETE_VM_NAMES.to_owned(),
                Some("vk-0,vk-a,vk-b,vk-c".to_owned())
            )])
        );
        assert!(DeleteVmNames::default().desired().is_empty());
        assert!(DeleteVmNames::from_annotations(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn rebuild_history_round_trip() {
        let mut h = RebuildHistory::default();
        assert_eq!(
            h.record_delete("demo-1", ts("2026-08-12T10:00:00.5Z"), 3),
            1
        );
        assert_eq!(h.record_delete("demo-1", ts("2026-08-12T10:00:01Z"), 3), 2);
        h.record_delete("demo-tb", ts("2026-08-12T10:00:02.123456789Z"), 3);
        let encoded = h.encode().expect("non-empty history encodes");
        // Key order inside an entry depends on serde_json's `preserve_order` feature; Go reads
        // by key, so compare as JSON values.
        let want: Value = serde_json::from_str(
            r#"{"demo-1":{"count":2,"lastDeleted":"2026-08-12T10:00:01Z","generation":3},
                "demo-tb":{"count":1,"lastDeleted":"2026-08-12T10:00:02.123456789Z","generation":3}}"#,
        )
        .expect("valid test JSON");
        assert_eq!(serde_json::from_str::<Value>(&encoded).ok(), Some(want));
        let a = map(&[(ann::REBUILD_HISTORY, &encoded)]);
        assert_eq!(RebuildHistory::from_annotations(&a), h);
        assert!(h.delta(&a).is_empty());
        assert_eq!(h.count("demo-1"), 2);
        assert_eq!(h.count("demo-2"), 0);
    }

    #[test]
    fn rebuild_history_reads_go_written_values() {
        let go = r#"{"demo-1":{"count":3,"lastDeleted":"2026-08-12T10:00:00.123Z"}}"#;
        let h = RebuildHistory::decode(go);
        let e = h.get("demo-1").expect("entry");
        assert_eq!(e.count, 3);
        assert_eq!(e.last_deleted, Some(ts("2026-08-12T10:00:00.123Z")));
        assert_eq!(e.generation, None);
        // Re-encoding a Go value without our extra field is byte-identical.
        assert_eq!(h.encode().as_deref(), Some(go));
    }

    #[test]
    fn rebuild_history_malformed_reads_as_empty() {
        for bad in ["", "null", "{", "[]", "\"x\"", "42", "{\"demo-1\": 5}"] {
            assert_eq!(
                RebuildHistory::decode(bad),
                RebuildHistory::default(),
                "{bad:?}"
            );
        }
        let h = RebuildHistory::decode(
            r#"{"a":{"count":"two","lastDeleted":"yesterday"},"b":{"count":1,"future":true}}"#,
        );
        let a = h.get("a").expect("entry a");
        assert_eq!((a.count, a.last_deleted), (0, None));
        let b = h.get("b").expect("entry b");
        assert_eq!(b.extra.get("future"), Some(&Value::Bool(true)));
        assert!(h.encode().is_some_and(|s| s.contains(r#""future":true"#)));
    }

    #[test]
    fn rebuild_history_gc_and_reset() {
        let mut h = RebuildHistory::default();
        for pod in ["demo-0", "demo-1", "demo-5", "demo-tb", "demo-old"] {
            h.record_delete(pod, ts("2026-08-12T10:00:00Z"), 1);
        }
        let desired: BTreeSet<String> = ["demo-0", "demo-1", "demo-tb"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        h.retain_desired(&desired);
        assert_eq!(
            h.0.keys().map(String::as_str).collect::<Vec<_>>(),
            ["demo-0", "demo-1", "demo-tb"]
        );
        h.reset("demo-1");
        assert_eq!(h.count("demo-1"), 0);

        // An emptied ledger removes the key.
        let a = map(&[(ann::REBUILD_HISTORY, "{}")]);
        assert_eq!(
            RebuildHistory::default().delta(&a),
            AnnotationDelta::from([(ann::REBUILD_HISTORY.to_owned(), None)])
        );
        assert!(RebuildHistory::default().delta(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn hibernated_on_node() {
        let a = HibernatedOnNode("node-a".into()).to_annotations();
        assert_eq!(a, map(&[(ann::HIBERNATED_ON_NODE, "node-a")]));
        assert_eq!(
            HibernatedOnNode::from_annotations(&a),
            HibernatedOnNode("node-a".into())
        );
        assert_eq!(
            HibernatedOnNode::default().delta(&a),
            AnnotationDelta::from([(ann::HIBERNATED_ON_NODE.to_owned(), None)])
        );
        assert!(
            HibernatedOnNode::default()
                .delta(&BTreeMap::new())
                .is_empty()
        );
    }

    #[test]
    fn suspending_since() {
        let s = SuspendingSince::at(ts("2026-08-12T10:00:00.75Z"));
        let a = s.to_annotations();
        assert_eq!(a, map(&[(ann::SUSPENDING_SINCE, "2026-08-12T10:00:00Z")]));
        assert_eq!(SuspendingSince::from_annotations(&a), s);
        assert!(s.delta(&a).is_empty());

        for bad in ["", "soon", "2026-08-12", "1723456789"] {
            let s = SuspendingSince::from_annotations(&map(&[(ann::SUSPENDING_SINCE, bad)]));
            assert_eq!(s, SuspendingSince(None), "{bad:?}");
            assert!(!s.exceeded(ts("2030-01-01T00:00:00Z"), Duration::from_secs(180)));
        }

        let deadline = Duration::from_secs(180);
        assert!(!s.exceeded(ts("2026-08-12T10:03:00Z"), deadline));
        assert!(s.exceeded(ts("2026-08-12T10:03:01Z"), deadline));
        assert_eq!(
            SuspendingSince(None).delta(&a),
            AnnotationDelta::from([(ann::SUSPENDING_SINCE.to_owned(), None)])
        );
    }

    #[test]
    fn reclaim_record_round_trip() {
        let mut r = ReclaimRecord {
            generation: 7,
            ..ReclaimRecord::default()
        };
        r.add_vm("vk-ns-demo-0-505043");
        r.add_vm("vk-ns-demo-0-505043");
        assert_eq!(
            r.encode().as_deref(),
            Some(r#"{"generation":7,"vms":["vk-ns-demo-0-505043"]}"#)
        );
        r.add_restore("vk-ns-demo-0-505043");
        r.add_suspended("vk-ns-demo-0-505043");
        let encoded = r.encode().expect("non-empty record encodes");
        assert_eq!(
            encoded,
            r#"{"generation":7,"vms":["vk-ns-demo-0-505043"],"restore":["vk-ns-demo-0-505043"],"suspended":["vk-ns-demo-0-505043"]}"#
        );
        let a = map(&[(ann::HIBERNATE_RECLAIM, &encoded)]);
        assert_eq!(ReclaimRecord::from_annotations(&a), r);
        assert!(r.delta(&a).is_empty());
        assert!(r.contains_vm("vk-ns-demo-0-505043"));
        assert!(r.owes_restore("vk-ns-demo-0-505043"));

        // Removing the last VM removes the annotation.
        r.remove_vm("vk-ns-demo-0-505043");
        assert!(r.is_empty() && r.restore.is_empty() && r.suspended.is_empty());
        assert_eq!(r.encode(), None);
        assert_eq!(
            r.delta(&a),
            AnnotationDelta::from([(ann::HIBERNATE_RECLAIM.to_owned(), None)])
        );
        assert!(r.delta(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn reclaim_record_malformed_reads_as_empty() {
        for bad in [
            "",
            "null",
            "{",
            "[]",
            "7",
            r#"{"generation":"7","vms":["a"]}"#,
            r#"{"vms":"a"}"#,
        ] {
            assert_eq!(
                ReclaimRecord::decode(bad),
                ReclaimRecord::default(),
                "{bad:?}"
            );
        }
        let r = ReclaimRecord::decode(r#"{"generation":null,"vms":["a"],"restore":null}"#);
        assert_eq!(r.vms, ["a"]);
        assert_eq!(r.generation, 0);
        assert!(r.restore.is_empty());
    }
}
