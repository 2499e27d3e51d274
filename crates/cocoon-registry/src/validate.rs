//! Pull-side validation (registry.md §6 steps 3–4): the config descriptor, then every layer
//! against the config, all before a byte is written; the result is the list of files to write.

use std::collections::BTreeSet;

use cocoon_api::contract::oci;

use crate::error::{Error, Result};
use crate::manifest::{Descriptor, Manifest, Segment, SnapshotConfig, parse_sparse_map};
use crate::reference::Digest;

/// Largest config blob a pull accepts (registry.md §6.3).
pub const MAX_CONFIG_SIZE: u64 = 64 << 20;
/// Mode of a pulled file whose config entry has none.
pub const DEFAULT_FILE_MODE: u32 = 0o640;
/// Name of the envelope entry; never a layer.
pub const SNAPSHOT_JSON: &str = "snapshot.json";

/// Media types a snapshot layer may have (registry.md §5.4).
const SNAPSHOT_LAYER_TYPES: [&str; 7] = [
    oci::MEDIA_VM_CONFIG,
    oci::MEDIA_VM_STATE,
    oci::MEDIA_VM_MEMORY,
    oci::MEDIA_VM_CIDATA,
    oci::MEDIA_DISK_QCOW2,
    oci::MEDIA_DISK_RAW,
    oci::MEDIA_OCTET_STREAM,
];

/// One file of a validated snapshot, in layer order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFile {
    /// The file name (the layer title).
    pub name: String,
    /// Permission bits.
    pub mode: u32,
    /// The layer's digest.
    pub digest: Digest,
    /// The layer's size: the bytes on the wire (only the data extents for a sparse file).
    pub size: u64,
    /// Sparse restore data, when the file was pushed sparse.
    pub sparse: Option<SparseInfo>,
}

/// How a sparse file's packed layer maps back onto the logical file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseInfo {
    /// The `COCOON.sparse.map` text, passed through unchanged into an import tar.
    pub map_text: String,
    /// The data extents, in order.
    pub segments: Vec<Segment>,
    /// The logical file size.
    pub logical_size: u64,
}

impl PullFile {
    /// The file's size on disk after restore.
    pub fn logical_size(&self) -> u64 {
        self.sparse.as_ref().map_or(self.size, |s| s.logical_size)
    }
}

/// Checks the config descriptor of a snapshot manifest; returns its size.
pub fn check_config_descriptor(m: &Manifest) -> Result<(Digest, u64)> {
    let Some(c) = &m.config else {
        return Err(Error::protocol("snapshot manifest has no config"));
    };
    if c.media_type != oci::MEDIA_SNAPSHOT_CONFIG_V1 {
        return Err(Error::protocol(format!(
            "unexpected config media type {:?}",
            c.media_type
        )));
    }
    let size = u64::try_from(c.size)
        .map_err(|_| Error::protocol(format!("negative config size {}", c.size)))?;
    if size > MAX_CONFIG_SIZE {
        return Err(Error::protocol(format!(
            "config blob too large: {size} > {MAX_CONFIG_SIZE}"
        )));
    }
    let digest =
        Digest::parse(&c.digest).map_err(|e| Error::protocol(format!("config digest: {e}")))?;
    Ok((digest, size))
}

/// Validates every layer of a snapshot manifest of wire `version` against its config and
/// returns the files to write, in layer order.
pub fn plan_snapshot(m: &Manifest, version: u8, cfg: &SnapshotConfig) -> Result<Vec<PullFile>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(m.layers.len());
    for (i, layer) in m.layers.iter().enumerate() {
        let field = |what: &str| format!("layers[{i}].{what}");
        let size = u64::try_from(layer.size).map_err(|_| {
            Error::protocol(format!(
                "{}: negative layer size {}",
                field("size"),
                layer.size
            ))
        })?;
        let (base_type, zstd) = match layer.media_type.strip_suffix(oci::ZSTD_SUFFIX) {
            Some(b) => (b, true),
            None => (layer.media_type.as_str(), false),
        };
        if !SNAPSHOT_LAYER_TYPES.contains(&base_type) {
            return Err(Error::protocol(format!(
                "{}: unknown layer media type {:?}",
                field("mediaType"),
                layer.media_type
            )));
        }
        if zstd && version < 2 {
            return Err(Error::protocol(format!(
                "{}: zstd layer in a v1 manifest",
                field("mediaType")
            )));
        }
        let chunked = is_chunk_layer(layer);
        if chunked && version < 2 {
            return Err(Error::protocol(format!(
                "{}: chunked file in a v1 manifest",
                field("annotations")
            )));
        }
        let name = layer.title().ok_or_else(|| {
            Error::protocol(format!("{}: layer has no title", field("annotations")))
        })?;
        check_file_name(name).map_err(|r| Error::protocol(format!("{}: {r}", field("title"))))?;
        let meta = cfg.files.get(name).cloned().unwrap_or_default();
        if !meta.chunks.is_empty() && version < 2 {
            return Err(Error::protocol(format!(
                "files[{name}].chunks: chunked file in a v1 manifest"
            )));
        }
        if (zstd || chunked || !meta.chunks.is_empty()) && meta.size.is_none() {
            return Err(Error::protocol(format!(
                "files[{name}].size: encoded file lacks its uncompressed size"
            )));
        }
        if zstd || chunked || !meta.chunks.is_empty() {
            // The v2 encodings (zstd, chunking) are recognised and validated above, but this
            // client does not decode them; refuse before anything is written.
            return Err(Error::protocol(format!(
                "{}: v2 encoded layers (zstd or chunked) are not supported by this client",
                field("mediaType")
            )));
        }
        if !seen.insert(name.to_string()) {
            return Err(Error::protocol(format!(
                "{}: duplicate file {name:?}",
                field("title")
            )));
        }
        let digest = Digest::parse(&layer.digest)
            .map_err(|e| Error::protocol(format!("{}: {e}", field("digest"))))?;
        let mode = match meta.mode {
            0 => DEFAULT_FILE_MODE,
            m if (1..=0o7777).contains(&m) => m as u32,
            m => {
                return Err(Error::protocol(format!(
                    "files[{name}].mode: invalid mode {m}"
                )));
            }
        };
        let sparse = match meta.sparse_map {
            None => None,
            Some(text) => Some(check_sparse(name, &text, meta.sparse_size, size)?),
        };
        out.push(PullFile {
            name: name.to_string(),
            mode,
            digest,
            size,
            sparse,
        });
    }
    Ok(out)
}

