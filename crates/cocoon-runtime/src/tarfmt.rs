//! The snapshot export tar of §2.3: the `snapshot.json` envelope first, then the flat files of
//! the snapshot directory, sparse files as data extents with `COCOON.sparse.*` PAX records.
//!
//! Synchronous (`std::io`) on purpose: the simulator runs it on a blocking thread bridged to
//! the async pipe, which keeps the format code free of async plumbing.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};

use super::types::SnapshotRecord;

/// Name of the first entry.
pub const ENVELOPE_NAME: &str = "snapshot.json";
/// Envelope `version`.
pub const ENVELOPE_VERSION: i64 = 1;
/// PAX key: JSON list of `{"o": offset, "l": length}` data extents.
pub const PAX_SPARSE_MAP: &str = "COCOON.sparse.map";
/// PAX key: logical file size (decimal).
pub const PAX_SPARSE_SIZE: &str = "COCOON.sparse.size";
/// Zero-detection granularity for sparse extents.
pub const SPARSE_BLOCK: u64 = 4096;
/// Above this map size the file is stored in full, keeping the PAX block well under 1 MiB.
const MAX_SPARSE_MAP_JSON: usize = 800 * 1024;
/// Mode for files whose header carries none.
const DEFAULT_MODE: u32 = 0o640;

/// `snapshot.json`: `{"config": <record minus created_at>, "version": 1}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The snapshot record without `created_at`.
    pub config: SnapshotRecord,
    /// Always 1.
    pub version: i64,
}

/// One data extent of a sparse file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// Offset in the logical file.
    #[serde(rename = "o")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(rename = "l")]
    pub length: u64,
}

/// The envelope bytes: indented JSON ending in a newline, `created_at` dropped.
pub fn envelope_bytes(record: &SnapshotRecord) -> io::Result<Vec<u8>> {
    let mut config = record.clone();
    config.created_at = None;
    let mut out = serde_json::to_vec_pretty(&Envelope {
        config,
        version: ENVELOPE_VERSION,
    })
    .map_err(io::Error::other)?;
    out.push(b'\n');
    Ok(out)
}

/// Reads and validates an envelope.
pub fn parse_envelope(bytes: &[u8]) -> io::Result<Envelope> {
    let env: Envelope = serde_json::from_slice(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("decode snapshot.json: {e}"),
        )
    })?;
    if env.version != ENVELOPE_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot.json: unsupported version {}", env.version),
        ));
    }
    Ok(env)
}

static ZERO_BLOCK: [u8; SPARSE_BLOCK as usize] = [0; SPARSE_BLOCK as usize];

/// Data extents of `file` (length `size`) at [`SPARSE_BLOCK`] granularity: runs of non-zero
/// blocks, coalesced. Zero detection instead of SEEK_DATA keeps it filesystem-independent.
pub fn data_extents(file: &mut File, size: u64) -> io::Result<Vec<Extent>> {
    file.seek(SeekFrom::Start(0))?;
    let mut extents: Vec<Extent> = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < size {
        let want = usize::try_from((size - offset).min(buf.len() as u64)).unwrap_or(buf.len());
        file.read_exact(&mut buf[..want])?;
        for (i, block) in buf[..want].chunks(SPARSE_BLOCK as usize).enumerate() {
            // Compared with a zero block (`memcmp`): a byte-by-byte test showed up as a
            // quarter of a node agent's CPU when snapshotting mostly-empty disks.
            if block == &ZERO_BLOCK[..block.len()] {
                continue;
            }
            let at = offset + i as u64 * SPARSE_BLOCK;
            let len = block.len() as u64;
            match extents.last_mut() {
                Some(last) if last.offset + last.length == at => last.length += len,
                _ => extents.push(Extent {
                    offset: at,
                    length: len,
                }),
            }
        }
        offset += want as u64;
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(extents)
}

fn header(name: &str, size: u64, mode: u32, mtime: u64) -> io::Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    Ok(h)
}

