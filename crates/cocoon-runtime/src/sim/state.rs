//! The simulator's persistent state: VMs, snapshots and images, their JSON index files under
//! the root, reference resolution (id, name, id prefix) and random ids.
//!
//! Indexes are rewritten atomically (temp file + rename) after every change, so a restarted
//! simulator with the same root sees exactly what the previous one committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::types::{
    CpuPolicy, NetworkConfig, NicNetwork, STATE_RUNNING, STATE_STOPPED_STALE, SnapshotRecord,
    VmRecord,
};

/// Writes `body` to `path` via a temporary file and a rename, creating parent directories.
pub(crate) fn write_atomic(path: &Path, body: &[u8]) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> io::Result<T> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(e),
    }
}

/// `n` random bytes as lower-case hex. Falls back to hashing time and a counter if the OS
/// RNG is unavailable, which keeps ids unique (if not unpredictable).
pub(crate) fn random_hex(n: usize) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut buf = vec![0u8; n];
    if getrandom::fill(&mut buf).is_err() {
        let mut out = Vec::new();
        while out.len() < n {
            let mut h = Sha256::new();
            h.update(format!(
                "{:?}-{}-{}",
                std::time::SystemTime::now(),
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            out.extend_from_slice(&h.finalize());
        }
        buf.copy_from_slice(&out[..n]);
    }
    hex::encode(buf)
}

/// One NIC of a simulated VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SimNic {
    pub mac: String,
    pub tap: String,
    /// The address: reported in the record for static NICs, leased for DHCP NICs.
    pub ip: String,
    /// Static NIC (its network is in `static_networks`).
    pub is_static: bool,
    /// When the DHCP lease appears in the lease file (`None`: not booted yet, or static).
    pub lease_due: Option<chrono::DateTime<chrono::Utc>>,
}

/// A simulated VM: the stored record plus what the simulator models beyond it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SimVm {
    /// The record as stored (state never reads `stopped (stale)` here).
    pub record: VmRecord,
    /// The simulated hypervisor process is alive.
    pub alive: bool,
    pub nics: Vec<SimNic>,
    /// File name of the guest disk inside the VM's run directory.
    pub disk_file: String,
    /// Guest OS as requested at run (empty for clones).
    pub os: String,
    pub cpu_policy: CpuPolicy,
    pub restore_mode: String,
    /// Injection: `net_resize` fails until the next `start`.
    pub net_resize_broken: bool,
}

impl SimVm {
    /// The record as `inspect`/`list`/events report it.
    pub fn reported(&self) -> VmRecord {
        let mut r = self.record.clone();
        if r.state == STATE_RUNNING && !self.alive {
            r.state = STATE_STOPPED_STALE.to_owned();
        }
        r
    }

    /// Rebuilds `record.network_configs` from the NIC list.
    pub fn sync_nics(&mut self, gateway: &str, prefix: i64, num_queues: i64) {
        self.record.network_configs = self
            .nics
            .iter()
            .map(|n| NetworkConfig {
                tap: n.tap.clone(),
                mac: n.mac.clone(),
                num_queues,
                queue_size: 256,
                backend: "cni".into(),
                bridge_dev: String::new(),
                netns_path: String::new(),
                network: n.is_static.then(|| NicNetwork {
                    ip: n.ip.clone(),
                    gateway: gateway.to_owned(),
                    prefix,
                }),
                extra: serde_json::Map::new(),
            })
            .collect();
    }
}

/// A snapshot entry of the index (cocoon's own index carries `pending` and `data_dir` too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SimSnapshot {
    #[serde(flatten)]
    pub record: SnapshotRecord,
    pub pending: bool,
    pub data_dir: PathBuf,
}

/// An image of the local store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SimImage {
    pub name: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// `oci` | `cloudimg`.
    pub image_type: String,
    pub size: u64,
}

#[derive(Default, Serialize, Deserialize)]
struct VmIndex {
    #[serde(default)]
    vms: BTreeMap<String, SimVm>,
}

#[derive(Default, Serialize, Deserialize)]
struct SnapshotIndex {
    #[serde(default)]
    snapshots: BTreeMap<String, SimSnapshot>,
}

