//! The handler's [`Effects`]: what each planned action and compensation does against the
//! runtime, the registry and the API, with the counters the spec gives each. The only place
//! the plans reach the runtime.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cocoon_api::contract::checkpoint as ckpt;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{VmSpec, tags};
use cocoon_api::naming::fork_snapshot_name;
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::exec::Effects;
use super::plan::transfer::GateError;
use super::plan::wake::{
    ArtifactRead, LocalRead, Source, SourceFacts, SourceNext, SourceRead, VerifyRead,
};
use super::plan::{
    Action, ActionError, AfterFailedRemove, CloneFrom, ClonePull, Undo, after_failed_remove,
    removed,
};
use crate::metrics::NodeMetrics;
use crate::pods::api_writer::ApiWriter;
use crate::pods::artifacts::Artifacts;
use crate::pods::artifacts::PushRefusal;
use crate::pods::create::clone_request;
use crate::pods::error::{PodError, RegistryFailure, RuntimeFailure};
use crate::pods::publisher::Publisher;
use crate::pods::rules::{self, PodResources};
use crate::pods::state::TrackedVm;
use crate::pods::store::PodStore;
use crate::pods::tenant::ArtifactUse;
use crate::pods::tenant::Owner;
use crate::pods::{Handler, status};
use cocoon_api::contract::owner as owner_rule;
use cocoon_runtime::{
    CloneSource, RunRequest, Runtime, RuntimeError, SnapshotRecord, VmRecord, exec_capture,
};

/// One pod operation's view of the handler: the pod, its spec, the VM it acts on, and what
/// the steps so far handed on.
pub(crate) struct PodOp<'a> {
    store: &'a PodStore,
    api: &'a ApiWriter,
    artifacts: &'a Artifacts,
    publisher: &'a Arc<Publisher>,
    metrics: &'a NodeMetrics,
    /// `VK_RESTORE_MODE`.
    restore_mode: &'a str,
    key: &'a str,
    pod: &'a Pod,
    spec: &'a VmSpec,
    /// The tracked VM (its id and IP are what [`Undo::RestoreRuntime`] writes back).
    vm: Option<&'a TrackedVm>,
    carry: Mutex<Carry>,
}

/// What a step hands on to the later ones.
#[derive(Default)]
struct Carry {
    /// The snapshot the next clone is from.
    snapshot: Option<SnapshotRecord>,
    /// The VM the bring-up brought up.
    brought_up: Option<VmRecord>,
    /// When the boot clock started.
    boot_started: Option<Instant>,
    /// The clone base was imported by this bring-up.
    imported: bool,
    /// The ref `vm run` boots.
    run_image: String,
    /// The indexed VM an adoption takes.
    adopt: Option<TrackedVm>,
}

impl<'a> PodOp<'a> {
    /// An operation on `pod` (`key`), acting on the tracked `vm` if any.
    pub(crate) fn new(
        h: &'a Handler,
        key: &'a str,
        pod: &'a Pod,
        spec: &'a VmSpec,
        vm: Option<&'a TrackedVm>,
    ) -> Self {
        PodOp {
            store: &h.store,
            api: &h.api,
            artifacts: &h.artifacts,
            publisher: &h.publisher,
            metrics: &h.metrics,
            restore_mode: &h.cfg.restore_mode,
            key,
            pod,
            spec,
            vm,
            carry: Mutex::default(),
        }
    }

    /// The operation clones from `source`: a local copy is the snapshot of the next clone.
    pub(crate) fn clone_from(&self, source: &Source) {
        if let Source::Local(snapshot) = source {
            self.carry().snapshot = Some(SnapshotRecord::clone(snapshot));
        }
    }

    /// The operation adopts `vm` (from the by-name index).
    pub(crate) fn adopting(&self, vm: TrackedVm) {
        self.carry().adopt = Some(vm);
    }

