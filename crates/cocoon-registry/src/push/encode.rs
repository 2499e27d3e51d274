//! The v2 encoding rule (which files are compressed, which chunked) and the zstd encoders:
//! a whole file into a spool file, one chunk into memory.

use std::fs::File;
use std::io::Write as _;
use std::sync::Arc;

use crate::client::{FileBlob, IO_BUF, SpoolProgress};
use crate::config::V2Options;
use crate::error::{Error, Result};
use crate::manifest::Segment;
use crate::reference::Hasher;
use crate::sparse::ExtentReader;

/// Files smaller than this stay raw in v2 (cocoon-common v0.3.0's writer).
pub const MIN_COMPRESS_SIZE: u64 = 1 << 20;

/// How one file goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// One raw layer (every v1 file, and small v2 files).
    Raw,
    /// One layer, one zstd frame.
    Zstd,
    /// Fixed-size chunks, one blob per chunk, each its own zstd frame when `compress`.
    Chunks { compress: bool, chunk: u64 },
}

/// The Go writer's rule: compress files of at least 1 MiB when a level is set; chunk a file
/// when a chunk size is set and the file is compressed or larger than a chunk.
pub fn encoding(size: u64, v2: V2Options) -> Encoding {
    let compress = v2.zstd_level > 0 && size >= MIN_COMPRESS_SIZE;
    if v2.chunk_size > 0 && (compress || size > v2.chunk_size) {
        Encoding::Chunks {
            compress,
            chunk: v2.chunk_size,
        }
    } else if compress {
        Encoding::Zstd
    } else {
        Encoding::Raw
    }
}

/// `len` layer bytes of `src` from layer offset `offset`.
pub(super) fn read_range(src: &FileBlob, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    r.seek(offset);
    let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    let n = r.read_into(&mut buf)?;
    if n != buf.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "file shrank while it was being read",
        ));
    }
    Ok(buf)
}

/// Compresses `len` layer bytes of `src` from layer offset `offset` into one zstd frame with
/// the content size in its header and a content checksum (a chunk: the Go writer's
/// `EncodeAll`), reading them in `IO_BUF` pieces: no chunk-sized buffer of raw bytes (and
/// its page faults) besides the output.
pub(super) fn compress_range(src: &FileBlob, offset: u64, len: u64, level: i32) -> Result<Vec<u8>> {
    let io = |e| Error::io("compressing a chunk", e);
    let bound =
        zstd::zstd_safe::compress_bound(usize::try_from(len).map_err(|_| {
            Error::invalid("chunk size", format!("{len} bytes do not fit in memory"))
        })?);
    let mut enc =
        zstd::stream::write::Encoder::new(Vec::with_capacity(bound), level).map_err(io)?;
    enc.include_checksum(true).map_err(io)?;
    enc.include_contentsize(true).map_err(io)?;
    enc.set_pledged_src_size(Some(len)).map_err(io)?;
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    r.seek(offset);
    let mut buf = vec![0u8; IO_BUF];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(IO_BUF as u64)).unwrap_or(IO_BUF);
        let n = r.read_into(&mut buf[..want]).map_err(io)?;
        if n == 0 {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "file shrank while it was being read",
            )));
        }
        enc.write_all(&buf[..n]).map_err(io)?;
        left -= n as u64;
    }
    enc.finish().map_err(io)
}

/// Compresses a file's layer bytes into one zstd frame (streaming, content checksum, libzstd
/// worker threads) into the unlinked spool file `out`, hashing the output: the encoded layer
/// blob. `progress` follows what is on disk, and carries the digest at the end.
pub(super) fn compress_to_spool(
    src: &FileBlob,
    out: Arc<File>,
    level: i32,
    workers: u32,
    progress: &tokio::sync::watch::Sender<SpoolProgress>,
) -> Result<FileBlob> {
    /// Writes to the spool, hashing and counting what reached the file.
    struct Spool<'a> {
        file: &'a File,
        hasher: Hasher,
        n: u64,
        progress: &'a tokio::sync::watch::Sender<SpoolProgress>,
    }
    impl std::io::Write for Spool<'_> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = self.file.write(b)?;
            self.hasher.update(&b[..n]);
            self.n += n as u64;
            self.progress.send_replace((self.n, None));
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.file.flush()
        }
    }
    let io = |e| Error::io("compressing into the spool file", e);
    let sink = std::io::BufWriter::with_capacity(
        IO_BUF,
        Spool {
            file: &out,
            hasher: Hasher::new(),
            n: 0,
            progress,
        },
    );
    let mut enc = zstd::stream::write::Encoder::new(sink, level).map_err(io)?;
    enc.include_checksum(true).map_err(io)?;
    if workers > 1 {
        enc.multithread(workers).map_err(io)?;
    }
    let mut r = ExtentReader::new(src.file.clone(), src.extents.clone());
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = r.read_into(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        enc.write_all(&buf[..n]).map_err(io)?;
    }
    let sink = enc.finish().map_err(io)?;
    let spool = sink.into_inner().map_err(|e| io(e.into_error()))?;
    let (size, digest) = (spool.n, spool.hasher.finish());
    progress.send_replace((size, Some(digest.clone())));
    Ok(FileBlob {
        file: out.clone(),
        extents: Segment::whole(size),
        size,
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_follows_the_go_writer() {
        const MIB: u64 = 1 << 20;
        let knobs = |zstd_level, chunk_mib: u64| V2Options {
            zstd_level,
            chunk_size: chunk_mib * MIB,
        };
        let chunks = |compress, mib: u64| Encoding::Chunks {
            compress,
            chunk: mib * MIB,
        };
        for (size, v2, want) in [
            // All knobs off: every file raw (v1).
            (6 * MIB, knobs(0, 0), Encoding::Raw),
            // zstd only: files of at least 1 MiB compressed whole.
            (MIB, knobs(3, 0), Encoding::Zstd),
            (MIB - 1, knobs(3, 0), Encoding::Raw),
            (0, knobs(3, 0), Encoding::Raw),
            // zstd and chunks: a compressed file is always chunked, even below a chunk.
            (6 * MIB, knobs(3, 1), chunks(true, 1)),
            (2 * MIB, knobs(3, 64), chunks(true, 64)),
            (MIB - 1, knobs(3, 1), Encoding::Raw),
            // Chunks only: raw chunks for files larger than a chunk.
            (2 * MIB, knobs(0, 1), chunks(false, 1)),
            (MIB, knobs(0, 1), Encoding::Raw),
        ] {
            assert_eq!(encoding(size, v2), want, "{size} {v2:?}");
        }
    }
}
