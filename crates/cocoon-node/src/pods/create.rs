//! CreatePod (`node.md` §6): validation, unmanaged and adopt paths, the restore decision with
//! its evidence guards, the bring-up paths, and the background ready/post-clone steps.
//!
//! The decisions live in the planners: the admission in [`super::plan::admit`], the restore
//! decision and, from the mode dispatch on, the unmanaged, adopt and bring-up paths in
//! [`super::plan::create`], run by the executor; this module gathers their facts (the
//! runtime lookup, the tenant and host reach checks, the evidence read), applies their
//! answers, and runs the background steps.

use std::sync::Arc;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::checkpoint as ckpt;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, LifecycleState, VmRuntime, VmSpec};
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tracing::{info, warn};

use super::admission::unmanaged_ip_check;
use super::api_writer::ApiWriter;
use super::effects::{PodOp, read_wake_source};
use super::exec;
use super::host_reach::host_reach_check;
use super::plan::create::{BringUpPlan, Route};
use super::plan::{self, admit};
use super::rules::{self};
use super::store::PodStore;
use super::tenant;
use super::{Handler, PodConfig, PodError, Result, annotation, pod_key, uid};
use cocoon_runtime::{CloneRequest, CloneSource, CpuPolicy};

impl Handler {
    /// CreatePod (§6.1).
    pub async fn create_pod(self: &Arc<Self>, pod: Pod) -> Result<()> {
        let key = pod_key(&pod);
        let spec = VmSpec::from_meta(&pod.metadata);
        // An unmanaged pod's pre-assigned id must not be exactly the id of a VM the runtime
        // knows (a prefix or name match is not asked: see `tenant`, "Unmanaged pods").
        let pre_id = VmRuntime::from_meta(&pod.metadata).id;
        let mut found = admit::Found::default();
        loop {
            match admit::next(&key, &spec, &pre_id, &found) {
                admit::Next::Skip(e) => {
                    let (op, result, reason) = admit::SKIPPED;
                    self.metrics.pod_lifecycle(op, result, reason);
                    return Err(PodError::Skipped(e));
                }
                admit::Next::Claim => {
                    // Claim this incarnation before anything else, if it fits the node (the
                    // kubelet's resource admission, see `admission`).
                    if let Err(r) =
                        self.store
                            .claim_if_fits(&key, &pod, self.cfg.tenant.allocatable.as_ref())
                    {
                        found.rejected = Some(r);
                        continue;
                    }
                    self.api
                        .set_lifecycle(&pod, LifecycleState::Creating, "")
                        .await;
                    found.claimed = true;
                }
                admit::Next::Reject(r) => return self.api.reject_pod(&pod, &r).await,
                admit::Next::LookUpPreId => {
                    let known = self.artifacts.runtime_has_vm_id(&pre_id).await;
                    found.pre_id_known = Some(known.map_err(|e| e.to_string()));
                }
                // Tenant isolation before any runtime, registry or by-name-index use of the
                // names.
                admit::Next::CheckTenant { id_known } => {
                    let verdict = tenant_check(&self.store, &self.cfg, &pod, &spec, id_known).await;
                    found.tenant = Some(verdict.map_err(|r| r.to_string()));
                }
                // Host reach: URL images and CNI networks only from the node's allowlists.
                admit::Next::CheckHostReach => {
                    let verdict = host_reach_check(&self.cfg, &spec);
                    found.host_reach = Some(verdict.map_err(|r| r.to_string()));
                }
                // An unmanaged pod's IP: in the node's ranges, used by no other pod.
                admit::Next::CheckUnmanagedIp => {
                    let verdict = unmanaged_ip_check(&self.store, &self.cfg, &key, &pod);
                    found.unmanaged_ip = Some(verdict.map_err(|r| r.to_string()));
                }
                admit::Next::Refuse(f) => return self.fail_create(&pod, false, f.into()).await,
                admit::Next::Admit => break,
            }
        }
        // Only now is the pod a holder of its VM name, with its name, `managed` and
        // pre-assigned id fixed (see `tenant::Admitted`).
        self.store.tables().admit(&key, &pod);

        // The mode dispatch and the bring-up are planned (`plan::create`).
        let adopt = if spec.managed {
            // Never an unmanaged pod's synthetic record: only a runtime VM is adopted.
            (self.store.tables().vms_by_name.get(&spec.vm_name).cloned()).filter(|v| !v.synthetic)
        } else {
            None
        };
        let pre = VmRuntime::from_meta(&pod.metadata);
        let clone_dir = annotation(&pod, ann::CLONE_FROM_DIR).map(str::to_owned);
        let mode = annotation(&pod, ann::MODE).unwrap_or("").to_owned();
        let facts = plan::create::Facts {
            spec: &spec,
            mode: &mode,
            clone_dir: clone_dir.as_deref(),
            pre_id: &pre.id,
            pre_ip: &pre.ip,
            adoptable: adopt.is_some(),
        };
        let op = PodOp::new(self, &key, &pod, &spec, None);
        match plan::create::route(&facts) {
            Route::Refused(f) => return self.fail_create(&pod, false, f.into()).await,
            Route::Steps(steps) => {
                if let Some(vm) = adopt {
                    info!(pod = %key, vm = %spec.vm_name, id = %vm.id(), "adopting existing VM");
                    op.adopting(vm);
                }
                if let Err(f) = exec::run(&op, &steps).await {
                    return self.fail_create(&pod, false, f.into()).await;
                }
                return Ok(());
            }
            Route::BringUp => {}
        }

        let flags = HibernateFlags::from_meta(&pod.metadata);
        let evidence = match self.artifacts.owner_of(&pod).await {
            Ok(owner) => {
                self.artifacts
                    .hibernate_evidence(&spec.vm_name, &owner)
                    .await
            }
            Err(e) => Err(e.to_string()),
        };
        let decision = plan::create::restore_decision(
            &spec,
            flags.restore_from_hibernate,
            clone_dir.as_deref(),
            evidence,
        );
        if let Some(verdict) = decision.count {
            self.metrics.hibernate_evidence(verdict);
        }
        if decision.derive {
            self.store.tables().derived_restore.insert(key.clone());
        }
        if let Some((reason, message)) = &decision.warning {
            self.api.event(&pod, true, reason, message).await;
        }
        let restoring = match decision.restoring {
            Ok(r) => r,
            Err(f) => return self.fail_create(&pod, false, f.into()).await,
        };
        // docs/checkpoints.md §Forks: a fresh bring-up clones the checkpoint read here.
        let spec = match annotation(&pod, ckpt::FROM_CHECKPOINT_ANNOTATION) {
            Some(name) if !restoring => match checkpoint_base(&self.api, &pod, name, &spec).await {
                Ok(spec) => spec,
                Err(e) => return self.fail_create(&pod, false, e).await,
            },
            _ => spec.clone(),
        };
        let facts = plan::create::Facts {
            spec: &spec,
            ..facts
        };
        let steps = match plan::create::bring_up(&facts, restoring) {
            Err(f) => return self.fail_create(&pod, restoring, f.into()).await,
            Ok(BringUpPlan::Fresh(steps)) => steps,
            Ok(BringUpPlan::Restore) => {
                // The boot clock spans the wake source's reads and pull.
                let _ = exec::run(&op, &plan::create::restore_begin()).await;
                let vm = spec.vm_name.as_str();
                let source = match self.artifacts.owner_of(&pod).await {
                    Ok(owner) => read_wake_source(&self.artifacts, &self.metrics, vm, &owner).await,
                    Err(e) => Err(e.into()),
                };
                match source {
                    Ok(source) => {
                        op.clone_from(&source);
                        plan::create::restore(&facts, &source)
                    }
                    Err(e) => {
                        return self.fail_create(&pod, true, e).await;
                    }
                }
            }
        };
        if let Err(f) = exec::run(&op, &steps).await {
            return self.fail_create(&pod, restoring, f.into()).await;
        }
        Ok(())
    }

