//! The push entry points — a snapshot directory and an export tar — and the closing config
//! blob and manifest.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cocoon_api::contract::oci;
use tokio::io::AsyncRead;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::file::push_budget;
use super::stage::{entry_meta, list_snapshot_files, spool_entry, stage_file};
use super::{OutLayer, PushEvent, PushOptions, PushReport, PushedLayer, Staged};
use crate::client::{FileBlob, RegistryClient};
use crate::error::{Error, Result, ResultExt};
use crate::manifest::{
    Descriptor, Segment, SnapshotEnvelope, SnapshotFile, build_snapshot_manifest_as,
    snapshot_config, snapshot_layer_v2,
};
use crate::reference::validate_tag;
use crate::tar::TarReader;
use crate::validate::{SNAPSHOT_JSON, check_file_name};

/// Largest `snapshot.json` accepted.
const MAX_ENVELOPE: u64 = 16 << 20;

impl RegistryClient {
    /// Pushes a snapshot directory (`snapshot.json` plus the data files, as `--from-dir`
    /// reads it) to `<repo>:<tag>`. Files are layers in name order; holes stay holes.
    pub async fn push_snapshot_dir(
        &self,
        repo: &str,
        dir: &Path,
        opts: &PushOptions,
    ) -> Result<PushReport> {
        validate_tag(&opts.tag)?;
        let path = self.repo_path(repo)?;
        let env_path = dir.join(SNAPSHOT_JSON);
        let env_bytes = std::fs::read(&env_path)
            .map_err(|e| Error::io(format!("reading {}", env_path.display()), e))?;
        let envelope = SnapshotEnvelope::parse(&env_bytes)?;
        let names = list_snapshot_files(dir)?;
        // Hashing is CPU-bound: at most one file per CPU hashes at a time, largest first, so
        // the big files start uploading early and the small ones hash while they do.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let hashing = Arc::new(Semaphore::new(cpus.min(self.config().transfer_concurrency)));
        let transfers = Arc::new(Semaphore::new(self.config().transfer_concurrency));
        let sent = Arc::new(AtomicU64::new(0));
        let budget = push_budget(self.config().memory_budget);
        let mut order: Vec<(usize, String, u64)> = names
            .into_iter()
            .enumerate()
            .map(|(idx, name)| {
                let len = std::fs::metadata(dir.join(&name)).map_or(0, |m| m.len());
                (idx, name, len)
            })
            .collect();
        order.sort_by_key(|o| std::cmp::Reverse(o.2));
        let mut tasks = JoinSet::new();
        for (idx, name, _) in order {
            let file_path = dir.join(&name);
            let (client, path, opts, sent) =
                (self.clone(), path.clone(), opts.clone(), sent.clone());
            let (hashing, transfers, budget) = (hashing.clone(), transfers.clone(), budget.clone());
            tasks.spawn(async move {
                let cancelled = |_| Error::protocol("push cancelled");
                let staged = {
                    let _hash = hashing.acquire_owned().await.map_err(cancelled)?;
                    stage_file(name, file_path, client.config().v2).await?
                };
                let _transfer = transfers.acquire_owned().await.map_err(cancelled)?;
                let name = staged.name.clone();
                let (meta, layers) = client
                    .push_file(&path, staged, &opts, &sent, &budget)
                    .await?;
                Ok::<_, Error>((idx, name, meta, layers))
            });
        }
        let results = join_all(tasks).await?;
        self.finish_push(repo, &envelope, results, opts, &sent)
            .await
    }