#[derive(Default, Serialize, Deserialize)]
struct ImageIndex {
    #[serde(default)]
    images: BTreeMap<String, SimImage>,
}

/// Everything the simulator knows, guarded by one mutex in the runtime.
#[derive(Default)]
pub(crate) struct State {
    /// VMs by id.
    pub vms: BTreeMap<String, SimVm>,
    /// Snapshots by name (pending imports included, never persisted).
    pub snapshots: BTreeMap<String, SimSnapshot>,
    /// Images by name.
    pub images: BTreeMap<String, SimImage>,
    /// Active holds per snapshot name (`clone`, `export`), for `snapshot rm`'s lock check.
    pub holds: HashMap<String, Vec<&'static str>>,
    /// VM ids whose create call is still in flight (for `reconcile_stale_create`).
    pub creating: HashSet<String>,
    /// Next synthetic PID.
    pub next_pid: i64,
    /// Last lease-file content written, to skip identical rewrites.
    pub last_leases: Option<Vec<super::net::Lease>>,
}

/// Paths of the simulator's files under its root.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn vm_index(&self) -> PathBuf {
        self.root.join("sim/vms.json")
    }
    pub fn snapshot_index(&self) -> PathBuf {
        self.root.join("snapshot/db/snapshots.json")
    }
    pub fn image_index(&self) -> PathBuf {
        self.root.join("sim/images.json")
    }
    pub fn image_blobs(&self) -> PathBuf {
        self.root.join("sim/images")
    }
    pub fn snapshot_data(&self) -> PathBuf {
        self.root.join("snapshot/localfile")
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("sim/tmp")
    }
    /// `<root>/run/<cloudhypervisor|firecracker>/<id>/`, like cocoon's per-VM run dir.
    pub fn vm_dir(&self, hypervisor: &str, id: &str) -> PathBuf {
        let dir = if hypervisor == crate::types::HYPERVISOR_FC {
            "firecracker"
        } else {
            "cloudhypervisor"
        };
        self.root.join("run").join(dir).join(id)
    }
}

impl State {
    /// Loads the indexes under `layout`; pending imports of a previous process are dropped
    /// with their data.
    pub fn load(layout: &Layout) -> io::Result<State> {
        let vms: VmIndex = read_json(&layout.vm_index())?;
        let snaps: SnapshotIndex = read_json(&layout.snapshot_index())?;
        let images: ImageIndex = read_json(&layout.image_index())?;
        let mut snapshots = snaps.snapshots;
        snapshots.retain(|_, s| {
            if s.pending {
                let _ = std::fs::remove_dir_all(&s.data_dir);
            }
            !s.pending
        });
        let next_pid = vms
            .vms
            .values()
            .map(|v| v.record.pid)
            .max()
            .unwrap_or(0)
            .max(20_000)
            + 1;
        Ok(State {
            vms: vms.vms,
            snapshots,
            images: images.images,
            next_pid,
            ..State::default()
        })
    }

