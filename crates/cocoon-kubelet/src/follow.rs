//! Followed logs (`follow=true`): one shared reader per pod, however many followers.
//!
//! The runtime answers tails only (`vm logs --tail N`), so a followed log is read again every
//! [`FOLLOW_POLL`]. Doing that once per follower made N followers cost N runtime calls (each
//! a `cocoon` process and a log capture) every half second; here the first follower of a pod
//! starts a [`Feed`] whose one task reads the tail, and every follower of the pod watches the
//! feed's latest [`Snap`]. The feed's task stops when its last follower leaves, when the pod
//! has no live VM any more, or when the server stops.
//!
//! Memory per pod is one snapshot (the tail, bounded by the log limits) plus, per follower,
//! a reference to the last snapshot it sent from; a follower that falls behind skips to the
//! newest snapshot (aligning with [`follow_from`]) instead of queueing old ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::limits::{KubeletLimits, SlotGuard, bound_log};
use super::{FOLLOW_POLL, FOLLOW_WINDOW, PodBackend, follow_from, log_lines};

/// One read of a followed log.
#[derive(Debug)]
pub(super) struct Snap {
    /// 0 for the lines the feed started from, then +1 per read that brought new lines.
    seq: u64,
    lines: Arc<Vec<String>>,
    /// Where the lines new since snapshot `seq - 1` start.
    new_from: usize,
}

/// Where one pod's followed log is read.
struct Target {
    backend: Arc<dyn PodBackend>,
    ns: String,
    pod: String,
    container: String,
    limits: KubeletLimits,
    /// The node's log-read permits: a read waits for its next turn when none is free.
    reads: Arc<tokio::sync::Semaphore>,
}

/// The shared reader of one pod's log; its task stops when the last follower drops it.
pub(super) struct Feed {
    key: String,
    feeds: Feeds,
    rx: watch::Receiver<Arc<Snap>>,
    stop: CancellationToken,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.cancel();
        let mut map = self.feeds.map();
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

/// The feeds of one server, by `namespace/pod`. Holds only feeds with a follower (a dead
/// entry is removed when its feed drops), so it is bounded by the follower limit.
#[derive(Clone, Default)]
pub(super) struct Feeds(Arc<Mutex<HashMap<String, Weak<Feed>>>>);

impl Feeds {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Feed>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pod's feed, started (from `first`, the lines the joining follower already has)
    /// when the pod has none.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn join(
        &self,
        backend: Arc<dyn PodBackend>,
        ns: &str,
        pod: &str,
        container: &str,
        limits: KubeletLimits,
        first: &[String],
        stopping: &CancellationToken,
        reads: Arc<tokio::sync::Semaphore>,
    ) -> Arc<Feed> {
        let key = format!("{ns}/{pod}");
        let mut map = self.map();
        // A feed whose task ended (the VM went away, a read failed) is replaced.
        if let Some(feed) = map.get(&key).and_then(Weak::upgrade)
            && feed.rx.has_changed().is_ok()
        {
            return feed;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let (tx, rx) = watch::channel(Arc::new(Snap {
            seq: 0,
            lines: Arc::new(first.to_vec()),
            new_from: first.len(),
        }));
        let stop = stopping.child_token();
        let target = Target {
            backend,
            ns: ns.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
            limits,
            reads,
        };
        tokio::spawn(read_feed(target, tx, stop.clone()));
        let feed = Arc::new(Feed {
            key: key.clone(),
            feeds: self.clone(),
            rx,
            stop,
        });
        map.insert(key, Arc::downgrade(&feed));
        feed
    }
}

/// The feed's task: reads the tail each [`FOLLOW_POLL`] and publishes a snapshot when it
/// brought new lines. Ends (closing every follower's stream) when the pod has no live VM, a
/// read fails, or `stop` is cancelled.
async fn read_feed(t: Target, tx: watch::Sender<Arc<Snap>>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(FOLLOW_POLL) => {}
        }
        let Ok(_permit) = t.reads.try_acquire() else {
            continue;
        };
        let read = tokio::select! {
            () = stop.cancelled() => return,
            r = t.backend.logs(&t.ns, &t.pod, &t.container, FOLLOW_WINDOW, t.limits.log_max_bytes) => r,
        };
        let body = match read {
            Ok(Some(body)) => body,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(namespace = %t.ns, pod = %t.pod, error = %e, "followed container logs failed");
                return;
            }
        };
        let lines = log_lines(&bound_log(
            &body,
            t.limits.log_max_bytes,
            t.limits.log_max_line_bytes,
        ));
        let prev = tx.borrow().clone();
        let from = follow_from(&prev.lines, &lines);
        if from < lines.len() {
            tx.send_replace(Arc::new(Snap {
                seq: prev.seq + 1,
                lines: Arc::new(lines),
                new_from: from,
            }));
        }
    }
}

/// One follower's stream: `first` (the lines it read itself), then what the pod's feed
/// brings, until the feed ends, the server stops, or nothing was sent for `idle` (zero:
/// never). Holds its follower slot and the pod side's stream token for its lifetime.
pub(super) fn body(
    feed: Arc<Feed>,
    first: Vec<u8>,
    slot: (SlotGuard, Option<super::StreamToken>),
    idle: Duration,
    stopping: CancellationToken,
    who: String,
) -> axum::body::Body {
    struct Follower {
        rx: watch::Receiver<Arc<Snap>>,
        seen: Arc<Vec<String>>,
        seen_seq: Option<u64>,
        first: Option<Vec<u8>>,
        last_sent: Instant,
        idle: Duration,
        stopping: CancellationToken,
        who: String,
        _feed: Arc<Feed>,
        _slot: (SlotGuard, Option<super::StreamToken>),
    }
    let mut rx = feed.rx.clone();
    // Whatever the feed holds now is aligned against `first` before anything newer.
    rx.mark_changed();
    let state = Follower {
        rx,
        seen: Arc::new(log_lines(&first)),
        seen_seq: None,
        first: Some(first),
        last_sent: Instant::now(),
        idle,
        stopping,
        who,
        _feed: feed,
        _slot: slot,
    };
    let stream = futures::stream::unfold(state, |mut f| async move {
        if let Some(first) = f.first.take() {
            f.last_sent = Instant::now();
            return Some((
                Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(first)),
                f,
            ));
        }
        loop {
            let idle = f.idle;
            let deadline = f.last_sent + idle;
            let idle_out = async move {
                if idle.is_zero() {
                    std::future::pending::<()>().await;
                } else {
                    tokio::time::sleep_until(deadline).await;
                }
            };
            tokio::select! {
                () = f.stopping.cancelled() => return None,
                () = idle_out => {
                    tracing::info!(pod = %f.who, idle = ?idle, "followed log idle for the streaming idle timeout; closing");
                    return None;
                }
                changed = f.rx.changed() => if changed.is_err() {
                    return None;
                },
            }
            let snap = f.rx.borrow_and_update().clone();
            let from = if f.seen_seq.is_some_and(|s| s + 1 == snap.seq) {
                snap.new_from
            } else {
                follow_from(&f.seen, &snap.lines)
            };
            f.seen = snap.lines.clone();
            f.seen_seq = Some(snap.seq);
            let mut chunk = String::new();
            for line in &snap.lines[from.min(snap.lines.len())..] {
                chunk.push_str(line);
                chunk.push('\n');
            }
            if !chunk.is_empty() {
                f.last_sent = Instant::now();
                return Some((Ok(axum::body::Bytes::from(chunk)), f));
            }
        }
    });
    axum::body::Body::from_stream(stream)
}
