//! What the controller remembers of its own recent writes, per set: entries by set UID, then
//! by pod (name or UID), each lapsing at an instant. Shared by the expected creates
//! ([`super::expected`]) and the expected deletes ([`super::deleted`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// An entry that lapses at an instant.
pub trait Lapses {
    /// When the entry stops counting.
    fn until(&self) -> Instant;
}

impl Lapses for Instant {
    fn until(&self) -> Instant {
        *self
    }
}

/// Entries of every set, by set UID, then pod key.
#[derive(Debug)]
pub struct PerSet<V> {
    sets: HashMap<String, BTreeMap<String, V>>,
}

impl<V> Default for PerSet<V> {
    fn default() -> Self {
        PerSet {
            sets: HashMap::new(),
        }
    }
}

impl<V: Lapses> PerSet<V> {
    /// Remembers `value` under `key` for the set `set_uid`.
    pub fn insert(&mut self, set_uid: &str, key: &str, value: V) {
        self.sets
            .entry(set_uid.to_string())
            .or_default()
            .insert(key.to_string(), value);
    }

    /// Drops the entries of every set that lapsed by `now`, then hands the set `set_uid`'s
    /// entries (if any) to `settle`, whose answer is returned; a set left without entries
    /// leaves.
    pub fn settle<R: Default>(
        &mut self,
        set_uid: &str,
        now: Instant,
        settle: impl FnOnce(&mut BTreeMap<String, V>) -> R,
    ) -> R {
        self.sets.retain(|_, pods| {
            pods.retain(|_, v| v.until() > now);
            !pods.is_empty()
        });
        let Some(pods) = self.sets.get_mut(set_uid) else {
            return R::default();
        };
        let answer = settle(pods);
        if pods.is_empty() {
            self.sets.remove(set_uid);
        }
        answer
    }

    /// The set is gone: nothing of it is remembered any more.
    pub fn forget_set(&mut self, set_uid: &str) {
        self.sets.remove(set_uid);
    }

    /// Only the sets `keep` names are remembered.
    pub fn retain_sets(&mut self, keep: impl Fn(&str) -> bool) {
        self.sets.retain(|uid, _| keep(uid));
    }

    /// Whether anything of the set `set_uid` is remembered.
    pub fn has_set(&self, set_uid: &str) -> bool {
        self.sets.contains_key(set_uid)
    }

    /// Entries over all sets.
    pub fn len(&self) -> usize {
        self.sets.values().map(BTreeMap::len).sum()
    }

    /// Nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }
}
