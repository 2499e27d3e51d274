//! What the bench binaries share: the `cargo bench` entry point and the process's CPU time.

use std::future::Future;
use std::time::Duration;

/// The `main` of a bench binary: runs `bench` on a multi-threaded runtime when cargo passed
/// `--bench` (as `cargo bench` does), otherwise prints `usage` (e.g. under `cargo test
/// --benches`); a failure is printed with the bench's `name` and exits 1.
pub fn bench_main<F, E>(name: &str, usage: &str, bench: impl FnOnce() -> F)
where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    if !std::env::args().any(|a| a == "--bench") {
        println!("{usage}");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench()) {
        eprintln!("{name} failed: {e}");
        std::process::exit(1);
    }
}

/// User + system CPU time of this process.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A `kB` figure of this process's `/proc/self/status` (`VmHWM` is the peak resident set,
/// `VmRSS` the current one), in KiB.
pub fn proc_status_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
