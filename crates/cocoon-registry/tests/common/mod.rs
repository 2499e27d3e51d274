//! Shared by the integration tests and the benchmark: builds snapshot directories with real
//! data, holes and zero runs, and compares files by logical content and allocation.
#![allow(dead_code)]

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: fast incompressible test data, reproducible from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A file of a test snapshot: `size` logical bytes; `data` ranges hold random bytes, the
/// rest is a hole; `zero_ranges` are written as explicit zeros (data on disk, zero content).
#[derive(Clone, Debug)]
pub struct FileSpec {
    pub name: &'static str,
    pub size: u64,
    pub data: Vec<(u64, u64)>,
    pub zero_ranges: Vec<(u64, u64)>,
    pub mode: u32,
}

impl FileSpec {
    /// A file fully written with random data.
    pub fn dense(name: &'static str, size: u64) -> FileSpec {
        FileSpec {
            name,
            size,
            data: vec![(0, size)],
            zero_ranges: vec![],
            mode: 0o640,
        }
    }

    /// A sparse file with data islands.
    pub fn sparse(name: &'static str, size: u64, data: Vec<(u64, u64)>) -> FileSpec {
        FileSpec {
            name,
            size,
            data,
            zero_ranges: vec![],
            mode: 0o600,
        }
    }
}

/// Writes `snapshot.json` (id `snapshot_id`, name `name`) and the files into `dir`.
pub fn write_snapshot_dir(
    dir: &Path,
    name: &str,
    snapshot_id: &str,
    files: &[FileSpec],
    seed: u64,
) {
    let env = serde_json::json!({
        "version": 1,
        "config": {
            "id": snapshot_id, "name": name, "image": "ghcr.io/cocoonstack/cocoon/ubuntu:24.04",
            "image_digest": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
            "image_type": "oci", "image_blob_ids": {"abcd": {}}, "hypervisor": "cloud-hypervisor",
            "cpu": 2, "memory": 1073741824u64, "storage": 10737418240u64, "nics": 1,
            "network": "cocoon-dhcp", "windows": false
        }
    });
    std::fs::write(
        dir.join("snapshot.json"),
        serde_json::to_vec_pretty(&env).expect("json"),
    )
    .expect("write");
    // One random block, stamped with a counter per write: every block differs, and large
    // files cost no more than the writes (a PRNG over gigabytes is slow in test builds).
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 4 << 20];
    rng.fill(&mut buf);
    let mut stamp = seed.wrapping_mul(1 << 32);
    for f in files {
        let path = dir.join(f.name);
        let file = File::create(&path).expect("create");
        file.set_len(f.size).expect("set_len");
        for &(off, len) in &f.data {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(buf.len() as u64) as usize;
                stamp += 1;
                buf[..8].copy_from_slice(&stamp.to_le_bytes());
                buf[8] |= 1; // never an all-zero block
                file.write_all_at(&buf[..n], off + done).expect("write");
                done += n as u64;
            }
        }
        let zeros = vec![0u8; 1 << 20];
        for &(off, len) in &f.zero_ranges {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], off + done).expect("write");
                done += n as u64;
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode)).expect("chmod");
    }
}

/// Whether two files have the same logical content (holes read as zeros). Compared block
/// by block with `memcmp`, which stays fast in unoptimised test builds.
pub fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = f.read(&mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// Bytes the filesystem allocated for a file.
pub fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(u64::MAX)
}

/// Permission bits.
pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0)
}

/// Whether the filesystem under `dir` reports holes (`SEEK_HOLE`); tests that check
/// allocation need it.
pub fn fs_keeps_holes(dir: &Path) -> bool {
    let p = dir.join(".hole-probe");
    let ok = (|| -> io::Result<bool> {
        let f = File::create(&p)?;
        f.set_len(16 << 20)?;
        f.write_all_at(&[1u8; 4096], 8 << 20)?;
        f.sync_all()?;
        Ok(allocated(&p) < 1 << 20)
    })()
    .unwrap_or(false);
    let _ = std::fs::remove_file(&p);
    ok
}

/// Reads a tar the way a lenient importer does (a missing end-of-archive is a clean end):
/// every entry's header and content; `Err` when an entry is cut short.
pub async fn read_tar_entries(
    bytes: Vec<u8>,
) -> io::Result<Vec<(cocoon_registry::tar::Entry, Vec<u8>)>> {
    let mut r = cocoon_registry::tar::TarReader::new(std::io::Cursor::new(bytes));
    let mut out = Vec::new();
    while let Some(e) = r.next_entry().await? {
        let mut data = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = r.read_body(&mut buf).await?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        out.push((e, data));
    }
    Ok(out)
}
