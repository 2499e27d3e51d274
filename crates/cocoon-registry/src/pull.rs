//! Snapshot pull (registry.md §6) into a directory or an import tar, and cloud-image disk
//! streaming (§7): validated before writing, every blob verified while it streams, holes kept.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cocoon_api::contract::oci;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};
use tokio::task::JoinSet;

use crate::client::RegistryClient;
use crate::codec::{PIECE, ZstdStream, decode_all};
use crate::validate::PullBlob;

/// Pulls of v2 artifacts and of image indexes in this process (one node agent) at once
/// (registry.md §5.5): their chunk prefetch holds up to the pull budget in memory each.
static V2_PULLS: Semaphore = Semaphore::const_new(2);

/// Bytes handed from the network to a download's writer thread at a time. 256 KiB measured
/// the same throughput as 1 MiB with about half the peak RSS.
const PULL_BATCH: usize = 1 << 18;

use crate::error::{Error, Result, ResultExt};
use crate::manifest::{
    Descriptor, Kind, Manifest, SnapshotConfig, SnapshotEnvelope, classify, pick_index_child,
};
use crate::reference::{Digest, Reference};
use crate::retry::retry;
use crate::sparse::HoleWriter;
use crate::tar::{PAX_SPARSE_MAP, PAX_SPARSE_SIZE, end_of_archive, padding, regular_file_header};
use crate::validate::{
    MAX_CONFIG_SIZE, PullFile, SNAPSHOT_JSON, check_config_descriptor, plan_snapshot,
};

/// A validated snapshot, ready to be written.
#[derive(Debug, Clone)]
pub struct SnapshotPlan {
    /// The digest of the snapshot manifest (the index child when the tag is an index).
    pub manifest_digest: Digest,
    /// The wire format version (1, or 2 for a v2 artifact without encoded layers).
    pub version: u8,
    /// The config blob.
    pub config: SnapshotConfig,
    /// The files, in layer order.
    pub files: Vec<PullFile>,
    /// The tag named an image index (its child is the snapshot).
    pub from_index: bool,
}

impl SnapshotPlan {
    /// Whether the pull counts against the per-node limit of v2 pulls (registry.md §5.5).
    pub fn limited(&self) -> bool {
        self.version >= 2 || self.from_index
    }
}

/// The outcome of a pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullReport {
    pub manifest_digest: Digest,
    /// The snapshot identity recorded at push time.
    pub snapshot_id: String,
    /// Layer bytes downloaded.
    pub bytes_downloaded: u64,
    /// Files written, with their logical sizes.
    pub files: Vec<(String, u64)>,
    /// The files' data bytes (uncompressed; the extents of sparse files).
    pub data_bytes: u64,
    /// The wire format: `v1`, `v2`, `v2 zstd`, `v2 chunks` or `v2 zstd+chunks`.
    pub format: String,
}

impl SnapshotPlan {
    /// The wire format as [`PullReport::format`] names it.
    pub fn format(&self) -> String {
        let zstd = self.files.iter().any(|f| f.blobs.iter().any(|b| b.zstd));
        let chunks = self.files.iter().any(|f| f.blobs.len() > 1);
        wire_format(self.version >= 2, zstd, chunks)
    }

    fn data_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// `v1`, or `v2` with what it encodes.
pub fn wire_format(v2: bool, zstd: bool, chunks: bool) -> String {
    match (v2, zstd, chunks) {
        (false, _, _) => "v1".into(),
        (true, false, false) => "v2".into(),
        (true, true, false) => "v2 zstd".into(),
        (true, false, true) => "v2 chunks".into(),
        (true, true, true) => "v2 zstd+chunks".into(),
    }
}

impl RegistryClient {
    /// Steps 1–4 of registry.md §6: manifest (following an index to its `linux/amd64`
    /// child), classification, config blob, layer validation.
    pub async fn plan_snapshot_pull(&self, repo: &str, reference: &str) -> Result<SnapshotPlan> {
        let (m, digest, from_index) = self.resolve_manifest(repo, reference).await?;
        let version = match classify(&m, None) {
            Kind::Snapshot { version } => version,
            kind => {
                return Err(Error::WrongKind {
                    kind: kind.to_string(),
                    wanted: "snapshot".into(),
                });
            }
        };
        let (cdigest, csize) = check_config_descriptor(&m)?;
        let bytes = self
            .get_blob_bytes(repo, &cdigest, csize, MAX_CONFIG_SIZE)
            .await
            .context(|| "fetch snapshot config".to_string())?;
        let config: SnapshotConfig = serde_json::from_slice(&bytes)
            .map_err(|e| Error::protocol(format!("parse snapshot config: {e}")))?;
        let files = plan_snapshot(&m, version, &config)?;
        Ok(SnapshotPlan {
            manifest_digest: digest,
            version,
            config,
            files,
            from_index,
        })
    }

