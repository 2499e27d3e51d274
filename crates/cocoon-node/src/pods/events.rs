//! The VM event watcher (`node.md` §10): sub-second reaction to VMs that vanish or stop —
//! restart in place with a cooldown, evict when gone, deferred rechecks on transient inspects.
//!
//! The hibernate's own Remove produces events too; pods with the hibernate annotation are skipped.

use std::sync::Arc;
use std::time::Instant;

use cocoon_api::contract::{AnnotationCodec, HibernateFlags};
use cocoon_runtime::{VmEvent, VmRecord};
use futures::StreamExt;
use tracing::{info, warn};

use super::plan::vm_event::{AfterRemove, Eviction, OnGone, Recheck};
use super::plan::{self, vm_event};
use super::{Handler, pod_key, status};
use k8s_openapi::api::core::v1::Pod;

impl Handler {
    /// Runs the watcher until shutdown: backoff on start failures, fixed delay on clean ends.
    pub async fn watch_vm_events(self: Arc<Self>) {
        let t = self.cfg.timing.clone();
        let mut backoff = t.watch_backoff_start;
        loop {
            let stream = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                s = self.artifacts.rt().watch_events() => s,
            };
            match stream {
                Err(e) => {
                    warn!(error = %e, ?backoff, "starting the VM event stream failed");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(t.watch_backoff_max);
                }
                Ok(mut stream) => {
                    backoff = t.watch_backoff_start;
                    loop {
                        let item = tokio::select! {
                            _ = self.shutdown.cancelled() => return,
                            i = stream.next() => i,
                        };
                        match item {
                            Some(Ok(ev)) => self.dispatch_event(ev).await,
                            Some(Err(e)) => {
                                warn!(error = %e, "VM event stream failed");
                                break;
                            }
                            None => break,
                        }
                    }
                    let horizon = t.restart_cooldown * 2;
                    self.store
                        .tables()
                        .last_restart
                        .retain(|_, at| at.elapsed() < horizon);
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(t.watch_reconnect) => {}
                    }
                }
            }
        }
    }

    async fn dispatch_event(self: &Arc<Self>, ev: VmEvent) {
        if vm_event::means_gone(&ev) {
            self.handle_vm_gone(&ev.vm).await;
        }
    }

    /// handleVMGone (§10): the facts for [`vm_event::leave_alone`] and
    /// [`vm_event::on_inspect`], then their answer.
    pub(crate) async fn handle_vm_gone(self: &Arc<Self>, event_vm: &VmRecord) {
        let key = self
            .store
            .tables()
            .key_for_vm(&event_vm.id, event_vm.name());
        let matched =
            key.and_then(|key| Some((self.tracked_pod(&key)?, self.tracked_vm(&key)?, key)));
        let tracked = matched.as_ref().map(|(pod, vm, key)| vm_event::Tracked {
            synthetic: vm.synthetic,
            hibernate: HibernateFlags::from_meta(&pod.metadata).hibernate,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            resumed: self.store.tables().resumed.contains(key),
        });
        let (Some((pod, vm, key)), None) = (matched, vm_event::leave_alone(tracked.as_ref()))
        else {
            return;
        };
        let id = vm.id().to_owned();
        let outcome = self.artifacts.inspect_outcome(&id).await;
        let cooldown = vm_event::Cooldown {
            last: self.store.tables().last_restart.get(&id).copied(),
            now: Instant::now(),
            period: self.cfg.timing.restart_cooldown,
        };
        match vm_event::on_inspect(&outcome, cooldown) {
            OnGone::Ignore => {}
            OnGone::Evict(e) => self.evict(&key, &pod, e.reason, &e.message).await,
            OnGone::Recheck => {
                self.metrics.vm_inspect_transient_fail.inc();
                self.schedule_recheck(id);
            }
            OnGone::Restart => self.restart_in_place(&key, &pod, &id).await,
            OnGone::RemoveThenEvict(e) => self.remove_then_evict(&key, &pod, &id, e).await,
        }
    }

    /// `vm start` of a stopped VM whose cooldown allows it (§10, restart with cooldown).
    async fn restart_in_place(self: &Arc<Self>, key: &str, pod: &Pod, id: &str) {
        self.store
            .tables()
            .last_restart
            .insert(id.to_owned(), Instant::now());
        info!(pod = %key, vm = id, "restarting a stopped VM in place");
        let started = self
            .artifacts
            .rt()
            .start(id)
            .await
            .map_err(|e| e.to_string());
        if let Some(eviction) = vm_event::after_start(started) {
            self.remove_then_evict(key, pod, id, eviction).await;
            return;
        }
        if let Ok(rec) = self.artifacts.rt().inspect(id).await {
            let mut t = self.store.tables();
            if let Some(cur) = t.vms_by_pod.get(key).filter(|v| v.id() == id).cloned() {
                let mut updated = cur;
                updated.record.pid = rec.pid;
                updated.record.network_configs = rec.network_configs;
                updated.record.state = rec.state;
                t.track_vm(key, updated);
            }
        }
    }

    async fn remove_then_evict(&self, key: &str, pod: &Pod, id: &str, eviction: Eviction) {
        let removed = plan::removed(self.artifacts.rt().remove(id).await);
        match vm_event::after_remove(removed, eviction) {
            AfterRemove::Evict(e) => self.evict(key, pod, e.reason, &e.message).await,
            AfterRemove::Keep(error) => {
                warn!(pod = %key, vm = id, %error, "remove before eviction failed; keeping the pod");
            }
        }
    }

    /// evictPod (§10).
    pub(crate) async fn evict(&self, key: &str, pod: &Pod, reason: &str, message: &str) {
        // The DELETE below brings the pod back with a deletionTimestamp; DeletePod must not
        // finish it (as `Succeeded`) while this eviction does.
        self.store.tables().evicting.insert(key.to_owned());
        if !self.api.delete_incarnation(key, pod).await {
            self.store.tables().evicting.remove(key);
            self.metrics.pod_evict_failure.inc();
            return;
        }
        warn!(pod = %key, reason, message, "pod evicted");
        let previous = self.tracked_pod(key).and_then(|p| p.status);
        self.publisher.forget(key);
        let st = status::evicted(previous.as_ref(), reason, message);
        let _ = self.api.write_status(pod, &st).await;
        self.store.tables().evicting.remove(key);
    }

    /// A deferred inspect loop for a VM whose inspect stayed transient.
    fn schedule_recheck(self: &Arc<Self>, id: String) {
        if self.shutdown.is_cancelled() || !self.store.tables().pending_recheck.insert(id.clone()) {
            return;
        }
        let me = self.clone();
        self.spawn(async move {
            let t = me.cfg.timing.clone();
            let start = Instant::now();
            let mut delay = t.recheck_start;
            loop {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(t.recheck_max);
                let Some(key) = me.store.tables().key_for_vm(&id, "") else {
                    break;
                };
                let Some(pod) = me.tracked_pod(&key) else {
                    break;
                };
                let outcome = me.artifacts.inspect_outcome(&id).await;
                match vm_event::recheck(outcome, start.elapsed(), t.recheck_budget) {
                    Recheck::Evict(e) => {
                        me.evict(&key, &pod, e.reason, &e.message).await;
                        break;
                    }
                    Recheck::BackOff => {}
                    Recheck::Stop => break,
                    Recheck::Replay(state) => {
                        me.store.tables().pending_recheck.remove(&id);
                        let mut rec = VmRecord {
                            id: id.clone(),
                            state,
                            ..Default::default()
                        };
                        rec.config.name = String::new();
                        me.handle_vm_gone(&rec).await;
                        return;
                    }
                }
            }
            me.store.tables().pending_recheck.remove(&id);
        });
    }
}

/// Key helper for tests.
pub fn key_of(pod: &Pod) -> String {
    pod_key(pod)
}
