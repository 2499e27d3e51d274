//! CreatePod (`node.md` §6): validation, unmanaged and adopt paths, the restore decision with
//! its evidence guards, the bring-up paths, and the background ready/post-clone steps.
//!
//! The decision order lives in `rules`; this module performs the calls in that order.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::{hibernate_snapshot_exists_message, node as ev};
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{
    AnnotationCodec, Backend, HibernateFlags, LifecycleState, Os, VmRuntime, VmSpec,
};
use cocoon_api::naming::fork_snapshot_name;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{info, warn};

use super::owned::Owner;
use super::rules::{self, BringUp, NicInfo, PodResources, Verdict};
use super::state::TrackedVm;
use super::tenant;
use super::transfer::WakeSource;
use super::{Handler, Result, annotation, failed, pod_key, uid};
use crate::runtime::{CloneRequest, CloneSource, CpuPolicy, RunRequest, VmRecord};

/// Which background step follows a bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FollowUp {
    /// Ready now.
    None,
    /// Post-restore (wake accounting).
    Restore,
    /// Post-clone (op `create`).
    Clone,
}

impl Handler {
    /// CreatePod (§6.1).
    pub async fn create_pod(self: &Arc<Self>, pod: Pod) -> Result<()> {
        let key = pod_key(&pod);
        let spec = VmSpec::from_meta(&pod.metadata);
        if spec.vm_name.is_empty() {
            self.metrics
                .pod_lifecycle(ev::OP_CREATE, m::RESULT_SKIPPED, m::REASON_MISSING_VMNAME);
            return Err(failed(format!(
                "pod {key} missing {} annotation",
                ann::VM_NAME
            )));
        }
        // Claim this incarnation before anything else.
        {
            let mut t = self.tables();
            t.pods.insert(key.clone(), pod.clone());
            t.start_times
                .entry(key.clone())
                .or_insert_with(|| Time(k8s_openapi::jiff::Timestamp::now()));
        }
        self.set_lifecycle(&pod, LifecycleState::Creating, "").await;

        // An unmanaged pod's pre-assigned id must not resolve to any VM the runtime knows
        // (exact id, name or id prefix): its record is synthetic and never touched there.
        let pre_id = VmRuntime::from_meta(&pod.metadata).id;
        let id_known = if spec.managed {
            false
        } else {
            match self.runtime_knows_vm(&pre_id).await {
                Ok(known) => known,
                Err(e) => {
                    let e = format!("look up pre-assigned VM id {pre_id:?}: {e}");
                    return self
                        .fail_create(&pod, false, ev::CREATE_BRING_UP_FAILED, &e)
                        .await;
                }
            }
        };
        // Tenant isolation before any runtime, registry or by-name-index use of the names.
        if let Err(refusal) = self.tenant_check(&pod, &spec, id_known).await {
            return self
                .fail_create(
                    &pod,
                    false,
                    ev::TENANT_ISOLATION_REFUSED,
                    &refusal.to_string(),
                )
                .await;
        }
        // Host reach: URL images and CNI networks only from the node's allowlists.
        if let Err(refusal) = self.host_reach_check(&spec) {
            let msg = refusal.to_string();
            return self
                .fail_create(&pod, false, ev::TENANT_ISOLATION_REFUSED, &msg)
                .await;
        }
        // Only now is the pod a holder of its VM name, with its name, `managed` and
        // pre-assigned id fixed (see `tenant::Admitted`).
        self.tables().admit(&key, &pod);

        if !spec.managed {
            return self.create_unmanaged(&key, &pod, &spec).await;
        }
        let adoptable = self.tables().vms_by_name.get(&spec.vm_name).cloned();
        if let Some(vm) = adoptable {
            info!(pod = %key, vm = %spec.vm_name, id = %vm.id(), "adopting existing VM");
            self.write_runtime(&pod, &vm, 0).await;
            self.track_vm(&key, vm);
            self.start_probe(&key).await;
            self.publish_ready(&key).await;
            self.metrics
                .pod_lifecycle(ev::OP_CREATE, m::RESULT_OK, m::REASON_ADOPTED);
            return Ok(());
        }

        let flags = HibernateFlags::from_meta(&pod.metadata);
        let clone_dir = annotation(&pod, ann::CLONE_FROM_DIR).map(str::to_owned);
        let restoring = match self
            .restore_decision(
                &pod,
                &spec,
                flags.restore_from_hibernate,
                clone_dir.as_deref(),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return self
                    .fail_create(&pod, false, ev::HIBERNATE_EVIDENCE_FAILED, &e)
                    .await;
            }
        };
        let started = Instant::now();
        let vm = match self
            .bring_up(&pod, &spec, restoring, clone_dir.as_deref())
            .await
        {
            Ok(vm) => vm,
            Err(e) => {
                return self
                    .fail_create(&pod, restoring, ev::CREATE_BRING_UP_FAILED, &e)
                    .await;
            }
        };
        let mode = if restoring {
            "clone".to_owned()
        } else {
            annotation(&pod, ann::MODE).unwrap_or("").to_owned()
        };
        self.observe_boot(&mode, &spec, started);
        let follow = if restoring {
            FollowUp::Restore
        } else if rules::is_cloned(&spec, clone_dir.as_deref()) {
            FollowUp::Clone
        } else {
            FollowUp::None
        };
        self.finish_bring_up(&key, &pod, &spec, vm, follow).await;
        self.metrics.pod_lifecycle(ev::OP_CREATE, m::RESULT_OK, "");
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
        if follow == FollowUp::None && !failed_now {
            self.publish_ready(key).await;
        } else {
            self.notify(key).await;
        }
    }

    fn observe_boot(&self, mode: &str, spec: &VmSpec, started: Instant) {
        self.metrics.vm_boot(
            mode,
            spec.effective_backend().as_str(),
            started.elapsed().as_secs_f64(),
        );
    }

    async fn create_unmanaged(self: &Arc<Self>, key: &str, pod: &Pod, spec: &VmSpec) -> Result<()> {
        let rt = VmRuntime::from_meta(&pod.metadata);
        if rt.id.is_empty() || rt.ip.is_empty() {
            let e = format!("unmanaged vm {} missing pre-assigned IP/VMID", spec.vm_name);
            return self
                .fail_create(pod, false, ev::CREATE_BRING_UP_FAILED, &e)
                .await;
        }
        let mut record = VmRecord {
            id: rt.id.clone(),
            state: "running".into(),
            ..Default::default()
        };
        record.config.name = spec.vm_name.clone();
        let mut tv = TrackedVm::new(record);
        tv.ip = rt.ip;
        tv.synthetic = true;
        self.track_vm(key, tv);
        self.start_probe(key).await;
        self.publish_ready(key).await;
        self.metrics.pod_lifecycle(ev::OP_CREATE, m::RESULT_OK, "");
        Ok(())
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
                t.holders_of(&spec.fork_from, Some(&key)),
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

    /// Step 6 of §6.1 with the guards of §6.3. `Err` is the evidence failure text.
    async fn restore_decision(
        &self,
        pod: &Pod,
        spec: &VmSpec,
        explicit: bool,
        clone_dir: Option<&str>,
    ) -> Result<bool, String> {
        let evidence = match self
            .hibernate_evidence(&spec.vm_name, &Owner::of(pod))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                self.metrics.hibernate_evidence("unavailable");
                self.event(pod, true, ev::HIBERNATE_EVIDENCE_UNAVAILABLE, &e)
                    .await;
                return Err(e);
            }
        };
        let verdict = rules::restore_verdict(spec, explicit, clone_dir, &evidence);
        if let Some(label) = verdict
            .label()
            .filter(|_| !explicit || !matches!(verdict, Verdict::Restore))
        {
            self.metrics.hibernate_evidence(label);
        }
        match verdict {
            Verdict::FreshBoot => Ok(false),
            Verdict::SourceConflict(e) | Verdict::ImageConflict(e) => Err(e),
            Verdict::Restore => {
                if !explicit {
                    self.tables().derived_restore.insert(pod_key(pod));
                    self.event(
                        pod,
                        true,
                        ev::HIBERNATE_SNAPSHOT_EXISTS,
                        &hibernate_snapshot_exists_message(&spec.vm_name),
                    )
                    .await;
                }
                Ok(true)
            }
        }
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

    /// bringUpVM (§6.2).
    async fn bring_up(
        &self,
        pod: &Pod,
        spec: &VmSpec,
        restoring: bool,
        clone_dir: Option<&str>,
    ) -> Result<VmRecord, String> {
        let vm = &spec.vm_name;
        let res = PodResources::of(pod);
        let policy = res.cpu_policy();
        let path = rules::bring_up_path(spec, restoring, clone_dir)?;
        let owner = Owner::of(pod);
        if path == BringUp::Restore {
            let src = self.resolve_wake_source(vm, &owner).await?;
            return self.clone_from_hibernate(spec, src, policy).await;
        }
        // A fresh bring-up starts a new lineage: never hand a dead incarnation's fork baseline
        // to new sub-agents.
        if let Err(e) = self
            .rt
            .snapshot_remove_if_exists(&fork_snapshot_name(vm))
            .await
        {
            warn!(vm, error = %e, "dropping the fork baseline failed");
        }
        match path {
            BringUp::Restore => Err("unreachable restore".into()),
            BringUp::CloneFromDir(dir) => {
                let mut req = self.clone_request(CloneSource::Dir(dir.clone()), spec, policy);
                req.pull = true;
                let r = self.rt.clone_vm(req).await;
                self.metrics.clone_from_dir(if r.is_ok() {
                    m::RESULT_OK
                } else {
                    m::RESULT_FAILED
                });
                r.map_err(|e| format!("clone vm {vm} from dir {}: {e}", dir.display()))
            }
            BringUp::Fork(src) => {
                let snap = self.ensure_fork_snapshot(&src).await?;
                let req = self.clone_request(CloneSource::Snapshot(snap.clone()), spec, policy);
                self.rt
                    .clone_vm(req)
                    .await
                    .map_err(|e| format!("clone vm {vm} from {snap}: {e}"))
            }
            BringUp::Run => {
                let image = self
                    .ensure_run_image(&spec.image, spec.force_pull)
                    .await
                    .map_err(|e| format!("ensure image {}: {e}", spec.image))?;
                let req = RunRequest {
                    image,
                    name: vm.clone(),
                    cpu: res.vcpus(),
                    memory: res.memory.clone(),
                    storage: spec.storage.clone(),
                    network: spec.network.clone(),
                    os: spec.os.map(|o| o.as_str().to_owned()).unwrap_or_default(),
                    backend: spec.backend,
                    no_direct_io: spec.no_direct_io,
                    cpu_policy: policy,
                };
                self.rt
                    .run(req)
                    .await
                    .map_err(|e| format!("run vm {vm}: {e}"))
            }
            BringUp::Clone => {
                let (repo, tag) = rules::parse_ref(&spec.image);
                let local = rules::local_snapshot_name(&repo, &tag);
                let (snap, imported) = match self.ensure_snapshot(&repo, &tag, &local, &owner).await
                {
                    Ok(s) => {
                        self.metrics.snapshot_pull(m::RESULT_OK);
                        s
                    }
                    Err(e) => {
                        self.metrics.snapshot_pull(m::RESULT_FAILED);
                        return Err(format!("ensure snapshot {local}: {e}"));
                    }
                };
                if let Some(s) = &snap {
                    rules::assert_snapshot_backend(&local, &s.hypervisor, spec.backend)
                        .map_err(|e| format!("clone vm {vm} from {local}: {e}"))?;
                }
                self.ensure_snapshot_base_image(snap.as_ref()).await?;
                let mut req =
                    self.clone_request(CloneSource::Snapshot(local.clone()), spec, policy);
                req.pull = snap.as_ref().is_some_and(|s| !s.image.is_empty());
                let cloned = self
                    .rt
                    .clone_vm(req)
                    .await
                    .map_err(|e| format!("clone vm {vm} from {local}: {e}"));
                if imported {
                    // A new clone base landed: older unused ones beyond the limit go.
                    self.collect_clone_bases().await;
                }
                cloned
            }
        }
    }

    /// cloneFromHibernate (§8.3): base image, clone, and cleanup of a one-shot import.
    pub(crate) async fn clone_from_hibernate(
        &self,
        spec: &VmSpec,
        src: WakeSource,
        policy: CpuPolicy,
    ) -> Result<VmRecord, String> {
        let vm = &spec.vm_name;
        let result = async {
            self.ensure_snapshot_base_image(Some(&src.snapshot)).await?;
            let mut req =
                self.clone_request(CloneSource::Snapshot(src.local.clone()), spec, policy);
            req.pull = !src.snapshot.image.is_empty();
            if ch_windows(spec) {
                req.nics = Some(1);
            }
            self.rt
                .clone_vm(req)
                .await
                .map_err(|e| format!("clone vm {vm} from {}: {e}", src.local))
        }
        .await;
        if src.import {
            let rt = self.rt.clone();
            let name = src.local.clone();
            self.spawn(async move {
                if let Err(e) = rt.snapshot_remove_if_exists(&name).await {
                    warn!(snapshot = %name, error = %e, "removing the wake import failed");
                }
            });
        }
        result
    }

    /// The post-restore / post-clone step (§6.9, §8.3), in the background.
    async fn post_bring_up(
        self: &Arc<Self>,
        key: &str,
        spec: &VmSpec,
        vm_id: &str,
        follow: FollowUp,
    ) {
        let wake = follow == FollowUp::Restore;
        let Some(vm) = self.tracked_vm(key) else {
            return;
        };
        let any_static = vm.record.network_configs.iter().any(|n| !n.is_dhcp());
        let needs_fixup = !(wake && ch_windows(spec)) && rules::post_clone_needed(spec, any_static);
        if needs_fixup {
            self.write_hint(key, spec, &vm).await;
            return;
        }
        self.ready_after_ip(key, vm_id, wake).await;
    }

    /// Hint mode (§6.9): write the fixup as a base64 annotation; `ready` follows the probe.
    async fn write_hint(self: &Arc<Self>, key: &str, spec: &VmSpec, vm: &TrackedVm) {
        let Some(pod) = self.tracked_pod(key) else {
            return;
        };
        let hint = if spec.effective_os() == Os::Windows {
            rules::WINDOWS_FIXUP.to_owned()
        } else {
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
            let cloud = spec.image.starts_with("http://")
                || spec.image.starts_with("https://")
                || overlay.exists();
            rules::linux_fixup_script(
                vm.name(),
                spec.backend == Some(Backend::Firecracker),
                cloud,
                &nics,
            )
        };
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
                let what = if wake { "wake" } else { "clone" };
                let msg = format!(
                    "{what} {vm}: dhcp lease not observed within {}s",
                    self.cfg.timing.ready_ip_wait.as_secs()
                );
                self.metrics.wake_ip_wait("timeout");
                if wake {
                    self.metrics.wake(m::RESULT_FAILED);
                }
                let reason = if wake {
                    ev::WAKE_IP_WAIT_TIMEOUT
                } else {
                    ev::POST_CLONE_IP_WAIT_TIMEOUT
                };
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

/// CH+Windows: the hibernate drops the NIC and the wake hot-adds one.
pub(crate) fn ch_windows(spec: &VmSpec) -> bool {
    spec.backend == Some(Backend::CloudHypervisor) && spec.os == Some(Os::Windows)
}
