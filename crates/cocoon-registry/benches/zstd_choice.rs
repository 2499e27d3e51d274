//! Why the v2 wire format uses libzstd (the `zstd` crate) and not a pure-Rust zstd (issue 27
//! item 3): both compress and decompress the same realistic memory image (half zero pages, a
//! quarter text, a quarter random, shuffled 4 KiB pages; deterministic) in memory, and the
//! bench prints throughput, ratio and CPU, as ratios to libzstd in the same run.
//!
//! `cargo bench -p cocoon-registry --bench zstd_choice` (ZSTD_CHOICE_MIB, default 256).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

/// xorshift64*: deterministic, fast enough in a release build.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `mib` MiB of pages: half zero, a quarter text (words of a small vocabulary, as page cache
/// and program text compress), a quarter random; the page order shuffled.
fn realistic_image(mib: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the ",
        "agent ",
        "cocoon ",
        "memory ",
        "snapshot ",
        "fn ",
        "return ",
        "let ",
        "0x00ff ",
        "{\"id\": ",
        "registry ",
        "\n",
        "    ",
        "import ",
        "error: ",
        "node ",
    ];
    let pages = mib * 1024 * 1024 / PAGE;
    let mut rng = Rng(0x636f_636f_6f6e);
    let mut kinds: Vec<u8> = (0..pages).map(|i| [0, 0, 1, 2][i % 4]).collect();
    for i in (1..kinds.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        kinds.swap(i, j);
    }
    let mut out = vec![0u8; pages * PAGE];
    for (page, kind) in out.chunks_mut(PAGE).zip(kinds) {
        match kind {
            1 => {
                let mut at = 0;
                while at < PAGE {
                    let w = WORDS[(rng.next() % WORDS.len() as u64) as usize].as_bytes();
                    let n = w.len().min(PAGE - at);
                    page[at..at + n].copy_from_slice(&w[..n]);
                    at += n;
                }
            }
            2 => {
                for b in page.chunks_mut(8) {
                    b.copy_from_slice(&rng.next().to_le_bytes()[..b.len()]);
                }
            }
            _ => {}
        }
    }
    out
}

struct Figure {
    what: String,
    wall: Duration,
    cpu: Duration,
    out_bytes: usize,
}

fn timed(what: String, f: impl FnOnce() -> Vec<u8>) -> (Figure, Vec<u8>) {
    let (t0, c0) = (Instant::now(), cocoon_testenv::bench::cpu_time());
    let out = f();
    let fig = Figure {
        what,
        wall: t0.elapsed(),
        cpu: cocoon_testenv::bench::cpu_time() - c0,
        out_bytes: out.len(),
    };
    (fig, out)
}

fn libzstd_compress(data: &[u8], level: i32, workers: u32) -> Vec<u8> {
    let mut enc = zstd::stream::Encoder::new(Vec::new(), level).expect("encoder");
    if workers > 0 {
        enc.multithread(workers).expect("zstdmt");
    }
    enc.write_all(data).expect("compress");
    enc.finish().expect("finish")
}

fn libzstd_decompress(frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    zstd::stream::Decoder::new(frame)
        .expect("decoder")
        .read_to_end(&mut out)
        .expect("decompress");
    out
}

fn ruzstd_compress(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

fn ruzstd_decompress(frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ruzstd::decoding::StreamingDecoder::new(frame)
        .expect("decoder")
        .read_to_end(&mut out)
        .expect("decompress");
    out
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("usage: cargo bench -p cocoon-registry --bench zstd_choice (ZSTD_CHOICE_MIB=256)");
        return;
    }
    let mib: usize = std::env::var("ZSTD_CHOICE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("image: {mib} MiB realistic memory pages; {cpus} CPUs");
    let image = realistic_image(mib);
    let mut rows = Vec::new();
    let mut frames = Vec::new();
    for (name, level, workers) in [
        ("libzstd level 1", 1, 0),
        ("libzstd level 1, zstdmt 2 workers", 1, 2),
        ("libzstd level 3", 3, 0),
        ("libzstd level 3, zstdmt 2 workers", 3, 2),
    ] {
        let (fig, frame) = timed(format!("compress   {name}"), || {
            libzstd_compress(&image, level, workers)
        });
        rows.push(fig);
        frames.push((name, frame));
    }
    let (fig, ru_frame) = timed("compress   ruzstd Fastest".into(), || {
        ruzstd_compress(&image)
    });
    rows.push(fig);
    let lib1 = frames[0].1.clone();
    // Each decoder reads both encoders' frames: the output must be the image.
    for (name, frame) in [
        ("libzstd level 1 frame", &lib1),
        ("ruzstd frame", &ru_frame),
    ] {
        let (fig, out) = timed(format!("decompress libzstd, {name}"), || {
            libzstd_decompress(frame)
        });
        assert!(out == image, "libzstd read back the {name}");
        rows.push(fig);
        let (fig, out) = timed(format!("decompress ruzstd,  {name}"), || {
            ruzstd_decompress(frame)
        });
        assert!(out == image, "ruzstd read back the {name}");
        rows.push(fig);
    }
    let mb = image.len() as f64 / 1e6;
    println!(
        "{:<58} {:>8} {:>9} {:>8} {:>10}",
        "case", "wall s", "MB/s", "CPU s", "out MB"
    );
    for r in &rows {
        println!(
            "{:<58} {:>8.2} {:>9.0} {:>8.2} {:>10.1}",
            r.what,
            r.wall.as_secs_f64(),
            mb / r.wall.as_secs_f64(),
            r.cpu.as_secs_f64(),
            r.out_bytes as f64 / 1e6
        );
    }
    let by = |what: &str| rows.iter().find(|r| r.what == what).expect("row");
    let ratio = |a: &Figure, b: &Figure| a.wall.as_secs_f64() / b.wall.as_secs_f64();
    let (lc, rc) = (
        by("compress   libzstd level 1"),
        by("compress   ruzstd Fastest"),
    );
    let (ld, rd) = (
        by("decompress libzstd, libzstd level 1 frame"),
        by("decompress ruzstd,  libzstd level 1 frame"),
    );
    println!(
        "ruzstd Fastest vs libzstd level 1, one thread: compress {:.2}x the time, {:.2}x the bytes; \
         decompress {:.2}x the time",
        ratio(rc, lc),
        rc.out_bytes as f64 / lc.out_bytes as f64,
        ratio(rd, ld)
    );
}