    /// The manifest at `reference`, with an image index resolved to its chosen child.
    async fn resolve_manifest(
        &self,
        repo: &str,
        reference: &str,
    ) -> Result<(Manifest, Digest, bool)> {
        let r = Reference::parse(reference)?;
        let fetched = self.get_manifest(repo, &r).await?;
        let m = Manifest::parse(&fetched.bytes)?;
        if classify(&m, fetched.media_type.as_deref()) != Kind::ImageIndex {
            return Ok((m, fetched.digest, false));
        }
        let child = pick_index_child(&m)?;
        let d = Digest::parse(&child.digest)
            .map_err(|e| Error::protocol(format!("index child: {e}")))?;
        let fetched = self.get_manifest(repo, &Reference::Digest(d)).await?;
        Ok((Manifest::parse(&fetched.bytes)?, fetched.digest, true))
    }

    /// Pulls `<repo>:<reference>` into directory `dest` (which must not exist): `snapshot.json`
    /// named `local_name`, and every file with its mode and holes. The files are written into
    /// a sibling staging directory renamed to `dest` only when all blobs verified, so `dest`
    /// appears complete or not at all. Data is not fsynced.
    pub async fn pull_snapshot_to_dir(
        &self,
        repo: &str,
        reference: &str,
        dest: &Path,
        local_name: &str,
    ) -> Result<PullReport> {
        if dest.exists() {
            return Err(Error::invalid(
                "destination",
                format!("{} already exists", dest.display()),
            ));
        }
        let plan = self.plan_snapshot_pull(repo, reference).await?;
        let _slot = v2_slot(&plan).await?;
        let staging = staging_dir(dest)?;
        let result = self.fill_dir(repo, &plan, &staging, local_name).await;
        match result {
            Ok(report) => {
                std::fs::rename(&staging, dest).map_err(|e| {
                    Error::io(
                        format!("renaming {} to {}", staging.display(), dest.display()),
                        e,
                    )
                })?;
                tracing::info!(repo, reference, dest = %dest.display(), bytes = report.bytes_downloaded, "snapshot pulled");
                Ok(report)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(e)
            }
        }
    }

    async fn fill_dir(
        &self,
        repo: &str,
        plan: &SnapshotPlan,
        dir: &Path,
        local_name: &str,
    ) -> Result<PullReport> {
        let env = SnapshotEnvelope::from_config(&plan.config, local_name);
        let env_path = dir.join(SNAPSHOT_JSON);
        std::fs::write(&env_path, env.to_bytes())
            .map_err(|e| Error::io(format!("writing {}", env_path.display()), e))?;
        let sem = Arc::new(Semaphore::new(self.config().transfer_concurrency));
        let received = Arc::new(AtomicU64::new(0));
        // One prefetch budget for the whole pull: files pulled in parallel share it.
        let budget = PullBudget::new(self.config().pull_budget);
        let mut tasks = JoinSet::new();
        for f in plan.files.iter().cloned() {
            let (client, sem, received) = (self.clone(), sem.clone(), received.clone());
            let budget = budget.clone();
            let path = dir.join(&f.name);
            let repo = repo.to_string();
            tasks.spawn(async move {
                let _permit = sem
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::protocol("pull cancelled"))?;
                let done = if f.is_plain() {
                    retry(&client.config().retry, "download blob", || {
                        client.download_file(&repo, &f, &path, &received)
                    })
                    .await
                } else {
                    client
                        .download_encoded(&repo, &f, &path, &received, &budget)
                        .await
                };
                done.context(|| format!("pull {}", f.name))
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| Error::io("pull task", std::io::Error::other(e.to_string())))??;
        }
        Ok(PullReport {
            manifest_digest: plan.manifest_digest.clone(),
            snapshot_id: plan.config.snapshot_id.clone(),
            bytes_downloaded: received.load(Ordering::Relaxed),
            files: plan
                .files
                .iter()
                .map(|f| (f.name.clone(), f.logical_size()))
                .collect(),
            data_bytes: plan.data_bytes(),
            format: plan.format(),
        })
    }

