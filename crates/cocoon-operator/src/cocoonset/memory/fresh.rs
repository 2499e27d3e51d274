//! This controller's own writes that the caches do not show yet.
//!
//! A pass reads the set and its pods from the informer caches. The watch events of a
//! pass's writes arrive a moment later, and not in the order of the writes across kinds: a
//! pass woken by the set's status event may still see a pod as it was before the hibernate
//! annotation this controller wrote on it, or the set as it was before the record patch, and
//! write the same thing again. After each successful write the object the API server
//! returned is kept, with the versions known to come before it: the resourceVersion the cache
//! showed when the pass read the object (the *base*), and what this controller's earlier
//! writes of it returned while the cache had not caught up. While the cache shows one of
//! those versions, a pass reads the kept object: it is newer than anything the cache has
//! shown. As soon as the cache shows any other version (this write's own, or someone else's)
//! the cache is trusted again and the entry goes; an intermediate version of another writer
//! costs at most a repeated write, never a lost change.
//!
//! Bounded: entries come only from this controller's own successful writes, each remembers at
//! most [`BEHIND`] versions, and each leaves when the cache shows another version (every pass
//! checks the entries of its set), when its set goes, or after [`TRUST_AFTER`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

/// How long a kept object may stand in for a cache that has not moved.
pub const TRUST_AFTER: Duration = Duration::from_secs(30);
/// How many versions before the kept object an entry remembers.
pub const BEHIND: usize = 8;

#[derive(Debug, Clone)]
struct Entry<K> {
    set_uid: String,
    /// Versions that come before `latest`, oldest first.
    behind: Vec<String>,
    latest: K,
    until: Instant,
}

impl<K> Entry<K> {
    /// Whether `version` (the cache's) comes before the kept object.
    fn is_behind(&self, version: Option<&str>) -> bool {
        version.is_some_and(|v| self.behind.iter().any(|b| b == v))
    }
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
    /// object or the kept one). When the cache had not caught up with the kept object yet,
    /// the kept object's version joins the ones known to come before the new one.
    pub fn wrote(&mut self, set_uid: &str, base: &str, mut written: K, now: Instant) {
        let Some(uid) = written.uid() else {
            return;
        };
        crate::controller::slim(&mut written);
        let mut behind = match self.entries.remove(&uid) {
            Some(e) if e.behind.iter().any(|v| v == base) => {
                let mut b = e.behind;
                b.extend(e.latest.resource_version());
                b
            }
            _ => vec![base.to_string()],
        };
        // The oldest (the base the cache is likely still at) stays; the middle goes first.
        let over = behind.len().saturating_sub(BEHIND);
        behind.drain(1..1 + over);
        self.entries.insert(
            uid,
            Entry {
                set_uid: set_uid.to_string(),
                behind,
                latest: written,
                until: now + TRUST_AFTER,
            },
        );
    }

    /// What a pass reads for `cached`: the kept object while the cache shows a version
    /// before it and it has not lapsed; `None` (read the cache) otherwise, and the entry
    /// leaves.
    pub fn view(&mut self, cached: &K, now: Instant) -> Option<K> {
        let uid = cached.uid()?;
        let e = self.entries.get(&uid)?;
        if e.until > now && e.is_behind(cached.resource_version().as_deref()) {
            return Some(e.latest.clone());
        }
        self.entries.remove(&uid);
        None
    }

    /// Drops the entries of the set `set_uid` whose object the cache no longer shows at a
    /// version before the kept one (`cached` gives the cache's current version of an object
    /// by namespace and name),
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
            e.is_behind(cached(ns, &e.latest.name_any()).as_deref())
        });
    }

    /// The set is gone: nothing of it is kept.
    pub fn forget_set(&mut self, set_uid: &str) {
        self.entries.retain(|_, e| e.set_uid != set_uid);
    }

    /// Only the sets `keep` names are kept.
    pub fn retain_sets(&mut self, keep: impl Fn(&str) -> bool) {
        self.entries.retain(|_, e| keep(&e.set_uid));
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
    fn a_second_write_before_the_cache_caught_up_keeps_every_version_before_it() {
        let now = Instant::now();
        let mut f = Fresh::default();
        f.wrote("set", "10", pod("11", true), now);
        // The next pass read the kept copy (the cache still at 10) and wrote again.
        assert!(f.view(&pod("10", false), now).is_some());
        f.wrote("set", "10", pod("12", true), now);
        // The cache shows the first write now: still behind the second.
        let seen = f.view(&pod("11", true), now).expect("still behind");
        assert_eq!(seen.resource_version().as_deref(), Some("12"));
        // A pass whose cache showed 11 writes a third time: 10, 11 and 12 are all behind it.
        f.wrote("set", "11", pod("13", true), now);
        for v in ["10", "11", "12"] {
            assert!(f.view(&pod(v, true), now).is_some(), "{v} is behind 13");
        }
        // The cache shows the last write: trusted again.
        assert!(f.view(&pod("13", true), now).is_none());
        // A write from a version the entry does not know (someone else's) starts afresh.
        f.wrote("set", "10", pod("11", true), now);
        f.wrote("set", "20", pod("21", true), now);
        assert!(
            f.view(&pod("10", false), now).is_none(),
            "10 is not known to come before 21"
        );
    }

    #[test]
    fn an_entry_remembers_a_bounded_number_of_versions() {
        let now = Instant::now();
        let mut f = Fresh::default();
        f.wrote("set", "100", pod("101", true), now);
        // Pass after pass reads a cache still at 100 and writes again.
        for v in 101..200 {
            f.wrote("set", "100", pod(&(v + 1).to_string(), true), now);
        }
        let e = f.entries.values().next().expect("one entry");
        assert_eq!(e.behind.len(), BEHIND);
        assert_eq!(e.behind.first().map(String::as_str), Some("100"));
        assert_eq!(e.behind.last().map(String::as_str), Some("199"));
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