    fn carry(&self) -> MutexGuard<'_, Carry> {
        self.carry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Removes `<vm>` and `fork-<vm>` concurrently, each within its own 10 s, in a task of its
/// own (detached from the caller) that is awaited, so an immediate recreate cannot race them.
async fn drop_local_snapshots_bounded(rt: &Arc<dyn Runtime>, vm: &str) {
    let rt = rt.clone();
    let (a, b) = (vm.to_owned(), fork_snapshot_name(vm));
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

/// `resolveWakeSource(vm)`'s reads (§8.3), as [`super::plan::wake::source`] asks for them, for the
/// pod `owner`: the registry's `:hibernate` is used (and trusted to verify the local copy)
/// only when it is the owner's. Counts `cocoon_vk_snapshot_verify_total`.
pub(crate) async fn read_wake_source(
    artifacts: &Artifacts,
    metrics: &NodeMetrics,
    vm: &str,
    owner: &Owner,
) -> Result<Source, PodError> {
    let mut f = SourceFacts {
        registry: artifacts.registry().is_some(),
        ..SourceFacts::default()
    };
    loop {
        match super::plan::wake::source(vm, &f) {
            SourceNext::Use(source) => return Ok(source),
            SourceNext::Fail(e) => return Err(PodError::plan(e)),
            SourceNext::Read(SourceRead::Artifact) => {
                let read = artifacts
                    .owned_artifact(ArtifactUse::OwnVm, vm, tags::HIBERNATE, owner)
                    .await;
                f.artifact = Some(match read {
                    Ok(Some(a)) => ArtifactRead::Owned { digest: a.digest },
                    Ok(None) => ArtifactRead::Absent,
                    Err(GateError::Refused(r)) => ArtifactRead::Refused(r.to_string()),
                    Err(GateError::Failed(e)) => ArtifactRead::Unreadable(e),
                });
            }
            SourceNext::Read(SourceRead::Local) => {
                f.local = Some(match artifacts.snapshot_exact(vm).await {
                    Ok(s) => LocalRead::Present(Box::new(s)),
                    Err(e) if e.is_snapshot_not_found() => LocalRead::Absent,
                    Err(e) => LocalRead::Failed(e.to_string()),
                });
            }
            SourceNext::Read(SourceRead::Verify) => {
                let local = match &f.local {
                    Some(LocalRead::Present(s)) => s.id.clone(),
                    _ => String::new(),
                };
                let verdict = match &artifacts.registry() {
                    None => VerifyRead::Matches,
                    Some(reg) => match reg.snapshot_info(vm, tags::HIBERNATE).await {
                        Ok(None) => VerifyRead::Stale,
                        Ok(Some(i)) if i.snapshot_id != local => {
                            info!(vm, registry = %i.snapshot_id, %local, "local snapshot is stale");
                            VerifyRead::Stale
                        }
                        Ok(Some(_)) => VerifyRead::Matches,
                        Err(e) => VerifyRead::Failed(e.to_string()),
                    },
                };
                metrics.snapshot_verify(match verdict {
                    VerifyRead::Matches => "ok",
                    VerifyRead::Stale => "stale",
                    VerifyRead::Failed(_) => "error",
                });
                f.verify = Some(verdict);
            }
        }
    }
}

const RENEW: [&str; 4] = ["cmd", "/c", "ipconfig", "/renew"];

/// Runs `argv` in the guest of `id` within `limit`; true when it ran and succeeded.
async fn exec_bounded(rt: &dyn Runtime, id: &str, argv: &[&str], limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, exec_capture(rt, id, argv, None)).await,
        Ok(out) if out.result.is_ok()
    )
}

