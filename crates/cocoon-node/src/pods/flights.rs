//! Per-key async locks (single flights, the status lock): the holder of a key's lock
//! re-checks the local store, so concurrent callers end up doing the work once.
//!
//! Keys come from outside input (pod keys, image strings, snapshot names), so a lock lives
//! only while somebody holds or waits for it: every lookup drops the locks nobody else has a
//! handle to. The table is then as large as the work in flight, not as the agent's history.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One key's lock.
pub type FlightLock = Arc<tokio::sync::Mutex<()>>;

/// The locks in use, by key.
#[derive(Debug, Default)]
pub struct Flights {
    locks: Mutex<HashMap<String, FlightLock>>,
}

impl Flights {
    /// The lock of `key`, shared with every caller that holds a handle to it now; the locks
    /// no caller holds a handle to leave the table.
    pub fn get(&self, key: &str) -> FlightLock {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.retain(|k, l| k == key || Arc::strong_count(l) > 1);
        locks.entry(key.to_owned()).or_default().clone()
    }

    /// How many locks the table holds.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.locks.lock().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn callers_of_one_key_share_its_lock_while_any_holds_a_handle() {
        let f = Flights::default();
        let a = f.get("image ubuntu:24.04");
        let b = f.get("image ubuntu:24.04");
        assert!(Arc::ptr_eq(&a, &b));
        let held = a.lock().await;
        assert!(
            b.try_lock().is_err(),
            "the second caller waits for the first"
        );
        drop(held);
        assert!(b.try_lock().is_ok());
    }

    #[test]
    fn the_table_holds_the_locks_in_use_not_every_key_ever_seen() {
        let f = Flights::default();
        let kept = f.get("status:ns/kept");
        for i in 0..10_000 {
            let _l = f.get(&format!("status:ns/pod-{i}"));
        }
        assert_eq!(f.held(), 2, "the one still held and the last one asked for");
        let again = f.get("status:ns/kept");
        assert!(
            Arc::ptr_eq(&kept, &again),
            "a lock in use is never replaced"
        );
        drop((kept, again));
        let _other = f.get("other");
        assert_eq!(f.held(), 1);
    }
}
