//! The CocoonSet loop's intervals and rebuild budget (`cocoonset.md` §6); tests may shrink
//! them.

use std::time::Duration;

/// The loop's intervals and budget; tests may shrink them.
#[derive(Debug, Clone)]
pub struct Timing {
    /// After a pass that changed something.
    pub requeue_after_write: Duration,
    /// Waiting for the main to exist or become Ready, and for owned pods to go at teardown.
    pub wait_for_main: Duration,
    /// Rebuild backoff by prior rebuild count (the last entry repeats).
    pub rebuild_backoff: Vec<Duration>,
    /// Rebuilds before dead-letter.
    pub rebuild_budget: u32,
    /// Sub-agent creates in flight at once.
    pub create_fanout: usize,
    /// Polling while Suspending / Suspended (step 6).
    pub suspend_poll: Duration,
    /// Polling of the migration and the release wake (steps 8 and 9).
    pub migrate_poll: Duration,
    /// How long a set may stay Suspending before it reports Failed (6C).
    pub suspend_deadline: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            requeue_after_write: Duration::from_secs(1),
            wait_for_main: Duration::from_secs(5),
            rebuild_backoff: vec![
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(30),
            ],
            rebuild_budget: 4,
            create_fanout: 8,
            suspend_poll: Duration::from_secs(5),
            migrate_poll: Duration::from_secs(5),
            suspend_deadline: Duration::from_secs(180),
        }
    }
}

impl Timing {
    /// The backoff owed after `count` prior rebuilds.
    pub fn backoff(&self, count: i64) -> Duration {
        let i = usize::try_from(count.max(0)).unwrap_or(usize::MAX);
        self.rebuild_backoff
            .get(i)
            .or(self.rebuild_backoff.last())
            .copied()
            .unwrap_or_default()
    }
}