    /// Downloads one layer into `path`: the network side batches frames (about 256 KiB) for
    /// a blocking thread that verifies and writes them around the holes.
    async fn download_file(
        &self,
        repo: &str,
        f: &PullFile,
        path: &Path,
        received: &AtomicU64,
    ) -> Result<()> {
        let stream = self.get_blob(repo, &f.digest, f.size).await?;
        let (mut body, verifier) = stream.into_parts();
        let file = create_file(path, f.mode)?;
        let extents = f.extents();
        let logical = f.logical_size();
        // Frames go to the writer thread in batches of about 256 KiB: the frames themselves,
        // one wake-up per batch, at most two batches queued. (Copying them into recycled
        // buffers instead measured ~60% more CPU: hyper then reads in smaller pieces.)
        let (tx, mut rx) = mpsc::channel::<Vec<Bytes>>(2);
        let writer = tokio::task::spawn_blocking(move || -> Result<()> {
            let mut verifier = verifier;
            let mut w = HoleWriter::new(&file, extents, logical);
            while let Some(batch) = rx.blocking_recv() {
                for b in &batch {
                    verifier.update(b)?;
                    w.write(b)
                        .map_err(|e| Error::io("writing pulled file", e))?;
                }
            }
            verifier.finish()?;
            w.finish().map_err(|e| Error::io("sizing pulled file", e))
        });
        let feed = async {
            let mut batch = Vec::with_capacity(64);
            let mut batched = 0usize;
            while let Some(chunk) = body.next().await? {
                received.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                batched += chunk.len();
                batch.push(chunk);
                if batched >= PULL_BATCH {
                    batched = 0;
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(64));
                    if tx.send(full).await.is_err() {
                        return Ok(()); // the writer stopped; its error is reported below
                    }
                }
            }
            if !batch.is_empty() {
                let _ = tx.send(batch).await;
            }
            Ok::<(), Error>(())
        };
        let fed = feed.await;
        drop(tx);
        let written = writer
            .await
            .map_err(|e| Error::io("writer task", std::io::Error::other(e.to_string())))?;
        // A transport error explains a short stream better than the size mismatch it causes.
        fed?;
        written
    }

