//! Early notice of a change to the cocoon-net lease file (`VK_LEASES_PATH`), for the waits on
//! a DHCP lease: the probe warm-up of `node.md` §11.1 and the ready-after-IP poll of §6.9.
//!
//! Beyond the spec: those waits keep their intervals (100 ms × 1.5 warm-up, 200 ms poll) as
//! the fallback, and are cut short when the lease file changes, so a VM whose lease lands
//! 100 ms after its boot is Ready then, not at the next tick of a schedule. While anything
//! waits, one task per agent compares the file's (inode, length, mtime) every `every`; with
//! nobody waiting it sleeps. A change missed between two checks only costs the fallback
//! interval, never a wrong answer: the waiter re-resolves the IP itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// How often the lease file is checked while something waits on it.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);

/// The lease file's identity and version as `stat` reports it.
type Fingerprint = Option<(u64, u64, Option<SystemTime>)>;

fn fingerprint(path: &std::path::Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()))
}

/// Change notices of one lease file.
pub struct LeaseWatch {
    path: PathBuf,
    every: Duration,
    shutdown: CancellationToken,
    changes: watch::Sender<u64>,
    waiting: AtomicUsize,
    someone_waits: Notify,
    started: AtomicBool,
}

impl LeaseWatch {
    /// Watches `path` until `shutdown`, checking every `every` while something waits. The
    /// checking task starts with the first wait (inside the runtime).
    pub fn new(path: PathBuf, every: Duration, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(LeaseWatch {
            path,
            every,
            shutdown,
            changes: watch::channel(0).0,
            waiting: AtomicUsize::new(0),
            someone_waits: Notify::new(),
            started: AtomicBool::new(false),
        })
    }

    fn spawn_checks(self: &Arc<Self>) {
        // Read now, not when the task first runs: a change between the first wait and then
        // is a change.
        let mut last = fingerprint(&self.path);
        let w = self.clone();
        tokio::spawn(async move {
            loop {
                let wakeup = w.someone_waits.notified();
                if w.waiting.load(Ordering::Acquire) == 0 {
                    tokio::select! {
                        _ = w.shutdown.cancelled() => return,
                        _ = wakeup => {}
                    }
                }
                let now = fingerprint(&w.path);
                if now != last {
                    last = now;
                    w.changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                tokio::select! {
                    _ = w.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(w.every) => {}
                }
            }
        });
    }

    /// A wait for the next change after this call: take it **before** looking at the lease,
    /// so a change that lands while the caller looks is not missed.
    pub fn wait(self: &Arc<Self>) -> LeaseWait {
        let rx = self.changes.subscribe();
        if !self.started.swap(true, Ordering::AcqRel) {
            self.spawn_checks();
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.someone_waits.notify_one();
        LeaseWait {
            rx,
            watch: self.clone(),
        }
    }
}

/// One pending wait ([`LeaseWatch::wait`]); dropping it stops the checks once nothing waits.
pub struct LeaseWait {
    rx: watch::Receiver<u64>,
    watch: Arc<LeaseWatch>,
}

impl LeaseWait {
    /// Resolves once the lease file changed after the wait was taken.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for LeaseWait {
    fn drop(&mut self) {
        self.watch.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_resolves_when_the_file_is_replaced_and_not_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leases.json");
        std::fs::write(&path, b"[]").expect("write");
        let stop = CancellationToken::new();
        let lw = LeaseWatch::new(path.clone(), Duration::from_millis(1), stop.clone());
        let mut w = lw.wait();
        // Nothing changed: the wait is still pending after many checks.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(
            futures::FutureExt::now_or_never(w.changed()).is_none(),
            "no change, no notice"
        );
        // Replaced atomically, as cocoon-net (and the simulated runtime) writes it.
        let tmp = dir.path().join("leases.json.tmp");
        std::fs::write(&tmp, br#"[{"mac":"aa","ip":"10.0.0.2","expiry":"x"}]"#).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        tokio::time::timeout(Duration::from_secs(30), w.changed())
            .await
            .expect("the change is noticed");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_dropped_wait_stops_counting_and_a_new_one_sees_a_later_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leases.json");
        let stop = CancellationToken::new();
        let lw = LeaseWatch::new(path.clone(), Duration::from_millis(1), stop.clone());
        {
            let _w = lw.wait();
        }
        assert_eq!(
            lw.waiting.load(Ordering::Acquire),
            0,
            "a dropped wait is gone"
        );
        std::fs::write(&path, b"[]").expect("write");
        let mut w = lw.wait();
        std::fs::write(&path, b"[ ]").expect("write");
        tokio::time::timeout(Duration::from_secs(30), w.changed())
            .await
            .expect("a change after the wait is noticed");
        stop.cancel();
    }
}
