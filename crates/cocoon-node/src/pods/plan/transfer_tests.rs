//! Table tests of what the transfers' reads mean, row by row as `node.md` §6.3
//! (`hibernateEvidence`) and §6.6 (`ensureRunImage`, `ensureSnapshotBaseImage`) state it.

use cocoon_registry::Kind;
use cocoon_runtime::{RuntimeError, SnapshotRecord};

use super::transfer::{
    BaseImage, ByKind, GateError, LocalCopy, OwnedArtifact, RunImage, base_image, by_kind,
    local_copy, local_evidence, registry_evidence, run_image, run_image_flight,
};
use crate::pods::rules::Evidence;
use crate::pods::tenant::Refusal;

/// A row: the rule, what was read, what it means.
type Row<R, W> = (&'static str, R, W);

/// What a hibernate evidence read means.
type Means = Result<Evidence, String>;

/// The read of the owned `<vm>:hibernate` artifact.
type ArtifactRead = Result<Option<OwnedArtifact>, GateError>;

fn found(image: &str) -> Means {
    Ok(Evidence::Found {
        recorded_image: image.into(),
    })
}

fn artifact(base_image: Option<&str>) -> OwnedArtifact {
    OwnedArtifact {
        digest: "sha256:abc".into(),
        annotations: base_image
            .map(|b| ("cocoonstack.snapshot.baseimage".to_owned(), b.to_owned()))
            .into_iter()
            .collect(),
    }
}

#[test]
fn evidence_without_a_registry() {
    let rows: [Row<Result<(), RuntimeError>, Means>; 3] = [
        ("a local snapshot named <vm> → evidence", Ok(()), found("")),
        (
            "not found → no evidence",
            Err(RuntimeError::SnapshotNotFound("snapshot not found".into())),
            Ok(Evidence::None),
        ),
        (
            "any other inspect error → fails closed",
            Err(RuntimeError::Other("permission denied".into())),
            Err("inspect local snapshot vk-a: permission denied".into()),
        ),
    ];
    for (rule, inspected, want) in rows {
        assert_eq!(local_evidence("vk-a", &inspected), want, "{rule}");
    }
}

#[test]
fn evidence_with_a_registry() {
    let refusal = Refusal::HeldByOther { vm: "vk-a".into() };
    let rows: [Row<ArtifactRead, Means>; 5] = [
        (
            "the tag exists → evidence with its recorded base image",
            Ok(Some(artifact(Some("img:1")))),
            found("img:1"),
        ),
        (
            "the tag records no base image → evidence without one",
            Ok(Some(artifact(None))),
            found(""),
        ),
        (
            "a typed not-found → no evidence",
            Ok(None),
            Ok(Evidence::None),
        ),
        (
            "any other read error → fails closed",
            Err(GateError::Failed("503 Service Unavailable".into())),
            Err(
                "hibernate evidence for vk-a: get hibernate manifest: 503 Service Unavailable \
                 (refusing fresh boot)"
                    .into(),
            ),
        ),
        (
            "an artifact of another owner → fails closed",
            Err(GateError::Refused(refusal.clone())),
            Err(format!(
                "hibernate evidence for vk-a: {refusal} (refusing fresh boot)"
            )),
        ),
    ];
    for (rule, read, want) in rows {
        assert_eq!(registry_evidence("vk-a", read), want, "{rule}");
    }
}

#[test]
fn run_image_table() {
    let classify = |repo: &str, tag: &str| RunImage::Classify {
        repo: repo.into(),
        tag: tag.into(),
    };
    let rows = [
        (
            "an empty image → \"\" with no runtime call",
            "",
            true,
            RunImage::Nothing,
        ),
        (
            "no registry client → image pull",
            "ubuntu:24.04",
            false,
            RunImage::Pull,
        ),
        (
            "an http URL → image pull",
            "http://x/disk.img",
            true,
            RunImage::Pull,
        ),
        (
            "an HTTPS URL, any case → image pull",
            "HTTPS://x/disk.img",
            true,
            RunImage::Pull,
        ),
        (
            "a registry ref → classify its manifest",
            "ubuntu:24.04",
            true,
            classify("ubuntu", "24.04"),
        ),
        (
            "no tag → latest",
            "ubuntu",
            true,
            classify("ubuntu", "latest"),
        ),
    ];
    for (rule, image, registry, want) in rows {
        assert_eq!(run_image(image, registry), want, "{rule}");
    }
    assert_eq!(run_image_flight("ubuntu", false), "ubuntu");
    assert_eq!(
        run_image_flight("ubuntu", true),
        "force ubuntu",
        "a forced call never joins a non-forced flight"
    );
}

#[test]
fn run_image_by_kind_table() {
    let rows = [
        (
            "a snapshot → refused",
            Some(Kind::Snapshot { version: 2 }),
            ByKind::Refuse(
                "image ubuntu:24.04 is a snapshot artifact; use mode=clone instead of mode=run"
                    .into(),
            ),
        ),
        (
            "a cloud image → the local <repo>:<tag>",
            Some(Kind::CloudImage),
            ByKind::CloudImage {
                local: "ubuntu:24.04".into(),
            },
        ),
        (
            "a container image → image pull",
            Some(Kind::ContainerImage),
            ByKind::Pull,
        ),
        (
            "an index → image pull",
            Some(Kind::ImageIndex),
            ByKind::Pull,
        ),
        (
            "unclassifiable → image pull",
            Some(Kind::Unknown),
            ByKind::Pull,
        ),
        (
            "the manifest could not be read → image pull",
            None,
            ByKind::Pull,
        ),
    ];
    for (rule, kind, want) in rows {
        assert_eq!(
            by_kind("ubuntu:24.04", "ubuntu", "24.04", kind.as_ref()),
            want,
            "{rule}"
        );
    }
    let rows: [Row<Option<Result<(), RuntimeError>>, LocalCopy>; 4] = [
        ("forced → import, never inspected", None, LocalCopy::Import),
        ("present → boot it", Some(Ok(())), LocalCopy::Present),
        (
            "not found in any backend → import",
            Some(Err(RuntimeError::ImageNotFound(
                "not found in any backend".into(),
            ))),
            LocalCopy::Import,
        ),
        (
            "any other inspect error → fail",
            Some(Err(RuntimeError::Other("disk full".into()))),
            LocalCopy::Fail("inspect local image ubuntu:24.04: disk full".into()),
        ),
    ];
    for (rule, present, want) in rows {
        assert_eq!(local_copy("ubuntu:24.04", present.as_ref()), want, "{rule}");
    }
}

#[test]
fn snapshot_base_image_table() {
    let snap = |image: &str, digest: &str| SnapshotRecord {
        image: image.into(),
        image_digest: digest.into(),
        ..SnapshotRecord::default()
    };
    let (none, url, both, named) = (
        snap("", "sha256:1"),
        snap("https://x/disk.img", ""),
        snap("ubuntu:24.04", "sha256:1"),
        snap("ubuntu:24.04", ""),
    );
    let rows = [
        ("no snapshot → nothing", None, BaseImage::Nothing),
        (
            "no image recorded → nothing",
            Some(&none),
            BaseImage::Nothing,
        ),
        (
            "a URL → the allowlist decides",
            Some(&url),
            BaseImage::Url("https://x/disk.img"),
        ),
        (
            "by digest first, then by name",
            Some(&both),
            BaseImage::Local {
                digest: Some("sha256:1"),
                image: "ubuntu:24.04",
            },
        ),
        (
            "no digest → by name only",
            Some(&named),
            BaseImage::Local {
                digest: None,
                image: "ubuntu:24.04",
            },
        ),
    ];
    for (rule, s, want) in rows {
        assert_eq!(base_image(s), want, "{rule}");
    }
}
