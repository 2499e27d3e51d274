//! Snapshot sources and transfers for bring-up and wake (`node.md` §6.4–§6.6, §8.3): registry
//! push/pull through the runtime's export/import streams, clone-base and fork snapshots,
//! image materialisation and hibernate evidence (what their reads mean is decided in
//! [`crate::pods::plan::transfer`]; the wake source is decided in `plan::wake`, read in
//! `effects`).
//!
//! Single flights are per-key async locks whose holder re-checks the local store first;
//! registry pulls are additionally shared ([`Artifacts::shared_pull`]): one spawned task per
//! destination snapshot, whose outcome every concurrent caller awaits.

use cocoon_api::contract::metrics::node::{DIRECTION_PULL, DIRECTION_PUSH};
use std::sync::Arc;
use std::time::Instant;

use cocoon_api::contract::tags;
use cocoon_api::naming::fork_snapshot_name;
use cocoon_registry::{PushOptions, Reference, RegistryClient, classify};
use cocoon_runtime::{ImportHandle, Runtime, SnapshotRecord};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::io::AsyncWriteExt;
use tracing::{info, warn};

use super::Artifacts;
use crate::metrics::NodeMetrics;
use crate::pods::error::{PodError, Refused, RegistryFailure, RuntimeFailure};
use crate::pods::plan::transfer::{self, BaseImage, ByKind, LocalCopy, RunImage};
use crate::pods::rules::Evidence;
use crate::pods::store::PodStore;
use crate::pods::tenant::Owner;
use crate::pods::tenant::{self, ArtifactUse, SourceVm};

