//! UpdatePod (`node.md` §8): only the hibernate transition matters; what an update means is
//! decided in [`super::plan::update`]. Hibernate saves, pushes
//! `:hibernate`, clears the runtime annotations and removes the VM (compensating on failure):
//! planned in [`super::plan::hibernate`], run by the executor; wake pulls (or reuses a
//! verified local copy) and clones.
//!
//! The pod stays alive while hibernated, so no controller recreates it.

use std::sync::Arc;

use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{
    AnnotationCodec, GenerationStamp, HibernateFlags, LifecycleState, VmRuntime, VmSpec,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::effects::{PodOp, read_wake_source};
use super::exec;
use super::plan::ch_windows;
use super::plan::update::{Dispatch, Gate};
use super::plan::{self, StepFailed};
use super::state::TrackedVm;
use super::tenant;
use super::{Handler, PodError, Result, pod_key, uid};

impl Handler {
    /// UpdatePod (§8.1).
    pub async fn update_pod(self: &Arc<Self>, pod: Pod) -> Result<()> {
        let key = pod_key(&pod);
        // Tenant isolation: the VM name (written once, contract §2.2), `managed` and an
        // unmanaged pod's pre-assigned id are fixed when the pod was admitted. A pod whose
        // annotation now names another VM would hibernate into, or wake from, that VM's
        // snapshots; a flip to managed would run runtime verbs against the VM an unmanaged
        // pod's id names; a flip to unmanaged would leak its VM on delete. The admitted copy
        // is kept instead (by key, like the tracked VM: the tracked incarnation fixed these).
        let (resumed, admitted, current) = {
            let t = self.store.tables();
            (
                t.resumed.contains(&key),
                t.admitted.get(&key).cloned(),
                t.intents.get(&key).cloned(),
            )
        };
        let refusal = admitted.and_then(|admitted| {
            let incoming = VmSpec::from_meta(&pod.metadata);
            let id = VmRuntime::from_meta(&pod.metadata).id;
            tenant::check_update(&admitted, &incoming.vm_name, incoming.managed, &id)
                .err()
                .map(|r| r.to_string())
        });
        match plan::update::gate(resumed, refusal.as_deref(), current.as_ref()) {
            Gate::InFlight => {
                return Err(PodError::InFlight(key));
            }
            Gate::Refused { report } => {
                if let Some(refusal) = refusal.filter(|_| report) {
                    self.api
                        .fail_op(&pod, ev::TENANT_ISOLATION_REFUSED, ev::OP_UPDATE, &refusal)
                        .await;
                }
                return Ok(());
            }
            Gate::Pass => {}
        }
        // Store the incoming object with this agent's own intent re-applied: the controller's
        // copy may carry a stale lifecycle-state.
        let (vm, intent) = {
            let mut t = self.store.tables();
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
        let dispatch = plan::update::dispatch(&plan::update::Facts {
            managed: spec.managed,
            hibernate: HibernateFlags::from_meta(&pod.metadata).hibernate,
            has_vm: vm.is_some(),
            intent: intent.as_ref(),
            generation: GenerationStamp::from_meta(&pod.metadata).0,
        });
        match (&dispatch, vm) {
            (Dispatch::Hibernate, Some(vm)) => {
                // Its status was refreshed once the VM was gone (see `hibernate`).
                self.hibernate(&key, &pod, &spec, vm).await?;
            }
            (Dispatch::Wake, _) => self.wake(&key, &pod, &spec).await?,
            (Dispatch::LiftHibernateFailure, _) => {
                // Lifting a failed hibernate (§8.1): the annotation's removal is a new attempt.
                info!(pod = %key, "hibernate request withdrawn; lifting the hibernate failure");
                self.api
                    .set_lifecycle(&pod, LifecycleState::Creating, "")
                    .await;
                if self.publisher.probe_ready(&key) {
                    self.publisher.publish_ready(&key).await;
                } else {
                    self.store.tables().ready_pending.insert(key.clone());
                }
            }
            (Dispatch::Noop(Some(again)), _) => {
                self.api
                    .set_lifecycle(&pod, again.state, &again.message)
                    .await;
                if again.keep_hibernate_origin
                    && let Some(n) = self.store.tables().intents.get_mut(&key)
                {
                    n.failed_by_hibernate = true;
                }
            }
            _ => {}
        }
        let (op, result, reason) = dispatch.counted();
        self.metrics.pod_lifecycle(op, result, reason);
        // A checkpoint request on the pod: checked and taken in the background.
        self.checkpoint_request(&pod);
        Ok(())
    }

    async fn hibernate_fail(&self, key: &str, pod: &Pod, f: StepFailed) -> Result<()> {
        let err = PodError::from(f);
        self.api.fail_with(pod, ev::OP_UPDATE, "", &err).await;
        if let Some(i) = self.store.tables().intents.get_mut(key)
            && i.lifecycle.is_failed()
        {
            i.failed_by_hibernate = true;
        }
        self.publisher.notify(key).await;
        Err(err)
    }

    /// Hibernate (§8.2): the plan of [`plan::hibernate`], run by the executor; a refusal or a
    /// failed step fails the hibernate (its compensations already run).
    pub(crate) async fn hibernate(
        self: &Arc<Self>,
        key: &str,
        pod: &Pod,
        spec: &VmSpec,
        vm: TrackedVm,
    ) -> Result<()> {
        let facts = plan::hibernate::Facts {
            spec,
            vm_id: vm.id(),
            synthetic: vm.synthetic,
            registry: self.artifacts.registry().is_some(),
        };
        let steps = match plan::hibernate::plan(&facts) {
            Ok(steps) => steps,
            Err(refused) => return self.hibernate_fail(key, pod, refused).await,
        };
        let op = PodOp::new(self, key, pod, spec, Some(&vm));
        if let Err(f) = exec::run(&op, &steps).await {
            return self.hibernate_fail(key, pod, f).await;
        }
        info!(pod = %key, vm = %spec.vm_name, "hibernated");
        Ok(())
    }

    /// A failed wake: `cocoon_vk_wake_total{failed}` and failOp.
    async fn wake_fail(&self, pod: &Pod, f: StepFailed) -> Result<()> {
        self.metrics.wake(m::RESULT_FAILED);
        let err = PodError::from(f);
        self.api.fail_with(pod, ev::OP_UPDATE, "", &err).await;
        Err(err)
    }

    /// Wake (§8.3): the plan of [`plan::wake`], its source read in between.
    pub(crate) async fn wake(self: &Arc<Self>, key: &str, pod: &Pod, spec: &VmSpec) -> Result<()> {
        if spec.vm_name.is_empty() {
            return Ok(());
        }
        // Host reach: the annotations may have changed while the pod slept.
        if let Err(refusal) = super::host_reach::host_reach_check(&self.cfg, spec) {
            let msg = refusal.to_string();
            let current = self.store.tables().intents.get(key).cloned();
            if plan::update::report_refusal(&msg, current.as_ref()) {
                self.api
                    .fail_op(pod, ev::TENANT_ISOLATION_REFUSED, ev::OP_UPDATE, &msg)
                    .await;
            }
            return Ok(());
        }
        let op = PodOp::new(self, key, pod, spec, None);
        if let Err(f) = exec::run(&op, &plan::wake::begin()).await {
            return self.wake_fail(pod, f).await;
        }
        let vm = spec.vm_name.as_str();
        let source = match self.artifacts.owner_of(pod).await {
            Ok(owner) => read_wake_source(&self.artifacts, &self.metrics, vm, &owner).await,
            Err(e) => Err(e.into()),
        };
        let source = match source {
            Ok(s) => s,
            Err(e) => {
                let f = StepFailed::refused(plan::wake::WAKE.source, e.message());
                return self.wake_fail(pod, f).await;
            }
        };
        op.clone_from(&source);
        let steps = plan::wake::plan(vm, &source, ch_windows(spec));
        if let Err(f) = exec::run(&op, &steps).await {
            return self.wake_fail(pod, f).await;
        }
        info!(pod = %key, vm = %spec.vm_name, "woken");
        Ok(())
    }
}
