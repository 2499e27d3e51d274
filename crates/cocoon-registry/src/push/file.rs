//! One file pushed as its layer(s) in the encoding the v2 knobs pick: probe and upload,
//! the streamed zstd upload, parallel chunks within the memory budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::encode::{Encoding, compress_range, compress_to_spool, encoding, read_range};
use super::stage::create_unlinked;
use super::{OutLayer, PushEvent, PushOptions, PushedLayer, Staged};
use crate::client::RegistryClient;
use crate::error::{Error, Result, ResultExt};
use crate::manifest::SnapshotFile;
use crate::reference::Digest;

/// The push memory budget as a semaphore of KiB permits.
pub(super) fn push_budget(bytes: u64) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(budget_kib(bytes) as usize))
}

fn budget_kib(bytes: u64) -> u32 {
    u32::try_from((bytes >> 10).max(1)).unwrap_or(u32::MAX)
}

/// PATCH size of a streamed upload: what has to be on disk before it is sent.
const STREAM_PIECE: u64 = 8 << 20;

impl RegistryClient {
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

    /// Pushes one staged file as its layer(s) in the encoding the v2 knobs pick.
    pub(super) async fn push_file(
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
