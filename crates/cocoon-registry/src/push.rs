//! Snapshot push (registry.md §5) from a snapshot directory or an export tar: one layer per
//! file, config blob, manifest; present blobs skipped, bounded parallel transfers and memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cocoon_api::contract::oci;
use tokio::io::AsyncRead;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::client::{FileBlob, IO_BUF, RegistryClient, SpoolProgress};
use crate::config::V2Options;
use crate::error::{Error, Result, ResultExt};
use crate::manifest::{
    Descriptor, PushAnnotations, Segment, SnapshotEnvelope, SnapshotFile,
    build_snapshot_manifest_as, parse_sparse_map, snapshot_config, snapshot_layer_v2,
};
use crate::reference::{Digest, Hasher, validate_tag};
use crate::sparse::{ExtentReader, Layout, layout_of};
use crate::tar::{PAX_SPARSE_MAP, PAX_SPARSE_SIZE, TarReader};
use crate::validate::{SNAPSHOT_JSON, check_file_name, check_segments};

/// Largest `snapshot.json` accepted.
const MAX_ENVELOPE: u64 = 16 << 20;

/// What happened to one blob during a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// The registry already had the blob; nothing was sent.
    BlobSkipped {
        name: String,
        digest: Digest,
        size: u64,
    },
    /// The blob was uploaded.
    BlobUploaded {
        name: String,
        digest: Digest,
        size: u64,
    },
    /// The manifest was stored under the tag.
    ManifestPut { digest: Digest },
}

/// A callback for [`PushEvent`]s (logging, progress, tests).
pub type PushObserver = Arc<dyn Fn(&PushEvent) + Send + Sync>;

/// Push parameters.
#[derive(Clone, Default)]
pub struct PushOptions {
    /// The tag: `hibernate` or `latest`.
    pub tag: String,
    /// Manifest annotations; `created` defaults to now, `base_image` is the pod image.
    pub annotations: PushAnnotations,
    /// Called for every blob and for the manifest.
    pub observer: Option<PushObserver>,
}

impl PushOptions {
    /// Options for `tag` recording `base_image` as the snapshot's base image.
    pub fn new(tag: impl Into<String>, base_image: impl Into<String>) -> PushOptions {
        PushOptions {
            tag: tag.into(),
            annotations: PushAnnotations {
                base_image: base_image.into(),
                ..Default::default()
            },
            observer: None,
        }
    }

    fn notify(&self, e: PushEvent) {
        if let Some(o) = &self.observer {
            o(&e);
        }
    }
}

/// One layer of a finished push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedLayer {
    pub name: String,
    pub digest: Digest,
    /// Layer bytes (data extents only for sparse files).
    pub size: u64,
    /// Whether this push sent the bytes (false: the registry had them).
    pub uploaded: bool,
}

/// The outcome of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushReport {
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    /// The snapshot id recorded in the config.
    pub snapshot_id: String,
    pub layers: Vec<PushedLayer>,
    /// Layer bytes sent by this push.
    pub bytes_uploaded: u64,
    /// The files' data bytes (uncompressed; the extents of sparse files).
    pub data_bytes: u64,
    /// The wire format: `v1`, `v2 zstd`, `v2 chunks` or `v2 zstd+chunks`.
    pub format: String,
}

/// A file ready to become a layer.
struct Staged {
    name: String,
    meta: SnapshotFile,
    blob: FileBlob,
}

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

    /// Probes one blob and uploads it when missing.
    async fn transfer(
        &self,
        path: &str,
        staged: &Staged,
        opts: &PushOptions,
        sent: &AtomicU64,
    ) -> Result<PushedLayer> {
        let blob = &staged.blob;
        let uploaded = if self.has_blob_path(path, &blob.digest).await? {
            opts.notify(PushEvent::BlobSkipped {
                name: staged.name.clone(),
                digest: blob.digest.clone(),
                size: blob.size,
            });
            false
        } else {
            self.put_file_blob(path, blob)
                .await
                .context(|| format!("upload {} ({})", staged.name, blob.digest))?;
            sent.fetch_add(blob.size, Ordering::Relaxed);
            opts.notify(PushEvent::BlobUploaded {
                name: staged.name.clone(),
                digest: blob.digest.clone(),
                size: blob.size,
            });
            true
        };
        tracing::debug!(file = %staged.name, digest = %blob.digest, size = blob.size, uploaded, "layer");
        Ok(PushedLayer {
            name: staged.name.clone(),
            digest: blob.digest.clone(),
            size: blob.size,
            uploaded,
        })
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

/// A layer of a pushed file, with what its descriptor needs beyond the blob.
struct OutLayer {
    pushed: PushedLayer,
    zstd: bool,
    /// (index, count) of a chunk.
    chunk: Option<(usize, usize)>,
}

/// Files smaller than this stay raw in v2 (cocoon-common v0.3.0's writer).
pub const MIN_COMPRESS_SIZE: u64 = 1 << 20;

/// How one file goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// One raw layer (every v1 file, and small v2 files).
    Raw,
    /// One layer, one zstd frame.
    Zstd,
    /// Fixed-size chunks, one blob per chunk, each its own zstd frame when `compress`.
    Chunks { compress: bool, chunk: u64 },
}

