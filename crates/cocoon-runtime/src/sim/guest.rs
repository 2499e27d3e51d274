//! The simulated guest: a disk file that really holds the guest's files (so snapshots, exports
//! and clones carry them), and a tiny shell that `exec` runs against those files.
//!
//! Disk layout: `COCOON-SIM-GUEST v1\n`, a 16-digit length, `\n`, the JSON of [`GuestFs`], then
//! zeros up to [`GUEST_REGION`]; the rest of the file up to the configured disk size is a hole
//! (sparse) or pseudo-random bytes (filled), so tests can move realistic byte counts.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::tarfmt::data_extents;

mod lex;
mod shell;

pub use shell::run;

/// Magic line at offset 0 of every simulated guest disk.
pub const GUEST_MAGIC: &[u8] = b"COCOON-SIM-GUEST v1\n";
/// Bytes reserved at the start of the disk for the guest files.
pub const GUEST_REGION: u64 = 1 << 20;
/// The state token: random hex written at first boot and carried through every snapshot.
pub const TOKEN_PATH: &str = "/var/lib/cocoon-sim/state-token";
/// The guest hostname (the VM name at first boot; a restored VM keeps its source's).
pub const HOSTNAME_PATH: &str = "/etc/hostname";
const LEN_DIGITS: usize = 16;

/// The guest's files: absolute path → text content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestFs {
    /// Files by normalised absolute path.
    pub files: BTreeMap<String, String>,
}

impl GuestFs {
    /// The files of a first boot: hostname and a fresh state token.
    pub fn first_boot(hostname: &str, token: &str) -> Self {
        let mut fs = GuestFs::default();
        fs.files
            .insert(HOSTNAME_PATH.to_owned(), format!("{hostname}\n"));
        fs.files.insert(TOKEN_PATH.to_owned(), format!("{token}\n"));
        fs
    }

    /// The state token, trimmed.
    pub fn token(&self) -> Option<String> {
        self.files.get(TOKEN_PATH).map(|t| t.trim().to_owned())
    }
}

/// How the part of the disk beyond the guest region is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskFill {
    /// A hole: the file has the size but (almost) no data.
    Sparse,
    /// Pseudo-random bytes: every byte is data and hardly compressible.
    Filled,
}

/// Size and fill of a new guest disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSpec {
    /// Logical file size in bytes (at least the header is always written).
    pub size: u64,
    /// Layout beyond the guest region.
    pub fill: DiskFill,
}

impl Default for DiskSpec {
    fn default() -> Self {
        DiskSpec {
            size: 16 << 20,
            fill: DiskFill::Sparse,
        }
    }
}

fn header_bytes(fs: &GuestFs) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(fs).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(GUEST_MAGIC.len() + LEN_DIGITS + 1 + json.len());
    out.extend_from_slice(GUEST_MAGIC);
    out.extend_from_slice(format!("{:0width$}\n", json.len(), width = LEN_DIGITS).as_bytes());
    out.extend_from_slice(&json);
    if out.len() as u64 > GUEST_REGION {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            "no space left on device",
        ));
    }
    Ok(out)
}

/// Reads the guest files; `None` if the disk carries no (valid) guest header, e.g. a snapshot
/// imported from elsewhere.
pub fn read_guest(path: &Path) -> io::Result<Option<GuestFs>> {
    let mut f = File::open(path)?;
    let mut head = vec![0u8; GUEST_MAGIC.len() + LEN_DIGITS + 1];
    if f.read_exact(&mut head).is_err() || !head.starts_with(GUEST_MAGIC) {
        return Ok(None);
    }
    let len: Option<u64> =
        std::str::from_utf8(&head[GUEST_MAGIC.len()..GUEST_MAGIC.len() + LEN_DIGITS])
            .ok()
            .and_then(|s| s.parse().ok());
    let Some(len) = len.filter(|l| *l <= GUEST_REGION) else {
        return Ok(None);
    };
    let mut json = vec![0u8; len as usize];
    if f.read_exact(&mut json).is_err() {
        return Ok(None);
    }
    Ok(serde_json::from_slice(&json).ok())
}

