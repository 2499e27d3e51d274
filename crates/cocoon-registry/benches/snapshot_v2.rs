//! The v2 snapshot wire format (zstd, chunks) against v1 on a realistic memory image, through
//! the real testenv registry, over loopback and over a 1 Gbit/s link (issue 27 item 4).
//!
//! The image is made as the Go fixture generator describes (cocoon-common v0.3.0 fixtures
//! README): 4 KiB pages, half zero, a quarter text, a quarter random, in an order set by a
//! Fisher–Yates shuffle driven by SplitMix64 (seed `0x636f636f6f6e`), so every run pushes
//! the same bytes. The 1 Gbit/s link is a throttling TCP proxy inside this process on
//! 127.0.0.1: one token bucket of 125 000 000 bytes/s per direction (a full-duplex link),
//! shared by every connection going that way. Each push and pull runs in a child process,
//! which reports its wall time, CPU (user + system) and peak RSS.
//!
//! Run: `cargo bench -p cocoon-registry --bench snapshot_v2`. Under `cargo test` it only
//! prints how to run it (cargo bench passes `--bench`; cargo test does not).
//!
//! Knobs (environment): `SNAPSHOT_V2_BENCH_MIB` (image size, default 2048),
//! `SNAPSHOT_V2_BENCH_ROUNDS` (best of N per measure, default 1), `SNAPSHOT_V2_BENCH_LINKS`
//! (`loopback`, `1gbit` or both, default both), and the node agent's
//! `SNAPSHOT_TRANSFER_CONCURRENCY`, `SNAPSHOT_MEMORY_BUDGET_MIB`, `SNAPSHOT_PULL_BUDGET_MIB`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::convert::Infallible;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cocoon_registry::reference::Hasher;
use cocoon_registry::{Digest, PushOptions, RegistryClient, RegistryConfig};
use common::{FileSpec, TempDir, same_content, write_snapshot_dir};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;
/// The fixture generator's seed ("cocoon").
const SEED: u64 = 0x636f_636f_6f6e;
/// 1 Gbit/s in bytes per second, per direction.
const LINK_RATE: f64 = 125_000_000.0;
/// How far the link may run ahead of an idle moment (a small queue, as a NIC has).
const LINK_BURST: Duration = Duration::from_millis(2);
/// When a read fills the whole buffer the sender was waiting on us (a backlog): time the
/// proxy lost to scheduling (two cores shared with other jobs) is then credited up to this
/// much, as a real link would have kept sending. The "link MB/s" column shows the rate the
/// link actually carried over each transfer.
const LINK_BACKLOG_CREDIT: Duration = Duration::from_millis(50);
/// The proxy's read size.
const PROXY_BUF: usize = 256 << 10;
/// Goals of issue 27 item 4.
const GOAL_SPEEDUP: f64 = 2.5;
const GOAL_FLOOR_PCT: f64 = 85.0;
const GOAL_LOOPBACK_SLOWER_PCT: f64 = 10.0;

/// One wire format under test.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    zstd_level: u64,
    chunk_mib: u64,
}

const CASES: [Case; 5] = [
    Case {
        name: "v1",
        zstd_level: 0,
        chunk_mib: 0,
    },
    Case {
        name: "v2 zstd1",
        zstd_level: 1,
        chunk_mib: 0,
    },
    Case {
        name: "v2 zstd1+64M",
        zstd_level: 1,
        chunk_mib: 64,
    },
    Case {
        name: "v2 zstd3",
        zstd_level: 3,
        chunk_mib: 0,
    },
    Case {
        name: "v2 zstd3+64M",
        zstd_level: 3,
        chunk_mib: 64,
    },
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Link {
    Loopback,
    Gbit,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Loopback => "loopback",
            Link::Gbit => "1gbit",
        }
    }
}