/// Reads exactly the listed extents of a file, in order (the data of a sparse entry).
struct ExtentReader<'a> {
    file: &'a mut File,
    extents: std::slice::Iter<'a, Extent>,
    left: u64,
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            match self.extents.next() {
                Some(e) => {
                    self.file.seek(SeekFrom::Start(e.offset))?;
                    self.left = e.length;
                }
                None => return Ok(0),
            }
        }
        let want = usize::try_from(self.left.min(buf.len() as u64)).unwrap_or(buf.len());
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while exporting",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Appends one file, as a sparse entry when it has holes (and the map stays small), else in
/// full.
fn append_file(b: &mut tar::Builder<impl Write>, path: &Path, name: &str) -> io::Result<()> {
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    let size = meta.len();
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        meta.permissions().mode() & 0o777
    };
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    if size > 0 {
        let extents = data_extents(&mut file, size)?;
        let data: u64 = extents.iter().map(|e| e.length).sum();
        let map = serde_json::to_string(&extents).map_err(io::Error::other)?;
        if data < size && map.len() <= MAX_SPARSE_MAP_JSON {
            let logical = size.to_string();
            b.append_pax_extensions([
                (PAX_SPARSE_MAP, map.as_bytes()),
                (PAX_SPARSE_SIZE, logical.as_bytes()),
            ])?;
            let h = header(name, data, mode, mtime)?;
            let reader = ExtentReader {
                file: &mut file,
                extents: extents.iter(),
                left: 0,
            };
            return b.append(&h, reader);
        }
    }
    let h = header(name, size, mode, mtime)?;
    b.append(&h, &mut file)
}

/// Writes the §2.3 tar of `dir` to `out`: the envelope of `record`, then every regular file of
/// `dir` in name order (a `snapshot.json` inside `dir` is not repeated).
pub fn write_snapshot_tar(out: impl Write, record: &SnapshotRecord, dir: &Path) -> io::Result<()> {
    let mut b = tar::Builder::new(out);
    let env = envelope_bytes(record)?;
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    b.append(
        &header(ENVELOPE_NAME, env.len() as u64, 0o644, now)?,
        env.as_slice(),
    )?;
    let mut files: Vec<_> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != ENVELOPE_NAME)
        .collect();
    files.sort();
    for name in files {
        append_file(&mut b, &dir.join(&name), &name)?;
    }
    b.into_inner()?.flush()
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The file name an entry may be extracted as: its last path component, never `.`/`..`.
fn flat_name(entry_path: &Path) -> Option<String> {
    let name = entry_path.file_name()?.to_str()?;
    (name != "." && name != "..").then(|| name.to_owned())
}

/// Restores a sparse entry: a file of the logical size with each extent written in place.
fn extract_sparse(
    entry: &mut impl Read,
    path: &Path,
    mode: u32,
    map: &[u8],
    size: &[u8],
    data_len: u64,
) -> io::Result<()> {
    let extents: Vec<Extent> = serde_json::from_slice(map)
        .map_err(|e| invalid(format!("decode {PAX_SPARSE_MAP}: {e}")))?;
    let logical: u64 = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| invalid(format!("bad {PAX_SPARSE_SIZE}")))?;
    let total: u64 = extents.iter().map(|e| e.length).sum();
    if total != data_len
        || extents
            .iter()
            .any(|e| e.offset.saturating_add(e.length) > logical)
    {
        return Err(invalid(format!(
            "sparse map of {} does not match its data",
            path.display()
        )));
    }
    let mut file = create_file(path, mode)?;
    file.set_len(logical)?;
    for e in &extents {
        file.seek(SeekFrom::Start(e.offset))?;
        let copied = io::copy(&mut entry.take(e.length), &mut file)?;
        if copied != e.length {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated sparse data",
            ));
        }
    }
    file.sync_all()
}

fn create_file(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
}

