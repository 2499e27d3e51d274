//! OCI manifest, index and snapshot-config shapes, the snapshot manifest builder (registry.md
//! §5.2–§5.4) and classification (§7). Pure: bytes in, values out.

use std::collections::BTreeMap;
use std::fmt;

use cocoon_api::contract::oci;
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};
use crate::reference::Digest;

/// An OCI content descriptor (also an index entry, with `platform`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    #[serde(default)]
    pub digest: String,
    /// Signed so that a negative size in a hostile manifest is seen and rejected.
    #[serde(default)]
    pub size: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(
        rename = "artifactType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

impl Descriptor {
    /// A descriptor of `size` bytes with `digest`.
    pub fn new(media_type: &str, digest: &Digest, size: u64) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: digest.to_string(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
            annotations: BTreeMap::new(),
            artifact_type: None,
            platform: None,
        }
    }

    /// The `org.opencontainers.image.title` annotation.
    pub fn title(&self) -> Option<&str> {
        self.annotations
            .get(oci::ANNOTATION_TITLE)
            .map(String::as_str)
    }
}

/// An index entry's platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An OCI image manifest or index (both parse into this; indexes fill `manifests`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion", default)]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(
        rename = "artifactType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    /// Parses manifest bytes; malformed JSON is a protocol error.
    pub fn parse(bytes: &[u8]) -> Result<Manifest> {
        serde_json::from_slice(bytes).map_err(|e| Error::protocol(format!("parse manifest: {e}")))
    }
}

/// What a manifest stores (registry.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A cocoon snapshot; `version` is 1 or 2 (the wire format).
    Snapshot {
        version: u8,
    },
    CloudImage,
    ContainerImage,
    ImageIndex,
    Unknown,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Snapshot { .. } => "snapshot",
            Kind::CloudImage => "cloud-image",
            Kind::ContainerImage => "container-image",
            Kind::ImageIndex => "image-index",
            Kind::Unknown => "unknown",
        })
    }
}

/// Classifies a manifest in the order of registry.md §7: artifactType, then config media
/// type, then the top-level media type (falling back to the response's `Content-Type`).
pub fn classify(m: &Manifest, content_type: Option<&str>) -> Kind {
    match m.artifact_type.as_deref() {
        Some(oci::ARTIFACT_OS_IMAGE_V1 | oci::ARTIFACT_WINDOWS_IMAGE_V1) => {
            return Kind::CloudImage;
        }
        Some(oci::ARTIFACT_SNAPSHOT_V1) => return Kind::Snapshot { version: 1 },
        Some(oci::ARTIFACT_SNAPSHOT_V2) => return Kind::Snapshot { version: 2 },
        _ => {}
    }
    if let Some(c) = &m.config
        && matches!(
            c.media_type.as_str(),
            oci::MEDIA_OCI_IMAGE_CONFIG | oci::MEDIA_DOCKER_IMAGE_CONFIG
        )
    {
        return Kind::ContainerImage;
    }
    let top = m
        .media_type
        .as_deref()
        .or(content_type.map(|c| c.split(';').next().unwrap_or(c).trim()));
    match top {
        Some(oci::MEDIA_OCI_INDEX | oci::MEDIA_DOCKER_MANIFEST_LIST) => Kind::ImageIndex,
        _ => Kind::Unknown,
    }
}

/// The index child to follow: `linux/amd64`, else the first child with a platform whose
/// architecture is not `unknown` (attestations are `unknown/unknown`).
pub fn pick_index_child(index: &Manifest) -> Result<&Descriptor> {
    let with_platform = || {
        index
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(|p| (d, p)))
    };
    if let Some((d, _)) =
        with_platform().find(|(_, p)| p.os == "linux" && p.architecture == "amd64")
    {
        return Ok(d);
    }
    with_platform()
        .find(|(_, p)| p.architecture != "unknown" && !p.architecture.is_empty())
        .map(|(d, p)| {
            tracing::warn!(os = %p.os, arch = %p.architecture, digest = %d.digest, "image index has no linux/amd64 child; using another platform");
            d
        })
        .ok_or_else(|| Error::protocol("image index has no usable platform child"))
}