/// The node agent's transfer knobs, as the children apply them.
#[derive(Clone, Copy)]
struct Knobs {
    concurrency: usize,
    memory_budget_mib: u64,
    pull_budget_mib: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(&args[2..]);
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("snapshot_v2: run with `cargo bench -p cocoon-registry --bench snapshot_v2`");
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run());
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// SplitMix64, as the fixture generator uses it.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Writes the memory image: `size` bytes of pages, half zero, a quarter text, a quarter
/// random, shuffled page by page (every page written: no holes). Returns its digest.
fn write_memory_image(path: &Path, size: u64) -> Digest {
    let pages = usize::try_from(size / PAGE as u64).expect("pages");
    // 0 = zero, 1 = text, 2 = random.
    let mut kinds: Vec<u8> = (0..pages)
        .map(|i| match i {
            i if i < pages / 2 => 0,
            i if i < pages / 2 + pages / 4 => 1,
            _ => 2,
        })
        .collect();
    let mut rng = SplitMix64(SEED);
    for i in (1..pages).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        kinds.swap(i, j);
    }
    let file = File::create(path).expect("create memory-ranges");
    let mut out = std::io::BufWriter::with_capacity(4 << 20, &file);
    let mut hasher = Hasher::new();
    let mut page = vec![0u8; PAGE];
    for (p, kind) in kinds.iter().enumerate() {
        match kind {
            0 => page.fill(0),
            1 => {
                let line = format!(
                    "page {p:05}: cocoon snapshot memory-ranges fixture, the quick brown fox jumps over the lazy dog\n"
                );
                for (dst, src) in page.iter_mut().zip(line.as_bytes().iter().cycle()) {
                    *dst = *src;
                }
            }
            _ => {
                for word in page.chunks_exact_mut(8) {
                    word.copy_from_slice(&rng.next().to_le_bytes());
                }
            }
        }
        hasher.update(&page);
        out.write_all(&page).expect("write memory-ranges");
    }
    out.flush().expect("flush memory-ranges");
    drop(out);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    hasher.finish()
}

/// A link's token bucket: transmissions are laid end to end at `LINK_RATE`; a sender waits
/// until its bytes have been "sent".
struct Bucket {
    next_free: Mutex<Instant>,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// Reserves `n` bytes of the link; returns when they have crossed it. `backlog`: the
    /// sender had more waiting (see [`LINK_BACKLOG_CREDIT`]).
    fn reserve(&self, n: usize, backlog: bool) -> Instant {
        let now = Instant::now();
        let credit = if backlog {
            LINK_BACKLOG_CREDIT
        } else {
            LINK_BURST
        };
        let earliest = now.checked_sub(credit).unwrap_or(now);
        let mut next = self.next_free.lock().expect("bucket");
        let start = (*next).max(earliest);
        *next = start + Duration::from_secs_f64(n as f64 / LINK_RATE);
        *next
    }
}

/// The throttling proxy: bytes client → registry (`up`) and registry → client (`down`),
/// each direction its own bucket, counted.
struct Proxy {
    addr: String,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

async fn start_proxy(target: String) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
    let addr = listener.local_addr().expect("proxy addr").to_string();
    let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (up_bucket, down_bucket) = (Arc::new(Bucket::new()), Arc::new(Bucket::new()));
    let (up_count, down_count) = (up.clone(), down.clone());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let Ok(server) = TcpStream::connect(&target).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, up_bucket.clone(), up_count.clone()));
            tokio::spawn(pump(sr, cw, down_bucket.clone(), down_count.clone()));
        }
    });
    Proxy { addr, up, down }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bucket: Arc<Bucket>,
    count: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; PROXY_BUF];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let sent = bucket.reserve(n, n == buf.len());
        tokio::time::sleep_until(sent.into()).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

