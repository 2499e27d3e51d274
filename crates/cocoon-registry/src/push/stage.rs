//! Reading a push's inputs: the files of a snapshot directory (hole scan, hashing), the
//! metadata of export tar entries, and spooling tar entries to unlinked files.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::Staged;
use super::encode::{Encoding, encoding};
use crate::client::{FileBlob, IO_BUF};
use crate::config::V2Options;
use crate::error::{Error, Result};
use crate::manifest::{SnapshotFile, parse_sparse_map};
use crate::reference::{Digest, Hasher};
use crate::sparse::{ExtentReader, Layout, layout_of};
use crate::tar::{PAX_SPARSE_MAP, PAX_SPARSE_SIZE, TarReader};
use crate::validate::{SNAPSHOT_JSON, check_file_name, check_segments};

/// Regular files of a snapshot directory except `snapshot.json`, by name.
pub(super) fn list_snapshot_files(dir: &Path) -> Result<Vec<String>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let ft = entry
            .file_type()
            .map_err(|e| Error::io(format!("stat {}", entry.path().display()), e))?;
        if !ft.is_file() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            return Err(Error::invalid(
                "snapshot directory",
                format!("non-UTF-8 file name in {}", dir.display()),
            ));
        };
        if name == SNAPSHOT_JSON {
            continue;
        }
        check_file_name(&name).map_err(|r| Error::invalid("snapshot directory", r))?;
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// Opens a file, decides its layout and hashes its layer bytes (on a blocking thread).
/// A file the v2 knobs encode is not hashed raw (its layers are the encoded bytes); its
/// `digest` is then the empty blob's and never used.
pub(super) async fn stage_file(name: String, path: PathBuf, v2: V2Options) -> Result<Staged> {
    tokio::task::spawn_blocking(move || {
        let ctx = |what: &str| format!("{what} {}", path.display());
        let file = File::open(&path).map_err(|e| Error::io(ctx("opening"), e))?;
        let mode = {
            use std::os::unix::fs::PermissionsExt as _;
            file.metadata()
                .map_err(|e| Error::io(ctx("stat"), e))?
                .permissions()
                .mode()
                & 0o7777
        };
        let layout = layout_of(&file).map_err(|e| Error::io(ctx("scanning holes in"), e))?;
        let file = Arc::new(file);
        let digest = if encoding(layout.packed_size(), v2) == Encoding::Raw {
            hash_extents(&file, &layout).map_err(|e| Error::io(ctx("reading"), e))?
        } else {
            Digest::of(b"")
        };
        let meta = SnapshotFile {
            mode: i64::from(mode),
            sparse_map: layout.map_text(),
            sparse_size: if layout.sparse.is_some() {
                layout.size as i64
            } else {
                0
            },
            ..Default::default()
        };
        Ok(Staged {
            name,
            meta,
            blob: FileBlob {
                file,
                extents: layout.extents(),
                size: layout.packed_size(),
                digest,
            },
        })
    })
    .await
    .map_err(|e| Error::io("hashing task", std::io::Error::other(e.to_string())))?
}

fn hash_extents(file: &Arc<File>, layout: &Layout) -> std::io::Result<Digest> {
    let mut r = ExtentReader::new(file.clone(), layout.extents());
    let mut h = Hasher::new();
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = r.read_into(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finish())
}

/// The config entry of a tar entry: its mode and, for a sparse entry, the map and size,
/// checked against the entry's data size.
pub(super) fn entry_meta(
    name: &str,
    mode: u32,
    size: u64,
    pax: &BTreeMap<String, String>,
) -> Result<SnapshotFile> {
    let mut meta = SnapshotFile {
        mode: i64::from(mode),
        ..Default::default()
    };
    if let Some(map) = pax.get(PAX_SPARSE_MAP) {
        let field = format!("{name}: {PAX_SPARSE_SIZE}");
        let logical: u64 = pax
            .get(PAX_SPARSE_SIZE)
            .ok_or_else(|| Error::invalid(&field, "missing for a sparse entry"))?
            .parse()
            .map_err(|_| Error::invalid(&field, "not a number"))?;
        let segments = parse_sparse_map(map).map_err(|e| e.context(name))?;
        check_segments(&segments, logical, size)
            .map_err(|r| Error::invalid(format!("{name}: {PAX_SPARSE_MAP}"), r))?;
        meta.sparse_map = Some(map.clone());
        meta.sparse_size =
            i64::try_from(logical).map_err(|_| Error::invalid(&field, "too large"))?;
    }
    Ok(meta)
}

