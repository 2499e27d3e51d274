//! A main loop's sign of life for the node agent's systemd watchdog: the kubelet API's accept
//! loop beats one (the agent registers it with its watchdog, `cocoon_node::systemd`), and the
//! agent's other loops use the same type.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often the event-driven loops (pod watch, kubelet accept) beat while idle.
pub const BEAT_EVERY: Duration = Duration::from_secs(5);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn millis_since_epoch(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
struct Beat {
    name: &'static str,
    period: Duration,
    last_ms: AtomicU64,
}

/// A main loop's sign of life: the loop calls [`Heartbeat::beat`] at least every `period`
/// while it turns. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Heartbeat(Arc<Beat>);

impl Heartbeat {
    /// A heartbeat that has just beaten.
    pub fn new(name: &'static str, period: Duration) -> Self {
        let hb = Heartbeat(Arc::new(Beat {
            name,
            period,
            last_ms: AtomicU64::new(0),
        }));
        hb.beat();
        hb
    }

    /// The loop is alive now.
    pub fn beat(&self) {
        self.0
            .last_ms
            .store(millis_since_epoch(Instant::now()), Ordering::Relaxed);
    }

    /// How long ago the loop beat, at `now` (the facts the watchdog decides on).
    pub fn observe(&self, now: Instant) -> LoopAge {
        let last = self.0.last_ms.load(Ordering::Relaxed);
        LoopAge {
            name: self.0.name,
            period: self.0.period,
            age: Duration::from_millis(millis_since_epoch(now).saturating_sub(last)),
        }
    }
}

/// How long ago a loop beat, and how often it promised to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopAge {
    pub name: &'static str,
    pub period: Duration,
    pub age: Duration,
}
