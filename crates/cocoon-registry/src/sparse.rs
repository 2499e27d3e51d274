//! Sparse files: finding data extents with `SEEK_DATA`/`SEEK_HOLE` (push), reading a file's
//! layer bytes extent by extent, and writing a layer back with its holes (pull).
//!
//! Wire decision (as cocoon's export tar does it): a file with holes travels as its data
//! extents only, packed back to back; `files[].sparseMap`/`sparseSize` in the config say where
//! they go. The layer digest is over those packed bytes. Pull writes each extent at its
//! offset and also leaves all-zero 4 KiB blocks of dense files as holes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use bytes::{Bytes, BytesMut};

use crate::manifest::Segment;

/// Zero blocks are detected at this granularity (the usual filesystem block).
pub const BLOCK: usize = 4096;
/// A sparse map longer than this (JSON bytes) is not used; the file travels dense. Matches
/// cocoon's limit, which keeps the map inside tar's PAX header limits.
pub const MAX_SPARSE_MAP_JSON: usize = 800 * 1024;

/// How a file's bytes become a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The logical size.
    pub size: u64,
    /// The data extents, when the file travels sparse; `None` for a dense file.
    pub sparse: Option<Vec<Segment>>,
}

impl Layout {
    /// A dense layout of `size` bytes.
    pub fn dense(size: u64) -> Layout {
        Layout { size, sparse: None }
    }

    /// The extents the layer bytes come from (the whole file when dense).
    pub fn extents(&self) -> Vec<Segment> {
        match &self.sparse {
            Some(s) => s.clone(),
            None if self.size == 0 => Vec::new(),
            None => vec![Segment {
                offset: 0,
                length: self.size,
            }],
        }
    }

    /// The layer size: the sum of the data extents.
    pub fn packed_size(&self) -> u64 {
        match &self.sparse {
            Some(s) => s.iter().map(|s| s.length).sum(),
            None => self.size,
        }
    }

    /// The `COCOON.sparse.map` text of a sparse layout.
    pub fn map_text(&self) -> Option<String> {
        self.sparse
            .as_ref()
            .map(|s| serde_json::to_string(s).unwrap_or_default())
    }
}

/// Decides how `file` travels: sparse when it has holes and the filesystem reports them,
/// dense otherwise (empty, no holes, no `SEEK_HOLE` support, or an oversized map).
pub fn layout_of(file: &File) -> io::Result<Layout> {
    let size = file.metadata()?.len();
    if size == 0 {
        return Ok(Layout::dense(0));
    }
    let Some(segments) = data_segments(file, size)? else {
        return Ok(Layout::dense(size));
    };
    let data: u64 = segments.iter().map(|s| s.length).sum();
    if data == size {
        return Ok(Layout::dense(size));
    }
    let json_len = serde_json::to_string(&segments)
        .map(|s| s.len())
        .unwrap_or(usize::MAX);
    if json_len > MAX_SPARSE_MAP_JSON {
        return Ok(Layout::dense(size));
    }
    Ok(Layout {
        size,
        sparse: Some(segments),
    })
}

/// The data extents of `file` (first `size` bytes), or `None` when the filesystem does not
/// support `SEEK_DATA`.
pub fn data_segments(file: &File, size: u64) -> io::Result<Option<Vec<Segment>>> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut off: u64 = 0;
    while off < size {
        let Ok(at) = libc::off_t::try_from(off) else {
            break;
        };
        // SAFETY: lseek on an open descriptor we borrow; it only moves the file offset, and
        // all reads in this crate use positioned I/O.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // No data after `off`: the rest is a hole.
                Some(libc::ENXIO) => Ok(Some(out)),
                Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (data, hole) = (data as u64, (hole as u64).min(size));
        if data >= size {
            break;
        }
        if hole > data {
            out.push(Segment {
                offset: data,
                length: hole - data,
            });
        }
        off = hole.max(data + 1);
    }
    Ok(Some(out))
}

/// Reads a layer's bytes from a file: the extents of a [`Layout`], back to back.
#[derive(Debug)]
pub struct ExtentReader {
    file: std::sync::Arc<File>,
    extents: Vec<Segment>,
    /// Index of the current extent and the offset inside it.
    idx: usize,
    within: u64,
}

impl ExtentReader {
    /// A reader over `extents` of `file`.
    pub fn new(file: std::sync::Arc<File>, extents: Vec<Segment>) -> ExtentReader {
        ExtentReader {
            file,
            extents,
            idx: 0,
            within: 0,
        }
    }

    /// Moves to layer offset `pos` (used to resume and to read one upload chunk).
    pub fn seek(&mut self, mut pos: u64) {
        self.idx = 0;
        self.within = 0;
        while let Some(e) = self.extents.get(self.idx) {
            if pos < e.length {
                self.within = pos;
                return;
            }
            pos -= e.length;
            self.idx += 1;
        }
    }

