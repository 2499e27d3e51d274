//! The simulator's configuration: [`SimConfig`] and its `VK_SIM_*` environment knobs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::control::{CollisionWording, ImageKind, Latencies, MAX_LATENCY_SCALE};
use super::guest::{DiskFill, DiskSpec, MemoryFill};
use super::net::IpPool;
use crate::args::quantity_bytes;
use crate::error::{Result, RuntimeError};
use crate::heal::RetryPolicy;

/// Configuration of the simulator (the knobs that cannot change at run time are here; the
/// rest is also adjustable through [`SimHandle`](super::SimHandle)).
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// State root.
    pub root: PathBuf,
    /// The cocoon-net lease file (the node agent's `VK_LEASES_PATH`).
    pub lease_path: PathBuf,
    /// Address pool for DHCP leases and static NICs.
    pub ip_pool: IpPool,
    /// Networks whose NICs are static (IP in the record); every other network is DHCP.
    pub static_networks: BTreeSet<String>,
    /// Delay between boot and the DHCP lease appearing in the lease file.
    pub lease_delay: Duration,
    /// Lease validity; expiries are renewed by whole periods.
    pub lease_ttl: Duration,
    /// Event-stream tick interval (changes made by the simulator tick immediately).
    pub tick_interval: Duration,
    /// Per-verb latencies.
    pub latencies: Latencies,
    /// Size and fill of new guest disks (and so of snapshot disk files).
    pub disk: DiskSpec,
    /// Logical size of a snapshot's `memory-ranges` (a small header, then [`Self::memory_fill`]).
    pub memory_file_size: u64,
    /// What `memory-ranges` holds after its header (default: a hole).
    pub memory_fill: MemoryFill,
    /// Images `ensure_image` can pull.
    pub known_images: BTreeMap<String, ImageKind>,
    /// Pull any image ref.
    pub permissive_pull: bool,
    /// Collision wording of `snapshot save`.
    pub collision_wording: CollisionWording,
    /// §3.3 retry of a locked holder during save healing.
    pub save_retry: RetryPolicy,
    /// Ports each running VM serves a TCP echo on, bound on its addresses; the echoed bytes
    /// are its TAP counters (issue 39). Empty (the default): none.
    pub echo_ports: Vec<u16>,
}