/// The Go writer's rule: compress files of at least 1 MiB when a level is set; chunk a file
/// when a chunk size is set and the file is compressed or larger than a chunk.
pub fn encoding(size: u64, v2: V2Options) -> Encoding {
    let compress = v2.zstd_level > 0 && size >= MIN_COMPRESS_SIZE;
    if v2.chunk_size > 0 && (compress || size > v2.chunk_size) {
        Encoding::Chunks {
            compress,
            chunk: v2.chunk_size,
        }
    } else if compress {
        Encoding::Zstd
    } else {
        Encoding::Raw
    }
}

/// The push memory budget as a semaphore of KiB permits.
fn push_budget(bytes: u64) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(budget_kib(bytes) as usize))
}

fn budget_kib(bytes: u64) -> u32 {
    u32::try_from((bytes >> 10).max(1)).unwrap_or(u32::MAX)
}

impl RegistryClient {
    /// Pushes one staged file as its layer(s) in the encoding the v2 knobs pick.
    async fn push_file(
        &self,
        path: &str,
        staged: Staged,
        opts: &PushOptions,
        sent: &Arc<AtomicU64>,
        budget: &Arc<Semaphore>,
    ) -> Result<(SnapshotFile, Vec<OutLayer>)> {
        let v2 = self.config().v2;
        let size = staged.blob.size;
        let mut meta = staged.meta.clone();
        // The uncompressed size; dropped again when the artifact ends up v1.
        meta.size = Some(i64::try_from(size).unwrap_or(i64::MAX));
        match encoding(size, v2) {
            Encoding::Raw => {
                let pushed = self.transfer(path, &staged, opts, sent).await?;
                Ok((
                    meta,
                    vec![OutLayer {
                        pushed,
                        zstd: false,
                        chunk: None,
                    }],
                ))
            }
            Encoding::Zstd => {
                let spool = self
                    .config()
                    .spool_dir
                    .clone()
                    .unwrap_or_else(std::env::temp_dir);
                let src = staged.blob.clone();
                let level = v2.zstd_level;
                let workers = std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(8) as u32;
                let file = Arc::new(create_unlinked(&spool)?);
                // The upload follows the compressor through the spool file as it grows; the
                // finished spool is uploaded the ordinary way if that fails.
                let (progress, written) = tokio::sync::watch::channel((0u64, None));
                let out = file.clone();
                let compressed = tokio::task::spawn_blocking(move || {
                    compress_to_spool(&src, out, level, workers, &progress)
                });
                let streamed = self
                    .put_growing_blob(path, file, written, STREAM_PIECE)
                    .await;
                let blob = compressed
                    .await
                    .map_err(|e| Error::io("compress task", std::io::Error::other(e.to_string())))?
                    .context(|| format!("compressing {}", staged.name))?;
                let encoded = Staged {
                    name: staged.name.clone(),
                    meta: meta.clone(),
                    blob,
                };
                let pushed = match streamed {
                    Ok((digest, size)) if digest == encoded.blob.digest => {
                        sent.fetch_add(size, Ordering::Relaxed);
                        opts.notify(PushEvent::BlobUploaded {
                            name: encoded.name.clone(),
                            digest: digest.clone(),
                            size,
                        });
                        PushedLayer {
                            name: encoded.name.clone(),
                            digest,
                            size,
                            uploaded: true,
                        }
                    }
                    other => {
                        if let Err(e) = other {
                            tracing::debug!(file = %encoded.name, error = %e, "streamed upload failed; uploading the spool");
                        }
                        self.transfer(path, &encoded, opts, sent).await?
                    }
                };
                Ok((
                    meta,
                    vec![OutLayer {
                        pushed,
                        zstd: true,
                        chunk: None,
                    }],
                ))
            }
            Encoding::Chunks { compress, chunk } => {
                let count = usize::try_from(size.div_ceil(chunk)).unwrap_or(usize::MAX);
                // Chunks are read and compressed at most one per CPU, in chunk order, and
                // uploaded `transfer_concurrency` at a time: the first chunk is ready after
                // one chunk's compression (not after all the window's, which share the
                // CPUs), and compression keeps going while earlier chunks upload. At most
                // `transfer_concurrency + cpus` chunks are in flight.
                let conc = self.config().transfer_concurrency;
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                let encoders = Arc::new(Semaphore::new(cpus));
                let ahead = Arc::new(Semaphore::new(conc + cpus));
                let uploads = Arc::new(Semaphore::new(conc));
                let mut tasks = JoinSet::new();
                let mut done = Vec::with_capacity(count);
                let cancelled = |_| Error::protocol("push cancelled");
                for k in 0..count {
                    let offset = k as u64 * chunk;
                    let len = chunk.min(size - offset);
                    // Twice a chunk for each chunk in flight (a raw chunk is read whole; a
                    // compressed one streams into an output of up to its bound): memory stays
                    // within the budget.
                    let cost = u32::try_from((2 * len).div_ceil(1024))
                        .unwrap_or(u32::MAX)
                        .clamp(1, budget_kib(self.config().memory_budget));
                    let mem = budget
                        .clone()
                        .acquire_many_owned(cost)
                        .await
                        .map_err(cancelled)?;
                    let slot = ahead.clone().acquire_owned().await.map_err(cancelled)?;
                    let encoder = encoders.clone().acquire_owned().await.map_err(cancelled)?;
                    while let Some(r) = tasks.try_join_next() {
                        done.push(r.map_err(|e| {
                            Error::io("chunk task", std::io::Error::other(e.to_string()))
                        })??);
                    }
                    let (client, path, opts, sent) =
                        (self.clone(), path.to_string(), opts.clone(), sent.clone());
                    let src = staged.blob.clone();
                    let (name, level) = (staged.name.clone(), v2.zstd_level);
                    let uploads = uploads.clone();
                    tasks.spawn(async move {
                        let _held = (mem, slot);
                        let (bytes, digest) = tokio::task::spawn_blocking(move || {
                            let _encoder = encoder;
                            let bytes = if compress {
                                Bytes::from(compress_range(&src, offset, len, level)?)
                            } else {
                                Bytes::from(
                                    read_range(&src, offset, len)
                                        .map_err(|e| Error::io("reading a chunk", e))?,
                                )
                            };
                            let digest = Digest::of(&bytes);
                            Ok::<_, Error>((bytes, digest))
                        })
                        .await
                        .map_err(|e| {
                            Error::io("chunk task", std::io::Error::other(e.to_string()))
                        })??;
                        let size = bytes.len() as u64;
                        let _upload = uploads.acquire_owned().await.map_err(cancelled)?;
                        let uploaded = if client.has_blob_path(&path, &digest).await? {
                            opts.notify(PushEvent::BlobSkipped {
                                name: name.clone(),
                                digest: digest.clone(),
                                size,
                            });
                            false
                        } else {
                            client
                                .put_bytes_blob(&path, &digest, bytes)
                                .await
                                .context(|| format!("upload {name} chunk {k} ({digest})"))?;
                            sent.fetch_add(size, Ordering::Relaxed);
                            opts.notify(PushEvent::BlobUploaded {
                                name: name.clone(),
                                digest: digest.clone(),
                                size,
                            });
                            true
                        };
                        Ok::<_, Error>((
                            k,
                            PushedLayer {
                                name,
                                digest,
                                size,
                                uploaded,
                            },
                        ))
                    });
                }
                while let Some(r) = tasks.join_next().await {
                    done.push(r.map_err(|e| {
                        Error::io("chunk task", std::io::Error::other(e.to_string()))
                    })??);
                }
                done.sort_by_key(|d| d.0);
                meta.chunks = done.iter().map(|(_, l)| l.digest.to_string()).collect();
                let layers = done
                    .into_iter()
                    .map(|(k, pushed)| OutLayer {
                        pushed,
                        zstd: compress,
                        chunk: Some((k, count)),
                    })
                    .collect();
                Ok((meta, layers))
            }
        }
    }
}