    /// Fills `buf` with the next layer bytes; returns how many (0 at the end).
    pub fn read_into(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let Some(e) = self.extents.get(self.idx) else {
                break;
            };
            let left = e.length - self.within;
            if left == 0 {
                self.idx += 1;
                self.within = 0;
                continue;
            }
            let want = (buf.len() - filled).min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = self
                .file
                .read_at(&mut buf[filled..filled + want], e.offset + self.within)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shrank while it was being read",
                ));
            }
            filled += n;
            self.within += n as u64;
        }
        Ok(filled)
    }

    /// Reads up to `max` layer bytes into a fresh buffer; an empty buffer means the end.
    /// A file that shrank underneath fails instead of yielding short data.
    pub fn next_chunk(&mut self, max: usize) -> io::Result<Bytes> {
        let mut buf = BytesMut::zeroed(max);
        let n = self.read_into(&mut buf)?;
        buf.truncate(n);
        Ok(buf.freeze())
    }
}

/// Whether `b` is all zero bytes: compared against a zero block, which is `memcmp` (fast
/// even in unoptimised builds).
pub fn is_zero(b: &[u8]) -> bool {
    static ZEROS: [u8; BLOCK] = [0u8; BLOCK];
    b.chunks(BLOCK).all(|c| c == &ZEROS[..c.len()])
}

/// Writes a layer's bytes into a fresh file, restoring holes: extents of a sparse layer go
/// to their offsets, and all-zero aligned blocks are skipped (left as holes). Writes may come
/// in pieces of any size: a block split across pieces is held back until it is complete.
#[derive(Debug)]
pub struct HoleWriter<'f> {
    file: &'f File,
    extents: Vec<Segment>,
    idx: usize,
    within: u64,
    logical_size: u64,
    /// The start of a block (at `carry_off`, aligned) whose end has not arrived yet.
    carry: Vec<u8>,
    carry_off: u64,
}

impl<'f> HoleWriter<'f> {
    /// A writer for a file of `logical_size` whose layer bytes fill `extents` in order.
    pub fn new(file: &'f File, extents: Vec<Segment>, logical_size: u64) -> HoleWriter<'f> {
        HoleWriter {
            file,
            extents,
            idx: 0,
            within: 0,
            logical_size,
            carry: Vec::with_capacity(BLOCK),
            carry_off: 0,
        }
    }

    /// Writes the next layer bytes; bytes beyond the extents are an error.
    pub fn write(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let Some(e) = self.extents.get(self.idx) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "more layer bytes than the file's extents hold",
                ));
            };
            let left = e.length - self.within;
            if left == 0 {
                self.idx += 1;
                self.within = 0;
                continue;
            }
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let off = e.offset + self.within;
            self.put(off, &buf[..n])?;
            self.within += n as u64;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Writes `data` at file offset `off`.
    fn put(&mut self, mut off: u64, mut data: &[u8]) -> io::Result<()> {
        if !self.carry.is_empty() {
            if self.carry_off + self.carry.len() as u64 != off {
                self.flush_carry()?; // the block ended early (an extent boundary)
            } else {
                let take = (BLOCK - self.carry.len()).min(data.len());
                self.carry.extend_from_slice(&data[..take]);
                data = &data[take..];
                off += take as u64;
                if self.carry.len() == BLOCK {
                    self.flush_carry()?;
                }
                if data.is_empty() {
                    return Ok(());
                }
            }
        }
        let end = off + data.len() as u64;
        let tail = end - end % BLOCK as u64;
        if tail >= off && end > tail {
            // The last block starts aligned inside `data` but ends beyond it: hold it back.
            let split = (tail - off) as usize;
            write_skipping_zeros(self.file, off, &data[..split])?;
            self.carry.extend_from_slice(&data[split..]);
            self.carry_off = tail;
            Ok(())
        } else {
            write_skipping_zeros(self.file, off, data)
        }
    }

    /// Writes the held-back bytes unless they are all zero (the file is fresh, so unwritten
    /// bytes read as zero).
    fn flush_carry(&mut self) -> io::Result<()> {
        if !self.carry.is_empty() && !is_zero(&self.carry) {
            self.file.write_all_at(&self.carry, self.carry_off)?;
        }
        self.carry.clear();
        Ok(())
    }

    /// Writes what is held back and sets the logical size (trailing holes included).
    pub fn finish(mut self) -> io::Result<()> {
        self.flush_carry()?;
        self.file.set_len(self.logical_size)
    }
}