impl PodOp<'_> {
    /// `ipconfig /renew` (after `net_resize(id, 1)` when `re_add_nic`), detached with a 30 s
    /// budget; errors are logged.
    fn spawn_nic_restore(&self, id: &str, re_add_nic: bool) {
        let rt = self.artifacts.rt().clone();
        let id = id.to_owned();
        self.artifacts.spawn(async move {
            let work = async {
                if re_add_nic && let Err(e) = rt.net_resize(&id, 1).await {
                    warn!(vm = %id, error = %e, "NIC rollback failed");
                }
                let _ = exec_capture(rt.as_ref(), &id, &RENEW, None).await;
            };
            let _ = tokio::time::timeout(Duration::from_secs(30), work).await;
        });
    }

    async fn save(&self, name: &str, id: &str) -> Result<(), RuntimeFailure> {
        let start = Instant::now();
        match self.artifacts.rt().snapshot_save(name, id).await {
            Ok(()) => {
                self.metrics
                    .snapshot_save_duration
                    .observe(start.elapsed().as_secs_f64());
                self.metrics.snapshot_save(m::RESULT_OK);
                Ok(())
            }
            Err(e) => {
                self.metrics.snapshot_save(m::RESULT_FAILED);
                Err(e.into())
            }
        }
    }

    fn remove_snapshot_detached(&self, name: &str) {
        let rt = self.artifacts.rt().clone();
        let name = name.to_owned();
        self.artifacts.spawn(async move {
            if let Err(e) = rt.snapshot_remove_if_exists(&name).await {
                warn!(snapshot = %name, error = %e, "removing the wake import failed");
            }
        });
    }

    async fn pull(&self, repo: &str, reference: &str, into: &str) -> Result<(), RegistryFailure> {
        let res = self.artifacts.shared_pull(repo, reference, into).await;
        self.metrics.snapshot_pull(if res.is_ok() {
            m::RESULT_OK
        } else {
            m::RESULT_FAILED
        });
        let pulled = res?;
        let r = &pulled.report;
        self.api
            .transfer_event(
                repo,
                false,
                &r.format,
                r.bytes_downloaded,
                r.data_bytes,
                pulled.took,
            )
            .await;
        Ok(())
    }

    async fn clone_vm(
        &self,
        from: &CloneFrom,
        pull: ClonePull,
        nics: Option<u32>,
    ) -> Result<(), RuntimeFailure> {
        let from = match from {
            CloneFrom::Snapshot(s) => CloneSource::Snapshot(s.clone()),
            CloneFrom::Dir(d) => CloneSource::Dir(d.clone()),
        };
        let policy = PodResources::of(self.pod).cpu_policy();
        let mut req = clone_request(self.restore_mode, from, self.spec, policy);
        req.pull = match pull {
            ClonePull::IfSnapshotHasImage => self
                .carry()
                .snapshot
                .as_ref()
                .is_some_and(|s| !s.image.is_empty()),
            ClonePull::Always => true,
            ClonePull::Never => false,
        };
        req.nics = nics;
        let dir = matches!(req.from, CloneSource::Dir(_));
        let res = self.artifacts.rt().clone_vm(req).await;
        if dir {
            self.metrics.clone_from_dir(if res.is_ok() {
                m::RESULT_OK
            } else {
                m::RESULT_FAILED
            });
        }
        self.carry().brought_up = Some(res?);
        Ok(())
    }

    async fn run_vm(&self) -> Result<(), RuntimeFailure> {
        let res = PodResources::of(self.pod);
        let spec = self.spec;
        let req = RunRequest {
            image: self.carry().run_image.clone(),
            name: spec.vm_name.clone(),
            cpu: res.vcpus(),
            memory: res.memory.clone(),
            storage: spec.storage.clone(),
            network: spec.network.clone(),
            os: spec.os.map(|o| o.as_str().to_owned()).unwrap_or_default(),
            backend: spec.backend,
            no_direct_io: spec.no_direct_io,
            cpu_policy: res.cpu_policy(),
        };
        let vm = self.artifacts.rt().run(req).await?;
        self.carry().brought_up = Some(vm);
        Ok(())
    }

    async fn ensure_clone_base(
        &self,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<(), RegistryFailure> {
        let mut owner = Owner::of(self.pod);
        if let Some(name) = crate::pods::annotation(self.pod, ckpt::FROM_CHECKPOINT_ANNOTATION) {
            owner.pod = ckpt::owner_pod(name); // a checkpoint base records its checkpoint
        }
        match self
            .artifacts
            .ensure_snapshot(repo, tag, local, &owner)
            .await
        {
            Ok((snapshot, imported)) => {
                self.metrics.snapshot_pull(m::RESULT_OK);
                let mut c = self.carry();
                c.snapshot = snapshot;
                c.imported = imported;
                Ok(())
            }
            Err(e) => {
                self.metrics.snapshot_pull(m::RESULT_FAILED);
                Err(e)
            }
        }
    }

    async fn collect_clone_bases_if_imported(&self) {
        let imported = self.carry().imported;
        if imported {
            // A new clone base landed: older unused ones beyond the limit go.
            self.artifacts.collect_clone_bases(self.store).await;
        }
    }

    fn track_synthetic(&self, id: &str, ip: &str) {
        let mut record = VmRecord {
            id: id.to_owned(),
            state: "running".into(),
            ..Default::default()
        };
        record.config.name = self.spec.vm_name.clone();
        let mut tv = TrackedVm::new(record);
        tv.ip = ip.to_owned();
        tv.synthetic = true;
        self.store.track_vm(self.key, tv);
    }

    /// §7 step 5: save, then push to `:latest`; failures are counted and logged.
    async fn routine_snapshot(&self, name: &str, id: &str, base_image: &str) {
        if let Err(e) = self.save(name, id).await {
            warn!(pod = %self.key, vm = %name, error = %e, "routine snapshot save failed");
            return;
        }
        if let Err(e) = self.push(name, tags::LATEST, base_image).await {
            warn!(pod = %self.key, vm = %name, error = %e, "routine snapshot push failed");
        }
    }

    /// Forgets the pod and writes its final status `Succeeded`.
    async fn finish_delete(&self) {
        let previous = self
            .store
            .tracked_pod(self.key)
            .and_then(|p| p.status)
            .or_else(|| self.pod.status.clone());
        self.publisher.forget(self.key);
        let st = status::succeeded(previous.as_ref());
        if let Err(e) = self.api.write_status(self.pod, &st).await {
            debug!(pod = %self.key, error = %e, "final status write failed");
        }
    }

    /// May this pod drop the local snapshots `<vm>` and `fork-<vm>`? Local snapshots record no
    /// owner (the runtime keeps a name, an id and the image), so the admission facts that
    /// planned the drop decide, and, with a registry, the owner `<vm>:hibernate` records: a
    /// local copy of another pod's artifact (a colliding VM name) is kept and reported. A
    /// read that fails keeps them too (a leaked snapshot is recoverable, a dropped one not).
    async fn local_snapshots_are_ours(&self, vm: &str) -> bool {
        let Some(reg) = &self.artifacts.registry() else {
            return true;
        };
        let owner = match self.artifacts.owner_of(self.pod).await {
            Ok(o) => o,
            Err(e) => {
                warn!(pod = %self.key, vm, error = %e, "local snapshots kept: the owner could not be read");
                return false;
            }
        };
        match reg.manifest_annotations(vm, tags::HIBERNATE).await {
            Ok(a) => match owner_rule::owner_verdict(&a, &owner.actor()) {
                owner_rule::OwnerVerdict::Foreign { owner: recorded } => {
                    let message = owner_rule::foreign_snapshot_message(
                        "drop local snapshots of",
                        &format!("{vm}:{}", tags::HIBERNATE),
                        &recorded,
                        &owner.actor().to_string(),
                    );
                    warn!(pod = %self.key, vm, %message, "local snapshots kept");
                    self.api
                        .event(
                            self.pod,
                            true,
                            owner_rule::FOREIGN_SNAPSHOT_IGNORED,
                            &message,
                        )
                        .await;
                    false
                }
                owner_rule::OwnerVerdict::Owned | owner_rule::OwnerVerdict::NoOwnerRecorded => true,
            },
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                warn!(pod = %self.key, vm, error = %e, "local snapshots kept: the registry could not be read");
                false
            }
        }
    }

    async fn push(&self, name: &str, tag: &str, base_image: &str) -> Result<(), PodError> {
        let owner = self.artifacts.owner_of(self.pod).await?;
        let res = self
            .artifacts
            .push_owned(name, name, tag, base_image, &owner)
            .await;
        if let Err(PushRefusal::Foreign(recorded)) = &res {
            // Another pod's artifact under a colliding name: never replaced. The operation
            // fails with the reason (a hibernate keeps its VM running); the Warning names both.
            let message = owner_rule::foreign_snapshot_message(
                "push",
                &format!("{name}:{tag}"),
                recorded,
                &owner.actor().to_string(),
            );
            warn!(pod = %self.key, vm = %name, tag, %message, "push refused: the tag records another owner");
            self.api
                .event(
                    self.pod,
                    true,
                    owner_rule::FOREIGN_SNAPSHOT_IGNORED,
                    &message,
                )
                .await;
        }
        let res = res.map_err(|e| {
            match e {
                PushRefusal::Failed(e) => PodError::from(e),
                // Not a refusal of the operation: the push step failed (its policy decides).
                foreign @ PushRefusal::Foreign(_) => PodError::plan(foreign.to_string()),
            }
            .during(format!("push {name}:{tag}"))
        });
        self.metrics.snapshot_push(if res.is_ok() {
            m::RESULT_OK
        } else {
            m::RESULT_FAILED
        });
        res
    }
}

