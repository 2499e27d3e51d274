//! UpdatePod (`node.md` §8): only the hibernate transition matters. Hibernate saves, pushes
//! `:hibernate`, clears the runtime annotations and removes the VM (compensating on failure);
//! wake pulls (or reuses a verified local copy) and clones.
//!
//! The pod stays alive while hibernated, so no controller recreates it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_api::contract::events::{node as ev, woken_message};
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{
    AnnotationCodec, GenerationStamp, HibernateFlags, LifecycleState, Os, VmRuntime, VmSpec, tags,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::create::{FollowUp, ch_windows};
use super::owned::Owner;
use super::rules::PodResources;
use super::state::TrackedVm;
use super::tenant;
use super::{Handler, Result, failed, pod_key, uid};

/// What the inspect after a failed `vm rm` says about the hibernating VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailedRemove {
    /// The VM still exists: its disk and memory are intact, so `:hibernate` is the stale
    /// duplicate the compensation deletes.
    StillThere,
    /// The VM is gone (the remove took effect before failing): `:hibernate` is now the only
    /// copy of its state, so the hibernate stands.
    Gone,
    /// Unknown (the inspect failed otherwise): keep `:hibernate` and fail the hibernate.
    Unknown,
}

/// Decides the compensation of a failed `vm rm` from an inspect of the VM.
pub(crate) fn after_failed_remove<T>(
    inspect: &std::result::Result<T, cocoon_runtime::RuntimeError>,
) -> AfterFailedRemove {
    match inspect {
        Ok(_) => AfterFailedRemove::StillThere,
        Err(e) if e.is_vm_not_found() => AfterFailedRemove::Gone,
        Err(_) => AfterFailedRemove::Unknown,
    }
}

impl Handler {
    /// UpdatePod (§8.1).
    pub async fn update_pod(self: &Arc<Self>, pod: Pod) -> Result<()> {
        let key = pod_key(&pod);
        if self.tables().resumed.contains(&key) {
            return Err(failed(format!(
                "resumed operation still in flight for {key}"
            )));
        }
        // Tenant isolation: the VM name (written once, contract §2.2), `managed` and an
        // unmanaged pod's pre-assigned id are fixed when the pod was admitted. A pod whose
        // annotation now names another VM would hibernate into, or wake from, that VM's
        // snapshots; a flip to managed would run runtime verbs against the VM an unmanaged
        // pod's id names; a flip to unmanaged would leak its VM on delete. The admitted copy
        // is kept instead (by key, like the tracked VM: the tracked incarnation fixed these).
        let admitted = self.tables().admitted.get(&key).cloned();
        if let Some(admitted) = admitted {
            let incoming = VmSpec::from_meta(&pod.metadata);
            let id = VmRuntime::from_meta(&pod.metadata).id;
            if let Err(refusal) =
                tenant::check_update(&admitted, &incoming.vm_name, incoming.managed, &id)
            {
                let refusal = refusal.to_string();
                let already = self
                    .tables()
                    .intents
                    .get(&key)
                    .is_some_and(|i| i.lifecycle.is_failed() && i.lifecycle.message == refusal);
                if !already {
                    self.fail_op(&pod, ev::TENANT_ISOLATION_REFUSED, ev::OP_UPDATE, &refusal)
                        .await;
                }
                return Ok(());
            }
        }
        // Store the incoming object with this agent's own intent re-applied: the controller's
        // copy may carry a stale lifecycle-state.
        let (vm, intent) = {
            let mut t = self.tables();
            let mut p = pod.clone();
            let intent = t.intents.get(&key).cloned();
            match &intent {
                Some(i) if i.uid == uid(&pod) => {
                    i.lifecycle
                        .apply_to(p.metadata.annotations.get_or_insert_default());
                }
                Some(_) => {
                    t.intents.remove(&key);
                }
                None => {}
            }
            if let Some(old) = t.pods.get(&key) {
                p.status = old.status.clone();
            }
            t.pods.insert(key.clone(), p);
            (
                t.vms_by_pod.get(&key).cloned(),
                intent.filter(|i| i.uid == uid(&pod)),
            )
        };
        let spec = VmSpec::from_meta(&pod.metadata);
        if !spec.managed {
            self.metrics
                .pod_lifecycle(ev::OP_UPDATE, m::RESULT_SKIPPED, m::REASON_NOOP);
            return Ok(());
        }
        let want = HibernateFlags::from_meta(&pod.metadata).hibernate;
        match (want, vm) {
            (true, Some(vm)) => {
                // Its status was refreshed once the VM was gone (see `hibernate`).
                self.hibernate(&key, &pod, &spec, vm).await?;
                self.metrics.pod_lifecycle(ev::OP_UPDATE, m::RESULT_OK, "");
            }
            (false, None) => {
                self.wake(&key, &pod, &spec).await?;
                self.metrics.pod_lifecycle(ev::OP_UPDATE, m::RESULT_OK, "");
            }
            (false, Some(_))
                if intent
                    .as_ref()
                    .is_some_and(|i| i.failed_by_hibernate && i.lifecycle.is_failed()) =>
            {
                // Lifting a failed hibernate (§8.1): the annotation's removal is a new attempt.
                info!(pod = %key, "hibernate request withdrawn; lifting the hibernate failure");
                self.set_lifecycle(&pod, LifecycleState::Creating, "").await;
                if self.probes.result(&key).is_some_and(|p| p.ready) {
                    self.publish_ready(&key).await;
                } else {
                    self.tables().ready_pending.insert(key.clone());
                }
                self.metrics.pod_lifecycle(ev::OP_UPDATE, m::RESULT_OK, "");
            }
            _ => {
                let generation = GenerationStamp::from_meta(&pod.metadata).0;
                if let Some(i) = intent.filter(|i| generation > i.lifecycle.observed_generation)
                    && let Some(state) = i.lifecycle.state
                {
                    let keep_origin = i.failed_by_hibernate;
                    self.set_lifecycle(&pod, state, &i.lifecycle.message).await;
                    if keep_origin && let Some(n) = self.tables().intents.get_mut(&key) {
                        n.failed_by_hibernate = true;
                    }
                }
                self.metrics
                    .pod_lifecycle(ev::OP_UPDATE, m::RESULT_SKIPPED, m::REASON_NOOP);
            }
        }
        Ok(())
    }