/// Copies the current tar entry (`size` bytes) into an unlinked temporary file in `dir`
/// while hashing it; the file is written by a blocking thread fed through a small channel.
pub(super) async fn spool_entry<R: AsyncRead + Unpin>(
    reader: &mut TarReader<R>,
    dir: &Path,
    size: u64,
) -> Result<(File, Digest)> {
    let file = create_unlinked(dir)?;
    let writer = file
        .try_clone()
        .map_err(|e| Error::io("cloning spool file handle", e))?;
    let (tx, mut rx) = mpsc::channel::<Bytes>(2);
    let worker = tokio::task::spawn_blocking(move || -> std::io::Result<Digest> {
        let mut w = std::io::BufWriter::with_capacity(IO_BUF, writer);
        let mut h = Hasher::new();
        while let Some(b) = rx.blocking_recv() {
            h.update(&b);
            w.write_all(&b)?;
        }
        w.flush()?;
        Ok(h.finish())
    });
    let mut left = size;
    let feed = async {
        while left > 0 {
            let mut buf =
                bytes::BytesMut::zeroed(IO_BUF.min(usize::try_from(left).unwrap_or(IO_BUF)));
            let mut filled = 0;
            while filled < buf.len() {
                let n = reader
                    .read_body(&mut buf[filled..])
                    .await
                    .map_err(|e| Error::io("reading the export stream", e))?;
                if n == 0 {
                    return Err(Error::io(
                        "reading the export stream",
                        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "entry ended early"),
                    ));
                }
                filled += n;
            }
            left -= filled as u64;
            buf.truncate(filled);
            if tx.send(buf.freeze()).await.is_err() {
                break; // the writer failed; its error is reported below
            }
        }
        Ok(())
    };
    let fed = feed.await;
    drop(tx);
    let digest = worker
        .await
        .map_err(|e| Error::io("spool task", std::io::Error::other(e.to_string())))?
        .map_err(|e| Error::io(format!("writing spool file in {}", dir.display()), e))?;
    fed?;
    Ok((file, digest))
}

/// A read-write file in `dir` whose name is removed at once: its space is freed when the last
/// handle closes, even if the process dies.
pub(super) fn create_unlinked(dir: &Path) -> Result<File> {
    use std::hash::{BuildHasher, RandomState};
    for _ in 0..16 {
        let n = RandomState::new().hash_one(std::time::SystemTime::now());
        let p = dir.join(format!(".cocoon-spool-{}-{n:016x}", std::process::id()));
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                std::fs::remove_file(&p)
                    .map_err(|e| Error::io(format!("unlinking {}", p.display()), e))?;
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Error::io(
                    format!("creating a spool file in {}", dir.display()),
                    e,
                ));
            }
        }
    }
    Err(Error::io(
        format!("creating a spool file in {}", dir.display()),
        std::io::Error::other("no free name"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_entries_carry_their_map_into_the_config() {
        let mut pax = BTreeMap::new();
        pax.insert(
            PAX_SPARSE_MAP.to_string(),
            r#"[{"o":0,"l":4096},{"o":65536,"l":4096}]"#.to_string(),
        );
        pax.insert(PAX_SPARSE_SIZE.to_string(), "1048576".to_string());
        let m = entry_meta("cow.raw", 0o600, 8192, &pax).expect("meta");
        assert_eq!(m.mode, 0o600);
        assert_eq!(m.sparse_size, 1 << 20);
        assert!(m.sparse_map.is_some());
        // The map must account for exactly the entry's bytes.
        assert!(entry_meta("cow.raw", 0o600, 4096, &pax).is_err());
        pax.remove(PAX_SPARSE_SIZE);
        assert!(entry_meta("cow.raw", 0o600, 8192, &pax).is_err());
        let plain = entry_meta("config.json", 0o644, 10, &BTreeMap::new()).expect("meta");
        assert_eq!(plain.sparse_map, None);
    }
}