    /// Pulls `<repo>:<reference>` as the tar `cocoon snapshot import --name <local_name>`
    /// reads (registry.md §6 step 5): `snapshot.json` first, then each file in layer order
    /// with its mode and sparse PAX records. Nothing of a blob's last piece is written before
    /// the blob's size and digest verified, so on error the current entry is short and the
    /// archive unterminated; the caller still kills the importer (a short entry is the only
    /// tell a lenient reader gets) and removes what it created.
    pub async fn pull_snapshot_to_tar<W: AsyncWrite + Unpin>(
        &self,
        repo: &str,
        reference: &str,
        local_name: &str,
        mut w: W,
    ) -> Result<PullReport> {
        let started = std::time::Instant::now();
        let plan = self.plan_snapshot_pull(repo, reference).await?;
        let planned = started.elapsed();
        let _slot = v2_slot(&plan).await?;
        let slotted = started.elapsed();
        // Time spent waiting for the import stream to take bytes: the importer's pace.
        let mut waited = std::time::Duration::ZERO;
        let werr = |e: std::io::Error| Error::io("writing the import stream", e);
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let env = SnapshotEnvelope::from_config(&plan.config, local_name).to_bytes();
        w.write_all(&regular_file_header(
            SNAPSHOT_JSON,
            env.len() as u64,
            0o644,
            mtime,
            &[],
        ))
        .await
        .map_err(werr)?;
        w.write_all(&env).await.map_err(werr)?;
        w.write_all(&vec![0u8; padding(env.len() as u64)])
            .await
            .map_err(werr)?;
        let mut received = 0u64;
        let budget = PullBudget::new(self.config().pull_budget);
        for f in &plan.files {
            let size_text;
            let pax: Vec<(&str, &str)> = match &f.sparse {
                Some(s) => {
                    size_text = s.logical_size.to_string();
                    vec![
                        (PAX_SPARSE_MAP, s.map_text.as_str()),
                        (PAX_SPARSE_SIZE, size_text.as_str()),
                    ]
                }
                None => vec![],
            };
            w.write_all(&regular_file_header(&f.name, f.size, f.mode, mtime, &pax))
                .await
                .map_err(werr)?;
            if !f.is_plain() {
                let received_here = AtomicU64::new(0);
                self.write_encoded(repo, f, &mut w, &received_here, &budget, &mut waited)
                    .await
                    .context(|| format!("pull {}", f.name))?;
                received += received_here.load(Ordering::Relaxed);
                w.write_all(&vec![0u8; padding(f.size)])
                    .await
                    .map_err(werr)?;
                continue;
            }
            // The last piece of every blob is held back until the blob verified: a bad blob
            // leaves its entry short, so the archive cannot end cleanly even when the bytes
            // before it happen to end on a block boundary.
            let mut stream = self
                .get_blob(repo, &f.digest, f.size)
                .await
                .context(|| format!("pull {}", f.name))?;
            let mut held: Option<Bytes> = None;
            while let Some(chunk) = stream.next().await.context(|| format!("pull {}", f.name))? {
                received += chunk.len() as u64;
                if let Some(prev) = held.replace(chunk) {
                    timed_write(&mut w, &prev, &mut waited)
                        .await
                        .map_err(werr)?;
                }
            }
            if let Some(last) = held {
                timed_write(&mut w, &last, &mut waited)
                    .await
                    .map_err(werr)?;
            }
            w.write_all(&vec![0u8; padding(f.size)])
                .await
                .map_err(werr)?;
        }
        w.write_all(&end_of_archive()).await.map_err(werr)?;
        w.flush().await.map_err(werr)?;
        tracing::debug!(
            repo,
            reference,
            plan_ms = planned.as_millis() as u64,
            slot_wait_ms = (slotted - planned).as_millis() as u64,
            stream_ms = (started.elapsed() - slotted).as_millis() as u64,
            import_wait_ms = waited.as_millis() as u64,
            bytes = received,
            "snapshot streamed to the importer"
        );
        let (data_bytes, format) = (plan.data_bytes(), plan.format());
        Ok(PullReport {
            manifest_digest: plan.manifest_digest,
            snapshot_id: plan.config.snapshot_id,
            bytes_downloaded: received,
            files: plan
                .files
                .iter()
                .map(|f| (f.name.clone(), f.logical_size()))
                .collect(),
            data_bytes,
            format,
        })
    }

    /// Streams a cloud image's disk (registry.md §7) into `w`: the disk layers sorted by
    /// title and concatenated (split `.part` files reassemble), each verified. Returns the
    /// bytes written.
    pub async fn stream_cloud_image<W: AsyncWrite + Unpin>(
        &self,
        repo: &str,
        reference: &str,
        mut w: W,
    ) -> Result<u64> {
        let (m, _, _) = self.resolve_manifest(repo, reference).await?;
        let kind = classify(&m, None);
        if kind != Kind::CloudImage {
            return Err(Error::WrongKind {
                kind: kind.to_string(),
                wanted: "cloud-image".into(),
            });
        }
        let mut total = 0u64;
        for layer in cloud_image_disk_layers(&m)? {
            let digest = Digest::parse(&layer.digest)
                .map_err(|e| Error::protocol(format!("disk layer: {e}")))?;
            let size = u64::try_from(layer.size)
                .map_err(|_| Error::protocol("negative disk layer size"))?;
            let mut s = self.get_blob(repo, &digest, size).await?;
            // As for snapshots: a layer's last piece waits for its digest.
            let mut held: Option<Bytes> = None;
            while let Some(chunk) = s.next().await? {
                total += chunk.len() as u64;
                if let Some(prev) = held.replace(chunk) {
                    w.write_all(&prev)
                        .await
                        .map_err(|e| Error::io("writing the image stream", e))?;
                }
            }
            if let Some(last) = held {
                w.write_all(&last)
                    .await
                    .map_err(|e| Error::io("writing the image stream", e))?;
            }
        }
        w.flush()
            .await
            .map_err(|e| Error::io("writing the image stream", e))?;
        Ok(total)
    }
}