/// User plus system CPU seconds of process `pid` (all threads).
fn process_cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (field(11), field(12)) {
        (Some(u), Some(s)) => (u + s) / hz,
        _ => f64::NAN,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One push or pull, measured.
#[derive(Clone, Copy, Default)]
struct Measure {
    secs: f64,
    cpu: f64,
    registry_cpu: f64,
    hwm_kib: u64,
    /// Layer bytes the report says moved.
    wire: u64,
    /// Bytes through the proxy in the transfer's direction (0 on loopback).
    proxied: u64,
}

impl Measure {
    /// Keeps the faster of two rounds' times (with their CPU figures), the larger peak RSS.
    fn best(self, other: Measure) -> Measure {
        let hwm_kib = self.hwm_kib.max(other.hwm_kib);
        let mut m = if other.secs < self.secs || self.secs == 0.0 {
            other
        } else {
            self
        };
        m.hwm_kib = hwm_kib;
        m
    }
}

struct Row {
    link: Link,
    case: Case,
    push: Measure,
    pull: Measure,
}

type RawClient =
    Client<HttpConnector, http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

async fn run() {
    let size_mib = env_u64("SNAPSHOT_V2_BENCH_MIB").unwrap_or(2048).max(4);
    let rounds = env_u64("SNAPSHOT_V2_BENCH_ROUNDS").unwrap_or(1).max(1);
    let links: Vec<Link> = match std::env::var("SNAPSHOT_V2_BENCH_LINKS").as_deref() {
        Ok("loopback") => vec![Link::Loopback],
        Ok("1gbit") => vec![Link::Gbit],
        _ => vec![Link::Loopback, Link::Gbit],
    };
    let knobs = Knobs {
        concurrency: match env_u64("SNAPSHOT_TRANSFER_CONCURRENCY") {
            None | Some(0) => 8,
            Some(n) => n as usize,
        },
        memory_budget_mib: match env_u64("SNAPSHOT_MEMORY_BUDGET_MIB") {
            None | Some(0) => 9216,
            Some(n) => n,
        },
        pull_budget_mib: match env_u64("SNAPSHOT_PULL_BUDGET_MIB") {
            None | Some(0) => 2048,
            Some(n) => n,
        },
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cpus} CPUs, load average {} at start",
        load_average()
    );
    println!(
        "knobs: transfer concurrency {}, push memory budget {} MiB, pull budget {} MiB, rounds {rounds}",
        knobs.concurrency, knobs.memory_budget_mib, knobs.pull_budget_mib
    );

    let reg = cocoon_testenv::Registry::start_temp(None)
        .await
        .expect("registry");
    let work = TempDir::new("cocoon-registry-bench-v2");
    let src = work.path().join("snapshot");
    std::fs::create_dir_all(&src).expect("mkdir");
    let t = Instant::now();
    write_snapshot_dir(
        &src,
        "bench-vm",
        "sid-bench-v2",
        &[
            FileSpec::dense("config.json", 4096),
            FileSpec::dense("state.json", 64 * 1024),
        ],
        27,
    );
    let image = src.join("memory-ranges");
    let image_size = size_mib * MIB;
    let image_digest = write_memory_image(&image, image_size);
    println!(
        "image: memory-ranges {size_mib} MiB (half zero, a quarter text, a quarter random pages, \
         shuffled, seed {SEED:#x}), {image_digest}, written in {:.1}s; plus config.json 4 KiB, \
         state.json 64 KiB",
        t.elapsed().as_secs_f64()
    );

    let http: RawClient = Client::builder(TokioExecutor::new()).build_http();
    let pid = reg.pid();
    let reg_cpu = move || pid.map_or(f64::NAN, process_cpu_secs);

    // The loopback floor: a raw HTTP upload and download of the image's bytes, one blob, to
    // and from the same registry, best of the rounds.
    let (mut raw_up, mut raw_down) = (0.0f64, 0.0f64);
    let mut raw_cpu_up = f64::NAN;
    let mut raw_cpu_down = f64::NAN;
    if links.contains(&Link::Loopback) {
        for round in 0..rounds {
            let repo = format!("raw-{round}");
            let (t, c) = (Instant::now(), reg_cpu());
            raw_upload(&http, &reg.url(), &repo, &image, image_size, &image_digest).await;
            let rate = image_size as f64 / t.elapsed().as_secs_f64();
            if rate > raw_up {
                raw_up = rate;
                raw_cpu_up = reg_cpu() - c;
            }
            let out = work.path().join("raw-download");
            let (t, c) = (Instant::now(), reg_cpu());
            raw_download(&http, &reg.url(), &repo, &image_digest, image_size, &out).await;
            let rate = image_size as f64 / t.elapsed().as_secs_f64();
            if rate > raw_down {
                raw_down = rate;
                raw_cpu_down = reg_cpu() - c;
            }
            std::fs::remove_file(&out).ok();
        }
        println!(
            "raw HTTP copy of the image on loopback: upload {:.0} MB/s (registry CPU {raw_cpu_up:.1}s), \
             download {:.0} MB/s (registry CPU {raw_cpu_down:.1}s)",
            raw_up / 1e6,
            raw_down / 1e6
        );
    }

    let proxy = start_proxy(reg.addr().to_string()).await;
    let mut rows = Vec::new();
    for &link in &links {
        let addr = match link {
            Link::Loopback => reg.addr().to_string(),
            Link::Gbit => proxy.addr.clone(),
        };
        for case in CASES {
            let (mut push, mut pull) = (Measure::default(), Measure::default());
            for round in 0..rounds {
                let repo = format!(
                    "bench-{}-{}-{round}",
                    link.name(),
                    case.name.replace([' ', '+'], "-").to_lowercase()
                );
                let args = |op: &str, path: &Path| -> Vec<String> {
                    vec![
                        op.to_string(),
                        addr.clone(),
                        repo.clone(),
                        path.display().to_string(),
                        case.zstd_level.to_string(),
                        case.chunk_mib.to_string(),
                        knobs.concurrency.to_string(),
                        knobs.memory_budget_mib.to_string(),
                        knobs.pull_budget_mib.to_string(),
                    ]
                };
                let up0 = proxy.up.load(Ordering::Relaxed);
                let c = reg_cpu();
                let mut m = run_child(args("push", &src)).await;
                m.registry_cpu = reg_cpu() - c;
                m.proxied = proxy.up.load(Ordering::Relaxed) - up0;
                push = push.best(m);

                let dst = work.path().join("pulled");
                let down0 = proxy.down.load(Ordering::Relaxed);
                let c = reg_cpu();
                let mut m = run_child(args("pull", &dst)).await;
                m.registry_cpu = reg_cpu() - c;
                m.proxied = proxy.down.load(Ordering::Relaxed) - down0;
                pull = pull.best(m);
                // Outside the timing: the pulled image is the source, byte for byte.
                assert!(
                    same_content(&image, &dst.join("memory-ranges")).expect("compare"),
                    "{} {}: pulled memory-ranges differs from the source",
                    link.name(),
                    case.name
                );
                std::fs::remove_dir_all(&dst).ok();
            }
            println!(
                "{:<8} {:<13} push {:>6.2}s  pull {:>6.2}s  (wire {:.0} MB)",
                link.name(),
                case.name,
                push.secs,
                pull.secs,
                push.wire as f64 / 1e6
            );
            rows.push(Row {
                link,
                case,
                push,
                pull,
            });
        }
    }
    println!("load average at end: {}", load_average());
    report(&rows, image_size, raw_up, raw_down, knobs);
}

