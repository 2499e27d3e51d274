//! Snapshot push (registry.md §5) from a snapshot directory or an export tar: one layer per
//! file, config blob, manifest; present blobs skipped, bounded parallel transfers and memory.
//!
//! * `source` — the two entry points (a snapshot directory, an export tar) and the closing
//!   config blob and manifest.
//! * `file` — one file as its layer(s): probe, upload, the v2 zstd and chunk paths, the
//!   memory budget.
//! * `encode` — the v2 encoding rule and the zstd encoders (whole file into a spool, one chunk).
//! * `stage` — reading the inputs: directory listing, hole scan and hashing, tar entry
//!   metadata, spooling tar entries to unlinked files.

mod encode;
mod file;
mod source;
mod stage;

use std::sync::Arc;

use crate::client::FileBlob;
use crate::manifest::{PushAnnotations, SnapshotFile};
use crate::reference::Digest;

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

/// Asked right before the manifest put (the only write under the tag): `Err(reason)` withholds
/// it, and the push fails with [`crate::Error::ManifestWithheld`] (the blobs stay, untagged).
pub type ManifestGate = Arc<
    dyn Fn() -> futures::future::BoxFuture<'static, std::result::Result<(), String>> + Send + Sync,
>;

/// Push parameters.
#[derive(Clone, Default)]
pub struct PushOptions {
    /// The tag: `hibernate` or `latest`.
    pub tag: String,
    /// Manifest annotations; `created` defaults to now, `base_image` is the pod image.
    pub annotations: PushAnnotations,
    /// Called for every blob and for the manifest.
    pub observer: Option<PushObserver>,
    /// Checked right before the manifest put.
    pub before_manifest: Option<ManifestGate>,
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
            before_manifest: None,
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

/// A layer of a pushed file, with what its descriptor needs beyond the blob.
struct OutLayer {
    pushed: PushedLayer,
    zstd: bool,
    /// (index, count) of a chunk.
    chunk: Option<(usize, usize)>,
}