impl RegistryClient {
    /// Writes an encoded (v2) file's data into the import stream `w`. Chunks (and zstd blobs
    /// up to the pull budget) are verified whole before a byte of them is decoded; the last
    /// piece of the file is held back until every blob verified and the decoded size is
    /// `files[].size`, so a bad blob leaves the entry short.
    async fn write_encoded<W: AsyncWrite + Unpin>(
        &self,
        repo: &str,
        f: &PullFile,
        w: &mut W,
        received: &AtomicU64,
        budget: &PullBudget,
        waited: &mut std::time::Duration,
    ) -> Result<()> {
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let produce = self.produce_file(repo, f, tx, received, budget, false);
        let consume = async {
            let mut held: Option<Bytes> = None;
            while let Some(b) = rx.recv().await {
                if let Some(prev) = held.replace(b) {
                    timed_write(&mut *w, &prev, &mut *waited)
                        .await
                        .map_err(|e| Error::io("writing the import stream", e))?;
                }
            }
            Ok::<_, Error>(held)
        };
        let (produced, consumed) = tokio::join!(produce, consume);
        // A writer failure (the importer died) explains a producer's "receiver gone".
        let held = consumed?;
        produced?;
        if let Some(last) = held {
            timed_write(w, &last, waited)
                .await
                .map_err(|e| Error::io("writing the import stream", e))?;
        }
        Ok(())
    }

    /// Downloads an encoded (v2) file into `path` (in the staging directory), holes kept.
    async fn download_encoded(
        &self,
        repo: &str,
        f: &PullFile,
        path: &Path,
        received: &AtomicU64,
        budget: &PullBudget,
    ) -> Result<()> {
        let file = create_file(path, f.mode)?;
        let extents = f.extents();
        let logical = f.logical_size();
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let writer = tokio::task::spawn_blocking(move || -> Result<()> {
            let mut w = HoleWriter::new(&file, extents, logical);
            while let Some(b) = rx.blocking_recv() {
                w.write(&b)
                    .map_err(|e| Error::io("writing pulled file", e))?;
            }
            w.finish().map_err(|e| Error::io("sizing pulled file", e))
        });
        // Into the staging directory: a single zstd blob decodes while it downloads.
        let produced = self.produce_file(repo, f, tx, received, budget, true).await;
        let written = writer
            .await
            .map_err(|e| Error::io("writer task", std::io::Error::other(e.to_string())))?;
        produced?;
        written
    }

