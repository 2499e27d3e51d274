//! The open sessions per pod ([`Sessions`]) and the exec wake gate ([`WakeGate`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The shortest time between two `wake-request` writes on one pod, however many execs ask.
pub const WAKE_REQUEST_GAP: Duration = Duration::from_secs(5);

/// Open streams (exec sessions, followed logs) per pod, `<namespace>/<name>`. Holds only pods
/// with a stream open, so it is as bounded as the kubelet API's session limits.
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, usize>>>);

impl Sessions {
    fn table(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A stream of `key` opened; it counts until the guard is dropped.
    pub fn open(&self, key: &str) -> SessionGuard {
        *self.table().entry(key.to_owned()).or_insert(0) += 1;
        SessionGuard {
            sessions: self.clone(),
            key: key.to_owned(),
        }
    }

    /// Streams of `key` open now.
    pub fn count(&self, key: &str) -> usize {
        self.table().get(key).copied().unwrap_or(0)
    }

    /// Pods with a stream open.
    pub fn pods(&self) -> usize {
        self.table().len()
    }
}

/// One open stream of a [`Sessions`] table, closed on drop.
#[derive(Debug)]
pub struct SessionGuard {
    sessions: Sessions,
    key: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut t = self.sessions.table();
        if let Some(n) = t.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.remove(&self.key);
            }
        }
    }
}

/// Which pods had a `wake-request` written in the last `gap`: [`WakeGate::admit`] says
/// whether one more may be written now. Entries older than `gap` are dropped on every call,
/// so the table holds only the pods written to within the last `gap`.
#[derive(Debug)]
pub struct WakeGate {
    gap: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl Default for WakeGate {
    fn default() -> Self {
        Self::new(WAKE_REQUEST_GAP)
    }
}

impl WakeGate {
    pub fn new(gap: Duration) -> Self {
        WakeGate {
            gap,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// May `key` get a `wake-request` write at `now`? Yes records the write.
    pub fn admit(&self, key: &str, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.retain(|_, t| now.saturating_duration_since(*t) < self.gap);
        if last.contains_key(key) {
            return false;
        }
        last.insert(key.to_owned(), now);
        true
    }

    /// Pods written to within the gap.
    pub fn len(&self) -> usize {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_count_while_their_guards_live_and_leave_no_entry_behind() {
        let s = Sessions::default();
        let a = s.open("ns/p");
        let b = s.open("ns/p");
        let c = s.open("other/p");
        assert_eq!(
            (s.count("ns/p"), s.count("other/p"), s.count("ns/q")),
            (2, 1, 0)
        );
        drop(a);
        assert_eq!(s.count("ns/p"), 1);
        drop((b, c));
        assert_eq!((s.count("ns/p"), s.pods()), (0, 0));
    }

    #[test]
    fn one_wake_request_per_pod_per_gap_however_many_execs_ask() {
        let gate = WakeGate::new(Duration::from_secs(5));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let admitted = (0..1000).filter(|i| gate.admit("ns/p", at(*i))).count();
        assert_eq!(admitted, 1, "a flood within the gap: one write");
        assert!(gate.admit("ns/q", at(10)), "another pod has its own gap");
        assert!(!gate.admit("ns/p", at(4_999)));
        assert!(gate.admit("ns/p", at(5_000)), "the gap is over");
        assert!(gate.admit("ns/q", at(20_000)));
        assert_eq!(gate.len(), 1, "old entries are dropped");
    }
}