/// A data extent of a sparse file (`{"o": offset, "l": length}`, cocoon's PAX map form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    #[serde(rename = "o")]
    pub offset: u64,
    #[serde(rename = "l")]
    pub length: u64,
}

impl Segment {
    /// The extents of a dense file of `size` bytes: one segment, none when it is empty.
    pub fn whole(size: u64) -> Vec<Segment> {
        if size == 0 {
            vec![]
        } else {
            vec![Segment {
                offset: 0,
                length: size,
            }]
        }
    }
}

/// Per-file metadata in the snapshot config (`files[<name>]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mode: i64,
    /// The sparse map exactly as the `COCOON.sparse.map` PAX record carries it (a JSON list
    /// in a string, as the Go pusher writes it); a bare JSON list is accepted on read.
    #[serde(
        rename = "sparseMap",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "sparse_map_text"
    )]
    pub sparse_map: Option<String>,
    /// The logical size of a sparse file (`COCOON.sparse.size`).
    #[serde(rename = "sparseSize", default, skip_serializing_if = "is_zero")]
    pub sparse_size: i64,
    /// Uncompressed size of an encoded (v2) file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// The authoritative chunk order of a chunked (v2) file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn sparse_map_text<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        List(Vec<Segment>),
    }
    Ok(match Option::<Form>::deserialize(d)? {
        None => None,
        Some(Form::Text(t)) if t.is_empty() => None,
        Some(Form::Text(t)) => Some(t),
        Some(Form::List(l)) => Some(serde_json::to_string(&l).map_err(serde::de::Error::custom)?),
    })
}

/// Parses a sparse map's text.
pub fn parse_sparse_map(text: &str) -> Result<Vec<Segment>> {
    serde_json::from_str(text).map_err(|e| Error::invalid("sparseMap", e.to_string()))
}

/// The snapshot config blob (registry.md §5.3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotConfig {
    #[serde(rename = "schemaVersion", default)]
    pub schema_version: String,
    /// The snapshot identity.
    #[serde(rename = "snapshotId", default)]
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(
        rename = "imageDigest",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub image_digest: String,
    #[serde(
        rename = "imageType",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub image_type: String,
    #[serde(
        rename = "imageBlobIds",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub image_blob_ids: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub storage: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nics: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub windows: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, SnapshotFile>,
    #[serde(rename = "createdAt", default)]
    pub created_at: String,
}

/// The snapshot record inside `snapshot.json` (runtime.md §2.2; unknown fields ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub storage: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nics: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub windows: bool,
}

/// `snapshot.json`: `{"version":1,"config":{...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEnvelope {
    #[serde(default)]
    pub version: i64,
    #[serde(default)]
    pub config: SnapshotRecord,
}

impl SnapshotEnvelope {
    /// Parses `snapshot.json` bytes.
    pub fn parse(bytes: &[u8]) -> Result<SnapshotEnvelope> {
        serde_json::from_slice(bytes).map_err(|e| Error::invalid("snapshot.json", e.to_string()))
    }

    /// The bytes written on import: indented JSON ending in a newline (runtime.md §2.3).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// The envelope a pull writes: rebuilt from the registry config, named `local_name`.
    pub fn from_config(cfg: &SnapshotConfig, local_name: &str) -> SnapshotEnvelope {
        SnapshotEnvelope {
            version: 1,
            config: SnapshotRecord {
                id: cfg.snapshot_id.clone(),
                name: local_name.to_string(),
                description: cfg.description.clone(),
                image: cfg.image.clone(),
                image_digest: cfg.image_digest.clone(),
                image_type: cfg.image_type.clone(),
                image_blob_ids: cfg.image_blob_ids.clone(),
                hypervisor: cfg.hypervisor.clone(),
                cpu: cfg.cpu,
                memory: cfg.memory,
                storage: cfg.storage,
                nics: cfg.nics,
                network: cfg.network.clone(),
                windows: cfg.windows,
            },
        }
    }
}

