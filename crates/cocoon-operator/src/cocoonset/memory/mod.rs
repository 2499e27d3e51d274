//! The controller's memory of its own writes, per set: what a pass knows it wrote that the
//! caches may not show yet, and what it already reported.
//!
//! One [`WriteMemory`] holds, by set UID:
//! * the objects the set's last writes returned while the caches still show versions from
//!   before them ([`fresh`]), the pods it created that the pod cache does not show yet
//!   ([`expected`]), the pods it deleted that the pod cache still shows as they were
//!   ([`deleted`]), and the last status it wrote with the versions up to that write (step
//!   14 skips writing the same status again while the cache has not caught up);
//! * the set's metric labels (its series go when the set does) and the VM names the
//!   ownership gate refused and reported, each reported once.
//!
//! A pass reads what it knows it wrote in one call at its start ([`WriteMemory::recall`]),
//! records each write as it succeeds, and [`WriteMemory::forget`] drops everything of a set
//! once it is gone. A set being torn down keeps of its writes only what teardown reads again:
//! the set as its last write returned it (the delete stash is not written twice while the
//! cache lags) and its pod deletes (each pod is deleted once); its labels and its reports stay. Every entry comes from this controller's own
//! writes and reports and leaves with its set, so the memory stays bounded.

pub mod deleted;
pub mod expected;
pub mod fresh;
#[cfg(test)]
mod fresh_tests;
pub mod per_set;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cocoon_api::crd::set::{CocoonSet, CocoonSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use self::deleted::{Cached, Deleted};
use self::expected::Expected;
use self::fresh::Fresh;
use super::shared::status::versions_seen;
use crate::metrics::SetLabels;

/// The last status this controller wrote to a set: the resourceVersions it saw or produced
/// up to that write, the write's own included, and the status.
pub type WrittenStatus = (Vec<String>, CocoonSetStatus);

/// What this controller remembers of its own writes and reports, for every set.
#[derive(Default)]
pub struct WriteMemory {
    sets: Mutex<Sets>,
}

#[derive(Default)]
struct Sets {
    /// Per set: its metric labels.
    labels: HashMap<String, SetLabels>,
    /// Per set: its last status write ([`WrittenStatus`]).
    status: HashMap<String, WrittenStatus>,
    /// The pods created that the cache does not show yet.
    expected: Expected,
    /// The pods deleted that the cache still shows as they were.
    deleted: Deleted,
    /// The sets and pods as the last writes returned them.
    set_copies: Fresh<CocoonSet>,
    pod_copies: Fresh<Pod>,
    /// Per set: the (source, VM name) pairs the ownership gate refused and reported.
    foreign: HashMap<String, BTreeSet<(&'static str, String)>>,
}

impl Sets {
    /// The set a pass reads: the one this controller last wrote while the cache still shows
    /// the version that write started from, else `cached`.
    fn set_as_written(&mut self, cached: &CocoonSet, now: Instant) -> CocoonSet {
        let Some(uid) = cached.uid() else {
            return cached.clone();
        };
        self.set_copies
            .prune(&uid, |_, _| cached.resource_version(), now);
        self.set_copies
            .view(cached, now)
            .unwrap_or_else(|| cached.clone())
    }

    /// `owned` (from the pod cache) with each pod of the set `uid` written a moment ago that
    /// the cache still shows from before that write replaced by the written copy; the set's
    /// other kept pods leave.
    fn pods_as_written(&mut self, uid: &str, owned: &mut [Pod], now: Instant) {
        let cached: HashMap<(Option<String>, String), Option<String>> = owned
            .iter()
            .map(|p| {
                (
                    (p.metadata.namespace.clone(), p.name_any()),
                    p.resource_version(),
                )
            })
            .collect();
        self.pod_copies.prune(
            uid,
            |ns, name| {
                let key = (ns.map(str::to_string), name.to_string());
                cached.get(&key).cloned().flatten()
            },
            now,
        );
        if self.pod_copies.is_empty() {
            return;
        }
        for p in owned.iter_mut() {
            if let Some(kept) = self.pod_copies.view(p, now) {
                *p = kept;
            }
        }
    }

