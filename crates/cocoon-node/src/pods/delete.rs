//! DeletePod (`node.md` §7): the routine snapshot by role and policy, VM removal, local
//! snapshot cleanup unless `keep-snapshot-on-delete`, and forgetting the pod.
//!
//! Unmanaged VMs are never removed; a hibernated pod only loses its local snapshots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, VmSpec, tags};
use cocoon_api::naming::{
    fork_snapshot_name, owner_cocoonset_name, role_for_pod, should_snapshot_vm,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::owned::Owner;
use super::{Handler, Result, failed, pod_key, status, tenant};

impl Handler {
    /// DeletePod (§7).
    pub async fn delete_pod(self: &Arc<Self>, pod: &Pod) -> Result<()> {
        let key = pod_key(pod);
        if self.tables().evicting.contains(&key) {
            // The eviction deleting this pod forgets it and writes its `Failed` status (§10).
            return Ok(());
        }
        if self.tables().resumed.contains(&key) {
            return Err(failed(format!(
                "resumed operation still in flight for {key}"
            )));
        }
        let spec = VmSpec::from_meta(&pod.metadata);
        let vm = self.tracked_vm(&key);
        // `managed` as the pod was admitted (tenant isolation): a managed pod flipped to
        // unmanaged before its delete still has its VM removed, and an unmanaged pod flipped
        // to managed never has its synthetic record acted on.
        let managed = self
            .tables()
            .admitted_as(&key, &super::uid(pod))
            .map_or(spec.managed, |a| a.managed);
        if !managed || vm.as_ref().is_some_and(|v| v.synthetic) {
            self.finish_delete(&key, pod).await;
            return Ok(());
        }
        let keep = HibernateFlags::from_meta(&pod.metadata).keep_snapshot_on_delete;
        let Some(vm) = vm else {
            // Tenant isolation: only this pod's own snapshots. A tracked pod uses the name it
            // was tracked with; an untracked one (say, refused at create) only its own hashed
            // VM name that no other tracked pod holds.
            let (tracked, vm_name) = match self
                .tracked_pod(&key)
                .filter(|p| p.metadata.uid == pod.metadata.uid)
            {
                Some(p) => (true, VmSpec::from_meta(&p.metadata).vm_name),
                None => (false, spec.vm_name.clone()),
            };
            let holders = self.tables().holders_of(&vm_name, Some(&key));
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let may_drop = tenant::delete_may_drop_snapshots(
                tracked,
                ns,
                name,
                &vm_name,
                &holders,
                self.cfg.tenant.accept_legacy_vm_names,
            );
            if !keep && !vm_name.is_empty() {
                if may_drop {
                    self.drop_local_snapshots(&vm_name).await;
                } else {
                    warn!(pod = %key, vm = %vm_name, "not dropping the local snapshots of a VM that is not this pod's");
                }
            }
            self.forget(&key);
            let reason = if keep {
                m::REASON_SEAT_RELEASE
            } else {
                m::REASON_NO_VM
            };
            self.metrics
                .pod_lifecycle(ev::OP_DELETE, m::RESULT_SKIPPED, reason);
            return Ok(());
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
        let role = role_for_pod(ns, owner_cocoonset_name(owners), vm.name());
        let name = vm.name().to_owned();
        if should_snapshot_vm(spec.effective_snapshot_policy(), role)
            && self.registry.is_some()
            && !name.is_empty()
        {
            let start = Instant::now();
            match self.rt.snapshot_save(&name, vm.id()).await {
                Ok(()) => {
                    self.metrics
                        .snapshot_save_duration
                        .observe(start.elapsed().as_secs_f64());
                    self.metrics.snapshot_save(m::RESULT_OK);
                    match self
                        .push_owned(&name, &name, tags::LATEST, &spec.image, &Owner::of(pod))
                        .await
                    {
                        Ok(()) => self.metrics.snapshot_push(m::RESULT_OK),
                        Err(e) => {
                            self.metrics.snapshot_push(m::RESULT_FAILED);
                            warn!(pod = %key, vm = %name, error = %e, "routine snapshot push failed");
                        }
                    }
                }
                Err(e) => {
                    self.metrics.snapshot_save(m::RESULT_FAILED);
                    warn!(pod = %key, vm = %name, error = %e, "routine snapshot save failed");
                }
            }
        }
        if !vm.synthetic
            && let Err(e) = self.rt.remove(vm.id()).await
            && !e.is_vm_not_found()
        {
            self.metrics
                .pod_lifecycle(ev::OP_DELETE, m::RESULT_FAILED, "");
            return Err(failed(format!("remove vm {}: {e}", vm.id())));
        }
        if !keep {
            // Each removal gets its own 10 s, detached from the caller, and both are awaited so
            // an immediate recreate cannot race them.
            let rt = self.rt.clone();
            let (a, b) = (name.clone(), fork_snapshot_name(&name));
            let task = tokio::spawn(async move {
                let limit = Duration::from_secs(10);
                let (ra, rb) = tokio::join!(
                    tokio::time::timeout(limit, rt.snapshot_remove_if_exists(&a)),
                    tokio::time::timeout(limit, rt.snapshot_remove_if_exists(&b))
                );
                for r in [ra, rb] {
                    match r {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => warn!(error = %e, "snapshot cleanup on delete failed"),
                        Err(_) => warn!("snapshot cleanup on delete timed out"),
                    }
                }
            });
            let _ = task.await;
        }
        info!(pod = %key, vm = %name, keep, "VM deleted");
        self.finish_delete(&key, pod).await;
        self.metrics.pod_lifecycle(ev::OP_DELETE, m::RESULT_OK, "");
        Ok(())
    }

    async fn finish_delete(&self, key: &str, pod: &Pod) {
        let previous = self
            .tracked_pod(key)
            .and_then(|p| p.status)
            .or_else(|| pod.status.clone());
        self.forget(key);
        let st = status::succeeded(previous.as_ref());
        if let Err(e) = self.write_status(pod, &st).await {
            tracing::debug!(pod = %key, error = %e, "final status write failed");
        }
    }
}