    /// Sends file `f`'s data, decoded and in order, to `tx`: blobs that are buffered (chunks,
    /// zstd blobs up to the pull budget) are fetched up to `transfer_concurrency` ahead
    /// within the pull's `budget` and verified before decoding; a larger blob streams (its
    /// bytes are checked at its end, so the consumer must hold back the last piece until
    /// this returns). With `staged` (the data goes to a staging file that is kept only when
    /// the whole pull verified) an unchunked zstd blob streams too: decoding then overlaps
    /// the download instead of following it.
    ///
    /// Budget permits are taken here, in blob order, before a fetch is spawned: the front
    /// blob waits for its permits (this file then holds none, so whoever holds them is
    /// ahead and makes progress), a blob behind it takes only permits that are free now. So
    /// a later blob never holds what the front blob needs, whatever the budget.
    async fn produce_file(
        &self,
        repo: &str,
        f: &PullFile,
        tx: mpsc::Sender<Bytes>,
        received: &AtomicU64,
        budget: &PullBudget,
        staged: bool,
    ) -> Result<()> {
        let budget_bytes = budget.bytes;
        let window = self.config().transfer_concurrency.max(1);
        let buffered =
            |b: &PullBlob| (f.blobs.len() > 1 || (b.zstd && !staged)) && b.size <= budget_bytes;
        let mut fetches: std::collections::VecDeque<Aborting<Result<(Bytes, OwnedPermit)>>> =
            std::collections::VecDeque::new();
        let mut next = 0usize;
        let mut produced = 0u64;
        for (i, blob) in f.blobs.iter().enumerate() {
            next = next.max(i);
            while next < f.blobs.len() && next - i < window && buffered(&f.blobs[next]) {
                let Some(permit) = budget.take(f.blobs[next].size, next == i).await? else {
                    break;
                };
                let b = f.blobs[next].clone();
                let (client, repo) = (self.clone(), repo.to_string());
                fetches.push_back(Aborting(tokio::spawn(async move {
                    let bytes = retry(&client.config().retry, "download chunk", || {
                        client.get_blob_bytes(&repo, &b.digest, b.size, budget_bytes)
                    })
                    .await?;
                    Ok((bytes, OwnedPermit(permit)))
                })));
                next += 1;
            }
            let limit = f.size - produced;
            let what = format!("blob {repo}@{}", blob.digest);
            if buffered(blob) {
                let Some(mut fetch) = fetches.pop_front() else {
                    return Err(Error::protocol("chunk prefetch out of order"));
                };
                let (bytes, permit) = (&mut fetch.0)
                    .await
                    .map_err(|e| Error::io("chunk task", std::io::Error::other(e.to_string())))??;
                received.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let (zstd, tx) = (blob.zstd, tx.clone());
                produced += tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    let mut emit = |b: Bytes| {
                        tx.blocking_send(b)
                            .map_err(|_| Error::protocol("pull writer stopped"))
                    };
                    if zstd {
                        decode_all(&what, &bytes, limit, &mut emit)
                    } else {
                        pass_raw(&what, bytes, limit, &mut emit)
                    }
                })
                .await
                .map_err(|e| Error::io("decode task", std::io::Error::other(e.to_string())))??;
            } else {
                produced += self
                    .stream_blob(repo, blob, &what, limit, &tx, received)
                    .await?;
            }
        }
        if produced != f.size {
            return Err(Error::SizeMismatch {
                what: format!("files[{}] (decoded)", f.name),
                expected: f.size,
                actual: produced,
            });
        }
        Ok(())
    }

    /// Streams one blob too large to buffer, decoding it if it is zstd.
    async fn stream_blob(
        &self,
        repo: &str,
        blob: &PullBlob,
        what: &str,
        limit: u64,
        tx: &mpsc::Sender<Bytes>,
        received: &AtomicU64,
    ) -> Result<u64> {
        let mut stream = self.get_blob(repo, &blob.digest, blob.size).await?;
        if !blob.zstd {
            let mut n = 0u64;
            while let Some(b) = stream.next().await? {
                received.fetch_add(b.len() as u64, Ordering::Relaxed);
                n += b.len() as u64;
                if n > limit {
                    return Err(Error::SizeMismatch {
                        what: what.to_string(),
                        expected: limit,
                        actual: n,
                    });
                }
                tx.send(b)
                    .await
                    .map_err(|_| Error::protocol("pull writer stopped"))?;
            }
            return Ok(n);
        }
        let (ctx, mut crx) = mpsc::channel::<Bytes>(4);
        let (out, label) = (tx.clone(), what.to_string());
        let decoder = tokio::task::spawn_blocking(move || -> Result<u64> {
            let mut d = ZstdStream::new(label, limit)?;
            let mut emit = |b: Bytes| {
                out.blocking_send(b)
                    .map_err(|_| Error::protocol("pull writer stopped"))
            };
            while let Some(c) = crx.blocking_recv() {
                d.feed(&c, &mut emit)?;
            }
            d.finish(&mut emit)
        });
        let fed = async {
            while let Some(b) = stream.next().await? {
                received.fetch_add(b.len() as u64, Ordering::Relaxed);
                if ctx.send(b).await.is_err() {
                    break; // the decoder failed; its error is reported below
                }
            }
            Ok::<(), Error>(())
        }
        .await;
        drop(ctx);
        let decoded = decoder
            .await
            .map_err(|e| Error::io("decode task", std::io::Error::other(e.to_string())))?;
        fed?;
        decoded
    }
}

/// Writes `b` to the import stream, adding the time it took (the importer's backpressure) to
/// `waited`.
async fn timed_write<W: AsyncWrite + Unpin>(
    w: &mut W,
    b: &[u8],
    waited: &mut std::time::Duration,
) -> std::io::Result<()> {
    let t = std::time::Instant::now();
    let r = w.write_all(b).await;
    *waited += t.elapsed();
    r
}

/// A raw (uncompressed) chunk, handed on in pieces.
fn pass_raw(
    what: &str,
    bytes: Bytes,
    limit: u64,
    emit: &mut dyn FnMut(Bytes) -> Result<()>,
) -> Result<u64> {
    let n = bytes.len() as u64;
    if n > limit {
        return Err(Error::SizeMismatch {
            what: what.to_string(),
            expected: limit,
            actual: n,
        });
    }
    let mut rest = bytes;
    while !rest.is_empty() {
        let piece = rest.split_to(rest.len().min(PIECE));
        emit(piece)?;
    }
    Ok(n)
}

/// The memory one pull may hold in prefetched blobs (`pull_budget`), as KiB permits shared
/// by all the pull's files.
#[derive(Clone)]
struct PullBudget {
    permits: Arc<Semaphore>,
    bytes: u64,
    kib: u32,
}