/// `len` layer bytes of `src` from layer offset `offset`.
fn read_range(src: &FileBlob, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    r.seek(offset);
    let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    let n = r.read_into(&mut buf)?;
    if n != buf.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "file shrank while it was being read",
        ));
    }
    Ok(buf)
}

/// Compresses `len` layer bytes of `src` from layer offset `offset` into one zstd frame with
/// the content size in its header and a content checksum (a chunk: the Go writer's
/// `EncodeAll`), reading them in `IO_BUF` pieces: no chunk-sized buffer of raw bytes (and
/// its page faults) besides the output.
fn compress_range(src: &FileBlob, offset: u64, len: u64, level: i32) -> Result<Vec<u8>> {
    let io = |e| Error::io("compressing a chunk", e);
    let bound =
        zstd::zstd_safe::compress_bound(usize::try_from(len).map_err(|_| {
            Error::invalid("chunk size", format!("{len} bytes do not fit in memory"))
        })?);
    let mut enc =
        zstd::stream::write::Encoder::new(Vec::with_capacity(bound), level).map_err(io)?;
    enc.include_checksum(true).map_err(io)?;
    enc.include_contentsize(true).map_err(io)?;
    enc.set_pledged_src_size(Some(len)).map_err(io)?;
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    r.seek(offset);
    let mut buf = vec![0u8; IO_BUF];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(IO_BUF as u64)).unwrap_or(IO_BUF);
        let n = r.read_into(&mut buf[..want]).map_err(io)?;
        if n == 0 {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "file shrank while it was being read",
            )));
        }
        enc.write_all(&buf[..n]).map_err(io)?;
        left -= n as u64;
    }
    enc.finish().map_err(io)
}