/// `pwrite`s `buf` at `offset`, leaving all-zero blocks (aligned to the file offset) unwritten.
fn write_skipping_zeros(file: &File, offset: u64, buf: &[u8]) -> io::Result<()> {
    let mut pos = 0usize;
    // Pending run of data to write in one call.
    let mut run_start: Option<usize> = None;
    while pos < buf.len() {
        let abs = offset + pos as u64;
        let to_boundary = BLOCK - (abs % BLOCK as u64) as usize;
        let end = (pos + to_boundary).min(buf.len());
        let full_block = end - pos == BLOCK;
        // Only whole aligned blocks become holes; partial blocks are written.
        if full_block && is_zero(&buf[pos..end]) {
            if let Some(s) = run_start.take() {
                file.write_all_at(&buf[s..pos], offset + s as u64)?;
            }
        } else if run_start.is_none() {
            run_start = Some(pos);
        }
        pos = end;
    }
    if let Some(s) = run_start {
        file.write_all_at(&buf[s..], offset + s as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("cocoon-sparse-{}-{name}", std::process::id()))
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0u8; 4096]));
        assert!(is_zero(&[]));
        let mut b = [0u8; 100];
        b[99] = 1;
        assert!(!is_zero(&b));
        b[99] = 0;
        b[3] = 1;
        assert!(!is_zero(&b));
    }

    #[test]
    fn holes_are_found_and_the_layer_is_the_packed_data() {
        let p = temp("scan");
        let f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .expect("open");
        f.set_len(8 << 20).expect("len");
        f.write_all_at(&[1u8; 8192], 1 << 20).expect("w");
        f.write_all_at(&[2u8; 4096], 6 << 20).expect("w");
        let layout = layout_of(&f).expect("layout");
        let _ = std::fs::remove_file(&p);
        let Some(segs) = layout.sparse.clone() else {
            // The filesystem under the temp dir reports no holes (e.g. some overlay setups);
            // then the file must travel dense.
            assert_eq!(layout, Layout::dense(8 << 20));
            return;
        };
        assert_eq!(layout.size, 8 << 20);
        assert!(
            segs.iter()
                .any(|s| s.offset <= 1 << 20 && s.offset + s.length >= (1 << 20) + 8192)
        );
        assert!(
            segs.iter()
                .any(|s| s.offset <= 6 << 20 && s.offset + s.length >= (6 << 20) + 4096)
        );
        assert!(layout.packed_size() < 1 << 20);

        let mut r = ExtentReader::new(Arc::new(f), layout.extents());
        let mut total = 0u64;
        let mut ones = 0;
        loop {
            let c = r.next_chunk(3000).expect("read");
            if c.is_empty() {
                break;
            }
            total += c.len() as u64;
            ones += c.iter().filter(|&&b| b == 1).count();
        }
        assert_eq!(total, layout.packed_size());
        assert_eq!(ones, 8192);
    }

    #[test]
    fn hole_writer_restores_extents_and_skips_zero_blocks() {
        let p = temp("write");
        let f = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .expect("open");
        let extents = vec![
            Segment {
                offset: 4096,
                length: 4096,
            },
            Segment {
                offset: 1 << 20,
                length: 3 * 4096,
            },
        ];
        let mut w = HoleWriter::new(&f, extents, 4 << 20);
        let mut data = vec![7u8; 4096];
        data.extend(vec![0u8; 4096]); // becomes a hole inside the second extent
        data.extend(vec![9u8; 4096]);
        data.extend(vec![5u8; 4096]);
        // Odd pieces: they cross the extent boundary and split blocks, which are still
        // recognised as zero once complete.
        for piece in data.chunks(1000) {
            w.write(piece).expect("write");
        }
        assert!(w.write(&[1]).is_err(), "bytes past the extents are refused");
        let mut w = HoleWriter::new(&f, vec![], 4 << 20);
        w.write(&[]).expect("empty");
        w.finish().expect("finish");
        let meta = f.metadata().expect("meta");
        assert_eq!(meta.len(), 4 << 20);
        let mut back = vec![0u8; 4 << 20];
        f.read_exact_at(&mut back, 0).expect("read");
        let _ = std::fs::remove_file(&p);
        assert!(back[4096..8192].iter().all(|&b| b == 7));
        assert!(back[(1 << 20)..(1 << 20) + 4096].iter().all(|&b| b == 0));
        assert!(
            back[(1 << 20) + 4096..(1 << 20) + 8192]
                .iter()
                .all(|&b| b == 9)
        );
        assert!(
            back[(1 << 20) + 8192..(1 << 20) + 12288]
                .iter()
                .all(|&b| b == 5)
        );
        assert_eq!(back.iter().filter(|&&b| b != 0).count(), 3 * 4096);
        // Three data blocks written; everything else is a hole (`blocks` is in 512-byte units).
        assert!(meta.blocks() * 512 <= 3 * 4096, "blocks: {}", meta.blocks());
    }
}