    async fn hibernate_fail(&self, key: &str, pod: &Pod, reason: &str, err: String) -> Result<()> {
        self.fail_op(pod, reason, ev::OP_UPDATE, &err).await;
        if let Some(i) = self.tables().intents.get_mut(key)
            && i.lifecycle.is_failed()
        {
            i.failed_by_hibernate = true;
        }
        self.notify(key).await;
        Err(failed(err))
    }

    fn count_phase(&self, phase: &str, result: &str) {
        self.metrics.hibernate(phase, result);
    }

    /// Hibernate (§8.2).
    pub(crate) async fn hibernate(
        self: &Arc<Self>,
        key: &str,
        pod: &Pod,
        spec: &VmSpec,
        vm: TrackedVm,
    ) -> Result<()> {
        let name = spec.vm_name.clone();
        if vm.synthetic {
            // An unmanaged pod's record is synthetic: no runtime verb ever runs against it.
            let e = format!("vm {name} is unmanaged; it cannot be hibernated");
            return self
                .hibernate_fail(key, pod, ev::TENANT_ISOLATION_REFUSED, e)
                .await;
        }
        if spec.effective_os() == Os::Macos {
            let e = format!("macOS guest {name} does not support hibernate");
            return self
                .hibernate_fail(key, pod, ev::HIBERNATE_UNSUPPORTED, e)
                .await;
        }
        self.set_lifecycle(pod, LifecycleState::Hibernating, "")
            .await;
        let id = vm.id().to_owned();
        let nic_dropped = ch_windows(spec);
        if nic_dropped {
            let release = self
                .exec_bounded(
                    &id,
                    &["cmd", "/c", "ipconfig", "/release"],
                    Duration::from_secs(20),
                )
                .await;
            self.count_phase(
                "dhcp_release",
                if release {
                    m::RESULT_OK
                } else {
                    m::RESULT_FAILED
                },
            );
            if let Err(e) = self.rt.net_resize(&id, 0).await {
                self.count_phase("netresize", m::RESULT_FAILED);
                let rt = self.rt.clone();
                let vid = id.clone();
                self.spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(30),
                        cocoon_runtime::exec_capture(
                            rt.as_ref(),
                            &vid,
                            &["cmd", "/c", "ipconfig", "/renew"],
                            None,
                        ),
                    )
                    .await;
                });
                return self
                    .hibernate_fail(
                        key,
                        pod,
                        ev::HIBERNATE_NET_RESIZE_FAILED,
                        format!("drop NIC pre-hibernate {name}: {e}"),
                    )
                    .await;
            }
        }
        let start = Instant::now();
        if let Err(e) = self.rt.snapshot_save(&name, &id).await {
            self.metrics.snapshot_save(m::RESULT_FAILED);
            self.count_phase("snapshot", m::RESULT_FAILED);
            self.nic_rollback(nic_dropped, &id);
            return self
                .hibernate_fail(
                    key,
                    pod,
                    ev::HIBERNATE_SNAPSHOT_FAILED,
                    format!("snapshot save {name}: {e}"),
                )
                .await;
        }
        self.metrics
            .snapshot_save_duration
            .observe(start.elapsed().as_secs_f64());
        self.metrics.snapshot_save(m::RESULT_OK);
        if self.registry.is_some() {
            if let Err(e) = self
                .push_owned(&name, &name, tags::HIBERNATE, &spec.image, &Owner::of(pod))
                .await
            {
                self.metrics.snapshot_push(m::RESULT_FAILED);
                self.count_phase("push", m::RESULT_FAILED);
                self.nic_rollback(nic_dropped, &id);
                return self
                    .hibernate_fail(
                        key,
                        pod,
                        ev::HIBERNATE_PUSH_FAILED,
                        format!("push hibernation snapshot {name}: {e}"),
                    )
                    .await;
            }
            self.metrics.snapshot_push(m::RESULT_OK);
        }
        // Clear the VMID before Remove: the operator's manifest+VMID window shrinks to one RTT.
        let cleared = self.clear_runtime(pod).await.is_ok();
        if let Err(e) = self.rt.remove(&id).await
            && !e.is_vm_not_found()
        {
            // The compensation deletes `:hibernate` only while the VM provably still exists:
            // a remove that took effect and then failed leaves the tag as the only copy.
            let after = after_failed_remove(&self.rt.inspect(&id).await);
            if after == AfterFailedRemove::Gone {
                warn!(vm = %name, id = %id, error = %e, "vm rm failed but the VM is gone; the hibernate stands");
            } else {
                self.count_phase("remove", m::RESULT_FAILED);
                if after == AfterFailedRemove::StillThere {
                    if let Some(reg) = &self.registry
                        && let Err(de) = reg.delete_tag_if_present(&name, tags::HIBERNATE).await
                    {
                        warn!(vm = %name, error = %de, "compensating tag delete failed");
                    }
                } else {
                    warn!(vm = %name, id = %id, "vm rm failed and the VM could not be inspected; keeping :hibernate, which may be its only copy");
                }
                self.nic_rollback(nic_dropped, &id);
                self.write_runtime(pod, &vm, 0).await;
                return self
                    .hibernate_fail(
                        key,
                        pod,
                        ev::HIBERNATE_REMOVE_FAILED,
                        format!("remove vm {id}: {e}"),
                    )
                    .await;
            }
        }
        self.count_phase("remove", m::RESULT_OK);
        if !cleared && let Err(e) = self.clear_runtime(pod).await {
            warn!(pod = %key, error = %e, "clearing runtime annotations after remove failed");
        }
        self.probes.forget(key);
        {
            let mut t = self.tables();
            t.untrack_vm(key);
            self.metrics.set_vm_table_size(t.vms_by_pod.len());
        }
        // The status (not Ready, no IP) goes out before `hibernated`: the operator's pass
        // woken by `hibernated` then sees the pod's final status, and its `Suspended` needs
        // no second write for a readiness flip that lands after it. (§8.1 step 5's refresh
        // still follows the hibernate.)
        self.notify(key).await;
        self.set_lifecycle(pod, LifecycleState::Hibernated, "")
            .await;
        let msg = if self.registry.is_some() {
            ev::MSG_HIBERNATED_PUSHED
        } else {
            ev::MSG_HIBERNATED_LOCAL
        };
        self.event(pod, false, ev::HIBERNATED, msg).await;
        info!(pod = %key, vm = %name, "hibernated");
        Ok(())
    }

    async fn exec_bounded(&self, id: &str, argv: &[&str], limit: Duration) -> bool {
        matches!(
            tokio::time::timeout(limit, cocoon_runtime::exec_capture(self.rt.as_ref(), id, argv, None)).await,
            Ok(out) if out.result.is_ok()
        )
    }

    fn nic_rollback(&self, dropped: bool, id: &str) {
        if !dropped {
            return;
        }
        let rt = self.rt.clone();
        let id = id.to_owned();
        self.spawn(async move {
            let work = async {
                if let Err(e) = rt.net_resize(&id, 1).await {
                    warn!(vm = %id, error = %e, "NIC rollback failed");
                }
                let _ = cocoon_runtime::exec_capture(
                    rt.as_ref(),
                    &id,
                    &["cmd", "/c", "ipconfig", "/renew"],
                    None,
                )
                .await;
            };
            let _ = tokio::time::timeout(Duration::from_secs(30), work).await;
        });
    }

    /// Wake (§8.3).
    pub(crate) async fn wake(self: &Arc<Self>, key: &str, pod: &Pod, spec: &VmSpec) -> Result<()> {
        if spec.vm_name.is_empty() {
            return Ok(());
        }
        // Host reach: the annotations may have changed while the pod slept.
        if let Err(refusal) = self.host_reach_check(spec) {
            let msg = refusal.to_string();
            let already = self
                .tables()
                .intents
                .get(key)
                .is_some_and(|i| i.lifecycle.is_failed() && i.lifecycle.message == msg);
            if !already {
                self.fail_op(pod, ev::TENANT_ISOLATION_REFUSED, ev::OP_UPDATE, &msg)
                    .await;
            }
            return Ok(());
        }
        self.set_lifecycle(pod, LifecycleState::Creating, "").await;
        if let Err(e) = self.clear_runtime(pod).await {
            warn!(pod = %key, error = %e, "clearing runtime annotations at wake failed");
        }
        let src = match self
            .resolve_wake_source(&spec.vm_name, &Owner::of(pod))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                self.metrics.wake(m::RESULT_FAILED);
                self.fail_op(pod, ev::WAKE_PULL_FAILED, ev::OP_UPDATE, &e)
                    .await;
                return Err(failed(e));
            }
        };
        let label = src.local.clone();
        let started = Instant::now();
        let policy = PodResources::of(pod).cpu_policy();
        let vm = match self.clone_from_hibernate(spec, src, policy).await {
            Ok(vm) => vm,
            Err(e) => {
                self.metrics.wake(m::RESULT_FAILED);
                self.fail_op(pod, ev::WAKE_CLONE_FAILED, ev::OP_UPDATE, &e)
                    .await;
                return Err(failed(e));
            }
        };
        self.metrics.vm_boot(
            "clone",
            spec.effective_backend().as_str(),
            started.elapsed().as_secs_f64(),
        );
        // §8.3 step 6's order: the runtime annotations, tracking, probe and post-restore step
        // first, the Event last (it is nothing the operator waits on).
        self.finish_bring_up(key, pod, spec, vm, FollowUp::Restore)
            .await;
        self.event(pod, false, ev::WOKEN, &woken_message(&label))
            .await;
        info!(pod = %key, vm = %spec.vm_name, "woken");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_runtime::RuntimeError;

    #[test]
    fn a_failed_remove_deletes_the_tag_only_while_the_vm_exists() {
        let rows: [(std::result::Result<(), RuntimeError>, AfterFailedRemove); 3] = [
            (Ok(()), AfterFailedRemove::StillThere),
            (
                Err(RuntimeError::VmNotFound("vm x: VM not found".into())),
                AfterFailedRemove::Gone,
            ),
            (
                Err(RuntimeError::Other("connection reset".into())),
                AfterFailedRemove::Unknown,
            ),
        ];
        for (inspect, want) in rows {
            assert_eq!(after_failed_remove(&inspect), want, "{inspect:?}");
        }
    }
}