impl PullBudget {
    fn new(bytes: u64) -> PullBudget {
        let bytes = bytes.max(1 << 20);
        let kib = u32::try_from(bytes >> 10).unwrap_or(u32::MAX);
        PullBudget {
            permits: Arc::new(Semaphore::new(kib as usize)),
            bytes,
            kib,
        }
    }

    /// The permits of a blob of `size` bytes: waited for when `wait` (the front blob),
    /// otherwise only if free now (`None` when not).
    async fn take(&self, size: u64, wait: bool) -> Result<Option<OwnedSemaphorePermit>> {
        let cost = u32::try_from(size.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, self.kib);
        let cancelled = || Error::protocol("pull cancelled");
        if wait {
            return self
                .permits
                .clone()
                .acquire_many_owned(cost)
                .await
                .map(Some)
                .map_err(|_| cancelled());
        }
        match self.permits.clone().try_acquire_many_owned(cost) {
            Ok(p) => Ok(Some(p)),
            Err(TryAcquireError::NoPermits) => Ok(None),
            Err(TryAcquireError::Closed) => Err(cancelled()),
        }
    }
}

/// A permit of the pull budget, released when the chunk's bytes are decoded.
struct OwnedPermit(#[allow(dead_code)] OwnedSemaphorePermit);

/// A task aborted when dropped (a failed pull stops its prefetches).
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A slot of the per-node v2 pull limit, when the plan needs one.
async fn v2_slot(plan: &SnapshotPlan) -> Result<Option<tokio::sync::SemaphorePermit<'static>>> {
    if !plan.limited() {
        return Ok(None);
    }
    V2_PULLS
        .acquire()
        .await
        .map(Some)
        .map_err(|_| Error::protocol("pull cancelled"))
}

/// The disk layers of a cloud image, sorted by title (registry.md §7). The legacy Windows
/// types are the four disk types with a `windows.disk` infix.
pub fn cloud_image_disk_layers(m: &Manifest) -> Result<Vec<Descriptor>> {
    let mut disks: Vec<Descriptor> = m
        .layers
        .iter()
        .filter(|l| oci::DISK_LAYER_MEDIA_TYPES.contains(&l.media_type.as_str()))
        .cloned()
        .collect();
    if disks.is_empty() {
        return Err(Error::protocol("cloud image manifest has no disk layers"));
    }
    disks.sort_by(|a, b| a.title().unwrap_or("").cmp(b.title().unwrap_or("")));
    Ok(disks)
}

fn staging_dir(dest: &Path) -> Result<PathBuf> {
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        Error::invalid(
            "destination",
            format!("{} has no file name", dest.display()),
        )
    })?;
    let staging = parent.join(format!(".{name}.pulling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)
        .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
    Ok(staging)
}

fn create_file(path: &Path, mode: u32) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(crate::validate::file_mode(mode))
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::Digest;

    fn layer(mt: &str, title: &str) -> Descriptor {
        let mut d = Descriptor::new(mt, &Digest::of(title.as_bytes()), 1);
        d.annotations
            .insert(oci::ANNOTATION_TITLE.into(), title.into());
        d
    }

    #[test]
    fn cloud_image_disk_layers_sort_by_title_and_skip_others() {
        let m = Manifest {
            schema_version: 2,
            media_type: None,
            artifact_type: Some(oci::ARTIFACT_OS_IMAGE_V1.into()),
            config: None,
            layers: vec![
                layer(oci::MEDIA_DISK_QCOW2_PART, "disk.qcow2.part.002"),
                layer("application/vnd.oci.image.layer.v1.tar", "readme"),
                layer(oci::MEDIA_WINDOWS_DISK_QCOW2_PART, "disk.qcow2.part.001"),
                layer(oci::MEDIA_DISK_QCOW2_PART, "disk.qcow2.part.000"),
            ],
            manifests: vec![],
            subject: None,
            annotations: Default::default(),
        };
        let titles: Vec<_> = cloud_image_disk_layers(&m)
            .expect("layers")
            .iter()
            .map(|d| d.title().unwrap_or("").to_string())
            .collect();
        assert_eq!(
            titles,
            [
                "disk.qcow2.part.000",
                "disk.qcow2.part.001",
                "disk.qcow2.part.002"
            ]
        );
        let none = Manifest {
            layers: vec![layer("text/plain", "x")],
            ..m
        };
        assert_eq!(
            cloud_image_disk_layers(&none).err().map(|e| e.to_string()),
            Some("cloud image manifest has no disk layers".into())
        );
    }
}
