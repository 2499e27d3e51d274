//! The pod controller duties (`node.md` §3): watch the pods bound to this node, serialise the
//! operations per pod, retry with per-pod backoff, force-delete after DeletePod, and run the
//! lifecycle and status-drift reconcilers.
//!
//! Each pod key has one worker task fed through a `watch` channel, so bursts of updates
//! coalesce into the latest object and different pods proceed in parallel.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_api::contract::LifecycleState;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Handler, PodError, not_found, pod_key, status};
use crate::systemd::{BEAT_EVERY, Heartbeat};

type Workers = Arc<Mutex<HashMap<String, watch::Sender<Option<Pod>>>>>;

fn lock(w: &Workers) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Option<Pod>>>> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Runs the pod controller until `handler.shutdown` fires.
pub async fn run(handler: Arc<Handler>) {
    let workers: Workers = Arc::default();
    let api: Api<Pod> = Api::all(handler.api.client().clone());
    let cfg =
        watcher::Config::default().fields(&format!("spec.nodeName={}", handler.cfg.node_name));
    // The tracked copy of each pod keeps what the agent reads: never `managedFields`.
    let mut stream = watcher::watcher(api, cfg)
        .default_backoff()
        .modify(|pod| pod.metadata.managed_fields = None)
        .boxed();
    let mut relist = Relist::default();
    handler.spawn(lifecycle_reconciler(handler.clone()));
    handler.spawn(drift_reconciler(handler.clone()));
    // The systemd watchdog's view of this loop: it beats on every event and on an idle tick.
    let beat = Heartbeat::new("pod watch", BEAT_EVERY);
    handler.liveness.register(beat.clone());
    let mut idle = tokio::time::interval(BEAT_EVERY);
    loop {
        beat.beat();
        let next = tokio::select! {
            _ = handler.shutdown.cancelled() => break,
            _ = idle.tick() => continue,
            n = stream.try_next() => n,
        };
        let event = match next {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(e) => {
                warn!(error = %e, "pod watch error");
                continue;
            }
        };
        // Tracked pods that vanished while the watch was down get a local DeletePod.
        for key in relist.observe(&event, || handler.tracked_keys()) {
            feed(&handler, &workers, key, None);
        }
        match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                feed(&handler, &workers, pod_key(&pod), Some(pod));
            }
            Event::Delete(pod) => feed(&handler, &workers, pod_key(&pod), None),
            Event::Init | Event::InitDone => {}
        }
    }
    info!("pod controller stopped");
}

/// The pod keys one relist returned (`Init`, `InitApply`…, `InitDone`), to find the tracked
/// pods that vanished while the watch was down. Only `InitApply` events are remembered, and
/// the set is dropped at `InitDone`, so it holds at most one list's keys and nothing between
/// relists, however many events the watch delivers.
#[derive(Debug, Default)]
struct Relist {
    listed: HashSet<String>,
}

impl Relist {
    /// Feeds one watch event; at `InitDone`, returns the keys of `tracked` the list did not
    /// return (called only then).
    fn observe(
        &mut self,
        event: &Event<Pod>,
        tracked: impl FnOnce() -> Vec<String>,
    ) -> Vec<String> {
        match event {
            Event::Init => self.listed.clear(),
            Event::InitApply(obj) => {
                self.listed.insert(pod_key(obj));
            }
            Event::InitDone => {
                let listed = std::mem::take(&mut self.listed);
                return tracked()
                    .into_iter()
                    .filter(|k| !listed.contains(k))
                    .collect();
            }
            Event::Apply(_) | Event::Delete(_) => {}
        }
        Vec::new()
    }

    /// Keys remembered right now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.listed.len()
    }
}

fn feed(handler: &Arc<Handler>, workers: &Workers, key: String, pod: Option<Pod>) {
    let mut w = lock(workers);
    if let Some(tx) = w.get(&key) {
        tx.send_replace(pod);
        return;
    }
    let (tx, rx) = watch::channel(pod);
    w.insert(key.clone(), tx);
    let h = handler.clone();
    let ws = workers.clone();
    handler.spawn(worker(h, ws, key, rx));
}

/// What one pass over the latest object did.
enum Pass {
    /// The pod vanished and was cleaned up: the worker ends.
    Gone,
    /// Handled; wait for the next change.
    Done,
}

async fn process(h: &Arc<Handler>, key: &str, pod: Option<Pod>) -> Result<Pass, PodError> {
    let Some(pod) = pod else {
        if let Some(tracked) = h.tracked_pod(key) {
            h.delete_pod(&tracked).await?;
        }
        return Ok(Pass::Gone);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        h.delete_pod(&pod).await?;
        let api: Api<Pod> = Api::namespaced(
            h.api.client().clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp)
            .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) || super::superseded(&e) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Pass::Done);
    }
    if !h.is_tracked(key) {
        if terminal(&pod) {
            return Ok(Pass::Done);
        }
        h.create_pod(pod).await?;
    } else {
        h.update_pod(pod).await?;
    }
    Ok(Pass::Done)
}

