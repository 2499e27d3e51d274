//! Node capacity and allocatable (`node.md` §2.3): pure arithmetic over host figures and the
//! configured overrides, plus a thin reader of `/proc` and statfs that supplies the figures.
//!
//! Quantities are handled in milli-units (exact integers), so `allocatable = value × (100 −
//! reserve) / 100` rounds down without floating-point error. CPU renders as whole cores when
//! the result is a multiple of 1000m, else as millicores; byte resources render as plain
//! integers (bytes).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Capacity overrides (`VK_NODE_CPU`, `VK_NODE_MEM`, `VK_NODE_STORAGE`, `VK_NODE_HUGEPAGES`),
/// kept as the Quantity strings given; they are parsed when capacity is computed (a bad one is
/// fatal there, `node.md` §1 step 7).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityOverrides {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub storage: Option<String>,
    pub hugepages: Option<String>,
}

/// What [`read_resources`] takes of the agent's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityConfig {
    /// `COCOON_ROOT_DIR`: the filesystem whose size is the node's ephemeral storage.
    pub cocoon_root_dir: PathBuf,
    pub overrides: CapacityOverrides,
    /// `VK_RESERVE_PERCENT`: the share of each resource kept off allocatable.
    pub reserve_percent: u32,
    /// `VK_NODE_PODS`: the node's pod capacity.
    pub pods: u32,
}

/// Resource names of the Node status.
pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const HUGEPAGES_2MI: &str = "hugepages-2Mi";
pub const PODS: &str = "pods";

/// Errors computing capacity; fatal at startup (`node.md` §1 step 7).
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("parse {var}={value:?}: {reason}")]
    Quantity {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: missing {field}")]
    Field { path: PathBuf, field: &'static str },
}

/// What the host reports, before overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFigures {
    /// Logical CPUs.
    pub cpus: u64,
    /// `MemTotal` in bytes (kB × 1024).
    pub memory_bytes: u64,
    /// statfs total bytes of the cocoon root filesystem.
    pub storage_total_bytes: u64,
    /// statfs available (`Bavail`) bytes.
    pub storage_available_bytes: u64,
    /// `HugePages_Total × Hugepagesize` in bytes.
    pub hugepages_bytes: u64,
}

/// Capacity and allocatable, ready for `NodeStatus`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub capacity: BTreeMap<String, Quantity>,
    pub allocatable: BTreeMap<String, Quantity>,
}

/// Parses a Kubernetes Quantity into milli-units (non-negative only). Supports the decimal
/// (`m`, `k`, `M`, `G`, `T`, `P`, `E`) and binary (`Ki` … `Ei`) suffixes, decimal fractions
/// and `e<N>` exponents; fractional milli-units are rounded down.
pub fn parse_quantity_milli(raw: &str) -> Result<u128, String> {
    let s = raw.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() || number.matches('.').count() > 1 || number == "." {
        return Err("not a quantity".into());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits.parse().map_err(|_| "number too large".to_string())?;
    let frac_len = u32::try_from(frac_part.len()).map_err(|_| "too many digits".to_string())?;

    // The value is mantissa × 10^-frac_len × num / den; milli-units multiply by 1000.
    let (num, den): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| "bad suffix".to_string())?;
            let pow = 10u128
                .checked_pow(e.unsigned_abs())
                .ok_or_else(|| "exponent too large".to_string())?;
            if e >= 0 { (pow, 1) } else { (1, pow) }
        }
        _ => return Err(format!("unknown suffix {suffix:?}")),
    };
    let scale = 10u128
        .checked_pow(frac_len)
        .ok_or_else(|| "too many digits".to_string())?;
    mantissa
        .checked_mul(num)
        .and_then(|v| v.checked_mul(1000))
        .map(|v| v / den / scale)
        .ok_or_else(|| "quantity too large".to_string())
}

/// Renders milli-units: a whole number when exact, else `<n>m`.
pub fn format_milli(milli: u128) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// `value × (100 − reserve) / 100`, rounded down.
pub fn reserve(milli: u128, reserve_percent: u32) -> u128 {
    let keep = u128::from(100u32.saturating_sub(reserve_percent));
    milli * keep / 100
}