    /// Nothing of the writes of the set `uid` is kept (its labels and reports stay).
    fn forget_writes(&mut self, uid: &str) {
        self.forget_all_but_teardown(uid);
        self.set_copies.forget_set(uid);
    }

    /// What teardown does not read again of the set `uid`'s writes goes: its status, its
    /// expected creates, its written pods.
    fn forget_all_but_teardown(&mut self, uid: &str) {
        self.status.remove(uid);
        self.expected.forget_set(uid);
        self.pod_copies.forget_set(uid);
    }
}

/// What a pass of one set knows it wrote, read at its start.
#[derive(Debug, Clone)]
pub struct Recall {
    /// The set as this controller's last write returned it, while the cache still shows a
    /// version from before that write; else the cached set.
    pub cs: CocoonSet,
    /// The resourceVersion the cache showed the set at: the base of what the pass's writes
    /// of the set return.
    pub set_base: Option<String>,
    /// The set's owned pods from the cache, each one this controller wrote a moment ago
    /// that the cache still shows from before that write replaced by the written copy.
    pub owned: Vec<Pod>,
    /// The resourceVersions the cache showed those pods at, by name.
    pub pod_bases: HashMap<String, String>,
    /// The set's pods created a moment ago that the cache does not show yet, with the time
    /// their expectation has left.
    pub pending_creates: BTreeMap<String, Duration>,
    /// The last status this controller wrote to the set.
    pub last_status: Option<WrittenStatus>,
    /// The UIDs of the set's pods this controller deleted a moment ago that the cache still
    /// shows as they were (not terminating).
    pub deleted: BTreeSet<String>,
}

impl WriteMemory {
    fn lock(&self) -> MutexGuard<'_, Sets> {
        // A pass that panicked holding the lock left whole entries: the memory stays usable.
        self.sets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The start of a pass over `cached` (the set from the cache): what this controller knows
    /// it wrote for the set, with the set's owned pods as `owned_of` lists them from the pod
    /// cache for the set the pass reads (called without the memory held). The kept copies
    /// the caches have moved past leave, and so do the expectations the cache now shows. A
    /// set being deleted keeps nothing of its writes from here on.
    pub fn recall(
        &self,
        cached: &CocoonSet,
        owned_of: impl FnOnce(&CocoonSet) -> Vec<Pod>,
    ) -> Recall {
        let now = Instant::now();
        let cs = self.lock().set_as_written(cached, now);
        let mut owned = owned_of(&cs);
        let pod_bases = owned
            .iter()
            .filter_map(|p| Some((p.name_any(), p.resource_version()?)))
            .collect();
        let (mut pending_creates, mut last_status) = (BTreeMap::new(), None);
        let mut deleted = BTreeSet::new();
        if let Some(uid) = cs.uid() {
            let mut sets = self.lock();
            let cached = owned.iter().filter_map(|p| {
                Some(Cached {
                    uid: p.metadata.uid.as_deref()?,
                    terminating: p.metadata.deletion_timestamp.is_some(),
                })
            });
            deleted = sets.deleted.observe(&uid, cached, now);
            sets.pods_as_written(&uid, &mut owned, now);
            if cs.metadata.deletion_timestamp.is_some() {
                sets.forget_all_but_teardown(&uid);
            } else {
                let in_cache = owned.iter().filter_map(|p| {
                    Some((p.metadata.name.as_deref()?, p.metadata.uid.as_deref()?))
                });
                pending_creates = sets.expected.observe(&uid, in_cache, now);
                last_status = sets.status.get(&uid).cloned();
            }
        }
        Recall {
            cs,
            set_base: cached.resource_version(),
            owned,
            pod_bases,
            pending_creates,
            last_status,
            deleted,
        }
    }

    /// A write of the set returned `written`; the cache showed it at `base`. Nothing is kept
    /// of a write that let the set go (its last finalizer removed), nor of a set already
    /// forgotten: the watch's delete event may be handled before the write's answer is.
    pub fn wrote_set(&self, base: Option<&str>, written: CocoonSet) {
        let going = written.metadata.deletion_timestamp.is_some()
            && written
                .metadata
                .finalizers
                .as_ref()
                .is_none_or(Vec::is_empty);
        if going {
            return;
        }
        if let (Some(base), Some(uid)) = (base, written.uid()) {
            let mut sets = self.lock();
            if sets.labels.contains_key(&uid) {
                sets.set_copies.wrote(&uid, base, written, Instant::now());
            }
        }
    }

