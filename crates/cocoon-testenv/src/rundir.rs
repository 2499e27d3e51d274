//! Per-run directories under the system temp dir: creation, the keep marker, sweeping the
//! leftovers of SIGKILLed runs, removal, and reading the component log tails.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::process::tail_file;

/// Tails of every `*.log` under `run_dir/logs`, each under a `==> name <==` header.
pub fn log_tails_in(run_dir: &Path, lines: usize) -> String {
    let logs = run_dir.join("logs");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&logs) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect(),
        Err(e) => return format!("(no logs at {}: {e})", logs.display()),
    };
    files.sort();
    let mut out = format!("run dir: {}\n", run_dir.display());
    for f in files {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned());
        out.push_str(&format!(
            "==> {} <==\n{}\n",
            name.unwrap_or_default(),
            tail_file(&f, lines)
        ));
    }
    out
}

/// Marker file in a run dir that must survive (TESTENV_KEEP); the stale sweep skips it.
const KEEP_MARKER: &str = ".keep";

/// Creates a fresh directory `<tmp>/<prefix>-<pid>-<n>`, first sweeping away run dirs of
/// dead processes with the same prefix (a SIGKILLed test process cannot clean up itself).
pub(crate) fn make_run_dir(prefix: &str) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    let pid = std::process::id();
    sweep_stale_run_dirs(&base, prefix);
    for n in 0..1000u32 {
        let dir = base.join(format!("{prefix}-{pid}-{n}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
        }
    }
    Err(Error::Invalid {
        what: "run dir".into(),
        detail: format!("no free name for {prefix} under {}", base.display()),
    })
}

/// Marks `dir` to be kept by later sweeps.
pub(crate) fn mark_keep(dir: &Path) {
    if let Err(e) = std::fs::write(dir.join(KEEP_MARKER), b"") {
        tracing::warn!(dir = %dir.display(), error = %e, "could not mark run dir as kept");
    }
}

fn sweep_stale_run_dirs(base: &Path, prefix: &str) {
    for dir in stale_run_dirs(base, prefix) {
        tracing::info!(dir = %dir.display(), "removing run dir of a dead process");
        remove_run_dir(&dir);
    }
}

/// Run dirs `<base>/<prefix>-<pid>-<n>` whose process is gone and that are not marked kept.
pub(crate) fn stale_run_dirs(base: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        // `-<pid>-<n>`
        let mut parts = rest.strip_prefix('-').unwrap_or_default().split('-');
        let (Some(pid), Some(n), None) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(pid), true) = (pid.parse::<u32>(), n.parse::<u32>().is_ok()) else {
            continue;
        };
        let dir = entry.path();
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if !alive && !dir.join(KEEP_MARKER).exists() {
            out.push(dir);
        }
    }
    out
}

/// Where a run keeps its etcd data: memory (`/dev/shm/<run dir name>-etcd`) when the machine
/// has a tmpfs there, else `<run dir>/etcd`. On disk, etcd's writes (even without fsync) stall
/// behind the page cache's dirty throttling while other tests write gigabytes (the registry's
/// > 1 GiB round trip), and with them every API request of every test.
pub(crate) fn etcd_data_dir(run_dir: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    match run_dir.file_name() {
        Some(name) if shm.is_dir() => shm.join(format!("{}-etcd", name.to_string_lossy())),
        _ => run_dir.join("etcd"),
    }
}

pub(crate) fn remove_run_dir(dir: &Path) {
    for d in [etcd_data_dir(dir), dir.to_owned()] {
        if let Err(e) = std::fs::remove_dir_all(&d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %d.display(), error = %e, "could not remove run dir");
        }
    }
}