/// The config blob a push uploads, from the exported record and the per-file metadata.
pub fn snapshot_config(
    record: &SnapshotRecord,
    files: BTreeMap<String, SnapshotFile>,
    created_at: &str,
) -> SnapshotConfig {
    SnapshotConfig {
        schema_version: "v1".into(),
        snapshot_id: record.id.clone(),
        description: record.description.clone(),
        image: record.image.clone(),
        image_digest: record.image_digest.clone(),
        image_type: record.image_type.clone(),
        image_blob_ids: record.image_blob_ids.clone(),
        hypervisor: record.hypervisor.clone(),
        cpu: record.cpu,
        memory: record.memory,
        storage: record.storage,
        nics: record.nics,
        network: record.network.clone(),
        windows: record.windows,
        files,
        created_at: created_at.to_string(),
    }
}

/// A layer descriptor for snapshot file `name` (media type by name, title annotation).
pub fn snapshot_layer(name: &str, digest: &Digest, size: u64) -> Descriptor {
    let mut d = Descriptor::new(oci::layer_media_type(name), digest, size);
    d.annotations
        .insert(oci::ANNOTATION_TITLE.to_string(), name.to_string());
    d
}

/// A layer descriptor of a v2 file: the name's media type with `+zstd` when compressed, and
/// for one chunk of a chunked file its `cocoonstack.chunk.index`/`count` (decimal strings).
pub fn snapshot_layer_v2(
    name: &str,
    digest: &Digest,
    size: u64,
    zstd: bool,
    chunk: Option<(usize, usize)>,
) -> Descriptor {
    let mut d = snapshot_layer(name, digest, size);
    if zstd {
        d.media_type.push_str(oci::ZSTD_SUFFIX);
    }
    if let Some((index, count)) = chunk {
        d.annotations
            .insert(oci::ANNOTATION_CHUNK_INDEX.to_string(), index.to_string());
        d.annotations
            .insert(oci::ANNOTATION_CHUNK_COUNT.to_string(), count.to_string());
    }
    d
}

/// Manifest annotations of a push (registry.md §5.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushAnnotations {
    /// `org.opencontainers.image.created`, RFC3339 UTC.
    pub created: String,
    /// `cocoonstack.snapshot.baseimage`; written only when non-empty.
    pub base_image: String,
    /// `org.opencontainers.image.source` (optional).
    pub source: String,
    /// `org.opencontainers.image.revision` (optional).
    pub revision: String,
    /// `cocoonstack.snapshot.from-node` (optional).
    pub from_node: String,
    /// Caller annotations, passed through (the keys above win).
    pub extra: BTreeMap<String, String>,
}

impl PushAnnotations {
    fn into_map(self) -> BTreeMap<String, String> {
        let mut m = self.extra;
        let mut put = |k: &str, v: String| {
            if !v.is_empty() {
                m.insert(k.to_string(), v);
            }
        };
        put(oci::ANNOTATION_CREATED, self.created);
        put(oci::ANNOTATION_BASE_IMAGE, self.base_image);
        put(oci::ANNOTATION_SOURCE, self.source);
        put(oci::ANNOTATION_REVISION, self.revision);
        put(oci::ANNOTATION_FROM_NODE, self.from_node);
        m
    }
}

/// The snapshot manifest bytes (registry.md §5.2), pretty-printed; the digest is over them.
pub fn build_snapshot_manifest(
    config: Descriptor,
    layers: Vec<Descriptor>,
    annotations: PushAnnotations,
) -> Vec<u8> {
    build_snapshot_manifest_as(oci::ARTIFACT_SNAPSHOT_V1, config, layers, annotations)
}