    /// A write of a pod of the set `set_uid` returned `written`; the cache showed the pod
    /// at `base`.
    pub fn wrote_pod(&self, set_uid: Option<&str>, base: Option<&str>, written: Pod) {
        if let (Some(set), Some(base)) = (set_uid, base) {
            self.lock()
                .pod_copies
                .wrote(set, base, written, Instant::now());
        }
    }

    /// A status write of the set `uid` went through: `status`, written by a pass that saw or
    /// produced the versions `pass`. Returns the set's last status write as it now stands.
    pub fn wrote_status(
        &self,
        uid: &str,
        pass: &[String],
        status: CocoonSetStatus,
    ) -> WrittenStatus {
        let mut sets = self.lock();
        let before = sets.status.remove(uid).map(|(seen, _)| seen);
        let written = (versions_seen(before, pass), status);
        sets.status.insert(uid.to_string(), written.clone());
        written
    }

    /// A create of `pod` (UID `pod_uid`) for the set `set_uid` returned Created.
    pub fn created(&self, set_uid: &str, pod: &str, pod_uid: &str) {
        self.lock()
            .expected
            .created(set_uid, pod, pod_uid, Instant::now());
    }

    /// A delete of the pod `pod_uid` of the set `set_uid` succeeded (or found it gone).
    /// Nothing is kept for a set already forgotten (its delete event came first).
    pub fn deleted(&self, set_uid: &str, pod_uid: &str) {
        let mut sets = self.lock();
        if sets.labels.contains_key(set_uid) {
            sets.deleted.deleted(set_uid, pod_uid, Instant::now());
        }
    }

    /// Remembers the metric labels of `cs`; `Some` the first time, for its series to be
    /// initialised.
    pub fn track(&self, cs: &CocoonSet) -> Option<SetLabels> {
        let (uid, namespace) = (cs.uid()?, cs.namespace()?);
        let mut sets = self.lock();
        if sets.labels.contains_key(&uid) {
            return None;
        }
        let labels = SetLabels {
            namespace,
            cocoonset: cs.name_any(),
        };
        sets.labels.insert(uid, labels.clone());
        Some(labels)
    }

    /// True the first time the set `uid` reports `vm` from `source` as not its own.
    pub fn first_foreign_report(&self, uid: &str, source: &'static str, vm: &str) -> bool {
        self.lock()
            .foreign
            .entry(uid.to_string())
            .or_default()
            .insert((source, vm.to_string()))
    }

    /// Forgets everything of the set `uid`; returns its metric labels when it was tracked.
    pub fn forget(&self, uid: &str) -> Option<SetLabels> {
        let mut sets = self.lock();
        sets.forget_writes(uid);
        sets.deleted.forget_set(uid);
        sets.foreign.remove(uid);
        sets.labels.remove(uid)
    }

    /// Forgets every set whose UID is not in `present`; returns the UIDs and metric labels
    /// of the tracked ones.
    pub fn forget_all_but(&self, present: &BTreeSet<String>) -> Vec<(String, SetLabels)> {
        let mut sets = self.lock();
        let keep = |uid: &str| present.contains(uid);
        sets.status.retain(|uid, _| keep(uid));
        sets.expected.retain_sets(keep);
        sets.deleted.retain_sets(keep);
        sets.set_copies.retain_sets(keep);
        sets.pod_copies.retain_sets(keep);
        sets.foreign.retain(|uid, _| keep(uid));
        let gone: Vec<String> = sets
            .labels
            .keys()
            .filter(|uid| !keep(uid))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|uid| sets.labels.remove(&uid).map(|l| (uid, l)))
            .collect()
    }

    /// Whether anything of the set `uid` is remembered.
    pub fn remembers(&self, uid: &str) -> bool {
        let sets = self.lock();
        sets.labels.contains_key(uid)
            || sets.status.contains_key(uid)
            || sets.expected.has_set(uid)
            || sets.deleted.has_set(uid)
            || sets.set_copies.has_set(uid)
            || sets.pod_copies.has_set(uid)
            || sets.foreign.contains_key(uid)
    }

