//! Host-side resource usage of a real VM (§7.11's counterpart for the CLI backend): RSS and CPU
//! time of the hypervisor process from procfs, traffic counters of its TAPs from sysfs.
//!
//! The parsers are pure; [`read_stats`] takes the procfs/sysfs roots so tests can point it at
//! a fixture directory.

use std::path::Path;

use super::error::{Result, RuntimeError};
use super::types::{TapStats, VmRecord, VmStats};

/// Linux reports `/proc/<pid>/stat` times in USER_HZ, which the kernel ABI fixes at 100.
const USER_HZ: u64 = 100;

/// utime + stime (fields 14 and 15) of `/proc/<pid>/stat`, in nanoseconds. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_proc_stat_cpu_ns(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the command: state is field 3, so utime (14) is the 12th item here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    (utime + stime).checked_mul(1_000_000_000 / USER_HZ)
}

/// `VmRSS:` of `/proc/<pid>/status`, in bytes.
pub fn parse_proc_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn read_counter(dir: &Path, name: &str) -> u64 {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads the stats of `vm` under `proc_root` (normally `/proc`) and `sys_net_root` (normally
/// `/sys/class/net`). A VM with no PID reports zeros; an unreadable process is an error
/// (it has exited); a missing TAP reports zero counters.
pub fn read_stats(vm: &VmRecord, proc_root: &Path, sys_net_root: &Path) -> Result<VmStats> {
    let taps = vm
        .network_configs
        .iter()
        .filter(|n| !n.tap.is_empty())
        .map(|n| {
            let dir = sys_net_root.join(&n.tap).join("statistics");
            TapStats {
                tap: n.tap.clone(),
                rx_bytes: read_counter(&dir, "rx_bytes"),
                tx_bytes: read_counter(&dir, "tx_bytes"),
                rx_packets: read_counter(&dir, "rx_packets"),
                tx_packets: read_counter(&dir, "tx_packets"),
            }
        })
        .collect();
    if vm.pid <= 0 {
        return Ok(VmStats {
            pid: 0,
            taps,
            ..VmStats::default()
        });
    }
    let pid_dir = proc_root.join(vm.pid.to_string());
    let read = |name: &str| {
        std::fs::read_to_string(pid_dir.join(name))
            .map_err(|e| RuntimeError::Other(format!("stats of vm {}: read {name}: {e}", vm.id)))
    };
    let stat = read("stat")?;
    let status = read("status")?;
    Ok(VmStats {
        pid: vm.pid,
        rss_bytes: parse_proc_status_rss(&status).unwrap_or(0),
        cpu_time_ns: parse_proc_stat_cpu_ns(&stat).unwrap_or(0),
        taps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NetworkConfig;

    const STAT: &str =
        "4242 (cloud hyper)visor) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 0 0";

    #[test]
    fn proc_parsers() {
        // utime 250 + stime 50 ticks = 3 s.
        assert_eq!(parse_proc_stat_cpu_ns(STAT), Some(3_000_000_000));
        assert_eq!(parse_proc_stat_cpu_ns("garbage"), None);
        assert_eq!(
            parse_proc_status_rss("Name:\tch\nVmRSS:\t  2048 kB\n"),
            Some(2 * 1024 * 1024)
        );
        assert_eq!(parse_proc_status_rss("Name:\tch\n"), None);
    }

    #[test]
    fn reads_fixture_tree() {
        let dir = tempfile::tempdir().expect("tmp");
        let proc_root = dir.path().join("proc");
        let sys = dir.path().join("net");
        std::fs::create_dir_all(proc_root.join("4242")).expect("mkdir");
        std::fs::write(proc_root.join("4242/stat"), STAT).expect("write");
        std::fs::write(proc_root.join("4242/status"), "VmRSS:\t100 kB\n").expect("write");
        std::fs::create_dir_all(sys.join("tap0/statistics")).expect("mkdir");
        std::fs::write(sys.join("tap0/statistics/rx_bytes"), "1234\n").expect("write");

        let mut vm = VmRecord {
            id: "v".into(),
            pid: 4242,
            ..VmRecord::default()
        };
        for tap in ["tap0", "tapgone"] {
            vm.network_configs.push(NetworkConfig {
                tap: tap.into(),
                ..NetworkConfig::default()
            });
        }
        let st = read_stats(&vm, &proc_root, &sys).expect("stats");
        assert_eq!(st.pid, 4242);
        assert_eq!(st.rss_bytes, 102_400);
        assert_eq!(st.cpu_time_ns, 3_000_000_000);
        assert_eq!(st.taps[0].rx_bytes, 1234);
        assert_eq!(
            st.taps[1],
            TapStats {
                tap: "tapgone".into(),
                ..TapStats::default()
            }
        );

        vm.pid = 999;
        assert!(read_stats(&vm, &proc_root, &sys).is_err(), "exited process");
        vm.pid = 0;
        assert_eq!(
            read_stats(&vm, &proc_root, &sys).expect("zeros").rss_bytes,
            0
        );
    }
}
