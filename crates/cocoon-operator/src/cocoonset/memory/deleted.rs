//! Expected deletes: a pod this controller deleted a moment ago that the pod cache still shows
//! as it was before (no `deletionTimestamp`).
//!
//! Teardown deletes every owned pod the cache shows that is not already terminating. The watch
//! events of those deletes arrive a moment later: a pass woken by the first pod's event may
//! read a cache that still shows the others as they were, and would delete them again (a
//! write each, and a 404 for a pod the node agent already removed). After a delete succeeds
//! (or answers NotFound) the set's UID and the pod's UID are remembered until the cache shows
//! that pod terminating or no longer shows it, the set goes, or [`EXPECT_FOR`] passes; a pass
//! treats a remembered pod as already deleted. Entries come only from this controller's own
//! deletes and each leaves by one of those ways, so the memory stays bounded.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::per_set::PerSet;

/// How long a deleted pod is expected to show terminating before the cache is trusted again
/// (another delete of it is harmless: the pod is going either way).
pub const EXPECT_FOR: Duration = Duration::from_secs(30);

/// The expected deletes of every set, by set UID, then pod UID, with when each lapses.
pub type Deleted = PerSet<Instant>;

/// A pod as the cache shows it: its UID and whether it carries a `deletionTimestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached<'a> {
    pub uid: &'a str,
    pub terminating: bool,
}

impl PerSet<Instant> {
    /// A delete of the pod `pod_uid` of the set `set_uid` succeeded at `now`.
    pub fn deleted(&mut self, set_uid: &str, pod_uid: &str, now: Instant) {
        self.insert(set_uid, pod_uid, now + EXPECT_FOR);
    }

    /// A pass of the set `set_uid` whose cache shows its pods `cached`: the entries the cache
    /// has caught up with (the pod terminating, or absent) leave, and so do the lapsed ones of
    /// every set. Returns the UIDs of the set's pods deleted that the cache still shows as
    /// they were.
    pub fn observe<'a>(
        &mut self,
        set_uid: &str,
        cached: impl IntoIterator<Item = Cached<'a>>,
        now: Instant,
    ) -> BTreeSet<String> {
        self.settle(set_uid, now, |pods| {
            let behind: BTreeSet<&str> = cached
                .into_iter()
                .filter(|p| !p.terminating)
                .map(|p| p.uid)
                .collect();
            pods.retain(|uid, _| behind.contains(uid.as_str()));
            pods.keys().cloned().collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shows(uid: &str, terminating: bool) -> Cached<'_> {
        Cached { uid, terminating }
    }

    #[test]
    fn a_deleted_pod_counts_as_deleted_until_the_cache_shows_it_going_or_gone_or_30s_pass() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (what, cache shows, seconds after the delete, still expected afterwards)
        type Case<'a> = (&'a str, &'a [Cached<'a>], u64, &'a [&'a str]);
        let cases: &[Case<'_>] = &[
            (
                "the cache still shows both as they were: both expected",
                &[shows("u0", false), shows("u1", false)],
                1,
                &["u0", "u1"],
            ),
            (
                "the cache shows one terminating: it leaves",
                &[shows("u0", true), shows("u1", false)],
                1,
                &["u1"],
            ),
            (
                "the cache no longer shows one: it leaves",
                &[shows("u1", false)],
                1,
                &["u1"],
            ),
            (
                "lapsed after 30 s: the cache is trusted again",
                &[shows("u0", false), shows("u1", false)],
                30,
                &[],
            ),
        ];
        for (what, cached, after, want) in cases {
            let mut d = Deleted::default();
            d.deleted("set", "u0", t0);
            d.deleted("set", "u1", t0);
            let pending = d.observe("set", cached.iter().copied(), t0 + s(*after));
            let got: Vec<&str> = pending.iter().map(String::as_str).collect();
            assert_eq!(got, *want, "{what}");
            assert_eq!(d.len(), want.len(), "{what}: what leaves is gone");
        }
    }

    #[test]
    fn the_memory_is_bounded_seen_lapsed_and_gone_sets_leave() {
        let t0 = Instant::now();
        let mut d = Deleted::default();
        d.deleted("a", "ua", t0);
        d.deleted("b", "ub", t0);
        d.deleted("c", "uc", t0 + Duration::from_secs(20));
        // A pass of set c after 31 s: a's and b's entries have lapsed and go too.
        let pending = d.observe("c", [shows("uc", false)], t0 + Duration::from_secs(31));
        assert_eq!(pending, BTreeSet::from(["uc".to_string()]));
        assert_eq!(d.len(), 1);
        d.forget_set("c");
        assert!(d.is_empty() && !d.has_set("c"));
        // A set nothing was deleted for has nothing expected and adds nothing.
        assert!(d.observe("z", [shows("uz", false)], t0).is_empty());
        assert_eq!(d.len(), 0);
        d.deleted("y", "uy", t0);
        d.retain_sets(|uid| uid != "y");
        assert!(d.is_empty());
    }
}