fn is_chunk_layer(d: &Descriptor) -> bool {
    d.annotations.contains_key(oci::ANNOTATION_CHUNK_INDEX)
        || d.annotations.contains_key(oci::ANNOTATION_CHUNK_COUNT)
}

/// A snapshot file name must be a plain name: it becomes a path inside the target directory.
pub fn check_file_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("invalid file name {name:?}"));
    }
    if name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "file name {name:?} must not contain a path separator"
        ));
    }
    if name == SNAPSHOT_JSON {
        return Err(format!("{SNAPSHOT_JSON} cannot be a layer"));
    }
    if name.len() > 255 {
        return Err(format!("file name {name:?} is longer than 255 bytes"));
    }
    Ok(())
}

/// The sparse map must describe `packed` bytes as ordered, disjoint extents inside the
/// logical size.
fn check_sparse(name: &str, text: &str, sparse_size: i64, packed: u64) -> Result<SparseInfo> {
    let field = format!("files[{name}].sparseMap");
    let logical = u64::try_from(sparse_size)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            Error::protocol(format!("{field}: sparse map without a positive sparseSize"))
        })?;
    let segments = parse_sparse_map(text).map_err(|e| Error::protocol(format!("{field}: {e}")))?;
    check_segments(&segments, logical, packed)
        .map_err(|r| Error::protocol(format!("{field}: {r}")))?;
    Ok(SparseInfo {
        map_text: text.to_string(),
        segments,
        logical_size: logical,
    })
}