/// PATCH size of a streamed upload: what has to be on disk before it is sent.
const STREAM_PIECE: u64 = 8 << 20;

/// Compresses a file's layer bytes into one zstd frame (streaming, content checksum, libzstd
/// worker threads) into the unlinked spool file `out`, hashing the output: the encoded layer
/// blob. `progress` follows what is on disk, and carries the digest at the end.
fn compress_to_spool(
    src: &FileBlob,
    out: Arc<File>,
    level: i32,
    workers: u32,
    progress: &tokio::sync::watch::Sender<SpoolProgress>,
) -> Result<FileBlob> {
    /// Writes to the spool, hashing and counting what reached the file.
    struct Spool<'a> {
        file: &'a File,
        hasher: Hasher,
        n: u64,
        progress: &'a tokio::sync::watch::Sender<SpoolProgress>,
    }
    impl std::io::Write for Spool<'_> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = self.file.write(b)?;
            self.hasher.update(&b[..n]);
            self.n += n as u64;
            self.progress.send_replace((self.n, None));
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.file.flush()
        }
    }
    let io = |e| Error::io("compressing into the spool file", e);
    let sink = std::io::BufWriter::with_capacity(
        IO_BUF,
        Spool {
            file: &out,
            hasher: Hasher::new(),
            n: 0,
            progress,
        },
    );
    let mut enc = zstd::stream::write::Encoder::new(sink, level).map_err(io)?;
    enc.include_checksum(true).map_err(io)?;
    if workers > 1 {
        enc.multithread(workers).map_err(io)?;
    }
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = r.read_into(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        enc.write_all(&buf[..n]).map_err(io)?;
    }
    let sink = enc.finish().map_err(io)?;
    let spool = sink.into_inner().map_err(|e| io(e.into_error()))?;
    let (size, digest) = (spool.n, spool.hasher.finish());
    progress.send_replace((size, Some(digest.clone())));
    Ok(FileBlob {
        file: out.clone(),
        extents: Segment::whole(size),
        size,
        digest,
    })
}

