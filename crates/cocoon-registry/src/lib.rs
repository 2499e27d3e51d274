//! OCI registry client and VM snapshot artifact push/pull for cocoon (registry.md): the
//! operator probes, reads and deletes tags; the node agent pushes and pulls snapshots.
//!
//! * [`RegistryClient`] — manifest probe/get/put, delete by digest behind a probe, tag lists,
//!   blob probe, verified blob streams, chunked uploads; typed [`Error`]s with
//!   [`Error::class`] and [`Error::is_transient`]; retries with backoff for transient errors.
//! * [`RegistryConfig`] — `OCI_REGISTRY` (host plus path prefix), plain HTTP for loopback,
//!   `http://` or `OCI_REGISTRY_INSECURE`, credentials from the environment and the Docker
//!   config, timeouts and transfer tuning.
//! * Snapshots — [`RegistryClient::push_snapshot_dir`], [`RegistryClient::push_snapshot_tar`],
//!   [`RegistryClient::pull_snapshot_to_dir`], [`RegistryClient::pull_snapshot_to_tar`]:
//!   the v1 artifact of registry.md §5 (byte for byte when every v2 knob is 0) and the v2
//!   format of §5.5 (zstd layers, chunked files, parallel transfers within the memory and
//!   pull budgets, at most two v2 pulls per process), streamed in bounded memory, holes kept.
//!
//! No process-wide TLS provider is needed: the client passes rustls' `ring` provider
//! explicitly.

pub mod auth;
#[cfg(test)]
mod auth_tests;
mod client;
pub mod codec;
pub mod config;
mod error;
mod http;
pub mod manifest;
pub mod paging;
mod pull;
mod push;
pub mod reference;
pub mod retry;
pub mod sparse;
pub mod tar;
pub mod validate;

pub use auth::{CredentialSource, Credentials};
pub use client::{
    BlobStream, CheckedDelete, DeleteOutcome, FetchedManifest, ManifestHead, RegistryClient,
    SnapshotInfo, Verifier,
};
pub use config::{RegistryConfig, V2Options};
pub use error::{Error, ErrorClass, Result, ResultExt};
pub use manifest::{Kind, Manifest, PushAnnotations, SnapshotConfig, classify};
pub use paging::{ListLimits, PageWalk};
pub use pull::{PullReport, SnapshotPlan, cloud_image_disk_layers, wire_format};
pub use push::{ManifestGate, PushEvent, PushObserver, PushOptions, PushReport, PushedLayer};
pub use reference::{Digest, ImageRef, Reference, RegistryBase};
pub use retry::RetryPolicy;
pub use validate::{PullBlob, PullFile};