    /// failCreate (§6.1): failOp, then untrack the incarnation so the retry starts clean.
    async fn fail_create(&self, pod: &Pod, restoring: bool, err: PodError) -> Result<()> {
        if restoring {
            self.metrics.wake(m::RESULT_FAILED);
        }
        self.api
            .fail_with(pod, ev::OP_CREATE, ev::CREATE_BRING_UP_FAILED, &err)
            .await;
        let key = pod_key(pod);
        let same = self.store.tables().tracked_uid(&key) == Some(uid(pod).as_str());
        if same {
            self.publisher.probes().forget(&key);
            let mut t = self.store.tables();
            // Keep the intent: `failed` must stay sticky across the retry's `creating`.
            t.untrack_vm(&key);
            t.pods.remove(&key);
            t.admitted.remove(&key);
            t.derived_restore.remove(&key);
        }
        Err(err)
    }
}

/// The tenant-isolation decision of a CreatePod ([`tenant::check_create`]) over this
/// agent's tracked pods and the configured clone roots.
/// `id_known`: an unmanaged pod's pre-assigned id resolves to a VM the runtime knows.
async fn tenant_check(
    store: &PodStore,
    cfg: &PodConfig,
    pod: &Pod,
    spec: &VmSpec,
    id_known: bool,
) -> Result<(), tenant::Refusal> {
    let key = pod_key(pod);
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    // The spec's own validation of `clone-from-dir` (§6.2 step 3: relative, not canonical,
    // mode=run, fork-from) speaks first: such a value never reaches the runtime, and its
    // message must not be hidden behind the root check.
    let raw_dir = annotation(pod, ann::CLONE_FROM_DIR)
        .filter(|_| rules::clone_from_dir(annotation(pod, ann::CLONE_FROM_DIR), spec).is_ok());
    let pre_id = VmRuntime::from_meta(&pod.metadata).id;
    let (vm_holders, fork_holders, id_taken) = {
        let t = store.tables();
        let id_taken = !spec.managed
            && !pre_id.is_empty()
            && (id_known
                || t.vms_by_pod
                    .values()
                    .chain(t.vms_by_name.values())
                    .any(|v| !v.synthetic && v.id() == pre_id));
        (
            t.holders_of(&spec.vm_name, Some(&key)),
            t.fork_holders_of(&spec.fork_from, Some(&key)),
            id_taken,
        )
    };
    let roots = &cfg.clone_from_dir_roots;
    // Symlinks are resolved only for a directory that exists (a missing one fails the
    // clone anyway); roots that do not resolve are compared as configured.
    let mut resolved_dir = None;
    let mut resolved_roots = Vec::new();
    if spec.managed
        && let Some(dir) = tenant::clone_dir_to_check(raw_dir)
    {
        resolved_dir = tokio::fs::canonicalize(dir).await.ok();
        for r in roots {
            resolved_roots.push(
                tokio::fs::canonicalize(r)
                    .await
                    .unwrap_or_else(|_| r.clone()),
            );
        }
    }
    let verdict = tenant::check_create(&tenant::CreateCheck {
        namespace: ns,
        pod: name,
        vm: &spec.vm_name,
        vm_holders: &vm_holders,
        fork_from: &spec.fork_from,
        fork_holders: &fork_holders,
        clone_dir: raw_dir,
        roots,
        resolved_dir: resolved_dir.as_deref(),
        resolved_roots: &resolved_roots,
        managed: spec.managed,
        pre_id: &pre_id,
        claimed_managed_id: id_taken.then_some(pre_id.as_str()),
        image: &spec.image,
        accept_legacy: cfg.tenant.accept_legacy_vm_names,
    });
    if let Err(e) = &verdict {
        warn!(
            pod = %key,
            vm = %spec.vm_name,
            fork_from = %spec.fork_from,
            ?vm_holders,
            ?fork_holders,
            refusal = %e,
            "tenant isolation refused the pod"
        );
    }
    verdict
}

/// A bring-up's spec from checkpoint `name` of the pod's namespace, read now.
async fn checkpoint_base(api: &ApiWriter, pod: &Pod, name: &str, spec: &VmSpec) -> Result<VmSpec> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let api = Api::<CocoonCheckpoint>::namespaced(api.client().clone(), ns);
    let found = api
        .get_opt(name)
        .await
        .map_err(|e| PodError::plan(e.to_string()))?;
    ckpt::clone_spec_from(ns, name, found.as_ref(), spec).map_err(PodError::plan)
}

/// The `vm clone` request of a bring-up from `from` (§6.4), the restore mode defaulting
/// to `VK_RESTORE_MODE`.
pub(crate) fn clone_request(
    default_restore_mode: &str,
    from: CloneSource,
    spec: &VmSpec,
    policy: CpuPolicy,
) -> CloneRequest {
    CloneRequest {
        from,
        to: spec.vm_name.clone(),
        network: spec.network.clone(),
        backend: spec.backend,
        no_direct_io: spec.no_direct_io,
        pull: false,
        restore_mode: rules::restore_mode(spec, default_restore_mode),
        cpu_policy: policy,
        nics: None,
    }
}