/// Regular files of a snapshot directory except `snapshot.json`, by name.
fn list_snapshot_files(dir: &Path) -> Result<Vec<String>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let ft = entry
            .file_type()
            .map_err(|e| Error::io(format!("stat {}", entry.path().display()), e))?;
        if !ft.is_file() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            return Err(Error::invalid(
                "snapshot directory",
                format!("non-UTF-8 file name in {}", dir.display()),
            ));
        };
        if name == SNAPSHOT_JSON {
            continue;
        }
        check_file_name(&name).map_err(|r| Error::invalid("snapshot directory", r))?;
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// Opens a file, decides its layout and hashes its layer bytes (on a blocking thread).
/// A file the v2 knobs encode is not hashed raw (its layers are the encoded bytes); its
/// `digest` is then the empty blob's and never used.
async fn stage_file(name: String, path: PathBuf, v2: V2Options) -> Result<Staged> {
    tokio::task::spawn_blocking(move || {
        let ctx = |what: &str| format!("{what} {}", path.display());
        let file = File::open(&path).map_err(|e| Error::io(ctx("opening"), e))?;
        let mode = {
            use std::os::unix::fs::PermissionsExt as _;
            file.metadata()
                .map_err(|e| Error::io(ctx("stat"), e))?
                .permissions()
                .mode()
                & 0o7777
        };
        let layout = layout_of(&file).map_err(|e| Error::io(ctx("scanning holes in"), e))?;
        let file = Arc::new(file);
        let digest = if encoding(layout.packed_size(), v2) == Encoding::Raw {
            hash_extents(&file, &layout).map_err(|e| Error::io(ctx("reading"), e))?
        } else {
            Digest::of(b"")
        };
        let meta = SnapshotFile {
            mode: i64::from(mode),
            sparse_map: layout.map_text(),
            sparse_size: if layout.sparse.is_some() {
                layout.size as i64
            } else {
                0
            },
            ..Default::default()
        };
        Ok(Staged {
            name,
            meta,
            blob: FileBlob {
                file,
                extents: layout.extents(),
                size: layout.packed_size(),
                digest,
            },
        })
    })
    .await
    .map_err(|e| Error::io("hashing task", std::io::Error::other(e.to_string())))?
}

fn hash_extents(file: &Arc<File>, layout: &Layout) -> std::io::Result<Digest> {
    let mut r = ExtentReader::new(file.clone(), layout.extents());
    let mut h = Hasher::new();
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = r.read_into(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finish())
}

/// The config entry of a tar entry: its mode and, for a sparse entry, the map and size,
/// checked against the entry's data size.
fn entry_meta(
    name: &str,
    mode: u32,
    size: u64,
    pax: &BTreeMap<String, String>,
) -> Result<SnapshotFile> {
    let mut meta = SnapshotFile {
        mode: i64::from(mode),
        ..Default::default()
    };
    if let Some(map) = pax.get(PAX_SPARSE_MAP) {
        let field = format!("{name}: {PAX_SPARSE_SIZE}");
        let logical: u64 = pax
            .get(PAX_SPARSE_SIZE)
            .ok_or_else(|| Error::invalid(&field, "missing for a sparse entry"))?
            .parse()
            .map_err(|_| Error::invalid(&field, "not a number"))?;
        let segments = parse_sparse_map(map).map_err(|e| e.context(name))?;
        check_segments(&segments, logical, size)
            .map_err(|r| Error::invalid(format!("{name}: {PAX_SPARSE_MAP}"), r))?;
        meta.sparse_map = Some(map.clone());
        meta.sparse_size =
            i64::try_from(logical).map_err(|_| Error::invalid(&field, "too large"))?;
    }
    Ok(meta)
}