    pub fn save_vms(&self, layout: &Layout) -> io::Result<()> {
        #[derive(Serialize)]
        struct Out<'a> {
            vms: &'a BTreeMap<String, SimVm>,
        }
        let body = serde_json::to_vec_pretty(&Out { vms: &self.vms }).map_err(io::Error::other)?;
        write_atomic(&layout.vm_index(), &body)
    }

    pub fn save_snapshots(&self, layout: &Layout) -> io::Result<()> {
        #[derive(Serialize)]
        struct Out<'a> {
            snapshots: BTreeMap<&'a String, &'a SimSnapshot>,
        }
        let snapshots = self.snapshots.iter().filter(|(_, s)| !s.pending).collect();
        let body = serde_json::to_vec_pretty(&Out { snapshots }).map_err(io::Error::other)?;
        write_atomic(&layout.snapshot_index(), &body)
    }

    pub fn save_images(&self, layout: &Layout) -> io::Result<()> {
        #[derive(Serialize)]
        struct Out<'a> {
            images: &'a BTreeMap<String, SimImage>,
        }
        let body = serde_json::to_vec_pretty(&Out {
            images: &self.images,
        })
        .map_err(io::Error::other)?;
        write_atomic(&layout.image_index(), &body)
    }

    /// Resolves a VM reference: exact id, then name, then a unique id prefix of ≥ 3
    /// characters.
    pub fn resolve_vm(&self, r: &str) -> Option<&SimVm> {
        if r.is_empty() {
            return None;
        }
        if let Some(vm) = self.vms.get(r) {
            return Some(vm);
        }
        if let Some(vm) = self.vms.values().find(|v| v.record.config.name == r) {
            return Some(vm);
        }
        if r.len() < 3 {
            return None;
        }
        let mut hits = self.vms.values().filter(|v| v.record.id.starts_with(r));
        match (hits.next(), hits.next()) {
            (Some(vm), None) => Some(vm),
            _ => None,
        }
    }

    /// The id of [`resolve_vm`](Self::resolve_vm).
    pub fn resolve_vm_id(&self, r: &str) -> Option<String> {
        self.resolve_vm(r).map(|v| v.record.id.clone())
    }

    /// Resolves a committed snapshot as `runtime.md` §4/§7.2 say, in the same order as VMs:
    /// exact id, then name, then a unique id prefix (≥ 3). So a name that is another
    /// snapshot's id, or an id prefix, reaches that snapshot: callers that mean a name must
    /// check the record's name (the node agent does).
    pub fn resolve_snapshot(&self, r: &str) -> Option<&SimSnapshot> {
        if r.is_empty() {
            return None;
        }
        let committed = || self.snapshots.values().filter(|s| !s.pending);
        let mut exact = committed().filter(|s| s.record.id == r);
        if let (Some(s), None) = (exact.next(), exact.next()) {
            return Some(s);
        }
        if let Some(s) = self.snapshots.get(r).filter(|s| !s.pending) {
            return Some(s);
        }
        if r.len() < 3 {
            return None;
        }
        let mut hits = committed().filter(|s| s.record.id.starts_with(r));
        match (hits.next(), hits.next()) {
            (Some(s), None) => Some(s),
            _ => None,
        }
    }

    /// An image by name, by `sha256:<hex>` digest or by bare hex digest.
    pub fn find_image(&self, r: &str) -> Option<&SimImage> {
        self.images.get(r).or_else(|| {
            let hex = r.strip_prefix("sha256:").unwrap_or(r);
            (!hex.is_empty())
                .then(|| {
                    self.images
                        .values()
                        .find(|i| i.digest.strip_prefix("sha256:") == Some(hex))
                })
                .flatten()
        })
    }

    /// Every MAC in use.
    pub fn macs(&self) -> HashSet<String> {
        self.vms
            .values()
            .flat_map(|v| v.nics.iter().map(|n| n.mac.clone()))
            .collect()
    }

    /// Every IP in use.
    pub fn ips(&self) -> HashSet<std::net::Ipv4Addr> {
        self.vms
            .values()
            .flat_map(|v| v.nics.iter().filter_map(|n| n.ip.parse().ok()))
            .collect()
    }

    /// A fresh synthetic PID.
    pub fn take_pid(&mut self) -> i64 {
        let pid = self.next_pid.max(20_001);
        self.next_pid = pid + 1;
        pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(id: &str, name: &str) -> SimVm {
        let mut record = VmRecord {
            id: id.into(),
            state: STATE_RUNNING.into(),
            ..VmRecord::default()
        };
        record.config.name = name.into();
        SimVm {
            record,
            alive: true,
            nics: Vec::new(),
            disk_file: "cow.raw".into(),
            os: String::new(),
            cpu_policy: CpuPolicy::default(),
            restore_mode: String::new(),
            net_resize_broken: false,
        }
    }

    #[test]
    fn vm_references_resolve_by_id_name_and_unique_prefix() {
        let mut st = State::default();
        for (id, name) in [("abc111", "one"), ("abc222", "two"), ("def333", "abc")] {
            st.vms.insert(id.into(), vm(id, name));
        }
        let id = |r: &str| st.resolve_vm_id(r);
        assert_eq!(id("abc111").as_deref(), Some("abc111"));
        assert_eq!(id("two").as_deref(), Some("abc222"));
        // A name wins over an id prefix.
        assert_eq!(id("abc").as_deref(), Some("def333"));
        assert_eq!(id("def").as_deref(), Some("def333"));
        assert_eq!(id("abc1").as_deref(), Some("abc111"));
        assert_eq!(id("ab"), None, "prefix shorter than 3");
        assert_eq!(id("abc2").as_deref(), Some("abc222"));
        assert_eq!(id(""), None);
        st.vms.remove("def333");
        assert_eq!(st.resolve_vm_id("abc"), None, "ambiguous prefix");
    }

    #[test]
    fn snapshot_references_resolve_by_id_name_and_unique_prefix() {
        let mut st = State::default();
        for (id, name) in [("ABC111", "one"), ("ABC222", "two"), ("DEF333", "ABC")] {
            st.snapshots.insert(
                name.into(),
                SimSnapshot {
                    record: SnapshotRecord {
                        id: id.into(),
                        name: name.into(),
                        ..SnapshotRecord::default()
                    },
                    pending: false,
                    data_dir: PathBuf::new(),
                },
            );
        }
        let name = |st: &State, r: &str| st.resolve_snapshot(r).map(|s| s.record.name.clone());
        assert_eq!(name(&st, "ABC111").as_deref(), Some("one"), "exact id");
        assert_eq!(name(&st, "two").as_deref(), Some("two"), "name");
        assert_eq!(
            name(&st, "ABC").as_deref(),
            Some("ABC"),
            "a name wins over an id prefix"
        );
        assert_eq!(name(&st, "DEF").as_deref(), Some("ABC"), "unique id prefix");
        assert_eq!(
            name(&st, "ABC2").as_deref(),
            Some("two"),
            "unique id prefix"
        );
        assert_eq!(name(&st, "DE"), None, "prefix shorter than 3");
        assert_eq!(name(&st, ""), None);
        // An exact id wins over a name.
        st.snapshots.get_mut("two").expect("two").record.id = "one".into();
        assert_eq!(
            name(&st, "one").as_deref(),
            Some("two"),
            "exact id before name"
        );
    }

    #[test]
    fn stale_is_reported_not_stored() {
        let mut v = vm("a", "n");
        v.alive = false;
        assert_eq!(v.reported().state, STATE_STOPPED_STALE);
        assert_eq!(v.record.state, STATE_RUNNING);
    }

    #[test]
    fn indexes_persist_and_pending_imports_are_dropped() {
        let dir = tempfile::tempdir().expect("tmp");
        let layout = Layout {
            root: dir.path().to_path_buf(),
        };
        let mut st = State::default();
        st.vms.insert("a".into(), vm("a", "n"));
        let pending_dir = dir.path().join("pending");
        std::fs::create_dir_all(&pending_dir).expect("mkdir");
        for (name, pending, data_dir) in [
            ("s1", false, dir.path().join("s1")),
            ("s2", true, pending_dir.clone()),
        ] {
            st.snapshots.insert(
                name.into(),
                SimSnapshot {
                    record: SnapshotRecord {
                        id: format!("id-{name}"),
                        name: name.into(),
                        ..SnapshotRecord::default()
                    },
                    pending,
                    data_dir,
                },
            );
        }
        st.save_vms(&layout).expect("vms");
        st.save_snapshots(&layout).expect("snaps");
        st.save_images(&layout).expect("images");
        let back = State::load(&layout).expect("load");
        assert_eq!(back.vms, st.vms);
        assert_eq!(back.snapshots.keys().collect::<Vec<_>>(), ["s1"]);
        let text = std::fs::read_to_string(layout.snapshot_index()).expect("read");
        assert!(text.contains("\"pending\": false") && text.contains("\"data_dir\""));
        assert!(back.resolve_snapshot("id-s1").is_some());
        assert!(back.resolve_snapshot("s2").is_none());
    }

    #[test]
    fn random_ids_are_hex_and_distinct() {
        let a = random_hex(16);
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_hex(16));
    }
}