    /// Pods created and not yet seen in the cache, over all sets.
    pub fn expected_creates(&self) -> usize {
        self.lock().expected.len()
    }

    /// Whether a written copy of a pod of the set `uid` is kept.
    pub fn keeps_pods_of(&self, uid: &str) -> bool {
        self.lock().pod_copies.has_set(uid)
    }
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::contract::finalizers;
    use cocoon_api::crd::set::CocoonSetPhase;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::cocoonset::fixtures::{agent, set};

    /// The set `uid` as the cache shows it at `version`.
    fn cached(uid: &str, version: &str) -> CocoonSet {
        let mut cs = set();
        cs.metadata.uid = Some(uid.into());
        cs.metadata.resource_version = Some(version.into());
        cs
    }

    /// The main of a set as the cache shows it at `version`.
    fn main_at(version: &str) -> Pod {
        let mut p = agent(0);
        p.metadata.uid = Some("pod-0".into());
        p.metadata.resource_version = Some(version.into());
        p
    }

    fn status(phase: CocoonSetPhase) -> CocoonSetStatus {
        CocoonSetStatus {
            phase: Some(phase),
            ..CocoonSetStatus::default()
        }
    }

    /// Everything a pass of the set `uid` can leave behind: its labels, a set and a pod
    /// write the caches do not show, a create, a status write and a report.
    fn remember_all(m: &WriteMemory, uid: &str) {
        let cs = cached(uid, "10");
        assert!(m.track(&cs).is_some());
        m.wrote_set(Some("10"), cached(uid, "11"));
        m.wrote_pod(Some(uid), Some("20"), main_at("21"));
        m.created(uid, "demo-1", "pod-1");
        m.wrote_status(
            uid,
            &["10".into(), "11".into()],
            status(CocoonSetPhase::Running),
        );
        assert!(m.first_foreign_report(uid, ann::VM_NAME, "vk-other"));
    }

    #[test]
    fn a_pass_reads_what_it_wrote_in_one_call() {
        let m = WriteMemory::default();
        remember_all(&m, "a");
        let recall = m.recall(&cached("a", "10"), |_| vec![main_at("20")]);
        assert_eq!(
            recall.cs.resource_version().as_deref(),
            Some("11"),
            "the set as written"
        );
        assert_eq!(recall.set_base.as_deref(), Some("10"));
        assert_eq!(
            recall.owned[0].resource_version().as_deref(),
            Some("21"),
            "the pod as written"
        );
        assert_eq!(
            recall.pod_bases.get("demo-0").map(String::as_str),
            Some("20")
        );
        assert_eq!(
            recall.pending_creates.keys().collect::<Vec<_>>(),
            ["demo-1"]
        );
        assert_eq!(
            recall.last_status,
            Some((
                vec!["10".to_string(), "11".to_string()],
                status(CocoonSetPhase::Running)
            ))
        );
        // Once the caches show other versions, the caches decide again.
        let recall = m.recall(&cached("a", "12"), |_| vec![main_at("22")]);
        assert_eq!(recall.cs.resource_version().as_deref(), Some("12"));
        assert_eq!(recall.owned[0].resource_version().as_deref(), Some("22"));
        assert!(!m.keeps_pods_of("a"));
    }

    #[test]
    fn a_status_write_adds_the_passes_versions_to_the_ones_before() {
        let m = WriteMemory::default();
        m.wrote_status(
            "a",
            &["1".into(), "2".into()],
            status(CocoonSetPhase::Pending),
        );
        let last = m.wrote_status(
            "a",
            &["2".into(), "3".into()],
            status(CocoonSetPhase::Running),
        );
        assert_eq!(
            last,
            (
                vec!["1".to_string(), "2".to_string(), "3".to_string()],
                status(CocoonSetPhase::Running)
            )
        );
        assert_eq!(
            m.recall(&cached("a", "3"), |_| Vec::new()).last_status,
            Some(last)
        );
    }