impl PodOp<'_> {
    /// [`Action::StopVm`]: `vm stop` bounded by the grace period (the call is dropped when
    /// it runs out, which kills the `cocoon` child), then the report of `delete::stop_report`.
    async fn stop_gracefully(&self, id: &str, grace_secs: u64) {
        use super::plan::delete::{StopResult, stop_report};
        let grace = Duration::from_secs(grace_secs);
        let result = match tokio::time::timeout(grace, self.artifacts.rt().stop(id, grace)).await {
            Err(_) => StopResult::TimedOut,
            Ok(Ok(())) => StopResult::Stopped,
            Ok(Err(e)) if e.is_vm_not_found() => StopResult::Gone,
            Ok(Err(RuntimeError::Unsupported(e))) => StopResult::Unsupported(e),
            Ok(Err(e)) => StopResult::Failed(e.to_string()),
        };
        let report = stop_report(id, grace_secs, &result);
        if report.warn {
            warn!(pod = %self.key, vm = %id, "{}", report.log);
        } else {
            info!(pod = %self.key, vm = %id, "{}", report.log);
        }
        if let Some((reason, message)) = report.event {
            self.api.event(self.pod, true, reason, &message).await;
        }
    }

    /// Every action but the fork snapshot's (see [`Effects::apply`]).
    async fn apply_step(&self, action: &Action) -> Result<(), PodError> {
        match action {
            Action::Lifecycle(state) => self.api.set_lifecycle(self.pod, *state, "").await,
            Action::ReleaseDhcp { id } => {
                let argv = ["cmd", "/c", "ipconfig", "/release"];
                let ok = exec_bounded(
                    self.artifacts.rt().as_ref(),
                    id,
                    &argv,
                    Duration::from_secs(20),
                )
                .await;
                let result = if ok { m::RESULT_OK } else { m::RESULT_FAILED };
                self.metrics.hibernate("dhcp_release", result);
            }
            Action::DropNic { id } => {
                self.artifacts.rt().net_resize(id, 0).await?;
            }
            Action::SaveSnapshot { name, id } => self.save(name, id).await?,
            Action::Push {
                name,
                tag,
                base_image,
            } => self.push(name, tag, base_image).await?,
            Action::ClearRuntime | Action::RetryFailedClear => {
                return self.api.clear_runtime(self.pod).await;
            }
            Action::RemoveVm { id } => {
                return removed(self.artifacts.rt().remove(id).await).map_err(PodError::plan);
            }
            Action::StopVm { id, grace_secs } => self.stop_gracefully(id, *grace_secs).await,
            Action::CountPhaseOk(phase) => self.metrics.hibernate(phase, m::RESULT_OK),
            Action::UntrackVm => {
                self.publisher.probes().forget(self.key);
                let mut t = self.store.tables();
                t.untrack_vm(self.key);
                self.metrics.set_vm_table_size(t.vms_by_pod.len());
            }
            Action::PublishStatus => self.publisher.notify(self.key).await,
            Action::Event {
                warning,
                reason,
                message,
            } => self.api.event(self.pod, *warning, reason, message).await,
            Action::DropLocalSnapshots { vm } => {
                if self.local_snapshots_are_ours(vm).await {
                    self.artifacts.drop_local_snapshots(vm).await;
                }
            }
            Action::PullSnapshot {
                repo,
                reference,
                into,
            } => self.pull(repo, reference, into).await?,
            Action::InspectSnapshot { name } => {
                let s = self.artifacts.snapshot_exact(name).await?;
                self.carry().snapshot = Some(s);
            }
            Action::EnsureBaseImage => {
                let snapshot = self.carry().snapshot.clone();
                return self
                    .artifacts
                    .ensure_snapshot_base_image(snapshot.as_ref())
                    .await;
            }
            Action::CloneVm { from, pull, nics } => self.clone_vm(from, *pull, *nics).await?,
            Action::RemoveSnapshotDetached { name } => self.remove_snapshot_detached(name),
            Action::StartBootClock => self.carry().boot_started = Some(Instant::now()),
            Action::ObserveBoot { mode } => {
                let started = self.carry().boot_started;
                if let Some(started) = started {
                    let backend = self.spec.effective_backend();
                    self.metrics
                        .vm_boot(mode, backend.as_str(), started.elapsed().as_secs_f64());
                }
            }
            Action::FinishBringUp(follow) => {
                let vm = self.carry().brought_up.take();
                if let Some(vm) = vm {
                    self.publisher
                        .finish_bring_up(self.key, self.pod, self.spec, vm, *follow)
                        .await;
                }
            }
            Action::Warn(message) => warn!(pod = %self.key, "{message}"),
            Action::RoutineSnapshot {
                name,
                id,
                base_image,
            } => self.routine_snapshot(name, id, base_image).await,
            Action::DropLocalSnapshotsBounded { vm } => {
                let check = self.local_snapshots_are_ours(vm);
                if tokio::time::timeout(Duration::from_secs(10), check)
                    .await
                    .unwrap_or(false)
                {
                    drop_local_snapshots_bounded(self.artifacts.rt(), vm).await;
                }
            }
            Action::Forget => self.publisher.forget(self.key),
            Action::FinishDelete => self.finish_delete().await,
            Action::CountLifecycle { op, result, reason } => {
                self.metrics.pod_lifecycle(op, result, reason);
            }
            Action::TrackSynthetic { id, ip } => self.track_synthetic(id, ip),
            Action::Adopt => {
                let vm = self.carry().adopt.take();
                if let Some(vm) = vm {
                    self.api.write_runtime(self.pod, &vm, 0).await;
                    self.store.track_vm(self.key, vm);
                }
            }
            Action::StartProbe => self.publisher.start_probe(self.key).await,
            Action::PublishReady => {
                self.publisher.publish_ready(self.key).await;
            }
            Action::RemoveLocalSnapshot { name } => {
                self.artifacts.rt().snapshot_remove_if_exists(name).await?;
            }
            // Applied by `apply` itself (its refusal is not a failed step); never saved here.
            Action::EnsureForkSnapshot { src } => {
                return Err(PodError::plan(format!(
                    "fork source {src}: not applied as a plain step"
                )));
            }
            Action::EnsureRunImage { image, force } => {
                let image = self.artifacts.ensure_run_image(image, *force).await?;
                self.carry().run_image = image;
            }
            Action::RunVm => self.run_vm().await?,
            Action::EnsureCloneBase { repo, tag, local } => {
                self.ensure_clone_base(repo, tag, local).await?;
            }
            Action::AssertBackend { local } => {
                let hypervisor = self.carry().snapshot.as_ref().map(|s| s.hypervisor.clone());
                if let Some(hypervisor) = hypervisor {
                    rules::assert_snapshot_backend(local, &hypervisor, self.spec.backend)
                        .map_err(PodError::plan)?;
                }
            }
            Action::CollectCloneBasesIfImported => self.collect_clone_bases_if_imported().await,
        }
        Ok(())
    }
}