/// Extents are ordered and disjoint, end inside `logical`, and their lengths sum to `packed`.
pub fn check_segments(
    segments: &[Segment],
    logical: u64,
    packed: u64,
) -> std::result::Result<(), String> {
    let mut end = 0u64;
    let mut total = 0u64;
    for s in segments {
        if s.offset < end {
            return Err(format!(
                "extent at {} overlaps or is out of order",
                s.offset
            ));
        }
        end = s
            .offset
            .checked_add(s.length)
            .filter(|e| *e <= logical)
            .ok_or_else(|| {
                format!(
                    "extent at {} runs past the logical size {logical}",
                    s.offset
                )
            })?;
        total = total.saturating_add(s.length);
    }
    if total != packed {
        return Err(format!(
            "extents hold {total} bytes but the layer has {packed}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{SnapshotFile, snapshot_layer};
    use std::collections::BTreeMap;

    fn snapshot(layers: Vec<Descriptor>) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: Some(oci::MEDIA_OCI_MANIFEST.into()),
            artifact_type: Some(oci::ARTIFACT_SNAPSHOT_V1.into()),
            config: Some(Descriptor::new(
                oci::MEDIA_SNAPSHOT_CONFIG_V1,
                &Digest::of(b"cfg"),
                10,
            )),
            layers,
            manifests: vec![],
            subject: None,
            annotations: BTreeMap::new(),
        }
    }

    fn layer(name: &str, size: u64) -> Descriptor {
        snapshot_layer(name, &Digest::of(name.as_bytes()), size)
    }

    fn cfg(files: &[(&str, SnapshotFile)]) -> SnapshotConfig {
        SnapshotConfig {
            files: files
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        }
    }

    fn err(m: &Manifest, version: u8, c: &SnapshotConfig) -> String {
        plan_snapshot(m, version, c)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_valid_snapshot_plans_files_in_layer_order_with_modes() {
        let m = snapshot(vec![
            layer("config.json", 10),
            layer("memory-ranges", 4096),
            layer("cow.raw", 8192),
        ]);
        let c = cfg(&[
            (
                "config.json",
                SnapshotFile {
                    mode: 0o644,
                    ..Default::default()
                },
            ),
            (
                "cow.raw",
                SnapshotFile {
                    sparse_map: Some(r#"[{"o":0,"l":4096},{"o":1048576,"l":4096}]"#.into()),
                    sparse_size: 4 << 20,
                    ..Default::default()
                },
            ),
        ]);
        let plan = plan_snapshot(&m, 1, &c).expect("plan");
        let names: Vec<_> = plan.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "memory-ranges", "cow.raw"]);
        assert_eq!(plan[0].mode, 0o644);
        assert_eq!(plan[1].mode, DEFAULT_FILE_MODE);
        assert_eq!(plan[2].logical_size(), 4 << 20);
        assert_eq!(plan[2].sparse.as_ref().map(|s| s.segments.len()), Some(2));
    }

    #[test]
    fn rejections_of_section_6_step_4() {
        let c = cfg(&[]);
        let mut unknown = layer("x", 1);
        unknown.media_type = "application/x-evil".into();
        assert!(err(&snapshot(vec![unknown]), 1, &c).contains("unknown layer media type"));

        let mut zstd = layer("memory-ranges", 1);
        zstd.media_type = format!("{}+zstd", oci::MEDIA_VM_MEMORY);
        assert!(err(&snapshot(vec![zstd.clone()]), 1, &c).contains("zstd layer in a v1 manifest"));

        let mut chunk = layer("memory-ranges", 1);
        chunk
            .annotations
            .insert(oci::ANNOTATION_CHUNK_INDEX.into(), "0".into());
        assert!(
            err(&snapshot(vec![chunk.clone()]), 1, &c).contains("chunked file in a v1 manifest")
        );

        let chunks_in_cfg = cfg(&[(
            "memory-ranges",
            SnapshotFile {
                chunks: vec!["sha256:00".into()],
                size: Some(1),
                ..Default::default()
            },
        )]);
        assert!(
            err(
                &snapshot(vec![layer("memory-ranges", 1)]),
                1,
                &chunks_in_cfg
            )
            .contains("chunked file in a v1 manifest")
        );

        assert!(err(&snapshot(vec![zstd]), 2, &c).contains("lacks its uncompressed size"));
        assert!(err(&snapshot(vec![chunk]), 2, &c).contains("lacks its uncompressed size"));

        let mut negative = layer("config.json", 1);
        negative.size = -5;
        assert!(err(&snapshot(vec![negative]), 1, &c).contains("negative layer size"));
    }

    #[test]
    fn titles_must_be_plain_unique_names() {
        let c = cfg(&[]);
        for bad in ["../etc/passwd", "a/b", "..", "", "snapshot.json"] {
            let mut l = layer("config.json", 1);
            l.annotations
                .insert(oci::ANNOTATION_TITLE.into(), bad.into());
            assert!(plan_snapshot(&snapshot(vec![l]), 1, &c).is_err(), "{bad:?}");
        }
        let mut untitled = layer("config.json", 1);
        untitled.annotations.clear();
        assert!(err(&snapshot(vec![untitled]), 1, &c).contains("no title"));
        let dup = snapshot(vec![layer("a", 1), layer("a", 1)]);
        assert!(err(&dup, 1, &c).contains("duplicate file"));
    }

    #[test]
    fn sparse_maps_must_cover_the_layer_exactly() {
        let file = |map: &str, size: i64| {
            cfg(&[(
                "cow.raw",
                SnapshotFile {
                    sparse_map: Some(map.into()),
                    sparse_size: size,
                    ..Default::default()
                },
            )])
        };
        let m = snapshot(vec![layer("cow.raw", 8)]);
        assert!(plan_snapshot(&m, 1, &file(r#"[{"o":0,"l":4},{"o":10,"l":4}]"#, 20)).is_ok());
        assert!(err(&m, 1, &file(r#"[{"o":0,"l":4}]"#, 20)).contains("extents hold 4 bytes"));
        assert!(
            err(&m, 1, &file(r#"[{"o":10,"l":4},{"o":0,"l":4}]"#, 20)).contains("out of order")
        );
        assert!(
            err(&m, 1, &file(r#"[{"o":0,"l":4},{"o":18,"l":4}]"#, 20))
                .contains("past the logical size")
        );
        assert!(err(&m, 1, &file(r#"[{"o":0,"l":8}]"#, 0)).contains("sparseSize"));
        assert!(err(&m, 1, &file("not json", 20)).contains("sparseMap"));
    }

    #[test]
    fn config_descriptor_checks() {
        let mut m = snapshot(vec![]);
        assert!(check_config_descriptor(&m).is_ok());
        if let Some(c) = m.config.as_mut() {
            c.size = (MAX_CONFIG_SIZE + 1) as i64;
        }
        let e = check_config_descriptor(&m)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("config blob too large"), "{e}");
        if let Some(c) = m.config.as_mut() {
            c.size = 2 << 20; // over 1 MiB is fine
        }
        assert!(check_config_descriptor(&m).is_ok());
        if let Some(c) = m.config.as_mut() {
            c.media_type = oci::MEDIA_OCI_IMAGE_CONFIG.into();
        }
        assert!(check_config_descriptor(&m).is_err());
    }
}