/// Rewrites the guest files in place, zeroing what is left of a longer previous header.
pub fn write_guest(path: &Path, fs: &GuestFs) -> io::Result<()> {
    let new = header_bytes(fs)?;
    let old_len = old_header_len(path)?;
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(&new)?;
    if old_len > new.len() as u64 {
        io::copy(&mut io::repeat(0).take(old_len - new.len() as u64), &mut f)?;
    }
    f.sync_data()
}

fn old_header_len(path: &Path) -> io::Result<u64> {
    let mut f = File::open(path)?;
    let mut head = vec![0u8; GUEST_MAGIC.len() + LEN_DIGITS + 1];
    if f.read_exact(&mut head).is_err() || !head.starts_with(GUEST_MAGIC) {
        return Ok(0);
    }
    let len: u64 = std::str::from_utf8(&head[GUEST_MAGIC.len()..GUEST_MAGIC.len() + LEN_DIGITS])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(GUEST_REGION);
    Ok((head.len() as u64 + len).min(GUEST_REGION))
}

/// Creates a new guest disk holding `fs`, laid out per `spec`. `seed` varies the filled bytes.
pub fn create_disk(path: &Path, fs: &GuestFs, spec: DiskSpec, seed: u64) -> io::Result<()> {
    let header = header_bytes(fs)?;
    let mut f = File::create(path)?;
    f.write_all(&header)?;
    let size = spec.size.max(header.len() as u64);
    f.set_len(size)?;
    if spec.fill == DiskFill::Filled && size > GUEST_REGION {
        f.seek(SeekFrom::Start(GUEST_REGION))?;
        // xorshift64*: cheap, deterministic per seed, and incompressible enough.
        let mut x = seed | 1;
        let mut left = size - GUEST_REGION;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            for chunk in buf.chunks_mut(8) {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            let n = left.min(buf.len() as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
    }
    f.sync_all()
}

/// What a snapshot's `memory-ranges` holds beyond its header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryFill {
    /// A hole: the file has the size but (almost) no data.
    #[default]
    Sparse,
    /// Like a real guest's memory image: every 4 KiB page is data, half of them zero pages, a
    /// quarter text-like (words and spaces, as page cache and program text are), a quarter
    /// pseudo-random (compressed or encrypted data), in a deterministic shuffled order. zstd
    /// cuts it to about a third; v1 moves every byte.
    Realistic,
}

/// Page size of a [`MemoryFill::Realistic`] image.
pub const MEMORY_PAGE: usize = 4096;

/// Writes `len` bytes of a [`MemoryFill::Realistic`] image to `out`, deterministic per `seed`.
pub fn write_realistic_memory(out: &mut impl Write, len: u64, seed: u64) -> io::Result<()> {
    const WORDS: [&[u8]; 16] = [
        b"the ",
        b"cocoon ",
        b"agent ",
        b"kernel ",
        b"page ",
        b"memory ",
        b"snapshot ",
        b"return ",
        b"struct ",
        b"fn ",
        b"0x7ffd ",
        b"error ",
        b"self ",
        b"let ",
        b"=> ",
        b"\n    ",
    ];
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut buf = vec![0u8; 256 * MEMORY_PAGE];
    let mut left = len;
    while left > 0 {
        for page in buf.chunks_mut(MEMORY_PAGE) {
            // The page's kind from the top bits: 0-1 zero, 2 text, 3 random.
            match next() >> 62 {
                0 | 1 => page.fill(0),
                2 => {
                    let mut at = 0;
                    while at < page.len() {
                        let w = WORDS[(next() & 15) as usize];
                        let n = w.len().min(page.len() - at);
                        page[at..at + n].copy_from_slice(&w[..n]);
                        at += n;
                    }
                }
                _ => {
                    for c in page.chunks_mut(8) {
                        let v = next().to_le_bytes();
                        c.copy_from_slice(&v[..c.len()]);
                    }
                }
            }
        }
        let n = left.min(buf.len() as u64) as usize;
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Copies a file keeping its holes: only the data extents are written.
pub fn copy_sparse(src: &Path, dst: &Path) -> io::Result<u64> {
    let mut from = File::open(src)?;
    let size = from.metadata()?.len();
    let extents = data_extents(&mut from, size)?;
    let mut to = File::create(dst)?;
    to.set_len(size)?;
    for e in &extents {
        from.seek(SeekFrom::Start(e.offset))?;
        to.seek(SeekFrom::Start(e.offset))?;
        io::copy(&mut (&mut from).take(e.length), &mut to)?;
    }
    to.sync_all()?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A realistic memory image: deterministic per seed, about half zero pages, a quarter
    /// text (printable bytes only) and a quarter random, mixed.
    #[test]
    fn a_realistic_memory_image_is_half_zero_pages_a_quarter_text_a_quarter_random() {
        let pages = 4096;
        let mut a = Vec::new();
        write_realistic_memory(&mut a, (pages * MEMORY_PAGE) as u64 + 100, 7).expect("write");
        assert_eq!(a.len(), pages * MEMORY_PAGE + 100, "the exact length");
        let mut b = Vec::new();
        write_realistic_memory(&mut b, (pages * MEMORY_PAGE) as u64 + 100, 7).expect("write");
        assert_eq!(a, b, "deterministic per seed");
        let mut c = Vec::new();
        write_realistic_memory(&mut c, MEMORY_PAGE as u64 * 16, 8).expect("write");
        assert_ne!(&a[..c.len()], &c[..], "another seed, another image");

        let (mut zero, mut text, mut random) = (0usize, 0usize, 0usize);
        let mut kinds = Vec::new();
        for page in a.chunks(MEMORY_PAGE).take(pages) {
            let kind = if page.iter().all(|b| *b == 0) {
                zero += 1;
                0
            } else if page
                .iter()
                .all(|b| b.is_ascii_graphic() || b" \n".contains(b))
            {
                text += 1;
                1
            } else {
                random += 1;
                2
            };
            kinds.push(kind);
        }
        let share = |n: usize| n as f64 / pages as f64;
        assert!((0.45..0.55).contains(&share(zero)), "zero pages {zero}");
        assert!((0.2..0.3).contains(&share(text)), "text pages {text}");
        assert!((0.2..0.3).contains(&share(random)), "random pages {random}");
        let runs = kinds.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            runs > pages / 4,
            "shuffled, not in blocks: {runs} kind changes"
        );
    }

    #[test]
    fn disk_header_round_trip_and_sparse_copy() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("cow.raw");
        let fs = GuestFs::first_boot("vm-a", "abc123");
        create_disk(
            &p,
            &fs,
            DiskSpec {
                size: 4 << 20,
                fill: DiskFill::Sparse,
            },
            1,
        )
        .expect("create");
        assert_eq!(std::fs::metadata(&p).expect("meta").len(), 4 << 20);
        assert_eq!(read_guest(&p).expect("read"), Some(fs.clone()));

        let mut bigger = fs.clone();
        bigger.files.insert("/big".into(), "x".repeat(5000));
        write_guest(&p, &bigger).expect("write");
        write_guest(&p, &fs).expect("shrink");
        assert_eq!(read_guest(&p).expect("read"), Some(fs.clone()));

        let q = dir.path().join("copy.raw");
        copy_sparse(&p, &q).expect("copy");
        assert_eq!(std::fs::read(&p).expect("p"), std::fs::read(&q).expect("q"));
        assert_eq!(
            read_guest(&q).expect("read").and_then(|g| g.token()),
            Some("abc123".into())
        );

        let filled = dir.path().join("filled.raw");
        create_disk(
            &filled,
            &fs,
            DiskSpec {
                size: 3 << 20,
                fill: DiskFill::Filled,
            },
            7,
        )
        .expect("create");
        let bytes = std::fs::read(&filled).expect("read");
        assert_eq!(bytes.len(), 3 << 20);
        assert!(
            bytes[GUEST_REGION as usize..]
                .iter()
                .filter(|b| **b == 0)
                .count()
                < 100_000
        );

        std::fs::write(dir.path().join("foreign.raw"), b"not a sim disk").expect("w");
        assert_eq!(
            read_guest(&dir.path().join("foreign.raw")).expect("read"),
            None
        );
        let mut huge = GuestFs::default();
        huge.files
            .insert("/x".into(), "y".repeat(GUEST_REGION as usize));
        assert!(write_guest(&p, &huge).is_err(), "guest region is bounded");
    }
}