#[async_trait]
impl Effects for PodOp<'_> {
    fn pod(&self) -> &str {
        self.key
    }

    async fn apply(&self, action: &Action) -> Result<(), ActionError> {
        if let Action::EnsureForkSnapshot { src } = action {
            // Re-checked at the save: a refusal is the tenant rule's, not a failed step.
            let ns = self.pod.metadata.namespace.as_deref().unwrap_or_default();
            return self
                .artifacts
                .ensure_fork_snapshot(self.store, self.key, ns, src)
                .await
                .map(|_| ())
                .map_err(ActionError::from);
        }
        // Every other action's error is a failed step (its policy decides), never a refusal.
        self.apply_step(action)
            .await
            .map_err(|e| ActionError::Failed(e.message()))
    }

    async fn inspect_after_failed_remove(&self, id: &str) -> AfterFailedRemove {
        after_failed_remove(&self.artifacts.rt().inspect(id).await)
    }

    async fn undo(&self, undo: &Undo) {
        match undo {
            Undo::NicRollback { id } => self.spawn_nic_restore(id, true),
            Undo::RenewDhcp { id } => self.spawn_nic_restore(id, false),
            Undo::DeleteTagWhileVmAlive { repo, tag } => {
                // Only the tag this pod pushed: one recording another owner is left alone.
                if self.artifacts.registry().is_some() {
                    match self.artifacts.owner_of(self.pod).await {
                        Ok(owner) => self.artifacts.delete_owned_tag(repo, tag, &owner).await,
                        Err(e) => {
                            warn!(vm = %repo, error = %e, "compensating tag delete skipped: the owner could not be read");
                        }
                    }
                }
            }
            Undo::KeepTag { repo, tag } => {
                warn!(vm = %repo, tag, "vm rm failed and the VM could not be inspected; keeping the tag, which may be its only copy");
            }
            Undo::RestoreRuntime => {
                if let Some(vm) = self.vm {
                    self.api.write_runtime(self.pod, vm, 0).await;
                }
            }
            Undo::RemoveSnapshot { name } => self.remove_snapshot_detached(name),
            Undo::CollectCloneBasesIfImported => self.collect_clone_bases_if_imported().await,
        }
    }

    fn count_phase_failed(&self, phase: &'static str) {
        self.metrics.hibernate(phase, m::RESULT_FAILED);
    }
}