    /// Pushes the tar `cocoon snapshot export <name> -o -` writes (runtime.md §2.3) to
    /// `<repo>:<tag>`: each entry is spooled to an unlinked temporary file while hashed, then
    /// probed and uploaded in the background while the next entry is read. At most
    /// `transfer_concurrency` entries are spooled at once. The caller closes the stream and
    /// waits for the export process afterwards.
    pub async fn push_snapshot_tar<R>(
        &self,
        repo: &str,
        tar: R,
        opts: &PushOptions,
    ) -> Result<PushReport>
    where
        R: AsyncRead + Unpin,
    {
        validate_tag(&opts.tag)?;
        let path = self.repo_path(repo)?;
        let spool_dir = self
            .config()
            .spool_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let sem = Arc::new(Semaphore::new(self.config().transfer_concurrency));
        let sent = Arc::new(AtomicU64::new(0));
        let budget = push_budget(self.config().memory_budget);
        let mut reader = TarReader::new(tar);
        let mut envelope: Option<SnapshotEnvelope> = None;
        let mut tasks = JoinSet::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut idx = 0usize;
        let mut finished = Vec::new();
        let read_err = |e: std::io::Error| Error::io("reading the export stream", e);
        while let Some(entry) = reader.next_entry().await.map_err(read_err)? {
            let name = entry.name.trim_start_matches("./").to_string();
            if !entry.is_regular() || name.is_empty() {
                continue;
            }
            if name == SNAPSHOT_JSON {
                if entry.size > MAX_ENVELOPE {
                    return Err(Error::invalid(SNAPSHOT_JSON, "larger than 16 MiB"));
                }
                let mut buf = Vec::with_capacity(entry.size as usize);
                let mut chunk = vec![0u8; 64 << 10];
                loop {
                    let n = reader.read_body(&mut chunk).await.map_err(read_err)?;
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                envelope = Some(SnapshotEnvelope::parse(&buf)?);
                continue;
            }
            check_file_name(&name).map_err(|r| Error::invalid("export tar entry", r))?;
            if !seen.insert(name.clone()) {
                return Err(Error::invalid(
                    "export tar entry",
                    format!("duplicate file {name:?}"),
                ));
            }
            let meta = entry_meta(&name, entry.mode, entry.size, &entry.pax)?;
            // Holding a permit while spooling bounds the spooled-but-unsent files.
            let permit = sem
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::protocol("push cancelled"))?;
            let (file, digest) = spool_entry(&mut reader, &spool_dir, entry.size)
                .await
                .context(|| format!("spooling {name}"))?;
            let size = entry.size;
            let staged = Staged {
                name: name.clone(),
                meta,
                blob: FileBlob {
                    file: Arc::new(file),
                    extents: Segment::whole(size),
                    size,
                    digest,
                },
            };
            let (client, path, opts, sent, budget) = (
                self.clone(),
                path.clone(),
                opts.clone(),
                sent.clone(),
                budget.clone(),
            );
            let i = idx;
            idx += 1;
            tasks.spawn(async move {
                let _permit = permit;
                let name = staged.name.clone();
                let (meta, layers) = client
                    .push_file(&path, staged, &opts, &sent, &budget)
                    .await?;
                Ok::<_, Error>((i, name, meta, layers))
            });
            // Surface an upload failure without waiting for the whole stream.
            while let Some(done) = tasks.try_join_next() {
                finished.push(flatten(done)?);
            }
        }
        let envelope = envelope.ok_or_else(|| {
            Error::invalid("export tar", "snapshot.json not found in export stream")
        })?;
        let mut results = join_all(tasks).await?;
        results.extend(finished);
        self.finish_push(repo, &envelope, results, opts, &sent)
            .await
    }

