//! The figures of the `process_*` metrics (Prometheus' process collector names), read from a
//! Linux `/proc/<pid>` directory: CPU time, resident and virtual memory, start time, open and
//! maximum file descriptors. Pure parsing plus the file reads; the metrics themselves are in
//! [`crate::process`] (feature `process-metrics`).
//!
//! `/proc/<pid>/stat` counts CPU and start time in clock ticks of `USER_HZ`, which the kernel
//! fixes at 100 for every architecture's user ABI (the Go client's procfs assumes the same).

use std::path::{Path, PathBuf};

/// `USER_HZ`: clock ticks per second of `/proc/<pid>/stat`.
pub const TICKS_PER_SECOND: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` the collector needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `utime`: user-mode CPU time, in ticks.
    pub utime_ticks: u64,
    /// `stime`: kernel-mode CPU time, in ticks.
    pub stime_ticks: u64,
    /// `starttime`: when the process started, in ticks after boot.
    pub start_ticks: u64,
    /// `vsize`: virtual memory size, in bytes.
    pub vsize_bytes: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here: field n is index n - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
    })
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the Unix epoch.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS` of `/proc/<pid>/status` (written in kB), in bytes.
pub fn parse_resident_bytes(text: &str) -> Option<u64> {
    let value = text.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let mut parts = value.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`; `None` when unlimited.
pub fn parse_max_open_files(text: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// User + system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, in bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: Option<u64>,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
}

/// Reads a process's figures under a `/proc`-like root; each one that cannot be read (no
/// procfs, a field missing) is `None` on its own.
#[derive(Clone, Debug)]
pub struct Reader {
    proc_root: PathBuf,
    pid: String,
}

impl Default for Reader {
    fn default() -> Self {
        Self::this_process()
    }
}

impl Reader {
    /// The running process, through `/proc/self`.
    pub fn this_process() -> Self {
        Self::new("/proc", "self")
    }

    /// Process `pid` (or `self`) under `proc_root` (tests point it at a fake tree).
    pub fn new(proc_root: impl Into<PathBuf>, pid: &str) -> Self {
        Reader {
            proc_root: proc_root.into(),
            pid: pid.to_string(),
        }
    }

    fn read(&self, rel: &Path) -> Option<String> {
        std::fs::read_to_string(self.proc_root.join(rel)).ok()
    }

    fn own(&self, file: &str) -> Option<String> {
        self.read(&Path::new(&self.pid).join(file))
    }

    /// Every figure, read now.
    pub fn sample(&self) -> Sample {
        let stat = self.own("stat").as_deref().and_then(parse_stat);
        let boot = self
            .read(Path::new("stat"))
            .as_deref()
            .and_then(parse_boot_time);
        let open_fds = std::fs::read_dir(self.proc_root.join(&self.pid).join("fd"))
            .ok()
            .map(|dir| dir.filter(|e| e.is_ok()).count() as u64);
        Sample {
            cpu_seconds: stat.map(|s| (s.utime_ticks + s.stime_ticks) as f64 / TICKS_PER_SECOND),
            resident_bytes: self.own("status").as_deref().and_then(parse_resident_bytes),
            virtual_bytes: stat.map(|s| s.vsize_bytes),
            start_time_seconds: stat
                .zip(boot)
                .map(|(s, b)| b as f64 + s.start_ticks as f64 / TICKS_PER_SECOND),
            open_fds,
            max_fds: self.own("limits").as_deref().and_then(parse_max_open_files),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line of `/proc/<pid>/stat`, with a command name holding `) (` and spaces.
    const STAT: &str = "4242 (cocoon (op) x) S 1 4242 4242 0 -1 4194560 2512 0 0 0 \
        731 219 0 0 20 0 9 0 123456 1234567168 3072 18446744073709551615 1 1 0 0 0 0 0 0 \
        16386 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                utime_ticks: 731,
                stime_ticks: 219,
                start_ticks: 123456,
                vsize_bytes: 1234567168,
            })
        );
        assert_eq!(parse_stat("4242 (short) S 1 2 3"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn boot_time_rss_and_the_fd_limit() {
        let proc_stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764748800\nprocesses 7\n";
        assert_eq!(parse_boot_time(proc_stat), Some(1_764_748_800));
        assert_eq!(parse_boot_time("cpu 1 2\n"), None);

        let status = "Name:\tcocoon\nVmPeak:\t  99999 kB\nVmRSS:\t   12288 kB\nThreads:\t9\n";
        assert_eq!(parse_resident_bytes(status), Some(12288 * 1024));
        assert_eq!(
            parse_resident_bytes("VmRSS:\t12\n"),
            None,
            "a unit is required"
        );
        assert_eq!(parse_resident_bytes("Name:\tkthread\n"), None);

        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
            Max cpu time              unlimited            unlimited            seconds   \n\
            Max open files            1024                 1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(unlimited), None);
    }

    #[test]
    fn a_fake_tree_gives_every_figure_and_a_missing_one_only_its_own_none() {
        let root = std::env::temp_dir().join(format!("cocoon-procfs-{}", std::process::id()));
        let pid = root.join("77");
        std::fs::create_dir_all(pid.join("fd")).expect("fake /proc");
        std::fs::write(pid.join("stat"), STAT).expect("stat");
        std::fs::write(root.join("stat"), "btime 1000\n").expect("/proc/stat");
        std::fs::write(pid.join("status"), "VmRSS:\t4 kB\n").expect("status");
        for fd in ["0", "1", "2"] {
            std::fs::write(pid.join("fd").join(fd), "").expect("fd");
        }
        let got = Reader::new(&root, "77").sample();
        std::fs::remove_dir_all(&root).expect("cleanup");
        assert_eq!(
            got,
            Sample {
                cpu_seconds: Some(9.5),
                resident_bytes: Some(4096),
                virtual_bytes: Some(1234567168),
                start_time_seconds: Some(1000.0 + 1234.56),
                open_fds: Some(3),
                max_fds: None,
            }
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_plausible_figures() {
        let s = Reader::this_process().sample();
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0), "{s:?}");
        assert!(s.resident_bytes.is_some_and(|r| r > 0), "{s:?}");
        assert!(s.virtual_bytes.is_some_and(|v| v > 0), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!(
            s.start_time_seconds
                .is_some_and(|t| t <= now + 1.0 && t > now - 86400.0 * 365.0),
            "{s:?}"
        );
    }
}
