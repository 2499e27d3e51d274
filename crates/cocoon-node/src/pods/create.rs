//! CreatePod (`node.md` §6): validation, unmanaged and adopt paths, the restore decision with
//! its evidence guards, the bring-up paths, and the background ready/post-clone steps.
//!
//! The decisions live in the planners: the admission in [`super::plan::admit`], the restore
//! decision and, from the mode dispatch on, the unmanaged, adopt and bring-up paths in
//! [`super::plan::create`], run by the executor; this module gathers their facts (the
//! runtime lookup, the tenant and host reach checks, the evidence read), applies their
//! answers, and runs the background steps.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{
    AnnotationCodec, HibernateFlags, LifecycleState, Os, VmRuntime, VmSpec,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{info, warn};

use super::effects::{PodOp, read_wake_source};
use super::exec;
use super::plan::create::{BringUpPlan, Route};
use super::plan::follow_up::{self, Background, FollowUp};
use super::plan::{self, StepFailed, admit};
use super::rules::{self, NicInfo};
use super::state::TrackedVm;
use super::tenant;
use super::{Handler, Result, annotation, failed, pod_key, uid};
use cocoon_runtime::{CloneRequest, CloneSource, CpuPolicy, VmRecord};

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
                    return Err(failed(e));
                }
                admit::Next::Claim => {
                    // Claim this incarnation before anything else, if it fits the node (the
                    // kubelet's resource admission, see `admission`).
                    if let Err(r) = self.claim_if_fits(&key, &pod) {
                        found.rejected = Some(r);
                        continue;
                    }
                    self.set_lifecycle(&pod, LifecycleState::Creating, "").await;
                    found.claimed = true;
                }
                admit::Next::Reject(r) => return self.reject_pod(&pod, &r).await,
                admit::Next::LookUpPreId => {
                    let known = self.runtime_has_vm_id(&pre_id).await;
                    found.pre_id_known = Some(known.map_err(|e| e.to_string()));
                }
                // Tenant isolation before any runtime, registry or by-name-index use of the
                // names.
                admit::Next::CheckTenant { id_known } => {
                    let verdict = self.tenant_check(&pod, &spec, id_known).await;
                    found.tenant = Some(verdict.map_err(|r| r.to_string()));
                }
                // Host reach: URL images and CNI networks only from the node's allowlists.
                admit::Next::CheckHostReach => {
                    let verdict = self.host_reach_check(&spec);
                    found.host_reach = Some(verdict.map_err(|r| r.to_string()));
                }
                // An unmanaged pod's IP: in the node's ranges, used by no other pod.
                admit::Next::CheckUnmanagedIp => {
                    let verdict = self.unmanaged_ip_check(&key, &pod);
                    found.unmanaged_ip = Some(verdict.map_err(|r| r.to_string()));
                }
                admit::Next::Refuse(f) => return self.fail_create_with(&pod, false, f).await,
                admit::Next::Admit => break,
            }
        }
        // Only now is the pod a holder of its VM name, with its name, `managed` and
        // pre-assigned id fixed (see `tenant::Admitted`).
        self.tables().admit(&key, &pod);

        // The mode dispatch and the bring-up are planned (`plan::create`).
        let adopt = if spec.managed {
            // Never an unmanaged pod's synthetic record: only a runtime VM is adopted.
            (self.tables().vms_by_name.get(&spec.vm_name).cloned()).filter(|v| !v.synthetic)
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
            Route::Refused(f) => return self.fail_create_with(&pod, false, f).await,
            Route::Steps(steps) => {
                if let Some(vm) = adopt {
                    info!(pod = %key, vm = %spec.vm_name, id = %vm.id(), "adopting existing VM");
                    op.adopting(vm);
                }
                if let Err(f) = exec::run(&op, &steps).await {
                    return self.fail_create_with(&pod, false, f).await;
                }
                return Ok(());
            }
            Route::BringUp => {}
        }

        let flags = HibernateFlags::from_meta(&pod.metadata);
        let evidence = match self.owner_of(&pod).await {
            Ok(owner) => self.hibernate_evidence(&spec.vm_name, &owner).await,
            Err(e) => Err(e),
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
            self.tables().derived_restore.insert(key.clone());
        }
        if let Some((reason, message)) = &decision.warning {
            self.event(&pod, true, reason, message).await;
        }
        let restoring = match decision.restoring {
            Ok(r) => r,
            Err(f) => return self.fail_create_with(&pod, false, f).await,
        };
        let steps = match plan::create::bring_up(&facts, restoring) {
            Err(f) => return self.fail_create_with(&pod, restoring, f).await,
            Ok(BringUpPlan::Fresh(steps)) => steps,
            Ok(BringUpPlan::Restore) => {
                // The boot clock spans the wake source's reads and pull.
                let _ = exec::run(&op, &plan::create::restore_begin()).await;
                let vm = spec.vm_name.as_str();
                let source = match self.owner_of(&pod).await {
                    Ok(owner) => read_wake_source(self, vm, &owner).await,
                    Err(e) => Err(e),
                };
                match source {
                    Ok(source) => {
                        op.clone_from(&source);
                        plan::create::restore(&facts, &source)
                    }
                    Err(e) => {
                        return self
                            .fail_create(&pod, true, ev::CREATE_BRING_UP_FAILED, &e)
                            .await;
                    }
                }
            }
        };
        if let Err(f) = exec::run(&op, &steps).await {
            return self.fail_create_with(&pod, restoring, f).await;
        }
        Ok(())
    }

    /// Steps 9–15 of §6.1 (shared with wake): IP, runtime annotations, tracking, probe, status,
    /// and `ready` now or from the background step.
    pub(crate) async fn finish_bring_up(
        self: &Arc<Self>,
        key: &str,
        pod: &Pod,
        spec: &VmSpec,
        vm: VmRecord,
        follow: FollowUp,
    ) {
        let mut tv = TrackedVm::new(vm);
        let vm_id = tv.id().to_owned();
        self.track_vm(key, tv.clone());
        if tv.ip.is_empty() {
            tv.ip = self.resolve_ip(key);
        }
        self.write_runtime(pod, &tv, 0).await;
        {
            let mut t = self.tables();
            t.start_times
                .insert(key.to_owned(), Time(k8s_openapi::jiff::Timestamp::now()));
        }
        if follow != FollowUp::None {
            let me = self.clone();
            let (k, s) = (key.to_owned(), spec.clone());
            self.spawn(async move { me.post_bring_up(&k, &s, &vm_id, follow).await });
        }
        self.start_probe(key).await;
        let failed_now = self.intent_state(key) == Some(LifecycleState::Failed);
        if follow_up::ready_now(follow, failed_now) {
            self.publish_ready(key).await;
        } else {
            self.notify(key).await;
        }
    }

    /// The tenant-isolation decision of a CreatePod ([`tenant::check_create`]) over this
    /// agent's tracked pods and the configured clone roots.
    /// `id_known`: an unmanaged pod's pre-assigned id resolves to a VM the runtime knows.
    async fn tenant_check(
        &self,
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
            let t = self.tables();
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
        let roots = &self.cfg.clone_from_dir_roots;
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
            accept_legacy: self.cfg.tenant.accept_legacy_vm_names,
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

    /// [`Handler::fail_create`] of a refused or failed plan.
    async fn fail_create_with(&self, pod: &Pod, restoring: bool, f: StepFailed) -> Result<()> {
        let reason = f.reason.unwrap_or(ev::CREATE_BRING_UP_FAILED);
        self.fail_create(pod, restoring, reason, &f.message).await
    }

    /// failCreate (§6.1): failOp, then untrack the incarnation so the retry starts clean.
    async fn fail_create(&self, pod: &Pod, restoring: bool, reason: &str, err: &str) -> Result<()> {
        if restoring {
            self.metrics.wake(m::RESULT_FAILED);
        }
        self.fail_op(pod, reason, ev::OP_CREATE, err).await;
        let key = pod_key(pod);
        let same = self.tables().tracked_uid(&key) == Some(uid(pod).as_str());
        if same {
            self.probes.forget(&key);
            let mut t = self.tables();
            // Keep the intent: `failed` must stay sticky across the retry's `creating`.
            t.untrack_vm(&key);
            t.pods.remove(&key);
            t.admitted.remove(&key);
            t.derived_restore.remove(&key);
        }
        Err(failed(err))
    }

    pub(crate) fn clone_request(
        &self,
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
            restore_mode: rules::restore_mode(spec, &self.cfg.restore_mode),
            cpu_policy: policy,
            nics: None,
        }
    }

    /// The post-restore / post-clone step (§6.9, §8.3), in the background.
    async fn post_bring_up(
        self: &Arc<Self>,
        key: &str,
        spec: &VmSpec,
        vm_id: &str,
        follow: FollowUp,
    ) {
        let Some(vm) = self.tracked_vm(key) else {
            return;
        };
        let any_static = vm.record.network_configs.iter().any(|n| !n.is_dhcp());
        match follow_up::background(spec, follow, any_static) {
            Background::Hint => self.write_hint(key, spec, &vm).await,
            Background::ReadyAfterIp { wake } => self.ready_after_ip(key, vm_id, wake).await,
        }
    }

    /// Hint mode (§6.9): write the fixup as a base64 annotation; `ready` follows the probe.
    async fn write_hint(self: &Arc<Self>, key: &str, spec: &VmSpec, vm: &TrackedVm) {
        let Some(pod) = self.tracked_pod(key) else {
            return;
        };
        let nics: Vec<NicInfo> = vm
            .record
            .network_configs
            .iter()
            .map(|n| NicInfo {
                mac: n.mac.clone(),
                ip: n.static_ip().to_owned(),
                prefix: n.network.as_ref().map_or(0, |x| x.prefix),
                gateway: n
                    .network
                    .as_ref()
                    .map(|x| x.gateway.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let overlay = self
            .cfg
            .cocoon_root_dir
            .join("run/cloudhypervisor")
            .join(vm.id())
            .join("overlay.qcow2");
        let windows = spec.effective_os() == Os::Windows;
        let overlay = !windows && overlay.exists();
        let hint = follow_up::hint(spec, vm.name(), overlay, &nics);
        let encoded = base64::engine::general_purpose::STANDARD.encode(hint.as_bytes());
        warn!(pod = %key, vm = %vm.name(), "VM needs manual network setup; see the post-clone-hint annotation");
        let delta = [(ann::POST_CLONE_HINT.to_owned(), Some(encoded))].into();
        if let Err(e) = self.patch_annotations(&pod, delta).await {
            warn!(pod = %key, error = %e, "writing the post-clone hint failed");
        }
        self.tables().ready_pending.insert(key.to_owned());
        if self.probes.result(key).is_some_and(|p| p.ready)
            && self.tables().ready_pending.remove(key)
        {
            self.publish_ready(key).await;
        }
    }

    /// "Ready after IP" (§6.9): poll for the IP, then publish `ready`; a timeout fails.
    pub(crate) async fn ready_after_ip(self: &Arc<Self>, key: &str, vm_id: &str, wake: bool) {
        let deadline = Instant::now() + self.cfg.timing.ready_ip_wait;
        loop {
            // Taken before the IP is resolved: a lease that lands meanwhile ends the wait.
            let mut lease = self.leases.wait();
            let still_ours = self.tracked_vm(key).is_some_and(|v| v.id() == vm_id)
                && self
                    .tracked_pod(key)
                    .is_some_and(|p| !HibernateFlags::from_meta(&p.metadata).hibernate);
            if !still_ours {
                return;
            }
            if !self.resolve_ip(key).is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let Some(pod) = self.tracked_pod(key) else {
                    return;
                };
                let vm = VmSpec::from_meta(&pod.metadata).vm_name;
                let (reason, msg) =
                    follow_up::ip_wait_timeout(wake, &vm, self.cfg.timing.ready_ip_wait);
                self.metrics.wake_ip_wait("timeout");
                if wake {
                    self.metrics.wake(m::RESULT_FAILED);
                }
                self.event(&pod, true, reason, &msg).await;
                self.set_lifecycle(&pod, LifecycleState::Failed, &msg).await;
                self.notify(key).await;
                return;
            }
            // The 200 ms poll of §6.9, cut short by a change of the lease file.
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.timing.ready_ip_poll) => {}
                _ = lease.changed() => {}
            }
        }
        if let Some(pod) = self.tracked_pod(key) {
            // Persist the resolved IP for consumers of the runtime annotations.
            if let Some(vm) = self.tracked_vm(key) {
                self.write_runtime(&pod, &vm, 0).await;
            }
        }
        self.publish_ready(key).await;
        self.metrics.wake_ip_wait(m::RESULT_OK);
        if wake {
            self.metrics.wake(m::RESULT_OK);
        }
    }
}