fn override_milli(
    var: &'static str,
    value: &Option<String>,
) -> Result<Option<u128>, CapacityError> {
    value
        .as_deref()
        .map(|v| {
            parse_quantity_milli(v).map_err(|reason| CapacityError::Quantity {
                var,
                value: v.to_string(),
                reason,
            })
        })
        .transpose()
}

/// Capacity and allocatable from host figures, overrides, the reserve and the pod count.
pub fn compute(
    host: &HostFigures,
    overrides: &CapacityOverrides,
    reserve_percent: u32,
    pods: u32,
) -> Result<Resources, CapacityError> {
    use cocoon_api::contract::env::node as env;
    let mut out = Resources::default();
    // CPU keeps millicore precision; byte resources are whole bytes, so they are truncated to
    // whole units before and after the reserve (the Go agent's `Value()` arithmetic).
    let mut put = |name: &str, cap: u128, alloc_base: u128| {
        let (cap, alloc) = if name == CPU {
            (cap, reserve(alloc_base, reserve_percent))
        } else {
            (
                cap / 1000 * 1000,
                reserve(alloc_base / 1000, reserve_percent) * 1000,
            )
        };
        out.capacity
            .insert(name.to_string(), Quantity(format_milli(cap)));
        out.allocatable
            .insert(name.to_string(), Quantity(format_milli(alloc)));
    };

    let cpu =
        override_milli(env::NODE_CPU, &overrides.cpu)?.unwrap_or(u128::from(host.cpus) * 1000);
    put(CPU, cpu, cpu);

    let mem = override_milli(env::NODE_MEM, &overrides.memory)?
        .unwrap_or(u128::from(host.memory_bytes) * 1000);
    put(MEMORY, mem, mem);

    // Storage: capacity from the total, allocatable from what is actually free (Bavail);
    // an override replaces both.
    match override_milli(env::NODE_STORAGE, &overrides.storage)? {
        Some(v) => put(EPHEMERAL_STORAGE, v, v),
        None => put(
            EPHEMERAL_STORAGE,
            u128::from(host.storage_total_bytes) * 1000,
            u128::from(host.storage_available_bytes) * 1000,
        ),
    }

    let huge = override_milli(env::NODE_HUGEPAGES, &overrides.hugepages)?
        .unwrap_or(u128::from(host.hugepages_bytes) * 1000);
    if huge > 0 {
        put(HUGEPAGES_2MI, huge, huge);
    }

    let pods = Quantity(pods.to_string());
    out.capacity.insert(PODS.to_string(), pods.clone());
    out.allocatable.insert(PODS.to_string(), pods);
    Ok(out)
}

/// Fields of `/proc/meminfo` the agent uses, in their native units (kB or pages).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub mem_total_kib: u64,
    pub mem_available_kib: Option<u64>,
    pub hugepages_total: u64,
    pub hugepage_size_kib: u64,
}

/// Parses `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut info = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok());
        let Some(value) = value else { continue };
        match key.trim() {
            "MemTotal" => info.mem_total_kib = value,
            "MemAvailable" => info.mem_available_kib = Some(value),
            "HugePages_Total" => info.hugepages_total = value,
            "Hugepagesize" => info.hugepage_size_kib = value,
            _ => {}
        }
    }
    info
}

/// Busy CPU seconds from the aggregate `cpu` line of `/proc/stat` (user + nice + system + irq
/// + softirq + steal; idle and iowait excluded), given the clock tick rate.
pub fn parse_proc_stat_busy_seconds(text: &str, ticks_per_second: u64) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    #[allow(clippy::cast_precision_loss)]
    Some(busy as f64 / ticks_per_second.max(1) as f64)
}

/// Size figures of one filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// statvfs of `path`.
// The statvfs field widths differ between targets (u64 here, c_ulong on 32-bit), so the u64
// conversions are only "useless" on some of them.
#[allow(clippy::useless_conversion)]
pub fn statfs(path: &Path) -> Result<FsStats, CapacityError> {
    let read_err = |source| CapacityError::Read {
        path: path.to_path_buf(),
        source,
    };
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| read_err(std::io::Error::other("path contains NUL")))?;
    // SAFETY: statvfs only writes into the zeroed struct we pass and reads the C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(read_err(std::io::Error::last_os_error()));
    }
    let frsize = u64::from(st.f_frsize);
    Ok(FsStats {
        total_bytes: u64::from(st.f_blocks).saturating_mul(frsize),
        available_bytes: u64::from(st.f_bavail).saturating_mul(frsize),
    })
}