    /// Uploads the config blob and puts the manifest.
    async fn finish_push(
        &self,
        repo: &str,
        envelope: &SnapshotEnvelope,
        mut results: Vec<(usize, String, SnapshotFile, Vec<OutLayer>)>,
        opts: &PushOptions,
        sent: &AtomicU64,
    ) -> Result<PushReport> {
        results.sort_by_key(|r| r.0);
        let now = chrono::Utc::now();
        let created = if opts.annotations.created.is_empty() {
            now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        } else {
            opts.annotations.created.clone()
        };
        // The config's createdAt has nanoseconds (as the Go pusher's time.Time does): two
        // pushes of one snapshot within a second then still differ, so `hibernate` and
        // `latest` never share a manifest digest (registry.md §2.1).
        let config_created = now.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        // v2 only when a file was actually encoded: with the knobs on but only small files
        // the artifact stays v1, byte for byte (registry.md §5.5).
        let zstd = results
            .iter()
            .any(|(_, _, _, ls)| ls.iter().any(|l| l.zstd));
        let chunks = results
            .iter()
            .any(|(_, _, _, ls)| ls.iter().any(|l| l.chunk.is_some()));
        let v2 = zstd || chunks;
        let data_bytes: u64 = results
            .iter()
            .filter_map(|(_, _, m, _)| m.size)
            .map(|s| u64::try_from(s).unwrap_or(0))
            .sum();
        let files: BTreeMap<String, SnapshotFile> = results
            .iter()
            .map(|(_, n, m, _)| {
                let mut m = m.clone();
                if !v2 {
                    m.size = None;
                    m.chunks.clear();
                }
                (n.clone(), m)
            })
            .collect();
        let mut config = snapshot_config(&envelope.config, files, &config_created);
        if v2 {
            config.schema_version = "v2".into();
        }
        let config_bytes =
            Bytes::from(serde_json::to_vec(&config).map_err(|e| Error::protocol(e.to_string()))?);
        let config_size = config_bytes.len() as u64;
        let config_digest = self
            .put_blob_bytes(repo, config_bytes)
            .await
            .context(|| "upload config blob".to_string())?;
        let layers: Vec<Descriptor> = results
            .iter()
            .flat_map(|(_, _, _, ls)| ls.iter())
            .map(|l| {
                let p = &l.pushed;
                snapshot_layer_v2(&p.name, &p.digest, p.size, l.zstd, l.chunk)
            })
            .collect();
        let mut annotations = opts.annotations.clone();
        annotations.created = created;
        let artifact = if v2 {
            oci::ARTIFACT_SNAPSHOT_V2
        } else {
            oci::ARTIFACT_SNAPSHOT_V1
        };
        let manifest = build_snapshot_manifest_as(
            artifact,
            Descriptor::new(oci::MEDIA_SNAPSHOT_CONFIG_V1, &config_digest, config_size),
            layers,
            annotations,
        );
        if let Some(gate) = &opts.before_manifest {
            gate()
                .await
                .map_err(|reason| Error::ManifestWithheld { reason })?;
        }
        let manifest_digest = self
            .put_manifest(
                repo,
                &opts.tag,
                Bytes::from(manifest),
                oci::MEDIA_OCI_MANIFEST,
            )
            .await
            .context(|| format!("put manifest {repo}:{}", opts.tag))?;
        opts.notify(PushEvent::ManifestPut {
            digest: manifest_digest.clone(),
        });
        let layers: Vec<PushedLayer> = results
            .into_iter()
            .flat_map(|r| r.3)
            .map(|l| l.pushed)
            .collect();
        tracing::info!(repo, tag = %opts.tag, digest = %manifest_digest, layers = layers.len(), sent = sent.load(Ordering::Relaxed), "snapshot pushed");
        Ok(PushReport {
            manifest_digest,
            config_digest,
            snapshot_id: envelope.config.id.clone(),
            layers,
            bytes_uploaded: sent.load(Ordering::Relaxed),
            data_bytes,
            format: crate::pull::wire_format(v2, zstd, chunks),
        })
    }
}

type TaskResult = Result<(usize, String, SnapshotFile, Vec<OutLayer>)>;

fn flatten(r: std::result::Result<TaskResult, tokio::task::JoinError>) -> TaskResult {
    r.map_err(|e| Error::io("push task", std::io::Error::other(e.to_string())))?
}

/// Waits for every task; the first error wins (the rest are aborted when the set drops).
async fn join_all(
    mut tasks: JoinSet<TaskResult>,
) -> Result<Vec<(usize, String, SnapshotFile, Vec<OutLayer>)>> {
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(flatten(r)?);
    }
    Ok(out)
}
