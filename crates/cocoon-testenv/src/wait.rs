//! Deadline-bounded polling: every readiness check and every test synchronisation point
//! goes through here instead of fixed sleeps.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Interval between two polls of a condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What one poll of a condition observed.
#[derive(Debug)]
pub enum Probe<T> {
    /// The condition holds; stop polling.
    Ready(T),
    /// Not yet; the text describes what was seen (reported on timeout).
    NotYet(String),
    /// Waiting further is pointless (e.g. the process died).
    Fail(Error),
}

/// Polls `check` every [`POLL_INTERVAL`] until it is ready, fails, or `timeout` passes.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Probe<T>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last = String::from("nothing yet");
    loop {
        // Each attempt is itself bounded, so one hung request cannot overrun the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), check()).await {
            Ok(Probe::Ready(v)) => {
                tracing::debug!(what, elapsed = ?start.elapsed(), "ready");
                return Ok(v);
            }
            Ok(Probe::Fail(e)) => return Err(e),
            Ok(Probe::NotYet(seen)) => last = seen,
            Err(_) => last = format!("{last} (last attempt hung)"),
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now())))
            .await;
    }
}

/// Polls until `check` returns `Some`, for tests: `wait_until("pod bound", secs(30), ..)`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(what, timeout, || {
        let fut = check();
        async move {
            match fut.await {
                Some(v) => Probe::Ready(v),
                None => Probe::NotYet("condition false".into()),
            }
        }
    })
    .await
}
