//! DeletePod (`node.md` §7): the routine snapshot by role and policy, VM removal, local
//! snapshot cleanup unless `keep-snapshot-on-delete`, and forgetting the pod.
//!
//! Unmanaged VMs are never removed; a hibernated pod only loses its local snapshots. Planned
//! in [`super::plan::delete`], run by the executor.

use std::sync::Arc;

use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, VmSpec};
use cocoon_api::naming::{owner_cocoonset_name, role_for_pod};
use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::effects::PodOp;
use super::exec;
use super::plan;
use super::plan::delete::Gate;
use super::{Handler, PodError, Result, pod_key, tenant};

impl Handler {
    /// DeletePod (§7).
    pub async fn delete_pod(self: &Arc<Self>, pod: &Pod) -> Result<()> {
        let key = pod_key(pod);
        let (evicting, resumed) = {
            let t = self.store.tables();
            (t.evicting.contains(&key), t.resumed.contains(&key))
        };
        match plan::delete::gate(evicting, resumed) {
            // The eviction deleting this pod forgets it and writes its `Failed` status (§10).
            Gate::Evicting => return Ok(()),
            Gate::InFlight => {
                return Err(PodError::InFlight(key));
            }
            Gate::Pass => {}
        }
        self.store.tables().mark_deleting(&key, pod);
        let spec = VmSpec::from_meta(&pod.metadata);
        let vm = self.tracked_vm(&key);
        // `managed` as the pod was admitted (tenant isolation): a managed pod flipped to
        // unmanaged before its delete still has its VM removed, and an unmanaged pod flipped
        // to managed never has its synthetic record acted on.
        let managed = self
            .store
            .tables()
            .admitted_as(&key, &super::uid(pod))
            .map_or(spec.managed, |a| a.managed);
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        // Tenant isolation, without a VM: only this pod's own snapshots. A tracked pod uses
        // the name it was tracked with; an untracked one (say, refused at create) only its own
        // hashed VM name that no other tracked pod holds.
        let (vm_name, may_drop) = match &vm {
            Some(_) => (String::new(), false),
            None => {
                let (tracked, vm_name) = match self
                    .tracked_pod(&key)
                    .filter(|p| p.metadata.uid == pod.metadata.uid)
                {
                    Some(p) => (true, VmSpec::from_meta(&p.metadata).vm_name),
                    None => (false, spec.vm_name.clone()),
                };
                let holders = self.store.tables().holders_of(&vm_name, Some(&key));
                let legacy = self.cfg.tenant.accept_legacy_vm_names;
                let may_drop = tenant::delete_may_drop_snapshots(
                    tracked, ns, name, &vm_name, &holders, legacy,
                );
                (vm_name, may_drop)
            }
        };
        let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
        let facts = plan::delete::Facts {
            managed,
            vm: vm.as_ref().map(|v| plan::delete::Vm {
                id: v.id(),
                name: v.name(),
                synthetic: v.synthetic,
            }),
            keep: HibernateFlags::from_meta(&pod.metadata).keep_snapshot_on_delete,
            vm_name: &vm_name,
            may_drop,
            policy: spec.effective_snapshot_policy(),
            role: role_for_pod(
                ns,
                owner_cocoonset_name(owners),
                vm.as_ref().map_or("", |v| v.name()),
            ),
            registry: self.artifacts.registry().is_some(),
            image: &spec.image,
            grace_secs: plan::delete::stop_grace(
                pod.metadata.deletion_grace_period_seconds,
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds),
            ),
        };
        let steps = plan::delete::plan(&facts);
        let op = PodOp::new(self, &key, pod, &spec, vm.as_ref());
        if let Err(f) = exec::run(&op, &steps).await {
            self.metrics
                .pod_lifecycle(ev::OP_DELETE, m::RESULT_FAILED, "");
            return Err(f.into());
        }
        if facts.managed
            && let Some(v) = facts.vm.filter(|v| !v.synthetic)
        {
            info!(pod = %key, vm = %v.name, keep = facts.keep, "VM deleted");
        }
        Ok(())
    }
}
