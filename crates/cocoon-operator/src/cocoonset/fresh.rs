//! This controller's own writes that the caches do not show yet.
//!
//! A pass reads the set and its pods from the informer caches. The watch events of a
//! pass's writes arrive a moment later, and not in the order of the writes across kinds: a
//! pass woken by the set's status event may still see a pod as it was before the hibernate
//! annotation this controller wrote on it, or the set as it was before the record patch, and
//! write the same thing again. After each successful write the object the API server
//! returned is kept here with the resourceVersion the cache showed when the pass read it
//! (the *base*). While the cache still shows exactly that version, a pass reads the kept
//! object instead: it is the newer of the two, and the cache has delivered nothing since.
//! As soon as the cache shows any other version (its catch-up, or someone else's write) the
//! cache is trusted again and the entry leaves; an intermediate version of another writer
//! costs at most a repeated write, never a lost change.
//!
//! Bounded: entries come only from this controller's own successful writes; each leaves
//! when the cache moves past its base (every pass checks the entries of its set), when its
//! set goes, or after [`TRUST_AFTER`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

/// How long a kept object may stand in for a cache that has not moved.
pub const TRUST_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Entry<K> {
    set_uid: String,
    base: String,
    latest: K,
    until: Instant,
}

/// The kept objects of one kind, by object UID.
#[derive(Debug)]
pub struct Fresh<K> {
    entries: HashMap<String, Entry<K>>,
}

impl<K> Default for Fresh<K> {
    fn default() -> Self {
        Fresh {
            entries: HashMap::new(),
        }
    }
}

impl<K: Resource + Clone> Fresh<K> {
    /// A write of a pass of the set `set_uid` returned `written`; the cache showed the object
    /// at `base` when the pass read it (the cache's version, whether the pass read the cached
    /// object or the kept one).
    pub fn wrote(&mut self, set_uid: &str, base: &str, mut written: K, now: Instant) {
        let Some(uid) = written.uid() else {
            return;
        };
        crate::controller::slim(&mut written);
        self.entries.insert(
            uid,
            Entry {
                set_uid: set_uid.to_string(),
                base: base.to_string(),
                latest: written,
                until: now + TRUST_AFTER,
            },
        );
    }

    /// What a pass reads for `cached`: the kept object while the cache still shows its base
    /// and it has not lapsed; `None` (read the cache) otherwise, and the entry leaves.
    pub fn view(&mut self, cached: &K, now: Instant) -> Option<K> {
        let uid = cached.uid()?;
        let e = self.entries.get(&uid)?;
        if e.until > now && cached.resource_version().as_deref() == Some(e.base.as_str()) {
            return Some(e.latest.clone());
        }
        self.entries.remove(&uid);
        None
    }

    /// Drops the entries of the set `set_uid` whose object the cache no longer shows at its
    /// base (`cached` gives the cache's current version of an object by namespace and name),
    /// and the lapsed entries of every set.
    pub fn prune(
        &mut self,
        set_uid: &str,
        cached: impl Fn(Option<&str>, &str) -> Option<String>,
        now: Instant,
    ) {
        self.entries.retain(|_, e| {
            if e.until <= now {
                return false;
            }
            if e.set_uid != set_uid {
                return true;
            }
            let ns = e.latest.meta().namespace.as_deref();
            cached(ns, &e.latest.name_any()).as_deref() == Some(e.base.as_str())
        });
    }

    /// The set is gone: nothing of it is kept.
    pub fn forget_set(&mut self, set_uid: &str) {
        self.entries.retain(|_, e| e.set_uid != set_uid);
    }

    /// Whether anything of the set `set_uid` is kept.
    pub fn has_set(&self, set_uid: &str) -> bool {
        self.entries.values().any(|e| e.set_uid == set_uid)
    }

    /// How many objects are kept, over all sets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(rv: &str, hibernate: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("demo-0".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("pod-uid".into());
        p.metadata.resource_version = Some(rv.into());
        p.metadata.managed_fields = Some(vec![Default::default()]);
        if hibernate {
            p.annotations_mut()
                .insert("cocoonset.cocoonstack.io/hibernate".into(), "true".into());
        }
        p
    }

    #[test]
    fn a_write_stands_in_for_the_cache_until_the_cache_moves_past_the_version_it_was_read_at() {
        let now = Instant::now();
        let mut f = Fresh::default();
        let cached = pod("10", false);
        f.wrote("set", "10", pod("11", true), now);
        // The cache still shows version 10: the written copy (slimmed) is read.
        let seen = f.view(&cached, now).expect("the written copy");
        assert_eq!(seen.resource_version().as_deref(), Some("11"));
        assert!(seen.metadata.managed_fields.is_none());
        // The cache caught up (or another writer moved it): the cache decides again.
        assert!(f.view(&pod("11", true), now).is_none());
        assert!(f.is_empty(), "the entry left");
        assert!(f.view(&cached, now).is_none(), "and does not come back");
    }

    #[test]
    fn a_second_write_from_the_kept_copy_keeps_the_cache_version_as_its_base() {
        let now = Instant::now();
        let mut f = Fresh::default();
        let cached = pod("10", false);
        f.wrote("set", "10", pod("11", true), now);
        assert!(f.view(&cached, now).is_some());
        // The pass that read the kept copy writes again: its base is still what the cache
        // shows.
        f.wrote(
            "set",
            cached.resource_version().as_deref().unwrap_or(""),
            pod("12", true),
            now,
        );
        let seen = f.view(&cached, now).expect("still behind");
        assert_eq!(seen.resource_version().as_deref(), Some("12"));
        // The cache shows the first write only: it moved, and is trusted (a repeated write
        // at worst, never a lost one).
        assert!(f.view(&pod("11", true), now).is_none());
    }

    #[test]
    fn the_memory_is_bounded_moved_lapsed_and_gone_sets_leave() {
        let now = Instant::now();
        let mut f = Fresh::default();
        f.wrote("set", "10", pod("11", true), now);
        // A pass of another set leaves it; a pass of its set whose cache moved drops it.
        f.prune("other", |_, _| Some("99".into()), now);
        assert_eq!(f.len(), 1);
        f.prune("set", |_, _| Some("10".into()), now);
        assert_eq!(f.len(), 1, "the cache still shows the base");
        f.prune("set", |_, _| Some("11".into()), now);
        assert!(f.is_empty());
        // Lapsed, for any set's pass.
        f.wrote("set", "10", pod("11", true), now);
        f.prune("other", |_, _| None, now + TRUST_AFTER);
        assert!(f.is_empty());
        // Gone with its set; a view after the lapse reads the cache.
        f.wrote("set", "10", pod("11", true), now);
        assert!(f.has_set("set"));
        f.forget_set("set");
        assert!(!f.has_set("set") && f.is_empty());
        f.wrote("set", "10", pod("11", true), now);
        assert!(f.view(&pod("10", false), now + TRUST_AFTER).is_none());
        // The object is gone from the cache.
        f.wrote("set", "10", pod("11", true), now);
        f.prune("set", |_, _| None, now);
        assert!(f.is_empty());
    }
}