/// [`build_snapshot_manifest`] with the artifact type of the wire format (v1 or v2).
pub fn build_snapshot_manifest_as(
    artifact_type: &str,
    config: Descriptor,
    layers: Vec<Descriptor>,
    annotations: PushAnnotations,
) -> Vec<u8> {
    let m = Manifest {
        schema_version: 2,
        media_type: Some(oci::MEDIA_OCI_MANIFEST.to_string()),
        artifact_type: Some(artifact_type.to_string()),
        config: Some(config),
        layers,
        manifests: Vec::new(),
        subject: None,
        annotations: annotations.into_map(),
    };
    // Serializing plain strings and integers cannot fail.
    serde_json::to_vec_pretty(&m).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(mt: &str) -> Descriptor {
        Descriptor::new(mt, &Digest::of(b"x"), 1)
    }

    fn manifest(artifact: Option<&str>, config: Option<&str>, top: Option<&str>) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: top.map(str::to_string),
            artifact_type: artifact.map(str::to_string),
            config: config.map(desc),
            layers: vec![],
            manifests: vec![],
            subject: None,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn classification_follows_registry_md_section_7() {
        let cases = [
            (
                Some(oci::ARTIFACT_OS_IMAGE_V1),
                None,
                None,
                Kind::CloudImage,
            ),
            (
                Some(oci::ARTIFACT_WINDOWS_IMAGE_V1),
                None,
                None,
                Kind::CloudImage,
            ),
            (
                Some(oci::ARTIFACT_SNAPSHOT_V1),
                Some(oci::MEDIA_SNAPSHOT_CONFIG_V1),
                None,
                Kind::Snapshot { version: 1 },
            ),
            (
                Some(oci::ARTIFACT_SNAPSHOT_V2),
                None,
                None,
                Kind::Snapshot { version: 2 },
            ),
            // artifactType wins over a container config.
            (
                Some(oci::ARTIFACT_SNAPSHOT_V1),
                Some(oci::MEDIA_OCI_IMAGE_CONFIG),
                None,
                Kind::Snapshot { version: 1 },
            ),
            (
                None,
                Some(oci::MEDIA_OCI_IMAGE_CONFIG),
                None,
                Kind::ContainerImage,
            ),
            (
                None,
                Some(oci::MEDIA_DOCKER_IMAGE_CONFIG),
                None,
                Kind::ContainerImage,
            ),
            (None, None, Some(oci::MEDIA_OCI_INDEX), Kind::ImageIndex),
            (
                None,
                None,
                Some(oci::MEDIA_DOCKER_MANIFEST_LIST),
                Kind::ImageIndex,
            ),
            (
                Some("application/x-other"),
                Some("application/x-cfg"),
                None,
                Kind::Unknown,
            ),
            (None, None, None, Kind::Unknown),
        ];
        for (a, c, t, want) in cases {
            assert_eq!(
                classify(&manifest(a, c, t), None),
                want,
                "{a:?} {c:?} {t:?}"
            );
        }
        // An index without mediaType is recognised by its Content-Type.
        assert_eq!(
            classify(
                &manifest(None, None, None),
                Some("application/vnd.oci.image.index.v1+json; charset=utf-8")
            ),
            Kind::ImageIndex
        );
        assert!(Manifest::parse(b"{not json").is_err());
    }

    #[test]
    fn index_child_prefers_linux_amd64_then_any_known_platform() {
        let child = |arch: &str, os: &str, d: &str| Descriptor {
            platform: Some(Platform {
                architecture: arch.into(),
                os: os.into(),
                variant: None,
            }),
            ..Descriptor::new(oci::MEDIA_OCI_MANIFEST, &Digest::of(d.as_bytes()), 1)
        };
        let mut idx = manifest(None, None, Some(oci::MEDIA_OCI_INDEX));
        idx.manifests = vec![
            child("unknown", "unknown", "att"),
            child("arm64", "linux", "arm"),
            child("amd64", "linux", "amd"),
        ];
        assert_eq!(
            pick_index_child(&idx).map(|d| d.digest.clone()).ok(),
            Some(Digest::of(b"amd").to_string())
        );
        idx.manifests.pop();
        assert_eq!(
            pick_index_child(&idx).map(|d| d.digest.clone()).ok(),
            Some(Digest::of(b"arm").to_string())
        );
        idx.manifests.pop();
        assert!(pick_index_child(&idx).is_err());
    }

    #[test]
    fn snapshot_manifest_has_the_layout_of_section_5_2() {
        let cfg = Descriptor::new(oci::MEDIA_SNAPSHOT_CONFIG_V1, &Digest::of(b"cfg"), 3);
        let layers = vec![
            snapshot_layer("config.json", &Digest::of(b"a"), 1),
            snapshot_layer("overlay.qcow2", &Digest::of(b"b"), 1),
        ];
        let bytes = build_snapshot_manifest(
            cfg,
            layers,
            PushAnnotations {
                created: "2026-08-12T10:00:00Z".into(),
                base_image: "ghcr.io/cocoonstack/cocoon/ubuntu:24.04".into(),
                ..Default::default()
            },
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["schemaVersion"], 2);
        assert_eq!(v["mediaType"], oci::MEDIA_OCI_MANIFEST);
        assert_eq!(v["artifactType"], oci::ARTIFACT_SNAPSHOT_V1);
        assert_eq!(v["config"]["mediaType"], oci::MEDIA_SNAPSHOT_CONFIG_V1);
        assert_eq!(v["config"]["size"], 3);
        assert_eq!(v["layers"][0]["mediaType"], oci::MEDIA_VM_CONFIG);
        assert_eq!(
            v["layers"][0]["annotations"][oci::ANNOTATION_TITLE],
            "config.json"
        );
        assert_eq!(v["layers"][1]["mediaType"], oci::MEDIA_DISK_QCOW2);
        assert_eq!(
            v["annotations"][oci::ANNOTATION_CREATED],
            "2026-08-12T10:00:00Z"
        );
        assert_eq!(
            v["annotations"][oci::ANNOTATION_BASE_IMAGE],
            "ghcr.io/cocoonstack/cocoon/ubuntu:24.04"
        );
        // An empty base image is left out, not written empty.
        let bytes = build_snapshot_manifest(
            Descriptor::new(oci::MEDIA_SNAPSHOT_CONFIG_V1, &Digest::of(b"c"), 1),
            vec![],
            PushAnnotations {
                created: "t".into(),
                ..Default::default()
            },
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert!(v["annotations"].get(oci::ANNOTATION_BASE_IMAGE).is_none());
    }

    #[test]
    fn sparse_map_is_written_as_text_and_read_in_either_form() {
        let f = SnapshotFile {
            mode: 0o640,
            sparse_map: Some(r#"[{"o":0,"l":4096}]"#.into()),
            sparse_size: 1 << 20,
            ..Default::default()
        };
        let v = serde_json::to_value(&f).expect("json");
        assert_eq!(v["sparseMap"], r#"[{"o":0,"l":4096}]"#);
        assert_eq!(v["mode"], 0o640);
        let back: SnapshotFile = serde_json::from_value(v).expect("back");
        assert_eq!(back, f);
        let list: SnapshotFile =
            serde_json::from_str(r#"{"sparseMap":[{"o":0,"l":4096}],"sparseSize":1048576}"#)
                .expect("list form");
        assert_eq!(list.sparse_map.as_deref(), Some(r#"[{"o":0,"l":4096}]"#));
    }

    #[test]
    fn envelope_round_trips_through_the_config_blob() {
        let env = SnapshotEnvelope::parse(
            br#"{"version":1,"config":{"id":"sid-1","name":"vm-a","image":"img","image_digest":"sha256:00",
                "image_type":"cloudimg","image_blob_ids":{"ab":{}},"hypervisor":"cloud-hypervisor",
                "cpu":2,"memory":1073741824,"storage":10737418240,"nics":1,"network":"n","windows":true,
                "queue_size":512}}"#,
        )
        .expect("parse");
        let cfg = snapshot_config(&env.config, BTreeMap::new(), "2026-01-01T00:00:00Z");
        let v = serde_json::to_value(&cfg).expect("json");
        assert_eq!(v["snapshotId"], "sid-1");
        assert_eq!(v["imageBlobIds"]["ab"], serde_json::json!({}));
        assert_eq!(v["imageType"], "cloudimg");
        let back = SnapshotEnvelope::from_config(&cfg, "vm-a-hibernate-import");
        assert_eq!(back.config.name, "vm-a-hibernate-import");
        assert_eq!(
            SnapshotRecord {
                name: "vm-a".into(),
                ..back.config.clone()
            },
            env.config
        );
        assert!(back.to_bytes().ends_with(b"}\n"));
    }
}
