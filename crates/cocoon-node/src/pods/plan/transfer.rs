//! The decisions of the snapshot and image transfers (`node.md` §6.3, §6.6) as pure functions
//! over what their shell ([`crate::pods::transfer`]) read: what a hibernate evidence read
//! means, which way `ensureRunImage` materialises an image, and what
//! `ensureSnapshotBaseImage` has to check. Nothing here does I/O.
//!
//! The rules:
//! * evidence without a registry: a local snapshot named exactly `<vm>` is evidence (with no
//!   recorded image), not found is none, any other inspect error fails closed;
//! * evidence with a registry: the owned `<vm>:hibernate` artifact is evidence with its
//!   recorded base image, its absence is none, a refused or failed read fails closed
//!   (`(refusing fresh boot)`);
//! * `ensureRunImage`: an empty image is "" with no runtime call; without a registry, or for
//!   an http(s) URL, `cocoon image pull`; otherwise the manifest's kind decides: a snapshot is
//!   refused, a cloud image is used from (or imported into) the local `<repo>:<tag>`,
//!   anything else, an unreadable manifest included, falls back to `cocoon image pull`; a
//!   forced call never joins a non-forced one;
//! * `ensureSnapshotBaseImage`: nothing to do without a snapshot or its image; a URL image
//!   is `--pull`ed by cocoon (the host's run image URL allowlist applies); otherwise the
//!   image is looked up by digest, then by name, and only then ensured.

use cocoon_api::contract::oci::ANNOTATION_BASE_IMAGE;
use cocoon_registry::Kind;
use cocoon_runtime::{RuntimeError, SnapshotRecord};

use crate::pods::rules::{Evidence, parse_ref};
use crate::pods::tenant::Refusal;

/// Why the trust gate (`pods::owned`) did not hand out an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The artifact belongs to someone else.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The registry could not be read.
    #[error("{0}")]
    Failed(String),
}

/// A registry artifact the trust gate checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedArtifact {
    /// The manifest digest (`sha256:…`) to pull.
    pub digest: String,
    /// Its manifest annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// `hibernateEvidence(vm)` without a registry client, from the exact-name inspect of `<vm>`.
pub(crate) fn local_evidence<T>(
    vm: &str,
    inspected: &Result<T, RuntimeError>,
) -> Result<Evidence, String> {
    match inspected {
        Ok(_) => Ok(Evidence::Found {
            recorded_image: String::new(),
        }),
        Err(e) if e.is_snapshot_not_found() => Ok(Evidence::None),
        Err(e) => Err(format!("inspect local snapshot {vm}: {e}")),
    }
}

/// `hibernateEvidence(vm)` with a registry client, from the read of the owned
/// `<vm>:hibernate` artifact.
pub(crate) fn registry_evidence(
    vm: &str,
    artifact: Result<Option<OwnedArtifact>, GateError>,
) -> Result<Evidence, String> {
    match artifact {
        Ok(Some(a)) => Ok(Evidence::Found {
            recorded_image: a
                .annotations
                .get(ANNOTATION_BASE_IMAGE)
                .cloned()
                .unwrap_or_default(),
        }),
        Ok(None) => Ok(Evidence::None),
        Err(GateError::Refused(r)) => Err(format!(
            "hibernate evidence for {vm}: {r} (refusing fresh boot)"
        )),
        Err(GateError::Failed(e)) => Err(format!(
            "hibernate evidence for {vm}: get hibernate manifest: {e} (refusing fresh boot)"
        )),
    }
}

/// The single-flight key of `ensureRunImage(image, force)`.
pub(crate) fn run_image_flight(image: &str, force: bool) -> String {
    if force {
        format!("force {image}")
    } else {
        image.to_owned()
    }
}

/// Whether `image` is an http(s) URL (case-insensitive scheme).
pub(crate) fn is_url(image: &str) -> bool {
    let lower = image.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// How `ensureRunImage` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunImage {
    /// An empty image: the ref is "", no runtime call.
    Nothing,
    /// `cocoon image pull [--force] <image>`; the ref is the image unchanged.
    Pull,
    /// Read the manifest of `<repo>:<tag>` and decide by its kind ([`by_kind`]).
    Classify { repo: String, tag: String },
}

/// The start of `ensureRunImage(image, _)`; `registry`: a registry client is configured.
pub(crate) fn run_image(image: &str, registry: bool) -> RunImage {
    if image.is_empty() {
        return RunImage::Nothing;
    }
    if !registry || is_url(image) {
        return RunImage::Pull;
    }
    let (repo, tag) = parse_ref(image);
    RunImage::Classify { repo, tag }
}

/// What the manifest's kind means for a run image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ByKind {
    /// Fail with this error.
    Refuse(String),
    /// A cloud image: boot the local copy `local`, imported first if need be.
    CloudImage { local: String },
    /// `cocoon image pull` (a container image, an index, or an unreadable manifest).
    Pull,
}

/// `kind`: the classified manifest of `<repo>:<tag>`, `None` when it could not be read.
pub(crate) fn by_kind(image: &str, repo: &str, tag: &str, kind: Option<&Kind>) -> ByKind {
    match kind {
        Some(Kind::Snapshot { .. }) => ByKind::Refuse(format!(
            "image {image} is a snapshot artifact; use mode=clone instead of mode=run"
        )),
        Some(Kind::CloudImage) => ByKind::CloudImage {
            local: format!("{repo}:{tag}"),
        },
        _ => ByKind::Pull,
    }
}

/// What the local cloud image's inspect (unless the pull is forced) leaves to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LocalCopy {
    /// Present: boot it.
    Present,
    /// Import the disk layers into it.
    Import,
    /// Fail with this error.
    Fail(String),
}

/// `present`: `cocoon image inspect <local>`, `None` when forced (never inspected).
pub(crate) fn local_copy(local: &str, present: Option<&Result<(), RuntimeError>>) -> LocalCopy {
    match present {
        None => LocalCopy::Import,
        Some(Ok(())) => LocalCopy::Present,
        Some(Err(e)) if e.is_image_not_found() => LocalCopy::Import,
        Some(Err(e)) => LocalCopy::Fail(format!("inspect local image {local}: {e}")),
    }
}

/// What `ensureSnapshotBaseImage(snap)` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BaseImage<'a> {
    /// No snapshot, or it records no image: nothing.
    Nothing,
    /// An http(s) URL, fetched by `vm clone --pull` on the host: the URL allowlist decides.
    Url(&'a str),
    /// Present by this digest (when recorded), or by this name; otherwise
    /// `ensureRunImage(image, false)`.
    Local {
        digest: Option<&'a str>,
        image: &'a str,
    },
}

/// The check of `ensureSnapshotBaseImage(snap)`.
pub(crate) fn base_image(snap: Option<&SnapshotRecord>) -> BaseImage<'_> {
    let Some(s) = snap.filter(|s| !s.image.is_empty()) else {
        return BaseImage::Nothing;
    };
    if is_url(&s.image) {
        return BaseImage::Url(&s.image);
    }
    BaseImage::Local {
        digest: Some(s.image_digest.as_str()).filter(|d| !d.is_empty()),
        image: &s.image,
    }
}