impl SimConfig {
    /// Defaults under `root`: lease file `<root>/net/leases.json`, pool `10.88.0.0/16`, no
    /// static networks, lease delay 100 ms, tick 1 s, 16 MiB sparse disks, 64 KiB memory files.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        SimConfig {
            lease_path: root.join("net/leases.json"),
            root,
            ip_pool: IpPool::default(),
            static_networks: BTreeSet::new(),
            lease_delay: Duration::from_millis(100),
            lease_ttl: Duration::from_secs(3600),
            tick_interval: Duration::from_secs(1),
            latencies: Latencies::default(),
            disk: DiskSpec::default(),
            memory_file_size: 64 << 10,
            memory_fill: MemoryFill::Sparse,
            known_images: BTreeMap::new(),
            permissive_pull: false,
            collision_wording: CollisionWording::default(),
            save_retry: RetryPolicy::default(),
            echo_ports: Vec::new(),
        }
    }

    /// [`new`](Self::new) plus the environment (read through `get`):
    ///
    /// | env | effect |
    /// |---|---|
    /// | `VK_LEASES_PATH` | lease file |
    /// | `VK_SIM_LEASE_DELAY_MS` | lease delay |
    /// | `VK_SIM_TICK_MS` | event tick interval |
    /// | `VK_SIM_LATENCY_SCALE` | multiply every latency (e.g. `20` for a slow-motion demo) |
    /// | `VK_SIM_DISK_SIZE` | guest disk size (Quantity, e.g. `256Mi`) |
    /// | `VK_SIM_DISK_FILL` | `sparse` or `filled` |
    /// | `VK_SIM_MEMORY_SIZE` | logical size of a snapshot's `memory-ranges` (Quantity) |
    /// | `VK_SIM_MEMORY_FILL` | `sparse` (a hole) or `realistic` (like a real guest's image) |
    /// | `VK_SIM_IMAGES` | pullable images, comma separated, `ref` or `ref=cloudimg` |
    /// | `VK_SIM_PERMISSIVE_PULL` | `true`: any ref can be pulled |
    /// | `VK_SIM_STATIC_NETWORKS` | comma-separated static networks |
    /// | `VK_SIM_IP_POOL` | CIDR of the address pool |
    /// | `VK_SIM_COLLISION_WORDING` | `already-exists`, `in-use-by` or `held-by` |
    /// | `VK_SIM_ECHO_PORTS` | comma-separated ports every running VM echoes TCP on (its IP must be local to the host, e.g. a pool in 198.18.0.0/15 routed `local` on `lo`) |
    pub fn from_env(root: PathBuf, get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut cfg = SimConfig::new(root);
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let bad = |k: &str, v: &str| RuntimeError::Other(format!("invalid {k}={v:?}"));
        let millis = |k: &str| -> Result<Option<Duration>> {
            get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map(Duration::from_millis)
                        .map_err(|_| bad(k, &v))
                })
                .transpose()
        };
        if let Some(p) = get(cocoon_api::contract::env::node::LEASES_PATH) {
            cfg.lease_path = PathBuf::from(p);
        }
        if let Some(d) = millis("VK_SIM_LEASE_DELAY_MS")? {
            cfg.lease_delay = d;
        }
        if let Some(d) = millis("VK_SIM_TICK_MS")? {
            cfg.tick_interval = d;
        }
        if let Some(v) = get("VK_SIM_LATENCY_SCALE") {
            let f: f64 = v
                .parse()
                .ok()
                .filter(|f: &f64| (0.0..=MAX_LATENCY_SCALE).contains(f))
                .ok_or_else(|| bad("VK_SIM_LATENCY_SCALE", &v))?;
            cfg.latencies = cfg.latencies.scaled(f);
        }
        if let Some(v) = get("VK_SIM_DISK_SIZE") {
            let size = quantity_bytes(&v)
                .and_then(|b| u64::try_from(b).ok())
                .ok_or_else(|| bad("VK_SIM_DISK_SIZE", &v))?;
            cfg.disk.size = size;
        }
        if let Some(v) = get("VK_SIM_DISK_FILL") {
            cfg.disk.fill = match v.as_str() {
                "sparse" => DiskFill::Sparse,
                "filled" => DiskFill::Filled,
                _ => return Err(bad("VK_SIM_DISK_FILL", &v)),
            };
        }
        if let Some(v) = get("VK_SIM_MEMORY_SIZE") {
            let size = quantity_bytes(&v)
                .and_then(|b| u64::try_from(b).ok())
                .ok_or_else(|| bad("VK_SIM_MEMORY_SIZE", &v))?;
            cfg.memory_file_size = size;
        }
        if let Some(v) = get("VK_SIM_MEMORY_FILL") {
            cfg.memory_fill = match v.as_str() {
                "sparse" => MemoryFill::Sparse,
                "realistic" => MemoryFill::Realistic,
                _ => return Err(bad("VK_SIM_MEMORY_FILL", &v)),
            };
        }
        if let Some(v) = get("VK_SIM_IMAGES") {
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (name, kind) = match item.rsplit_once('=') {
                    Some((n, "cloudimg")) => (n, ImageKind::CloudImg),
                    Some((n, "oci")) => (n, ImageKind::Oci),
                    Some(_) => return Err(bad("VK_SIM_IMAGES", item)),
                    None => (item, guess_kind(item)),
                };
                cfg.known_images.insert(name.to_owned(), kind);
            }
        }
        if let Some(v) = get("VK_SIM_PERMISSIVE_PULL") {
            cfg.permissive_pull = matches!(v.as_str(), "true" | "1");
        }
        if let Some(v) = get("VK_SIM_STATIC_NETWORKS") {
            cfg.static_networks = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(v) = get("VK_SIM_IP_POOL") {
            cfg.ip_pool = IpPool::parse(&v)?;
        }
        if let Some(v) = get("VK_SIM_ECHO_PORTS") {
            cfg.echo_ports =
                super::echo::parse_ports(&v).ok_or_else(|| bad("VK_SIM_ECHO_PORTS", &v))?;
        }
        if let Some(v) = get("VK_SIM_COLLISION_WORDING") {
            cfg.collision_wording = match v.as_str() {
                "already-exists" => CollisionWording::AlreadyExists,
                "in-use-by" => CollisionWording::InUseBy,
                "held-by" => CollisionWording::HeldBy,
                _ => return Err(bad("VK_SIM_COLLISION_WORDING", &v)),
            };
        }
        Ok(cfg)
    }
}

/// Cloud image for URLs and qcow2/img names, OCI otherwise.
pub(super) fn guess_kind(image: &str) -> ImageKind {
    let lower = image.to_ascii_lowercase();
    if lower.starts_with("http://")
        || lower.starts_with("https://")
        || lower.ends_with(".qcow2")
        || lower.ends_with(".img")
    {
        ImageKind::CloudImg
    } else {
        ImageKind::Oci
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_scale_out_of_range_is_an_error_naming_the_variable() {
        let with = |v: &'static str| {
            SimConfig::from_env(PathBuf::from("/nonexistent"), move |k| {
                (k == "VK_SIM_LATENCY_SCALE").then(|| v.to_owned())
            })
        };
        assert!(with("20").is_ok());
        assert!(with("0").is_ok());
        for bad in ["inf", "NaN", "-1", "1e300", "1000001", "fast"] {
            let err = with(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("VK_SIM_LATENCY_SCALE"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn memory_size_and_fill_come_from_the_environment() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            SimConfig::from_env(PathBuf::from("/nonexistent"), move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            })
        };
        let c = with(&[
            ("VK_SIM_MEMORY_SIZE", "2Gi"),
            ("VK_SIM_MEMORY_FILL", "realistic"),
        ])
        .expect("valid");
        assert_eq!(c.memory_file_size, 2 << 30);
        assert_eq!(c.memory_fill, MemoryFill::Realistic);
        let c = with(&[]).expect("defaults");
        assert_eq!(
            (c.memory_file_size, c.memory_fill),
            (64 << 10, MemoryFill::Sparse)
        );
        for (k, v) in [
            ("VK_SIM_MEMORY_SIZE", "lots"),
            ("VK_SIM_MEMORY_FILL", "dense"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(k, v)]));
            let err = with(pairs).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(k), "{k}={v}: {err:?}");
        }
    }
}