/// The floor of a transfer of `wire` bytes: through the link at its rate, or on loopback at
/// the raw-copy rate measured in this run.
fn floor_secs(link: Link, wire: u64, raw_rate: f64) -> f64 {
    match link {
        Link::Gbit => wire as f64 / LINK_RATE,
        Link::Loopback => wire as f64 / raw_rate,
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

fn report(rows: &[Row], image_size: u64, raw_up: f64, raw_down: f64, knobs: Knobs) {
    println!();
    println!(
        "{:<8} {:<13} {:<4} {:>7} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>7} {:>7}",
        "link",
        "case",
        "dir",
        "wall s",
        "MB/s",
        "wire MB",
        "proxy MB",
        "link MB/s",
        "CPU s",
        "reg s",
        "RSS MiB",
        "floor s",
        "% floor"
    );
    for r in rows {
        for (dir, m, raw) in [("push", r.push, raw_up), ("pull", r.pull, raw_down)] {
            let floor = floor_secs(r.link, m.wire, raw);
            let (proxied, link_rate) = match r.link {
                Link::Gbit => (
                    format!("{:.1}", m.proxied as f64 / 1e6),
                    format!("{:.1}", m.proxied as f64 / 1e6 / m.secs),
                ),
                Link::Loopback => ("-".to_string(), "-".to_string()),
            };
            println!(
                "{:<8} {:<13} {:<4} {:>7.2} {:>8.0} {:>9.1} {:>9} {:>9} {:>7.2} {:>7.2} {:>9.1} {:>7.2} {:>6.0}%",
                r.link.name(),
                r.case.name,
                dir,
                m.secs,
                image_size as f64 / 1e6 / m.secs,
                m.wire as f64 / 1e6,
                proxied,
                link_rate,
                m.cpu,
                m.registry_cpu,
                m.hwm_kib as f64 / 1024.0,
                floor,
                100.0 * floor / m.secs,
            );
        }
    }
    println!(
        "MB/s: image bytes ({} MB) per wall second; wire MB: layer bytes the push/pull report \
         moved; proxy MB: bytes through the 1 Gbit/s proxy in the transfer's direction \
         (HTTP included); link MB/s: proxy bytes per wall second (at most 125); CPU s: user+sys of the push/pull process; reg s: the registry's; \
         floor: wire bytes / 125 MB/s on 1gbit, wire bytes / raw HTTP copy rate on loopback",
        image_size as f64 / 1e6
    );

    let find = |link: Link, name: &str| rows.iter().find(|r| r.link == link && r.case.name == name);
    println!();
    println!("goals:");
    if let Some(v1) = find(Link::Gbit, "v1") {
        for r in rows
            .iter()
            .filter(|r| r.link == Link::Gbit && r.case.name != "v1")
        {
            for (dir, m, base) in [("push", r.push, v1.push), ("pull", r.pull, v1.pull)] {
                let speedup = base.secs / m.secs;
                let pct = 100.0 * floor_secs(Link::Gbit, m.wire, 0.0) / m.secs;
                println!(
                    "  1gbit {:<13} {dir}: {speedup:.2}x v1 (goal >= {GOAL_SPEEDUP}x: {}), \
                     {pct:.0}% of its floor (goal >= {GOAL_FLOOR_PCT:.0}%: {})",
                    r.case.name,
                    verdict(speedup >= GOAL_SPEEDUP),
                    verdict(pct >= GOAL_FLOOR_PCT),
                );
            }
        }
    }
    if let Some(v1) = find(Link::Loopback, "v1") {
        for name in ["v2 zstd1", "v2 zstd1+64M"] {
            let Some(r) = find(Link::Loopback, name) else {
                continue;
            };
            for (dir, m, base) in [("push", r.push, v1.push), ("pull", r.pull, v1.pull)] {
                let slower = 100.0 * (m.secs / base.secs - 1.0);
                println!(
                    "  loopback {name:<13} {dir}: {:.2}s vs v1 {:.2}s, {slower:+.0}% \
                     (goal: at most {GOAL_LOOPBACK_SLOWER_PCT:.0}% slower: {})",
                    m.secs,
                    base.secs,
                    verdict(slower <= GOAL_LOOPBACK_SLOWER_PCT),
                );
            }
        }
    }
    let worst = |f: &dyn Fn(&Row) -> Measure| {
        rows.iter()
            .filter(|r| r.case.zstd_level > 0 || r.case.chunk_mib > 0)
            .map(|r| (f(r).hwm_kib, r))
            .max_by_key(|(h, _)| *h)
    };
    if let Some((hwm, r)) = worst(&|r| r.push) {
        let mib = hwm as f64 / 1024.0;
        println!(
            "  peak RSS of a v2 push: {mib:.0} MiB ({} {}) vs the push memory budget {} MiB: {}",
            r.link.name(),
            r.case.name,
            knobs.memory_budget_mib,
            verdict(mib <= knobs.memory_budget_mib as f64),
        );
    }
    if let Some((hwm, r)) = worst(&|r| r.pull) {
        let mib = hwm as f64 / 1024.0;
        println!(
            "  peak RSS of a v2 pull: {mib:.0} MiB ({} {}) vs the pull budget {} MiB: {}",
            r.link.name(),
            r.case.name,
            knobs.pull_budget_mib,
            verdict(mib <= knobs.pull_budget_mib as f64),
        );
    }
}

/// `POST` + monolithic `PUT` of the file's bytes, streamed from disk.
async fn raw_upload(
    http: &RawClient,
    base: &str,
    repo: &str,
    path: &Path,
    size: u64,
    digest: &Digest,
) {
    let empty = http_body_util::Empty::new()
        .map_err(|n: Infallible| match n {})
        .boxed_unsync();
    let post = hyper::Request::post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .body(empty)
        .expect("POST request");
    let resp = http.request(post).await.expect("POST");
    assert_eq!(resp.status(), 202, "raw upload POST");
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("Location")
        .to_string();
    let session = if location.starts_with("http") {
        location
    } else {
        format!("{base}{location}")
    };
    let sep = if session.contains('?') { '&' } else { '?' };
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Frame<Bytes>>>(4);
    let file = File::open(path).expect("open image");
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        loop {
            let mut buf = vec![0u8; 1 << 20];
            let n = file.read(&mut buf).expect("read image");
            if n == 0 {
                break;
            }
            buf.truncate(n);
            if tx.blocking_send(Ok(Frame::data(Bytes::from(buf)))).is_err() {
                break;
            }
        }
    });
    let frames =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let put = hyper::Request::put(format!("{session}{sep}digest={digest}"))
        .header("content-length", size)
        .header("content-type", "application/octet-stream")
        .body(StreamBody::new(frames).boxed_unsync())
        .expect("PUT request");
    let resp = http.request(put).await.expect("PUT");
    assert_eq!(resp.status(), 201, "raw upload PUT");
}