async fn worker(
    h: Arc<Handler>,
    workers: Workers,
    key: String,
    mut rx: watch::Receiver<Option<Pod>>,
) {
    let t = h.cfg.timing.clone();
    let mut backoff = t.retry_start;
    loop {
        let pod = rx.borrow_and_update().clone();
        // Subscribed before the operation: a VM name freed while it runs (a stale create
        // collected just after this create hit the name) still cuts the backoff short.
        let mut freed = h.store.names_freed();
        match process(&h, &key, pod).await {
            Ok(Pass::Gone) => {
                let mut w = lock(&workers);
                if rx.has_changed().unwrap_or(false) {
                    continue;
                }
                w.remove(&key);
                return;
            }
            Ok(Pass::Done) => {
                backoff = t.retry_start;
                if rx.changed().await.is_err() {
                    return;
                }
            }
            Err(e) => {
                debug!(pod = %key, error = %e, ?backoff, "pod operation failed; retrying");
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                // Wait out the backoff, but let a deletion (or a vanish) cut it short, and a
                // stale create that frees a VM name (the failure may have been that name).
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        _ = freed.changed() => break,
                        r = rx.changed() => {
                            if r.is_err() { return; }
                            let urgent = rx.borrow().as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                            if urgent { break; }
                        }
                    }
                }
                backoff = (backoff * 2).min(t.retry_max);
                rx.mark_changed();
            }
        }
    }
}

/// §5.4: re-flush intents whose flushed snapshot differs; `ready` re-runs the publication.
async fn lifecycle_reconciler(h: Arc<Handler>) {
    let beat = Heartbeat::new("pod lifecycle reconciler", h.cfg.timing.lifecycle_reconcile);
    h.liveness.register(beat.clone());
    loop {
        tokio::time::sleep(h.cfg.timing.lifecycle_reconcile).await;
        beat.beat();
        let dirty: Vec<(String, Option<LifecycleState>)> = h
            .store
            .tables()
            .intents
            .iter()
            .filter(|(_, i)| i.dirty())
            .map(|(k, i)| (k.clone(), i.lifecycle.state))
            .collect();
        for (key, state) in dirty {
            beat.beat();
            let Some(pod) = h.tracked_pod(&key) else {
                continue;
            };
            if state == Some(LifecycleState::Ready) {
                h.publisher.publish_ready(&key).await;
            } else {
                h.api.flush(&key, &pod).await;
            }
        }
    }
}

/// §12.2: republish statuses that drifted from what this agent computes.
async fn drift_reconciler(h: Arc<Handler>) {
    tokio::time::sleep(h.cfg.timing.drift_first).await;
    loop {
        let keys = h.tracked_keys();
        futures::stream::iter(keys)
            .for_each_concurrent(8, |key| {
                let h = h.clone();
                async move {
                    let lock = h.store.status_lock(&key);
                    let _publishing = lock.lock().await;
                    let Some((pod, st)) = h.publisher.compute_status(&key, false) else {
                        return;
                    };
                    let api: Api<Pod> = Api::namespaced(
                        h.api.client().clone(),
                        pod.metadata.namespace.as_deref().unwrap_or_default(),
                    );
                    let Ok(live) = api
                        .get(pod.metadata.name.as_deref().unwrap_or_default())
                        .await
                    else {
                        return;
                    };
                    if live.metadata.uid != pod.metadata.uid {
                        return;
                    }
                    let live_st = live.status.unwrap_or_default();
                    let (published, computed) =
                        (status::drift_key(&live_st), status::drift_key(&st));
                    if published != computed {
                        info!(pod = %key, ?published, ?computed, "republishing drifted status");
                        let _ = h.api.write_status(&pod, &st).await;
                    }
                }
            })
            .await;
        tokio::time::sleep(h.cfg.timing.drift_every).await;
    }
}

/// Grace used by tests and shutdown paths.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p
    }

    fn keys(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn relist_finds_the_tracked_pods_the_list_missed() {
        let mut r = Relist::default();
        let none = || -> Vec<String> { panic!("tracked keys are read at InitDone only") };
        assert!(r.observe(&Event::Init, none).is_empty());
        assert!(
            r.observe(&Event::InitApply(pod("a", "p1")), none)
                .is_empty()
        );
        assert!(
            r.observe(&Event::InitApply(pod("a", "p2")), none)
                .is_empty()
        );
        assert!(
            r.observe(&Event::InitApply(pod("a", "p1")), none)
                .is_empty()
        );
        assert_eq!(r.len(), 2, "a set: a pod listed twice counts once");
        let gone = r.observe(&Event::InitDone, || keys(&["a/p1", "a/p2", "a/p3", "b/p1"]));
        assert_eq!(gone, keys(&["a/p3", "b/p1"]));
        assert_eq!(r.len(), 0, "forgotten at InitDone");
        // A relist that restarts drops the partial list of the aborted one.
        r.observe(&Event::Init, none);
        r.observe(&Event::InitApply(pod("a", "p1")), none);
        r.observe(&Event::Init, none);
        r.observe(&Event::InitApply(pod("a", "p2")), none);
        let gone = r.observe(&Event::InitDone, || keys(&["a/p1", "a/p2"]));
        assert_eq!(gone, keys(&["a/p1"]));
    }

    #[test]
    fn events_between_relists_are_not_remembered() {
        let mut r = Relist::default();
        let none = || -> Vec<String> { panic!("tracked keys are read at InitDone only") };
        r.observe(&Event::Init, none);
        r.observe(&Event::InitApply(pod("a", "p0")), none);
        r.observe(&Event::InitDone, Vec::new);
        for i in 0..10_000 {
            let p = pod("a", &format!("p{i}"));
            assert!(r.observe(&Event::Apply(p.clone()), none).is_empty());
            assert!(r.observe(&Event::Delete(p), none).is_empty());
        }
        assert_eq!(
            r.len(),
            0,
            "watch events after InitDone must not grow the relist state"
        );
    }
}
