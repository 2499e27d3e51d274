//! Image verbs: pull (`ensure_image`), presence check, import.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use tokio_util::io::SyncIoBridge;

use super::config::guess_kind;
use super::control::{ImageKind, Verb};
use super::state::{SimImage, random_hex};
use super::transfer::{Throttle, import_handle};
use super::{Inner, NO_ARGS, On, PIPE_BUFFER, io_err};
use crate::error::{Result, RuntimeError};
use crate::io::ImportHandle;
use crate::types::SnapshotRecord;

impl Inner {
    /// Registers a pulled image (synthetic bytes: the digest is the ref's hash unless given).
    pub(super) fn register_pulled(&self, name: &str, digest: &str, kind: ImageKind) -> Result<()> {
        let digest = if digest.is_empty() {
            format!("sha256:{}", hex::encode(Sha256::digest(name.as_bytes())))
        } else {
            digest.to_owned()
        };
        let mut st = self.st();
        st.images.insert(
            name.to_owned(),
            SimImage {
                name: name.to_owned(),
                digest,
                image_type: kind.image_type().to_owned(),
                size: 0,
            },
        );
        st.save_images(&self.layout)
            .map_err(|e| io_err("save image index", e))
    }

    /// `--pull` of a clone: fetch the snapshot's base image if missing; a failure only warns.
    pub(super) async fn auto_pull(&self, snap: &SnapshotRecord) {
        if snap.image.is_empty() {
            return;
        }
        let present = {
            let st = self.st();
            st.find_image(&snap.image_digest).is_some() || st.find_image(&snap.image).is_some()
        };
        if present {
            return;
        }
        let kind = {
            let c = self.ctl();
            c.known_images
                .get(&snap.image)
                .copied()
                .or_else(|| c.permissive_pull.then(|| guess_kind(&snap.image)))
        };
        match kind {
            Some(kind) => {
                self.pace(Verb::EnsureImage).await;
                if let Err(e) = self.register_pulled(&snap.image, &snap.image_digest, kind) {
                    tracing::warn!(image = %snap.image, error = %e, "simulated auto-pull failed");
                }
            }
            None => tracing::warn!(
                image = %snap.image,
                "simulated auto-pull of the snapshot base image failed (unknown image); continuing"
            ),
        }
    }
}

pub(super) async fn ensure_image(inner: &Arc<Inner>, image: &str, force: bool) -> Result<()> {
    let call = inner
        .begin(
            Verb::EnsureImage,
            On::Image(image),
            serde_json::json!({ "force": force }),
        )
        .await?;
    if image.is_empty() {
        return Err(RuntimeError::Other("cocoon image pull: empty image".into()));
    }
    if !force && inner.st().find_image(image).is_some() {
        return Ok(());
    }
    let kind = {
        let c = inner.ctl();
        c.known_images
            .get(image)
            .copied()
            .or_else(|| c.permissive_pull.then(|| guess_kind(image)))
    };
    let Some(kind) = kind else {
        return Err(RuntimeError::Other(format!(
            "cocoon image pull {image}: manifest unknown (the simulator was not told about this image)"
        )));
    };
    call.pace().await;
    inner.register_pulled(image, "", kind)
}

pub(super) async fn image_present(inner: &Arc<Inner>, name_or_digest: &str) -> Result<()> {
    inner
        .begin(Verb::ImagePresent, On::Image(name_or_digest), NO_ARGS)
        .await?
        .pace()
        .await;
    match inner.st().find_image(name_or_digest) {
        Some(_) => Ok(()),
        None => Err(RuntimeError::ImageNotFound(format!(
            "image {name_or_digest} not found in any backend"
        ))),
    }
}

pub(super) async fn image_import(inner: &Arc<Inner>, name: &str) -> Result<ImportHandle> {
    inner
        .begin(Verb::ImageImport, On::Image(name), NO_ARGS)
        .await?;
    if name.is_empty() {
        return Err(RuntimeError::Other(
            "cocoon image import: empty name".into(),
        ));
    }
    let rate = inner.ctl().latencies.import_bytes_per_sec;
    let aborted = Arc::new(AtomicBool::new(false));
    let (sink, reader) = tokio::io::duplex(PIPE_BUFFER);
    let bridge = SyncIoBridge::new(reader);
    let (task_inner, task_name, flag) = (inner.clone(), name.to_owned(), aborted.clone());
    let task = tokio::task::spawn_blocking(move || -> Result<()> {
        let tmp = task_inner.layout.tmp().join(random_hex(8));
        let res = (|| -> io::Result<(String, String, u64)> {
            let mut input = Throttle::new(bridge, rate, Some(flag.clone()));
            let mut file = std::fs::File::create(&tmp)?;
            let mut hasher = Sha256::new();
            let mut head = Vec::new();
            let mut total = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = input.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if head.len() < 512 {
                    head.extend_from_slice(&buf[..n.min(512 - head.len())]);
                }
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n])?;
                total += n as u64;
            }
            file.sync_all()?;
            let kind = if head.starts_with(b"QFI\xfb") {
                crate::types::IMAGE_TYPE_CLOUDIMG
            } else if head.get(257..262) == Some(b"ustar") {
                crate::types::IMAGE_TYPE_OCI
            } else if total == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "empty image stream",
                ));
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unrecognized image format (want qcow2 or tar)",
                ));
            };
            if flag.load(Ordering::SeqCst) {
                return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "aborted"));
            }
            let hex = hex::encode(hasher.finalize());
            std::fs::rename(&tmp, task_inner.layout.image_blobs().join(&hex))?;
            Ok((format!("sha256:{hex}"), kind.to_owned(), total))
        })();
        match res {
            Ok((digest, image_type, size)) => {
                let mut st = task_inner.st();
                st.images.insert(
                    task_name.clone(),
                    SimImage {
                        name: task_name.clone(),
                        digest,
                        image_type,
                        size,
                    },
                );
                st.save_images(&task_inner.layout)
                    .map_err(|e| io_err("save image index", e))
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(RuntimeError::Other(format!(
                    "cocoon image import {task_name}: {e}"
                )))
            }
        }
    });
    Ok(import_handle(
        sink,
        task,
        aborted,
        format!("cocoon image import {name}"),
    ))
}