/// Reads host figures from a `/proc` root and the cocoon root directory. Tests point
/// `proc_root` at a fake tree.
#[derive(Debug, Clone)]
pub struct HostReader {
    pub proc_root: PathBuf,
    pub cocoon_root_dir: PathBuf,
}

impl HostReader {
    /// Reads the real `/proc`.
    pub fn new(cocoon_root_dir: PathBuf) -> Self {
        HostReader {
            proc_root: PathBuf::from("/proc"),
            cocoon_root_dir,
        }
    }

    fn read(&self, name: &str) -> Result<String, CapacityError> {
        let path = self.proc_root.join(name);
        std::fs::read_to_string(&path).map_err(|source| CapacityError::Read { path, source })
    }

    /// `/proc/meminfo`.
    pub fn meminfo(&self) -> Result<MemInfo, CapacityError> {
        let info = parse_meminfo(&self.read("meminfo")?);
        if info.mem_total_kib == 0 {
            return Err(CapacityError::Field {
                path: self.proc_root.join("meminfo"),
                field: "MemTotal",
            });
        }
        Ok(info)
    }

    /// statfs of the cocoon root directory.
    pub fn root_fs(&self) -> Result<FsStats, CapacityError> {
        statfs(&self.cocoon_root_dir)
    }

    /// Everything §2.3 needs. Fails when meminfo or statfs cannot be read.
    pub fn figures(&self) -> Result<HostFigures, CapacityError> {
        let mem = self.meminfo()?;
        let fs = self.root_fs()?;
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        Ok(HostFigures {
            cpus,
            memory_bytes: mem.mem_total_kib.saturating_mul(1024),
            storage_total_bytes: fs.total_bytes,
            storage_available_bytes: fs.available_bytes,
            hugepages_bytes: mem
                .hugepages_total
                .saturating_mul(mem.hugepage_size_kib)
                .saturating_mul(1024),
        })
    }

    /// `MemTotal − MemAvailable` in bytes, for the node collector.
    pub fn memory_used_bytes(&self) -> Option<u64> {
        let mem = self.meminfo().ok()?;
        let avail = mem.mem_available_kib?;
        Some(mem.mem_total_kib.saturating_sub(avail).saturating_mul(1024))
    }

    /// Busy CPU seconds of the host, for the node collector.
    pub fn node_cpu_seconds(&self) -> Option<f64> {
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100);
        parse_proc_stat_busy_seconds(&self.read("stat").ok()?, hz)
    }
}

/// Reads the host and computes capacity/allocatable for `cfg`.
pub fn read_resources(cfg: impl Into<CapacityConfig>) -> Result<Resources, CapacityError> {
    let cfg = cfg.into();
    let figures = HostReader::new(cfg.cocoon_root_dir).figures()?;
    compute(&figures, &cfg.overrides, cfg.reserve_percent, cfg.pods)
}

/// The host's usage as the kubelet API's stats summary reads it.
impl cocoon_kubelet::NodeUsage for HostReader {
    fn node_cpu_seconds(&self) -> Option<f64> {
        HostReader::node_cpu_seconds(self)
    }