/// Copies the current tar entry (`size` bytes) into an unlinked temporary file in `dir`
/// while hashing it; the file is written by a blocking thread fed through a small channel.
async fn spool_entry<R: AsyncRead + Unpin>(
    reader: &mut TarReader<R>,
    dir: &Path,
    size: u64,
) -> Result<(File, Digest)> {
    let file = create_unlinked(dir)?;
    let writer = file
        .try_clone()
        .map_err(|e| Error::io("cloning spool file handle", e))?;
    let (tx, mut rx) = mpsc::channel::<Bytes>(2);
    let worker = tokio::task::spawn_blocking(move || -> std::io::Result<Digest> {
        let mut w = std::io::BufWriter::with_capacity(IO_BUF, writer);
        let mut h = Hasher::new();
        while let Some(b) = rx.blocking_recv() {
            h.update(&b);
            w.write_all(&b)?;
        }
        w.flush()?;
        Ok(h.finish())
    });
    let mut left = size;
    let feed = async {
        while left > 0 {
            let mut buf =
                bytes::BytesMut::zeroed(IO_BUF.min(usize::try_from(left).unwrap_or(IO_BUF)));
            let mut filled = 0;
            while filled < buf.len() {
                let n = reader
                    .read_body(&mut buf[filled..])
                    .await
                    .map_err(|e| Error::io("reading the export stream", e))?;
                if n == 0 {
                    return Err(Error::io(
                        "reading the export stream",
                        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "entry ended early"),
                    ));
                }
                filled += n;
            }
            left -= filled as u64;
            buf.truncate(filled);
            if tx.send(buf.freeze()).await.is_err() {
                break; // the writer failed; its error is reported below
            }
        }
        Ok(())
    };
    let fed = feed.await;
    drop(tx);
    let digest = worker
        .await
        .map_err(|e| Error::io("spool task", std::io::Error::other(e.to_string())))?
        .map_err(|e| Error::io(format!("writing spool file in {}", dir.display()), e))?;
    fed?;
    Ok((file, digest))
}

/// A read-write file in `dir` whose name is removed at once: its space is freed when the last
/// handle closes, even if the process dies.
fn create_unlinked(dir: &Path) -> Result<File> {
    use std::hash::{BuildHasher, RandomState};
    for _ in 0..16 {
        let n = RandomState::new().hash_one(std::time::SystemTime::now());
        let p = dir.join(format!(".cocoon-spool-{}-{n:016x}", std::process::id()));
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                std::fs::remove_file(&p)
                    .map_err(|e| Error::io(format!("unlinking {}", p.display()), e))?;
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Error::io(
                    format!("creating a spool file in {}", dir.display()),
                    e,
                ));
            }
        }
    }
    Err(Error::io(
        format!("creating a spool file in {}", dir.display()),
        std::io::Error::other("no free name"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_follows_the_go_writer() {
        const MIB: u64 = 1 << 20;
        let knobs = |zstd_level, chunk_mib: u64| V2Options {
            zstd_level,
            chunk_size: chunk_mib * MIB,
        };
        let chunks = |compress, mib: u64| Encoding::Chunks {
            compress,
            chunk: mib * MIB,
        };
        for (size, v2, want) in [
            // All knobs off: every file raw (v1).
            (6 * MIB, knobs(0, 0), Encoding::Raw),
            // zstd only: files of at least 1 MiB compressed whole.
            (MIB, knobs(3, 0), Encoding::Zstd),
            (MIB - 1, knobs(3, 0), Encoding::Raw),
            (0, knobs(3, 0), Encoding::Raw),
            // zstd and chunks: a compressed file is always chunked, even below a chunk.
            (6 * MIB, knobs(3, 1), chunks(true, 1)),
            (2 * MIB, knobs(3, 64), chunks(true, 64)),
            (MIB - 1, knobs(3, 1), Encoding::Raw),
            // Chunks only: raw chunks for files larger than a chunk.
            (2 * MIB, knobs(0, 1), chunks(false, 1)),
            (MIB, knobs(0, 1), Encoding::Raw),
        ] {
            assert_eq!(encoding(size, v2), want, "{size} {v2:?}");
        }
    }

    #[test]
    fn sparse_entries_carry_their_map_into_the_config() {
        let mut pax = BTreeMap::new();
        pax.insert(
            PAX_SPARSE_MAP.to_string(),
            r#"[{"o":0,"l":4096},{"o":65536,"l":4096}]"#.to_string(),
        );
        pax.insert(PAX_SPARSE_SIZE.to_string(), "1048576".to_string());
        let m = entry_meta("cow.raw", 0o600, 8192, &pax).expect("meta");
        assert_eq!(m.mode, 0o600);
        assert_eq!(m.sparse_size, 1 << 20);
        assert!(m.sparse_map.is_some());
        // The map must account for exactly the entry's bytes.
        assert!(entry_meta("cow.raw", 0o600, 4096, &pax).is_err());
        pax.remove(PAX_SPARSE_SIZE);
        assert!(entry_meta("cow.raw", 0o600, 8192, &pax).is_err());
        let plain = entry_meta("config.json", 0o644, 10, &BTreeMap::new()).expect("meta");
        assert_eq!(plain.sparse_map, None);
    }
}