/// `GET` of the blob into a file, no verification.
async fn raw_download(
    http: &RawClient,
    base: &str,
    repo: &str,
    digest: &Digest,
    size: u64,
    out: &PathBuf,
) {
    let empty = http_body_util::Empty::new()
        .map_err(|n: Infallible| match n {})
        .boxed_unsync();
    let get = hyper::Request::get(format!("{base}/v2/{repo}/blobs/{digest}"))
        .body(empty)
        .expect("GET request");
    let resp = http.request(get).await.expect("GET");
    assert_eq!(resp.status(), 200, "raw download");
    let file = File::create(out).expect("create raw download");
    let mut body = resp.into_body();
    let mut written = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            file.write_all_at(&data, written).expect("write");
            written += data.len() as u64;
        }
    }
    assert_eq!(written, size, "raw download size");
}

/// Runs one push or pull in a child process (its own CPU time and peak RSS).
async fn run_child(args: Vec<String>) -> Measure {
    tokio::task::spawn_blocking(move || {
        let exe = std::env::current_exe().expect("current exe");
        let out = Command::new(exe)
            .arg("--child")
            .args(&args)
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child {args:?} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("RESULT "))
            .unwrap_or_default();
        let get = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        Measure {
            secs: get("secs"),
            cpu: get("cpu"),
            hwm_kib: get("hwm_kib") as u64,
            wire: get("wire") as u64,
            ..Measure::default()
        }
    })
    .await
    .expect("child task")
}