    fn memory_used_bytes(&self) -> Option<u64> {
        HostReader::memory_used_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(m: &BTreeMap<String, Quantity>, k: &str) -> Option<String> {
        m.get(k).map(|q| q.0.clone())
    }

    #[test]
    fn quantities() {
        for (raw, milli) in [
            ("1", 1000),
            ("250m", 250),
            ("1.5", 1500),
            ("2k", 2_000_000),
            ("1Ki", 1_024_000),
            ("1.5Gi", 1_610_612_736_000),
            ("64Gi", 68_719_476_736_000),
            ("1e3", 1_000_000),
            ("0.1m", 0),
        ] {
            assert_eq!(parse_quantity_milli(raw), Ok(milli), "{raw}");
        }
        for bad in ["", "-1", "abc", "1Qi", "1..2", "."] {
            assert!(parse_quantity_milli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn allocatable_math_table() {
        let host = HostFigures {
            cpus: 8,
            memory_bytes: 16 * 1024 * 1024 * 1024,
            storage_total_bytes: 1000,
            storage_available_bytes: 600,
            hugepages_bytes: 0,
        };
        struct Case {
            overrides: CapacityOverrides,
            reserve: u32,
            want: &'static [(&'static str, Option<&'static str>, Option<&'static str>)],
        }
        let cases = [
            Case {
                overrides: CapacityOverrides::default(),
                reserve: 20,
                want: &[
                    (CPU, Some("8"), Some("6400m")),
                    (MEMORY, Some("17179869184"), Some("13743895347")),
                    (EPHEMERAL_STORAGE, Some("1000"), Some("480")),
                    (HUGEPAGES_2MI, None, None),
                    (PODS, Some("7"), Some("7")),
                ],
            },
            Case {
                overrides: CapacityOverrides::default(),
                reserve: 0,
                want: &[
                    (CPU, Some("8"), Some("8")),
                    (EPHEMERAL_STORAGE, Some("1000"), Some("600")),
                ],
            },
            Case {
                overrides: CapacityOverrides::default(),
                reserve: 100,
                want: &[(CPU, Some("8"), Some("0")), (PODS, Some("7"), Some("7"))],
            },
            Case {
                overrides: CapacityOverrides {
                    cpu: Some("3".into()),
                    memory: Some("1Gi".into()),
                    storage: Some("100G".into()),
                    hugepages: Some("2Mi".into()),
                },
                reserve: 33,
                want: &[
                    (CPU, Some("3"), Some("2010m")),
                    (MEMORY, Some("1073741824"), Some("719407022")),
                    (EPHEMERAL_STORAGE, Some("100000000000"), Some("67000000000")),
                    (HUGEPAGES_2MI, Some("2097152"), Some("1405091")),
                ],
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let r = compute(&host, &c.overrides, c.reserve, 7).expect("compute");
            for (name, cap, alloc) in c.want {
                assert_eq!(q(&r.capacity, name).as_deref(), *cap, "case {i} {name} cap");
                assert_eq!(
                    q(&r.allocatable, name).as_deref(),
                    *alloc,
                    "case {i} {name} alloc"
                );
            }
        }
        let with_huge = HostFigures {
            hugepages_bytes: 4 * 2 * 1024 * 1024,
            ..host.clone()
        };
        let r = compute(&with_huge, &CapacityOverrides::default(), 50, 1).expect("compute");
        assert_eq!(q(&r.capacity, HUGEPAGES_2MI).as_deref(), Some("8388608"));
        assert_eq!(q(&r.allocatable, HUGEPAGES_2MI).as_deref(), Some("4194304"));

        let bad = CapacityOverrides {
            cpu: Some("lots".into()),
            ..Default::default()
        };
        let err = compute(&host, &bad, 20, 1).expect_err("bad override");
        assert!(
            err.to_string().starts_with("parse VK_NODE_CPU=\"lots\""),
            "{err}"
        );
    }

    #[test]
    fn meminfo_and_proc_stat() {
        let mem = parse_meminfo(
            "MemTotal:       16315412 kB\nMemFree: 1 kB\nMemAvailable:   8000000 kB\nHugePages_Total:      4\nHugepagesize:       2048 kB\n",
        );
        assert_eq!(
            mem,
            MemInfo {
                mem_total_kib: 16_315_412,
                mem_available_kib: Some(8_000_000),
                hugepages_total: 4,
                hugepage_size_kib: 2048
            }
        );
        let busy =
            parse_proc_stat_busy_seconds("cpu  100 10 50 9999 77 5 5 30 0 0\ncpu0 1 2 3 4\n", 100);
        assert_eq!(busy, Some(2.0));
    }

    #[test]
    fn reads_this_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let figures = HostReader::new(dir.path().to_path_buf())
            .figures()
            .expect("figures");
        assert!(figures.cpus >= 1 && figures.memory_bytes > 0);
        assert!(figures.storage_total_bytes >= figures.storage_available_bytes);
    }
}