/// Reads a §2.3 tar (raw or gzip) from `input`, extracting the files flat into `dest` and
/// returning the envelope. The first entry must be `snapshot.json`.
pub fn read_snapshot_tar(input: impl Read, dest: &Path) -> io::Result<Envelope> {
    let mut buffered = BufReader::new(input);
    let gz = buffered.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gz {
        Box::new(GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut archive = tar::Archive::new(reader);
    let mut envelope: Option<Envelope> = None;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let name = flat_name(&path);
        if envelope.is_none() {
            if name.as_deref() != Some(ENVELOPE_NAME) {
                return Err(invalid(format!(
                    "first tar entry is {}, want {ENVELOPE_NAME}",
                    path.display()
                )));
            }
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            envelope = Some(parse_envelope(&bytes)?);
            continue;
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let Some(name) = name.filter(|n| n != ENVELOPE_NAME) else {
            continue;
        };
        let mode = entry
            .header()
            .mode()
            .map(|m| m & 0o777)
            .unwrap_or(DEFAULT_MODE);
        let mode = if mode == 0 { DEFAULT_MODE } else { mode };
        let data_len = entry.size();
        let mut sparse: (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
        if let Some(exts) = entry.pax_extensions()? {
            for ext in exts {
                let ext = ext?;
                match ext.key() {
                    Ok(PAX_SPARSE_MAP) => sparse.0 = Some(ext.value_bytes().to_vec()),
                    Ok(PAX_SPARSE_SIZE) => sparse.1 = Some(ext.value_bytes().to_vec()),
                    _ => {}
                }
            }
        }
        let out = dest.join(&name);
        match sparse {
            (Some(map), Some(size)) => {
                extract_sparse(&mut entry, &out, mode, &map, &size, data_len)?
            }
            (Some(_), None) => {
                return Err(invalid(format!(
                    "{name}: {PAX_SPARSE_MAP} without {PAX_SPARSE_SIZE}"
                )));
            }
            _ => {
                let mut file = create_file(&out, mode)?;
                io::copy(&mut entry, &mut file)?;
                file.sync_all()?;
            }
        }
    }
    envelope.ok_or_else(|| invalid(format!("empty tar: no {ENVELOPE_NAME}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::IdSet;

    fn record() -> SnapshotRecord {
        SnapshotRecord {
            id: "sid-1".into(),
            name: "vk-a".into(),
            cpu: 2,
            memory: 1 << 30,
            image: "ubuntu:24.04".into(),
            image_type: "oci".into(),
            image_blob_ids: IdSet::from_iter(["ab"]),
            hypervisor: "cloud-hypervisor".into(),
            nics: 1,
            created_at: Some(chrono::Utc::now()),
            ..SnapshotRecord::default()
        }
    }

    fn write_sparse(path: &Path, size: u64, data: &[(u64, &[u8])]) {
        let mut f = File::create(path).expect("create");
        f.set_len(size).expect("len");
        for (at, bytes) in data {
            f.seek(SeekFrom::Start(*at)).expect("seek");
            f.write_all(bytes).expect("write");
        }
    }

    #[test]
    fn envelope_is_indented_first_and_drops_created_at() {
        let bytes = envelope_bytes(&record()).expect("env");
        let text = String::from_utf8(bytes.clone()).expect("utf8");
        assert!(text.ends_with("}\n"));
        assert!(text.contains("\n  \"config\": {"), "{text}");
        assert!(!text.contains("created_at"));
        let env = parse_envelope(&bytes).expect("parse");
        assert_eq!(env.version, 1);
        assert_eq!(env.config.id, "sid-1");
        assert!(parse_envelope(br#"{"config":{},"version":2}"#).is_err());
    }

    #[test]
    fn extents_coalesce_nonzero_blocks() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        write_sparse(
            &p,
            64 * 1024 + 100,
            &[(0, b"a"), (4096, b"b"), (40_000, b"c"), (65_600, b"d")],
        );
        let mut f = File::open(&p).expect("open");
        let ex = data_extents(&mut f, 64 * 1024 + 100).expect("extents");
        assert_eq!(
            ex,
            vec![
                Extent {
                    offset: 0,
                    length: 8192
                },
                Extent {
                    offset: 36_864,
                    length: 4096
                },
                // The last block is partial: the extent ends at the file end.
                Extent {
                    offset: 65_536,
                    length: 100
                },
            ]
        );
    }

    #[test]
    fn round_trip_keeps_bytes_holes_and_order() {
        let src = tempfile::tempdir().expect("tmp");
        std::fs::write(src.path().join("config.json"), b"{\"cpu\":2}").expect("w");
        std::fs::write(src.path().join("state.json"), b"{}").expect("w");
        write_sparse(
            &src.path().join("cow.raw"),
            1 << 20,
            &[(0, b"head"), (900_000, b"tail")],
        );
        std::fs::write(src.path().join("memory-ranges"), vec![7u8; 10_000]).expect("w");

        let mut tar_bytes = Vec::new();
        write_snapshot_tar(&mut tar_bytes, &record(), src.path()).expect("write");

        // Entry order and the sparse PAX records, read back with the tar crate directly.
        let mut archive = tar::Archive::new(tar_bytes.as_slice());
        let mut names = Vec::new();
        for e in archive.entries().expect("entries") {
            let mut e = e.expect("entry");
            let name = e.path().expect("path").display().to_string();
            if name == "cow.raw" {
                assert_eq!(e.size(), 8192, "only data blocks are stored");
                let pax: Vec<(String, String)> = e
                    .pax_extensions()
                    .expect("pax")
                    .expect("has pax")
                    .map(|x| {
                        let x = x.expect("ext");
                        (
                            x.key().expect("k").to_owned(),
                            x.value().expect("v").to_owned(),
                        )
                    })
                    .collect();
                assert!(pax.contains(&(PAX_SPARSE_SIZE.to_owned(), "1048576".to_owned())));
                assert!(pax.contains(&(
                    PAX_SPARSE_MAP.to_owned(),
                    r#"[{"o":0,"l":4096},{"o":897024,"l":4096}]"#.to_owned()
                )));
            }
            if name == "memory-ranges" {
                assert!(
                    e.pax_extensions().expect("pax").is_none(),
                    "dense file stays plain"
                );
            }
            let mut sink = Vec::new();
            e.read_to_end(&mut sink).expect("read");
            names.push(name);
        }
        assert_eq!(
            names,
            [
                "snapshot.json",
                "config.json",
                "cow.raw",
                "memory-ranges",
                "state.json"
            ]
        );

        let dst = tempfile::tempdir().expect("tmp");
        let env = read_snapshot_tar(tar_bytes.as_slice(), dst.path()).expect("read");
        assert_eq!(env.config.id, "sid-1");
        for f in ["config.json", "state.json", "cow.raw", "memory-ranges"] {
            assert_eq!(
                std::fs::read(src.path().join(f)).expect("src"),
                std::fs::read(dst.path().join(f)).expect("dst"),
                "{f}"
            );
        }
    }

    #[test]
    fn gzip_input_is_accepted() {
        let src = tempfile::tempdir().expect("tmp");
        std::fs::write(src.path().join("config.json"), b"{}").expect("w");
        let mut tar_bytes = Vec::new();
        write_snapshot_tar(&mut tar_bytes, &record(), src.path()).expect("write");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar_bytes).expect("gz");
        let gz = gz.finish().expect("gz");
        let dst = tempfile::tempdir().expect("tmp");
        read_snapshot_tar(gz.as_slice(), dst.path()).expect("read gzip");
        assert_eq!(
            std::fs::read(dst.path().join("config.json")).expect("r"),
            b"{}"
        );
    }

    #[test]
    fn first_entry_must_be_the_envelope_and_paths_are_flattened() {
        let mut b = tar::Builder::new(Vec::new());
        let data = b"x";
        b.append(&header("config.json", 1, 0o644, 0).expect("h"), &data[..])
            .expect("a");
        let bytes = b.into_inner().expect("tar");
        let dst = tempfile::tempdir().expect("tmp");
        let err = read_snapshot_tar(bytes.as_slice(), dst.path()).expect_err("no envelope");
        assert!(err.to_string().contains("want snapshot.json"), "{err}");

        let mut b = tar::Builder::new(Vec::new());
        let env = envelope_bytes(&record()).expect("env");
        b.append(
            &header("snapshot.json", env.len() as u64, 0o644, 0).expect("h"),
            env.as_slice(),
        )
        .expect("a");
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // A nested path lands flat inside dest, never outside it.
        b.append_data(&mut h, "sub/dir/evil.raw", &data[..])
            .expect("a");
        let bytes = b.into_inner().expect("tar");
        read_snapshot_tar(bytes.as_slice(), dst.path()).expect("read");
        assert_eq!(
            std::fs::read(dst.path().join("evil.raw")).expect("flat"),
            b"x"
        );

        assert!(
            read_snapshot_tar(&[][..], dst.path()).is_err(),
            "empty input"
        );
    }
}