impl Artifacts {
    /// Pulls `<repo>:<tag>` into the local snapshot `local` once for all concurrent callers.
    ///
    /// The pull runs in a task of its own, not in the caller's future: a caller that is
    /// cancelled (its pod operation dropped) neither aborts the transfer nor makes the next
    /// caller start it again; every caller, first or joining, awaits the same outcome. The
    /// entry is dropped when the pull ends, so a later call pulls afresh. Agent shutdown
    /// cancels the pull.
    pub async fn shared_pull(
        &self,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<PullSummary, Arc<RegistryFailure>> {
        let pull = {
            let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = pulls.get(local) {
                info!(snapshot = local, repo, tag, "joining the pull in flight");
                p.clone()
            } else {
                let rt = self.rt.clone();
                let registry = self.registry.clone();
                let metrics = self.metrics.clone();
                let table = self.pulls.clone();
                let stop = self.shutdown.clone();
                let (repo, tag, key) = (repo.to_owned(), tag.to_owned(), local.to_owned());
                // The table lock is held until the entry is in, so the task cannot remove it
                // before it exists.
                let task = tokio::spawn(async move {
                    let res = tokio::select! {
                        r = pull_snapshot(&*rt, registry.as_ref(), &metrics, &repo, &tag, &key) => r,
                        () = stop.cancelled() => Err(RegistryFailure::Transfer("node agent shutting down".to_owned())),
                    };
                    table.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
                    res.map_err(Arc::new)
                });
                let shared: SharedPull = async move {
                    task.await.unwrap_or_else(|e| {
                        Err(Arc::new(RegistryFailure::Transfer(format!(
                            "pull task failed: {e}"
                        ))))
                    })
                }
                .boxed()
                .shared();
                pulls.insert(local.to_owned(), shared.clone());
                shared
            }
        };
        pull.await
    }

    /// Pushes the local snapshot `name` to `<repo>:<tag>`, recording `base_image` and the
    /// `extra` manifest annotations (callers go through [`Artifacts::push_owned`]).
    pub(crate) async fn push_from(
        &self,
        name: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
        extra: std::collections::BTreeMap<String, String>,
    ) -> Result<(), RegistryFailure> {
        let Some(reg) = &self.registry else {
            return Err(RegistryFailure::NotConfigured);
        };
        let start = Instant::now();
        let export = self.rt.snapshot_export(name).await?;
        let mut opts = PushOptions::new(tag, base_image);
        opts.annotations.extra = extra;
        let pushed = reg.push_snapshot_tar(repo, export.stream, &opts).await;
        let exported = export.done.await;
        let took = start.elapsed();
        self.metrics
            .snapshot_push_duration
            .observe(took.as_secs_f64());
        let report = pushed?;
        self.metrics
            .snapshot_transfer_bytes(DIRECTION_PUSH, report.bytes_uploaded);
        exported?;
        if repo == name {
            self.api
                .transfer_event(
                    name,
                    true,
                    &report.format,
                    report.bytes_uploaded,
                    report.data_bytes,
                    took,
                )
                .await;
        }
        Ok(())
    }

    /// `hibernateEvidence(vm)` (§6.3), for the pod `owner` (an artifact recording another
    /// owner is refused, see [`crate::pods::tenant::check_artifact_owner`]).
    pub(crate) async fn hibernate_evidence(
        &self,
        vm: &str,
        owner: &Owner,
    ) -> Result<Evidence, String> {
        if self.registry.is_none() {
            return transfer::local_evidence(vm, &self.snapshot_exact(vm).await);
        }
        let artifact = self
            .owned_artifact(ArtifactUse::OwnVm, vm, tags::HIBERNATE, owner)
            .await;
        transfer::registry_evidence(vm, artifact)
    }

    /// Removes `<vm>` and `fork-<vm>` locally; errors are logged.
    pub(crate) async fn drop_local_snapshots(&self, vm: &str) {
        let fork = fork_snapshot_name(vm);
        let (a, b) = tokio::join!(
            self.rt.snapshot_remove_if_exists(vm),
            self.rt.snapshot_remove_if_exists(&fork)
        );
        for r in [a, b] {
            if let Err(e) = r {
                warn!(vm, error = %e, "removing a local snapshot failed");
            }
        }
    }

    /// `ensureSnapshot(repo, tag, local)` (§6.4) for a clone base of pod `owner`; `local` is
    /// looked up by its exact name only. `None` = no snapshot (the clone then fails inside the
    /// runtime). The second value is true when this call imported it.
    pub(crate) async fn ensure_snapshot(
        &self,
        repo: &str,
        tag: &str,
        local: &str,
        owner: &Owner,
    ) -> Result<(Option<SnapshotRecord>, bool), RegistryFailure> {
        if repo.is_empty() {
            return Ok((None, false));
        }
        if let Ok(s) = self.snapshot_exact(local).await {
            return Ok((Some(s), false));
        }
        if self.registry.is_none() {
            return Ok((None, false));
        }
        let lock = self.flight(&format!("snapshot {local}"));
        let _held = lock.lock().await;
        if let Ok(s) = self.snapshot_exact(local).await {
            return Ok((Some(s), false));
        }
        let what = match cocoon_api::contract::checkpoint::is_checkpoint_repository(repo) {
            true => ArtifactUse::Checkpoint, // its owner is checked: the checkpoint
            false => ArtifactUse::CloneBase,
        };
        let artifact = self
            .owned_artifact(what, repo, tag, owner)
            .await?
            .ok_or_else(|| RegistryFailure::NoArtifact(format!("{repo}:{tag}")))?;
        // The lock orders the re-check; the transfer itself is shared, so a holder that is
        // cancelled leaves it running for the next one. The digest is the one checked.
        self.shared_pull(repo, &artifact.digest, local).await?;
        self.snapshot_exact(local)
            .await
            .map(|s| (Some(s), true))
            .map_err(|e| {
                RuntimeFailure::during(format!("inspect imported snapshot {local}"), e).into()
            })
    }

    /// `ensureForkSnapshot(src)` (§6.5): one save per lineage baseline, for the pod `key` of
    /// namespace `ns`.
    ///
    /// The tenant rule runs again here, at the moment of the save and with the tables as they
    /// are now ([`tenant::check_fork_source`] before an existing baseline is reused,
    /// [`tenant::check_fork_save`] before a new one is saved). Unlike §6.5 the source is never
    /// taken from the by-name table (an unmanaged pod's synthetic record sits there with the
    /// id its tenant chose, which the runtime would resolve to whatever VM has that name or id
    /// prefix): it is the runtime's record fetched by the exact name `src`, saved by its id.
    pub(crate) async fn ensure_fork_snapshot(
        &self,
        store: &PodStore,
        key: &str,
        ns: &str,
        src: &str,
    ) -> Result<String, PodError> {
        let name = fork_snapshot_name(src);
        let lock = self.flight(&format!("fork {name}"));
        let _held = lock.lock().await;
        let holders = store.tables().fork_holders_of(src, Some(key));
        tenant::check_fork_source(ns, src, &holders).map_err(|r| fork_refused(key, src, r))?;
        if self.snapshot_exact(&name).await.is_ok() {
            return Ok(name);
        }
        // A miss says only that: never which other VM the runtime resolved the name to.
        let found = self.vm_exact(src).await.map_err(|e| {
            if e.is_vm_not_found() {
                RuntimeFailure::Unexpected(format!("inspect fork source vm {src}: VM not found"))
            } else {
                RuntimeFailure::during(format!("inspect fork source vm {src}"), e)
            }
        })?;
        let found = SourceVm {
            name: found.name().to_owned(),
            id: found.id,
            synthetic: false,
        };
        // The holders as they are after the inspect, right before the save.
        let holders = store.tables().fork_holders_of(src, Some(key));
        tenant::check_fork_save(ns, src, &holders, &found)
            .map_err(|r| fork_refused(key, src, r))?;
        self.rt.snapshot_save(&name, &found.id).await.map_err(|e| {
            RuntimeFailure::during(format!("snapshot fork source vm {src} as {name}"), e)
        })?;
        Ok(name)
    }

    /// `ensureRunImage(image, force)` (§6.6): the ref to pass to `vm run`.
    pub(crate) async fn ensure_run_image(
        &self,
        image: &str,
        force: bool,
    ) -> Result<String, PodError> {
        let (repo, tag) = match transfer::run_image(image, self.registry.is_some()) {
            RunImage::Nothing => return Ok(String::new()),
            RunImage::Pull => (None, None),
            RunImage::Classify { repo, tag } => (Some(repo), Some(tag)),
        };
        let lock = self.flight(&transfer::run_image_flight(image, force));
        let _held = lock.lock().await;
        let pull = || async {
            self.rt
                .ensure_image(image, force)
                .await
                .map(|()| image.to_owned())
                .map_err(PodError::from)
        };
        let (Some(reg), Some(repo), Some(tag)) = (self.registry.as_ref(), repo, tag) else {
            return pull().await;
        };
        let kind = match Reference::parse(&tag) {
            Ok(r) => match reg.get_manifest(&repo, &r).await {
                Ok(f) => cocoon_registry::Manifest::parse(&f.bytes)
                    .map(|mf| classify(&mf, f.media_type.as_deref()))
                    .ok(),
                Err(_) => None,
            },
            Err(_) => None,
        };
        let local = match transfer::by_kind(image, &repo, &tag, kind.as_ref()) {
            ByKind::Refuse(e) => return Err(PodError::plan(e)),
            ByKind::Pull => return pull().await,
            ByKind::CloudImage { local } => local,
        };
        let present = if force {
            None
        } else {
            Some(self.rt.image_present(&local).await)
        };
        match transfer::local_copy(&local, present.as_ref()) {
            LocalCopy::Present => return Ok(local),
            LocalCopy::Fail(e) => return Err(PodError::plan(e)),
            LocalCopy::Import => {}
        }
        let mut import = self.rt.image_import(&local).await?;
        let streamed = reg.stream_cloud_image(&repo, &tag, &mut import.sink).await;
        if let Err(e) = streamed {
            // Unverified bytes reached the importer: it must not keep them.
            let _ = import.kill().await;
            return Err(RegistryFailure::Client(e).into());
        }
        let ImportHandle { mut sink, done, .. } = import;
        let _ = sink.shutdown().await;
        drop(sink);
        done.await?;
        Ok(local)
    }

    /// `ensureSnapshotBaseImage(snap)` (§6.6).
    pub(crate) async fn ensure_snapshot_base_image(
        &self,
        snap: Option<&SnapshotRecord>,
    ) -> Result<(), PodError> {
        let (digest, image) = match transfer::base_image(snap) {
            BaseImage::Nothing => return Ok(()),
            // `vm clone --pull` fetches a URL base image on the host: the allowlist applies.
            BaseImage::Url(image) => {
                return crate::pods::host_reach::url_verdict(&self.run_image_urls, image)
                    .map_err(|why| PodError::plan(format!("snapshot base image {image}: {why}")));
            }
            BaseImage::Local { digest, image } => (digest, image),
        };
        if let Some(digest) = digest
            && self.rt.image_present(digest).await.is_ok()
        {
            return Ok(());
        }
        if self.rt.image_present(image).await.is_ok() {
            return Ok(());
        }
        self.ensure_run_image(image, false)
            .await
            .map(|_| ())
            .map_err(|e| e.during(format!("ensure snapshot base image {image}")))
    }
}

/// A pull in flight: the outcome of its task, awaitable by any number of callers.
pub(crate) type SharedPull = Shared<BoxFuture<'static, Result<PullSummary, Arc<RegistryFailure>>>>;

/// What a finished pull moved, for the `SnapshotPulled` Event.
#[derive(Debug, Clone)]
pub struct PullSummary {
    pub report: cocoon_registry::PullReport,
    pub took: std::time::Duration,
}

/// Pulls `<repo>:<tag>` into the local snapshot `local` through the runtime's import stream
/// (registry.md §6).
async fn pull_snapshot(
    rt: &dyn Runtime,
    registry: Option<&RegistryClient>,
    metrics: &NodeMetrics,
    repo: &str,
    tag: &str,
    local: &str,
) -> Result<PullSummary, RegistryFailure> {
    let Some(reg) = registry else {
        return Err(RegistryFailure::NotConfigured);
    };
    let start = Instant::now();
    let res = import_snapshot(rt, reg, repo, tag, local).await;
    let took = start.elapsed();
    metrics.snapshot_pull_duration.observe(took.as_secs_f64());
    if let Ok(report) = &res {
        metrics.snapshot_transfer_bytes(DIRECTION_PULL, report.bytes_downloaded);
    }
    res.map(|report| PullSummary { report, took })
}

/// Streams `<repo>:<tag>` into `cocoon snapshot import --name <local>`. The client withholds
/// the last bytes of every file until its blob verified, so a bad blob never forms a complete
/// archive; on any pull error the importer is also killed (not just cut off: an archive may
/// end cleanly at an entry boundary) and whatever it created under `local` is removed, so a
/// tampered snapshot is never registered, not even briefly.
async fn import_snapshot(
    rt: &dyn Runtime,
    reg: &RegistryClient,
    repo: &str,
    tag: &str,
    local: &str,
) -> Result<cocoon_registry::PullReport, RegistryFailure> {
    let start = Instant::now();
    let mut import = rt.snapshot_import(local).await?;
    let pulled = reg
        .pull_snapshot_to_tar(repo, tag, local, &mut import.sink)
        .await;
    let streamed = start.elapsed();
    let report = match pulled {
        Ok(r) => r,
        Err(e) => {
            if let Err(k) = import.kill().await {
                info!(snapshot = local, error = %k, "import stopped after a failed pull");
            }
            if let Err(r) = rt.snapshot_remove_if_exists(local).await {
                warn!(snapshot = local, error = %r, "removing a failed import");
            }
            return Err(e.into());
        }
    };
    let ImportHandle { mut sink, done, .. } = import;
    let _ = sink.shutdown().await;
    drop(sink);
    done.await?;
    // The importer's tail: what it still did after the last byte reached it.
    info!(
        snapshot = local,
        bytes = report.bytes_downloaded,
        streamed_ms = streamed.as_millis() as u64,
        importer_tail_ms = (start.elapsed() - streamed).as_millis() as u64,
        "snapshot imported"
    );
    Ok(report)
}

/// `import_snapshot` for callers outside the agent (the text of its error).
pub async fn import_snapshot_from_registry(
    rt: &dyn Runtime,
    reg: &RegistryClient,
    repo: &str,
    tag: &str,
    local: &str,
) -> Result<cocoon_registry::PullReport, String> {
    import_snapshot(rt, reg, repo, tag, local)
        .await
        .map_err(|e| e.to_string())
}

/// A fork source refused at the save: `TenantIsolationRefused` with the rule's text.
fn fork_refused(key: &str, src: &str, refusal: tenant::Refusal) -> PodError {
    warn!(pod = %key, fork_from = %src, %refusal, "tenant isolation refused the fork source at the save");
    Refused::from(refusal).into()
}
