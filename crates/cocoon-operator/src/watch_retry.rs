//! Watch filtering and retry, shared by both controllers: the watch filter that wakes a
//! controller only when the part of an object it looks at changed, the bound on a step's
//! fan-out, and the per-object retry backoff after a failed pass.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Resource, ResourceExt};

/// The identity of an object across its watch events: its UID, else its name.
pub fn object_key<K: Resource>(obj: &K) -> String {
    obj.uid().unwrap_or_else(|| obj.name_any())
}

/// A stable hash of the parts of an object a controller reacts to.
pub fn fingerprint(parts: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// Passes deletes, and creates or updates whose `fingerprint` differs from the last one seen
/// for the object; relists of unchanged objects and bookkeeping events pass nothing.
pub fn changed_only<K>(
    events: impl Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send + 'static,
    fingerprint: impl Fn(&K) -> u64 + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    events.filter_map(move |ev| {
        let out = match ev {
            Err(e) => Some(Err(e)),
            Ok(WatchEvent::Apply(obj) | WatchEvent::InitApply(obj)) => {
                let fp = fingerprint(&obj);
                match seen.insert(object_key(&obj), fp) {
                    Some(prev) if prev == fp => None,
                    _ => Some(Ok(obj)),
                }
            }
            Ok(WatchEvent::Delete(obj)) => {
                seen.remove(&object_key(&obj));
                Some(Ok(obj))
            }
            Ok(WatchEvent::Init | WatchEvent::InitDone) => None,
        };
        futures::future::ready(out)
    })
}

/// Runs `futures` with at most `limit` in flight (at least one), and returns their outputs
/// in input order: a fan-out over every pod of a set stays bounded however large the set.
pub async fn at_most<F: Future>(limit: usize, futures: Vec<F>) -> Vec<F::Output> {
    futures::stream::iter(futures)
        .buffered(limit.max(1))
        .collect()
        .await
}

/// Per-object failure counts: 400 ms after the first failed pass, doubling to a minute (as
/// controller-runtime's per-item backoff), back to the start after a pass that succeeds.
#[derive(Debug, Default)]
pub struct RetryBackoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl RetryBackoff {
    /// Counts a failed pass of `key`; returns how long to wait before the next.
    pub fn failed(&self, key: String) -> Duration {
        let attempts = self
            .failures
            .lock()
            .map(|mut m| {
                let n = m.entry(key).or_insert(0);
                *n = n.saturating_add(1);
                *n
            })
            .unwrap_or(1);
        Duration::from_millis(200u64.saturating_mul(1 << attempts.min(9)))
            .min(Duration::from_secs(60))
    }

    /// A pass of `key` succeeded.
    pub fn succeeded(&self, key: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(uid: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{uid}")),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn backoff_doubles_to_a_minute_and_resets_on_success() {
        let b = RetryBackoff::default();
        let delays: Vec<_> = (0..12).map(|_| b.failed("a".into())).collect();
        assert_eq!(delays[0], Duration::from_millis(400));
        assert_eq!(delays[1], Duration::from_millis(800));
        assert_eq!(delays[7], Duration::from_millis(51_200));
        assert!(delays[8..].iter().all(|d| *d == Duration::from_secs(60)));
        assert_eq!(
            b.failed("b".into()),
            Duration::from_millis(400),
            "per object"
        );
        b.succeeded("a");
        assert_eq!(b.failed("a".into()), Duration::from_millis(400));
    }

    #[tokio::test]
    async fn at_most_bounds_the_futures_in_flight_and_keeps_the_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (now, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let job = |i: usize| {
            let (now, peak) = (&now, &peak);
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                // Stay in flight across a few polls, finishing out of order.
                for _ in 0..(i % 5) + 1 {
                    tokio::task::yield_now().await;
                }
                now.fetch_sub(1, Ordering::SeqCst);
                i
            }
        };
        let out = at_most(8, (0..30).map(job).collect()).await;
        assert_eq!(out, (0..30).collect::<Vec<_>>());
        assert_eq!(
            peak.load(Ordering::SeqCst),
            8,
            "eight in flight, never more"
        );
        peak.store(0, Ordering::SeqCst);
        let out = at_most(0, (0..3).map(job).collect()).await;
        assert_eq!(out, [0, 1, 2]);
        assert_eq!(
            peak.load(Ordering::SeqCst),
            1,
            "a zero limit still runs one"
        );
    }

    #[tokio::test]
    async fn only_changes_of_the_fingerprinted_part_pass() {
        let events = futures::stream::iter(vec![
            Ok(WatchEvent::Init),
            Ok(WatchEvent::InitApply(cm("1", "x"))),
            Ok(WatchEvent::InitDone),
            Ok(WatchEvent::Apply(cm("1", "x"))),
            Ok(WatchEvent::Apply(cm("1", "y"))),
            Ok(WatchEvent::Apply(cm("2", "y"))),
            Ok(WatchEvent::Delete(cm("1", "y"))),
            Ok(WatchEvent::Apply(cm("1", "y"))),
        ]);
        let passed: Vec<(String, String)> = changed_only(events, |c: &ConfigMap| {
            fingerprint(c.data.as_ref().and_then(|d| d.get("k")))
        })
        .map(|r| {
            let c = r.expect("no errors");
            let v = c.data.as_ref().and_then(|d| d.get("k")).cloned();
            (c.uid().unwrap_or_default(), v.unwrap_or_default())
        })
        .collect()
        .await;
        assert_eq!(
            passed,
            [
                ("1", "x"), // first sight
                ("1", "y"), // changed
                ("2", "y"), // another object
                ("1", "y"), // the delete
                ("1", "y"), // seen anew after the delete
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }
}