/// `op addr repo path zstd chunk_mib concurrency memory_budget_mib pull_budget_mib`.
fn child(args: &[String]) {
    let num = |i: usize| -> u64 { args[i].parse().expect("numeric child argument") };
    let (op, addr, repo, path) = (&args[0], &args[1], &args[2], Path::new(&args[3]));
    let mut cfg = RegistryConfig::for_registry(addr).expect("config");
    cfg.apply_snapshot_knobs(num(4), num(5), num(7), num(8))
        .expect("knobs");
    cfg.transfer_concurrency = num(6) as usize;
    let client = RegistryClient::new(cfg).expect("client");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cpu0 = cocoon_testenv::bench::cpu_time().as_secs_f64();
    let (secs, wire, format) = rt.block_on(async {
        let t = Instant::now();
        match op.as_str() {
            "push" => {
                let r = client
                    .push_snapshot_dir(repo, path, &PushOptions::new("latest", "bench-image"))
                    .await
                    .expect("push");
                (t.elapsed().as_secs_f64(), r.bytes_uploaded, r.format)
            }
            "pull" => {
                let r = client
                    .pull_snapshot_to_dir(repo, "latest", path, "bench-vm-pulled")
                    .await
                    .expect("pull");
                (t.elapsed().as_secs_f64(), r.bytes_downloaded, r.format)
            }
            other => panic!("unknown child op {other}"),
        }
    });
    println!(
        "RESULT secs={secs} cpu={} hwm_kib={} wire={wire} format={}",
        cocoon_testenv::bench::cpu_time().as_secs_f64() - cpu0,
        cocoon_testenv::bench::proc_status_kib("VmHWM").unwrap_or(0),
        format.replace(' ', "_")
    );
}
