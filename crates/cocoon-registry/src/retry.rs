//! Retries with exponential backoff for transient errors only (transport, 5xx, 408, 429):
//! the pure delay decision, and the loop that applies it to an async call.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// How transient failures are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 = no retry).
    pub attempts: u32,
    /// Delay before the first retry; doubled for each further retry.
    pub base_delay: Duration,
    /// Upper bound of one delay (also caps a registry's `Retry-After`).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..Default::default()
        }
    }

    /// The delay before attempt `failed + 1` after `failed` failed attempts ending in `err`, or
    /// `None` when the call must not be retried. `jitter` in `[0, 1)` spreads concurrent
    /// retries (the delay is scaled into `[0.5, 1.0)` of its nominal value).
    pub fn delay_after(&self, failed: u32, err: &Error, jitter: f64) -> Option<Duration> {
        if failed >= self.attempts || !err.is_transient() {
            return None;
        }
        if let Some(ra) = err.retry_after() {
            return Some(ra.min(self.max_delay));
        }
        let exp = failed.saturating_sub(1).min(20);
        let nominal = self
            .base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        let scale = 0.5 + 0.5 * jitter.clamp(0.0, 0.999);
        Some(nominal.mul_f64(scale))
    }
}

/// A cheap jitter source in `[0, 1)`; no need for cryptographic randomness here.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let v = RandomState::new().hash_one(std::time::Instant::now());
    (v % 10_000) as f64 / 10_000.0
}

/// Runs `call` until it succeeds, fails permanently, or the attempts are used up.
/// `what` names the call in logs.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut failed = 0;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                failed += 1;
                match policy.delay_after(failed, &e, jitter()) {
                    Some(d) => {
                        tracing::debug!(what, attempt = failed, delay_ms = d.as_millis() as u64, error = %e, "retrying");
                        tokio::time::sleep(d).await;
                    }
                    None => return Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_from_status;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
        }
    }

    #[test]
    fn transient_errors_back_off_exponentially_up_to_the_cap() {
        let e = Error::transport("reset");
        let p = policy();
        // jitter 0.999 ≈ the nominal delay.
        let d: Vec<_> = (1..=4).map(|n| p.delay_after(n, &e, 0.999)).collect();
        assert!(
            d[0].is_some_and(|d| d > Duration::from_millis(99) && d <= Duration::from_millis(100))
        );
        assert!(
            d[1].is_some_and(|d| d > Duration::from_millis(199) && d <= Duration::from_millis(200))
        );
        assert!(
            d[2].is_some_and(|d| d > Duration::from_millis(349) && d <= Duration::from_millis(350))
        );
        assert_eq!(d[3], None, "attempts are used up");
    }

    #[test]
    fn jitter_stays_within_half_to_full_delay() {
        let e = Error::transport("reset");
        let p = policy();
        assert_eq!(p.delay_after(1, &e, 0.0), Some(Duration::from_millis(50)));
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let p = policy();
        for status in [400u16, 401, 403, 404, 405, 501] {
            let e = error_from_status("manifest", status, b"", None);
            assert_eq!(p.delay_after(1, &e, 0.5), None, "{status}");
        }
        assert_eq!(p.delay_after(1, &Error::invalid("tag", "bad"), 0.5), None);
    }

    #[test]
    fn retry_after_of_a_429_is_honoured_but_capped() {
        let p = policy();
        let e = error_from_status("blob", 429, b"", Some(Duration::from_millis(120)));
        assert_eq!(p.delay_after(1, &e, 0.5), Some(Duration::from_millis(120)));
        let e = error_from_status("blob", 429, b"", Some(Duration::from_secs(60)));
        assert_eq!(p.delay_after(1, &e, 0.5), Some(Duration::from_millis(350)));
    }

    #[tokio::test]
    async fn retry_stops_at_the_first_success_or_permanent_error() {
        let p = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        };
        let mut calls = 0;
        let r: Result<u32> = retry(&p, "t", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(Error::transport("reset"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r.ok(), Some(3));

        let mut calls = 0;
        let r: Result<u32> = retry(&p, "t", || {
            calls += 1;
            async { Err(error_from_status("manifest", 404, b"", None)) }
        })
        .await;
        assert!(r.is_err_and(|e| e.is_not_found()));
        assert_eq!(calls, 1);
    }
}
