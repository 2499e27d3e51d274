//! Pull-side validation (registry.md §6 steps 3–4): the config descriptor, then every layer
//! against the config, all before a byte is written; the result is the list of files to write.

use std::collections::BTreeMap;

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
    /// The first blob's digest (the only blob of a v1 file).
    pub digest: Digest,
    /// The file's data size: the bytes of the tar entry (only the data extents for a sparse
    /// file), uncompressed.
    pub size: u64,
    /// The blobs whose (decoded) concatenation is the data, in order: one for an unchunked
    /// file, `files[].chunks` order for a chunked one.
    pub blobs: Vec<PullBlob>,
    /// Sparse restore data, when the file was pushed sparse.
    pub sparse: Option<SparseInfo>,
}

/// One blob of a file: a whole layer, or one chunk of a chunked (v2) file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullBlob {
    pub digest: Digest,
    /// Bytes on the wire.
    pub size: u64,
    /// A zstd stream (`+zstd` media type) to decode.
    pub zstd: bool,
}

impl PullFile {
    /// The file's size on disk after restore.
    pub fn logical_size(&self) -> u64 {
        self.sparse.as_ref().map_or(self.size, |s| s.logical_size)
    }

    /// The file's data extents: its sparse map, or the whole file.
    pub fn extents(&self) -> Vec<Segment> {
        self.sparse
            .as_ref()
            .map_or_else(|| Segment::whole(self.size), |s| s.segments.clone())
    }

    /// Stored as written: one raw blob, no chunks, no compression (every v1 file).
    pub fn is_plain(&self) -> bool {
        self.blobs.len() == 1 && !self.blobs[0].zstd
    }

    /// Bytes on the wire.
    pub fn wire_size(&self) -> u64 {
        self.blobs.iter().map(|b| b.size).sum()
    }
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
/// returns the files to write, in first-appearance order of their titles. The rules are
/// cocoon-common v0.3.0's: `+zstd` layers and chunks only in v2; a chunked file is the
/// concatenation of `files[].chunks` (the authoritative order; the chunk annotations are
/// hints); `files[].size` is the uncompressed size and must hold.
pub fn plan_snapshot(m: &Manifest, version: u8, cfg: &SnapshotConfig) -> Result<Vec<PullFile>> {
    // Layers grouped by title, in first-appearance order.
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<(usize, PullBlob, bool)>> = BTreeMap::new();
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
        let digest = Digest::parse(&layer.digest)
            .map_err(|e| Error::protocol(format!("{}: {e}", field("digest"))))?;
        if !groups.contains_key(name) {
            order.push(name.to_string());
        }
        groups.entry(name.to_string()).or_default().push((
            i,
            PullBlob { digest, size, zstd },
            chunked,
        ));
    }
    let mut out = Vec::with_capacity(order.len());
    for name in order {
        let layers = groups.remove(&name).unwrap_or_default();
        let meta = cfg.files.get(&name).cloned().unwrap_or_default();
        let first = layers.first().map_or(0, |l| l.0);
        let field = |what: &str| format!("layers[{first}].{what}");
        if !meta.chunks.is_empty() && version < 2 {
            return Err(Error::protocol(format!(
                "files[{name}].chunks: chunked file in a v1 manifest"
            )));
        }
        let encoded =
            !meta.chunks.is_empty() || layers.iter().any(|(_, b, chunked)| b.zstd || *chunked);
        if encoded && meta.size.is_none() {
            return Err(Error::protocol(format!(
                "files[{name}].size: encoded file lacks its uncompressed size"
            )));
        }
        let blobs: Vec<PullBlob> = if meta.chunks.is_empty() {
            if layers.len() != 1 {
                return Err(Error::protocol(format!(
                    "{}: duplicate file {name:?}",
                    field("title")
                )));
            }
            layers.into_iter().map(|l| l.1).collect()
        } else {
            if meta.chunks.len() != layers.len() {
                return Err(Error::protocol(format!(
                    "files[{name}].chunks: lists {} chunks but the manifest has {} layers titled {name:?}",
                    meta.chunks.len(),
                    layers.len()
                )));
            }
            let mut blobs = Vec::with_capacity(meta.chunks.len());
            for (k, c) in meta.chunks.iter().enumerate() {
                let d = Digest::parse(c)
                    .map_err(|e| Error::protocol(format!("files[{name}].chunks[{k}]: {e}")))?;
                let b = layers
                    .iter()
                    .find(|(_, b, _)| b.digest == d)
                    .map(|(_, b, _)| b.clone())
                    .ok_or_else(|| {
                        Error::protocol(format!(
                            "files[{name}].chunks[{k}]: {d} is not a layer titled {name:?}"
                        ))
                    })?;
                blobs.push(b);
            }
            blobs
        };
        let wire: u64 = blobs.iter().map(|b| b.size).sum();
        let size = match meta.size {
            None => wire,
            Some(s) => {
                let s = u64::try_from(s).map_err(|_| {
                    Error::protocol(format!("files[{name}].size: negative size {s}"))
                })?;
                if !encoded && s != wire {
                    return Err(Error::protocol(format!(
                        "files[{name}].size: {s} but the layer has {wire} bytes"
                    )));
                }
                s
            }
        };
        let mode = match meta.mode {
            0 => DEFAULT_FILE_MODE,
            // Permission bits only: a pulled file is never setuid, setgid or sticky.
            m if (1..=0o7777).contains(&m) => file_mode(m as u32),
            m => {
                return Err(Error::protocol(format!(
                    "files[{name}].mode: invalid mode {m}"
                )));
            }
        };
        let sparse = match meta.sparse_map {
            None => None,
            Some(text) => Some(check_sparse(&name, &text, meta.sparse_size, size)?),
        };
        out.push(PullFile {
            digest: blobs[0].digest.clone(),
            name,
            mode,
            size,
            blobs,
            sparse,
        });
    }
    Ok(out)
}

/// The permission bits a pulled file gets: `mode & 0o777`, or [`DEFAULT_FILE_MODE`] when
/// nothing is left (a config claiming only setuid/setgid/sticky bits).
pub fn file_mode(mode: u32) -> u32 {
    match mode & 0o777 {
        0 => DEFAULT_FILE_MODE,
        m => m,
    }
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
    fn pulled_modes_keep_only_permission_bits() {
        let with_mode = |mode: i64| {
            cfg(&[(
                "memory-ranges",
                SnapshotFile {
                    mode,
                    ..Default::default()
                },
            )])
        };
        let m = snapshot(vec![layer("memory-ranges", 1)]);
        let planned = |mode| {
            plan_snapshot(&m, 1, &with_mode(mode))
                .map(|p| p[0].mode)
                .ok()
        };
        assert_eq!(planned(0o600), Some(0o600));
        // setuid, setgid and sticky are dropped; the permission bits stay.
        assert_eq!(planned(0o4755), Some(0o755));
        assert_eq!(planned(0o2750), Some(0o750));
        assert_eq!(planned(0o1777), Some(0o777));
        assert_eq!(planned(0o7777), Some(0o777));
        // Nothing but special bits: the default mode, not 0.
        assert_eq!(planned(0o6000), Some(DEFAULT_FILE_MODE));
        assert_eq!(planned(0), Some(DEFAULT_FILE_MODE));
        assert!(plan_snapshot(&m, 1, &with_mode(0o10000)).is_err());
        assert!(plan_snapshot(&m, 1, &with_mode(-1)).is_err());
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
