//! Expected creates (controller-runtime's "expectations"): a pod this controller created a
//! moment ago that the pod cache does not show yet.
//!
//! A pass woken by one create (a sub-agent's, say) reads a cache that may not hold the pods
//! created beside it; without this memory it would post them again (409) and, for a toolbox,
//! read the pod past the cache to rule out a name collision. After a create returns Created
//! the set's UID and the pod's name are remembered until the cache shows that pod (by UID),
//! the set goes, or [`EXPECT_FOR`] passes; a pass that does not see an expected pod treats it
//! as existing and pending. Entries come only from this controller's own successful creates,
//! and each leaves by one of those three ways, so the memory stays bounded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::per_set::{Lapses, PerSet};

/// How long a created pod is expected before the cache is trusted again.
pub const EXPECT_FOR: Duration = Duration::from_secs(30);

/// One expected pod: the UID its create returned and when the expectation lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pod_uid: String,
    until: Instant,
}

impl Lapses for Entry {
    fn until(&self) -> Instant {
        self.until
    }
}

/// The expected creates of every set, by set UID, then pod name.
pub type Expected = PerSet<Entry>;

impl PerSet<Entry> {
    /// A create of `pod` (UID `pod_uid`) for the set `set_uid` returned Created at `now`.
    pub fn created(&mut self, set_uid: &str, pod: &str, pod_uid: &str, now: Instant) {
        self.insert(
            set_uid,
            pod,
            Entry {
                pod_uid: pod_uid.to_string(),
                until: now + EXPECT_FOR,
            },
        );
    }

    /// A pass of the set `set_uid` whose cache shows `cached` (pod name, UID): the entries
    /// the cache now shows leave, and so do the lapsed ones of every set. Returns the set's
    /// pods still pending (not in the cache yet), each with the time its expectation has left.
    pub fn observe<'a>(
        &mut self,
        set_uid: &str,
        cached: impl IntoIterator<Item = (&'a str, &'a str)>,
        now: Instant,
    ) -> BTreeMap<String, Duration> {
        self.settle(set_uid, now, |pods| {
            for (name, uid) in cached {
                if pods.get(name).is_some_and(|e| e.pod_uid == uid) {
                    pods.remove(name);
                }
            }
            pods.iter()
                .map(|(name, e)| (name.clone(), e.until.saturating_duration_since(now)))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_pod_is_pending_until_the_cache_shows_it_the_set_goes_or_30s_pass() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (what, cache shows (name, uid), seconds after the create, pending afterwards)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u64, &'a [&'a str]);
        let cases: &[Case<'_>] = &[
            (
                "not in the cache yet: pending",
                &[],
                1,
                &["demo-1", "demo-tb"],
            ),
            (
                "the cache shows one: the other stays pending",
                &[("demo-1", "u1")],
                1,
                &["demo-tb"],
            ),
            (
                "an older pod of the name (another UID) is not the created one",
                &[("demo-1", "old"), ("demo-tb", "u2")],
                1,
                &["demo-1"],
            ),
            (
                "lapsed after 30 s: the cache is trusted again",
                &[],
                30,
                &[],
            ),
        ];
        for (what, cached, after, want) in cases {
            let mut e = Expected::default();
            e.created("set", "demo-1", "u1", t0);
            e.created("set", "demo-tb", "u2", t0);
            let pending = e.observe("set", cached.iter().copied(), t0 + s(*after));
            let names: Vec<&str> = pending.keys().map(String::as_str).collect();
            assert_eq!(names, *want, "{what}");
            assert_eq!(e.len(), want.len(), "{what}: what leaves is gone");
        }
    }

    #[test]
    fn the_memory_is_bounded_seen_lapsed_and_gone_sets_leave() {
        let t0 = Instant::now();
        let mut e = Expected::default();
        e.created("a", "a-0", "ua", t0);
        e.created("b", "b-0", "ub", t0);
        e.created("c", "c-0", "uc", t0 + Duration::from_secs(20));
        // A pass of set c after 31 s: a's and b's entries have lapsed and go too.
        let pending = e.observe("c", [], t0 + Duration::from_secs(31));
        assert_eq!(
            pending,
            BTreeMap::from([("c-0".to_string(), Duration::from_secs(19))])
        );
        assert_eq!(e.len(), 1);
        e.forget_set("c");
        assert_eq!(e.len(), 0);
        // A set never created for has nothing pending and adds nothing.
        assert!(e.observe("z", [("z-0", "uz")], t0).is_empty());
        assert_eq!(e.len(), 0);
    }
}