    #[test]
    fn a_set_being_torn_down_keeps_of_its_writes_only_the_set_and_its_labels_and_reports() {
        let m = WriteMemory::default();
        remember_all(&m, "a");
        let mut deleting = cached("a", "30");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        deleting.metadata.finalizers = Some(vec![finalizers::COCOONSET.into()]);
        let recall = m.recall(&deleting, |_| vec![main_at("20")]);
        assert!(recall.pending_creates.is_empty() && recall.last_status.is_none());
        // Its stash write is read back while the cache still shows the set from before it.
        let mut stashed = deleting.clone();
        stashed.metadata.resource_version = Some("31".into());
        m.wrote_set(Some("30"), stashed);
        let again = m.recall(&deleting, |_| Vec::new());
        assert_eq!(again.cs.resource_version().as_deref(), Some("31"));
        assert!(again.pending_creates.is_empty() && again.last_status.is_none());
        assert_eq!(m.expected_creates(), 0);
        // Its labels and its reports stay until the set is gone.
        assert!(m.track(&cached("a", "10")).is_none(), "still tracked");
        assert!(!m.first_foreign_report("a", ann::VM_NAME, "vk-other"));
        assert!(m.remembers("a"));
    }

    #[test]
    fn a_pod_deleted_counts_as_deleted_until_the_cache_shows_it_going_teardown_included() {
        let m = WriteMemory::default();
        let mut deleting = cached("a", "30");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(m.track(&deleting).is_some());
        m.deleted("a", "pod-0");
        let deleted = |pods: Vec<Pod>| m.recall(&deleting, |_| pods).deleted;
        assert_eq!(
            deleted(vec![main_at("20")]),
            BTreeSet::from(["pod-0".to_string()]),
            "the cache still shows it as it was"
        );
        assert!(m.remembers("a"), "kept while the set is torn down");
        let mut going = main_at("21");
        going.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(deleted(vec![going]).is_empty(), "the cache shows it going");
        assert!(
            !m.lock().deleted.has_set("a"),
            "nothing of its deletes is kept"
        );
        m.deleted("a", "pod-0");
        assert!(
            deleted(Vec::new()).is_empty(),
            "the cache no longer shows it"
        );
        m.deleted("a", "pod-0");
        m.forget("a");
        assert!(deleted(vec![main_at("20")]).is_empty(), "the set went");
    }

    #[test]
    fn writes_answered_after_the_set_was_forgotten_leave_nothing_behind() {
        // The watch's delete event of a set may be handled before the answer of the write
        // that let it go (its last finalizer removed), or of a pod delete of its last pass.
        let m = WriteMemory::default();
        let cs = cached("a", "30");
        assert!(m.track(&cs).is_some());
        m.forget("a");
        m.deleted("a", "pod-0");
        m.wrote_set(Some("30"), cached("a", "31"));
        assert!(!m.remembers("a"), "a forgotten set stays forgotten");

        assert!(m.track(&cs).is_some());
        let mut let_go = cached("a", "32");
        let_go.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let_go.metadata.finalizers = None;
        m.wrote_set(Some("31"), let_go);
        assert!(
            !m.lock().set_copies.has_set("a"),
            "the write that removed the last finalizer is not kept"
        );
    }

    #[test]
    fn one_forget_drops_everything_of_a_set_and_nothing_of_the_others() {
        let m = WriteMemory::default();
        remember_all(&m, "a");
        remember_all(&m, "b");
        let labels = m.forget("a").expect("it was tracked");
        assert_eq!(labels.cocoonset, "demo");
        assert!(!m.remembers("a"));
        assert!(m.remembers("b"));
        assert_eq!(m.expected_creates(), 1, "b's create");
        assert!(
            m.first_foreign_report("a", ann::VM_NAME, "vk-other"),
            "reported anew"
        );
        // After a relist, the sets that are no longer listed go, the listed ones stay.
        remember_all(&m, "c");
        let gone = m.forget_all_but(&BTreeSet::from(["c".to_string()]));
        assert_eq!(
            gone.iter().map(|(uid, _)| uid.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        assert!(!m.remembers("a") && !m.remembers("b") && m.remembers("c"));
    }
}
