//! Lifecycle intents (`node.md` §5.4): the per-pod record of the lifecycle triple this agent
//! means to publish, and the accept/drop rules every write goes through.
//!
//! `failed` is sticky at the same generation until a new attempt (`creating`/`hibernating`)
//! starts; writes for dead incarnations (another UID) are dropped.

use cocoon_api::contract::{Lifecycle, LifecycleState};

/// One pod's intent: the incarnation it belongs to, the wanted triple and what was flushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Pod UID the intent belongs to.
    pub uid: String,
    /// Wanted triple.
    pub lifecycle: Lifecycle,
    /// Snapshot string of the last successful flush (empty = never flushed).
    pub flushed: String,
    /// True when the current `failed` came from a hibernate attempt (used to lift it, §8.1).
    pub failed_by_hibernate: bool,
}

impl Intent {
    /// True when the wanted triple has not been flushed yet.
    pub fn dirty(&self) -> bool {
        self.flushed != snapshot(&self.lifecycle)
    }
}

/// The equality string of §5.4: `state \0 generation \0 message`.
pub fn snapshot(l: &Lifecycle) -> String {
    format!(
        "{}\x00{}\x00{}",
        l.state.map_or("", |s| s.as_str()),
        l.observed_generation,
        l.message
    )
}

/// Why a write was dropped (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Rule 1: a tracked pod with another UID exists.
    OtherIncarnationTracked,
    /// Rule 3: an intent for another UID exists and the pod is not tracked.
    OtherIncarnationIntent,
    /// Rule 4: the generation went backwards.
    Stale,
    /// Rule 5: `failed` is sticky.
    StickyFailed,
}

/// Rules 1–5 of §5.4. `tracked_uid` is the UID of the tracked pod under the key (if any),
/// `generation` the already computed observed generation of the new write.
pub fn accept(
    tracked_uid: Option<&str>,
    existing: Option<&Intent>,
    uid: &str,
    state: LifecycleState,
    generation: i64,
) -> Result<(), Drop> {
    if tracked_uid.is_some_and(|t| t != uid) {
        return Err(Drop::OtherIncarnationTracked);
    }
    let Some(cur) = existing else { return Ok(()) };
    if cur.uid != uid {
        return if tracked_uid.is_none() {
            Err(Drop::OtherIncarnationIntent)
        } else {
            // The tracked pod has this UID: the old intent is a leftover of a dead incarnation.
            Ok(())
        };
    }
    if generation < cur.lifecycle.observed_generation {
        return Err(Drop::Stale);
    }
    let new_attempt = matches!(
        state,
        LifecycleState::Failed | LifecycleState::Creating | LifecycleState::Hibernating
    );
    if cur.lifecycle.state == Some(LifecycleState::Failed)
        && !new_attempt
        && generation == cur.lifecycle.observed_generation
    {
        return Err(Drop::StickyFailed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use LifecycleState::*;

    fn intent(uid: &str, state: LifecycleState, generation: i64) -> Intent {
        Intent {
            uid: uid.into(),
            lifecycle: Lifecycle::new(state, generation, ""),
            flushed: String::new(),
            failed_by_hibernate: false,
        }
    }

    #[test]
    fn accept_rules_in_order() {
        // Rule 1: a tracked pod with a different UID → drop.
        assert_eq!(
            accept(Some("b"), None, "a", Ready, 1),
            Err(Drop::OtherIncarnationTracked)
        );
        // Rule 3: an intent for another UID and the pod is not tracked → drop.
        assert_eq!(
            accept(None, Some(&intent("b", Ready, 1)), "a", Ready, 1),
            Err(Drop::OtherIncarnationIntent)
        );
        // ... but a tracked pod of this UID replaces a dead incarnation's intent.
        assert_eq!(
            accept(Some("a"), Some(&intent("b", Ready, 1)), "a", Creating, 1),
            Ok(())
        );
        // Rule 4: lower generation → stale.
        assert_eq!(
            accept(Some("a"), Some(&intent("a", Ready, 3)), "a", Ready, 2),
            Err(Drop::Stale)
        );
        // Rule 5: failed is sticky at the same generation ...
        let failed = intent("a", Failed, 2);
        assert_eq!(
            accept(Some("a"), Some(&failed), "a", Ready, 2),
            Err(Drop::StickyFailed)
        );
        assert_eq!(
            accept(Some("a"), Some(&failed), "a", Hibernated, 2),
            Err(Drop::StickyFailed)
        );
        // ... until a new attempt starts, or the generation moves on.
        for s in [Failed, Creating, Hibernating] {
            assert_eq!(accept(Some("a"), Some(&failed), "a", s, 2), Ok(()), "{s}");
        }
        assert_eq!(accept(Some("a"), Some(&failed), "a", Ready, 3), Ok(()));
        // Rule 6: otherwise accept.
        assert_eq!(
            accept(Some("a"), Some(&intent("a", Creating, 1)), "a", Ready, 1),
            Ok(())
        );
        assert_eq!(accept(None, None, "a", Creating, 0), Ok(()));
    }

    #[test]
    fn snapshot_string_and_dirty() {
        let l = Lifecycle::new(Hibernated, 4, "x");
        assert_eq!(snapshot(&l), "hibernated\u{0}4\u{0}x");
        let mut i = intent("a", Hibernated, 4);
        assert!(i.dirty());
        i.flushed = snapshot(&i.lifecycle);
        assert!(!i.dirty());
    }
}
