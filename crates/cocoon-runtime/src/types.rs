//! The records the runtime returns (VM record §2.1, snapshot record §2.2) with the exact JSON
//! field names `cocoon` prints, and the typed inputs of every operation (§1).
//!
//! Records keep unknown JSON fields in `extra` so an event or inspect result round-trips in
//! full even when a newer `cocoon` adds fields. Go prints `null` for empty slices and maps, so
//! every collection field reads `null` as empty.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use cocoon_api::contract::Backend;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::io::{AsyncRead, AsyncWrite};

/// `state` of a VM that is up. The node agent treats every other state as down.
pub const STATE_RUNNING: &str = "running";
/// `state` while `vm run`/`vm clone` is still creating the VM.
pub const STATE_CREATING: &str = "creating";
/// `state` after create, before the first start.
pub const STATE_CREATED: &str = "created";
/// `state` of a stopped VM.
pub const STATE_STOPPED: &str = "stopped";
/// `state` of a VM whose hypervisor failed.
pub const STATE_ERROR: &str = "error";
/// `state` reported when the record says running but the hypervisor process is dead.
pub const STATE_STOPPED_STALE: &str = "stopped (stale)";

/// `hypervisor` value of cloud-hypervisor VMs and snapshots.
pub const HYPERVISOR_CH: &str = "cloud-hypervisor";
/// `hypervisor` value of Firecracker VMs and snapshots.
pub const HYPERVISOR_FC: &str = "firecracker";
/// `image_type` of OCI images.
pub const IMAGE_TYPE_OCI: &str = "oci";
/// `image_type` of cloud images (qcow2).
pub const IMAGE_TYPE_CLOUDIMG: &str = "cloudimg";

/// Reads `null` (Go's empty slice/map) as the default value.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + DeserializeOwned,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Reads a list whose entries may be `null` (cocoon v0.5.x's `[]*NetworkConfig` prints a nil
/// entry as `null`): the list itself may be `null` too; `null` entries carry nothing and are
/// dropped.
fn null_entries_dropped<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let list = Option::<Vec<Option<T>>>::deserialize(d)?.unwrap_or_default();
    Ok(list.into_iter().flatten().collect())
}

/// A set of ids, printed by cocoon as a JSON object of empty objects (`{"<id>": {}}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSet(pub BTreeSet<String>);

impl IdSet {
    /// True when the set holds `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

impl<S: Into<String>> FromIterator<S> for IdSet {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        IdSet(iter.into_iter().map(Into::into).collect())
    }
}

impl Serialize for IdSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let empty = serde_json::Map::new();
        s.collect_map(self.0.iter().map(|k| (k, &empty)))
    }
}

impl<'de> Deserialize<'de> for IdSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map: Option<BTreeMap<String, serde_json::Value>> = Option::deserialize(d)?;
        Ok(IdSet(map.unwrap_or_default().into_keys().collect()))
    }
}

/// `config` of a VM record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmConfig {
    /// vCPU count.
    #[serde(default)]
    pub cpu: i64,
    /// Memory in bytes.
    #[serde(default)]
    pub memory: i64,
    /// Root disk size in bytes.
    #[serde(default)]
    pub storage: i64,
    /// virtio-net queue size.
    #[serde(default)]
    pub queue_size: i64,
    /// virtio-blk queue size.
    #[serde(default)]
    pub disk_queue_size: i64,
    /// Image reference the VM was built from (for clones: the snapshot's image).
    #[serde(default)]
    pub image: String,
    /// Image digest.
    #[serde(default)]
    pub image_digest: String,
    /// `oci` | `cloudimg`.
    #[serde(default)]
    pub image_type: String,
    /// CNI network name.
    #[serde(default)]
    pub network: String,
    /// Disk opened without O_DIRECT.
    #[serde(default)]
    pub no_direct_io: bool,
    /// Windows guest.
    #[serde(default)]
    pub windows: bool,
    /// VM name (unique per host).
    #[serde(default)]
    pub name: String,
    /// Fields this version does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `network` of a NIC: present only for static NICs with an address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicNetwork {
    /// Static IPv4 address; empty means DHCP.
    #[serde(default)]
    pub ip: String,
    /// Gateway.
    #[serde(default)]
    pub gateway: String,
    /// Prefix length.
    #[serde(default)]
    pub prefix: i64,
}

/// One entry of `network_configs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Host TAP device.
    #[serde(default)]
    pub tap: String,
    /// Guest MAC.
    #[serde(default)]
    pub mac: String,
    /// Queue pairs.
    #[serde(default)]
    pub num_queues: i64,
    /// Queue size.
    #[serde(default)]
    pub queue_size: i64,
    /// `cni` | `bridge`.
    #[serde(default)]
    pub backend: String,
    /// Bridge device (bridge backend).
    #[serde(default)]
    pub bridge_dev: String,
    /// Network namespace (CNI backend).
    #[serde(default)]
    pub netns_path: String,
    /// Static addressing; `None` (absent or null) means DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NicNetwork>,
    /// Fields this version does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl NetworkConfig {
    /// The static IP, or `""` for a DHCP NIC (missing/null `network` or an empty `ip`).
    pub fn static_ip(&self) -> &str {
        self.network.as_ref().map(|n| n.ip.as_str()).unwrap_or("")
    }

    /// True for a DHCP NIC.
    pub fn is_dhcp(&self) -> bool {
        self.static_ip().is_empty()
    }
}

/// One entry of `storage_configs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StorageConfig {
    /// Backing file.
    #[serde(default)]
    pub path: String,
    /// Read-only.
    #[serde(default)]
    pub ro: bool,
    /// Disk serial.
    #[serde(default)]
    pub serial: String,
    /// `layer` | `cow` | `cidata` | `data`.
    #[serde(default)]
    pub role: String,
    /// Fields this version does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A VM record (§2.1) as printed by `vm inspect`, `vm list -o json`, `vm clone/run --output
/// json` and the event stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    /// Generated id.
    #[serde(default)]
    pub id: String,
    /// `cloud-hypervisor` | `firecracker`.
    #[serde(default)]
    pub hypervisor: String,
    /// `creating`, `created`, `running`, `stopped`, `error` or `stopped (stale)`.
    #[serde(default)]
    pub state: String,
    /// Guest configuration; `config.name` is the VM name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub config: VmConfig,
    /// Hypervisor PID (0 when not running).
    #[serde(default)]
    pub pid: i64,
    /// Hypervisor API socket.
    #[serde(default)]
    pub socket_path: String,
    /// NICs, first NIC first; `null` entries (v0.5.x) are dropped.
    #[serde(default, deserialize_with = "null_entries_dropped")]
    pub network_configs: Vec<NetworkConfig>,
    /// Disks; `null` entries are dropped.
    #[serde(default, deserialize_with = "null_entries_dropped")]
    pub storage_configs: Vec<StorageConfig>,
    /// True once the VM has booted (or was restored from a snapshot).
    #[serde(default)]
    pub first_booted: bool,
    /// Snapshots taken from this VM.
    #[serde(default)]
    pub snapshot_ids: IdSet,
    /// Creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Last record update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
    /// Last start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// Last stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<DateTime<Utc>>,
    /// Fields this version does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl VmRecord {
    /// The VM name (`config.name`).
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// True only for the exact state `running`.
    pub fn is_running(&self) -> bool {
        self.state == STATE_RUNNING
    }

    /// MAC of the first NIC, or `""`.
    pub fn mac(&self) -> &str {
        self.network_configs
            .first()
            .map(|n| n.mac.as_str())
            .unwrap_or("")
    }

    /// Static IP of the first NIC, or `""` (no NIC, or a DHCP first NIC).
    pub fn ip(&self) -> &str {
        self.network_configs
            .first()
            .map(NetworkConfig::static_ip)
            .unwrap_or("")
    }

    /// Every static IP, in NIC order (the IP list of the event tuple, §5).
    pub fn ips(&self) -> Vec<&str> {
        self.network_configs
            .iter()
            .map(NetworkConfig::static_ip)
            .filter(|ip| !ip.is_empty())
            .collect()
    }
}

/// A snapshot record (§2.2) as printed by `snapshot inspect` / `snapshot list -o json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// vCPUs of the source VM.
    #[serde(default)]
    pub cpu: i64,
    /// Memory in bytes.
    #[serde(default)]
    pub memory: i64,
    /// Disk size in bytes.
    #[serde(default)]
    pub storage: i64,
    /// virtio-net queue size.
    #[serde(default)]
    pub queue_size: i64,
    /// virtio-blk queue size.
    #[serde(default)]
    pub disk_queue_size: i64,
    /// Base image reference.
    #[serde(default)]
    pub image: String,
    /// Base image digest.
    #[serde(default)]
    pub image_digest: String,
    /// `oci` | `cloudimg`.
    #[serde(default)]
    pub image_type: String,
    /// CNI network of the source VM.
    #[serde(default)]
    pub network: String,
    /// Disk opened without O_DIRECT.
    #[serde(default)]
    pub no_direct_io: bool,
    /// Windows guest.
    #[serde(default)]
    pub windows: bool,
    /// Snapshot id: the snapshot identity, kept across export/import.
    #[serde(default)]
    pub id: String,
    /// Local name.
    #[serde(default)]
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Image blob ids (hex), a set.
    #[serde(default)]
    pub image_blob_ids: IdSet,
    /// `cloud-hypervisor` | `firecracker`.
    #[serde(default)]
    pub hypervisor: String,
    /// NIC count at save time.
    #[serde(default)]
    pub nics: i64,
    /// Save time; absent in the export envelope (§2.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Fields this version does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// CPU policy flags of `vm clone` / `vm run` (node.md §6.8). A zero field is not emitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPolicy {
    /// `--cpu-weight`.
    pub weight: u64,
    /// `--cpu-quota-us`.
    pub quota_us: u64,
    /// `--cpu-period-us`.
    pub period_us: u64,
}

impl CpuPolicy {
    /// True when no flag would be emitted.
    pub fn is_empty(&self) -> bool {
        self.weight == 0 && self.quota_us == 0 && self.period_us == 0
    }
}

/// Where a clone comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CloneSource {
    /// A snapshot in the local store, by name.
    Snapshot(String),
    /// `--from-dir`: a directory holding `snapshot.json` and the data files.
    Dir(PathBuf),
}

impl CloneSource {
    /// The snapshot name or the directory, for messages.
    pub fn label(&self) -> String {
        match self {
            CloneSource::Snapshot(s) => s.clone(),
            CloneSource::Dir(d) => d.display().to_string(),
        }
    }
}

/// Input of `clone` (§1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneRequest {
    /// Snapshot name or `--from-dir` directory.
    pub from: CloneSource,
    /// New VM name; empty lets cocoon pick `cocoon-clone-<id>`.
    pub to: String,
    /// CNI network override; empty inherits the snapshot's.
    pub network: String,
    /// Target backend; `None` means cloud-hypervisor.
    pub backend: Option<Backend>,
    /// `--no-direct-io`.
    pub no_direct_io: bool,
    /// `--pull` (also implied by a directory source).
    pub pull: bool,
    /// `copy` | `ondemand` | `mmap`; empty emits no flag. Passed through as given.
    pub restore_mode: String,
    /// CPU policy; zero fields are not emitted.
    pub cpu_policy: CpuPolicy,
    /// NIC-count override (`--nics`, `Some(0)` emits `--nics 0`).
    pub nics: Option<u32>,
}

impl CloneRequest {
    /// A clone of snapshot `from` into VM `to` with every other field empty.
    pub fn from_snapshot(from: impl Into<String>, to: impl Into<String>) -> Self {
        CloneRequest {
            from: CloneSource::Snapshot(from.into()),
            to: to.into(),
            network: String::new(),
            backend: None,
            no_direct_io: false,
            pull: false,
            restore_mode: String::new(),
            cpu_policy: CpuPolicy::default(),
            nics: None,
        }
    }

    /// True when the target backend is Firecracker (`None` = cloud-hypervisor).
    pub fn is_firecracker(&self) -> bool {
        self.backend == Some(Backend::Firecracker)
    }
}

/// Input of `run` (§1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Image reference or local image name (positional).
    pub image: String,
    /// VM name; empty omits `--name`.
    pub name: String,
    /// vCPUs; 0 omits `--cpu`.
    pub cpu: u32,
    /// Memory as a Kubernetes Quantity string (`4Gi`); converted to bytes, empty omits.
    pub memory: String,
    /// Root disk as a Quantity string; converted to bytes, empty omits.
    pub storage: String,
    /// CNI network; empty omits.
    pub network: String,
    /// Guest OS; `windows` (any case) adds `--windows`.
    pub os: String,
    /// Backend; Firecracker adds `--fc`.
    pub backend: Option<Backend>,
    /// `--no-direct-io`.
    pub no_direct_io: bool,
    /// CPU policy; zero fields are not emitted.
    pub cpu_policy: CpuPolicy,
}

impl RunRequest {
    /// True for a Windows guest (case-insensitive, as the CLI layer compares it).
    pub fn is_windows(&self) -> bool {
        self.os.eq_ignore_ascii_case("windows")
    }
}

/// A readable byte stream.
pub type ByteReader = Pin<Box<dyn AsyncRead + Send>>;
/// A writable byte sink.
pub type ByteWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// Input of `exec` (§1). Streams are optional: a missing stdin sends nothing (and no `-i`), a
/// missing stdout/stderr discards that stream.
pub struct ExecRequest {
    /// VM id (or name).
    pub id: String,
    /// Command and arguments; a leading `--` is passed through.
    pub argv: Vec<String>,
    /// Environment, emitted as `-e K=V` sorted by key.
    pub env: BTreeMap<String, String>,
    /// Guest stdin.
    pub stdin: Option<ByteReader>,
    /// Guest stdout.
    pub stdout: Option<ByteWriter>,
    /// Guest stderr.
    pub stderr: Option<ByteWriter>,
}

impl ExecRequest {
    /// An exec of `argv` in VM `id` with no env and no streams.
    pub fn new(id: impl Into<String>, argv: impl IntoIterator<Item = impl Into<String>>) -> Self {
        ExecRequest {
            id: id.into(),
            argv: argv.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            stdin: None,
            stdout: None,
            stderr: None,
        }
    }
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecRequest")
            .field("id", &self.id)
            .field("argv", &self.argv)
            .field("env", &self.env)
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// Outcome of the optional `reconcile_stale_create` verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StaleCreateOutcome {
    /// The stale `creating` record was removed.
    #[serde(rename = "collected")]
    Collected,
    /// A live create still owns the record.
    #[serde(rename = "busy")]
    Busy,
    /// The VM is not in state `creating`.
    #[serde(rename = "not-creating")]
    NotCreating,
    /// No such VM.
    #[serde(rename = "not-found")]
    NotFound,
}

impl StaleCreateOutcome {
    /// The wire spelling (also the `outcome` label of
    /// `cocoon_vk_stale_create_reconcile_total`).
    pub fn as_wire(self) -> &'static str {
        match self {
            Self::Collected => "collected",
            Self::Busy => "busy",
            Self::NotCreating => "not-creating",
            Self::NotFound => "not-found",
        }
    }

    /// Parses the wire spelling; anything else (including empty) is `None`.
    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "collected" => Some(Self::Collected),
            "busy" => Some(Self::Busy),
            "not-creating" => Some(Self::NotCreating),
            "not-found" => Some(Self::NotFound),
            _ => None,
        }
    }
}

/// Per-TAP traffic counters (host side).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapStats {
    /// TAP device name.
    pub tap: String,
    /// Bytes received on the host side.
    pub rx_bytes: u64,
    /// Bytes sent on the host side.
    pub tx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
}

/// Resource usage of one VM's hypervisor process (for metrics and `/stats/summary`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStats {
    /// Hypervisor PID (0 when not running).
    pub pid: i64,
    /// Resident set size in bytes.
    pub rss_bytes: u64,
    /// User + system CPU time in nanoseconds.
    pub cpu_time_ns: u64,
    /// One entry per NIC.
    pub taps: Vec<TapStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The §5 example event's VM, extended with a DHCP NIC and Go-style nulls.
    const RECORD: &str = r#"{"id":"abc","hypervisor":"cloud-hypervisor","state":"stopped",
        "config":{"cpu":2,"memory":1073741824,"storage":10737418240,"image":"img","name":"vk-ns-demo-0-505043","future":1},
        "pid":0,"network_configs":[{"tap":"t0","mac":"aa:bb:cc:00:00:01","num_queues":4,"queue_size":512,
        "network":{"ip":"10.0.0.5","gateway":"10.0.0.1","prefix":24}},{"tap":"t1","mac":"aa:bb:cc:00:00:02","network":null}],
        "storage_configs":null,"first_booted":true,"snapshot_ids":{"s1":{}},
        "created_at":"2025-01-02T03:04:05.123456789Z","updated_at":"2025-01-02T03:04:05Z","new_top":"x"}"#;

    #[test]
    fn vm_record_reads_cli_json_and_derives_name_mac_ip() {
        let vm: VmRecord = serde_json::from_str(RECORD).expect("parse");
        assert_eq!(vm.name(), "vk-ns-demo-0-505043");
        assert_eq!(vm.mac(), "aa:bb:cc:00:00:01");
        assert_eq!(vm.ip(), "10.0.0.5");
        assert_eq!(vm.ips(), vec!["10.0.0.5"]);
        assert!(vm.network_configs[1].is_dhcp());
        assert!(vm.storage_configs.is_empty());
        assert!(vm.snapshot_ids.contains("s1"));
        assert!(!vm.is_running());
        assert_eq!(vm.config.extra["future"], 1);
        assert_eq!(vm.extra["new_top"], "x");
    }

    #[test]
    fn vm_record_round_trips_with_unknown_fields() {
        let vm: VmRecord = serde_json::from_str(RECORD).expect("parse");
        let text = serde_json::to_string(&vm).expect("print");
        let back: VmRecord = serde_json::from_str(&text).expect("reparse");
        assert_eq!(back, vm);
        let v: serde_json::Value = serde_json::from_str(&text).expect("value");
        assert_eq!(v["snapshot_ids"], serde_json::json!({"s1": {}}));
        assert!(v["network_configs"][1].get("network").is_none());
    }

    #[test]
    fn dhcp_first_nic_has_no_ip() {
        for nic in [
            r#"{"mac":"m"}"#,
            r#"{"mac":"m","network":null}"#,
            r#"{"mac":"m","network":{"ip":"","gateway":"","prefix":0}}"#,
        ] {
            let vm: VmRecord =
                serde_json::from_str(&format!(r#"{{"id":"x","network_configs":[{nic}]}}"#))
                    .expect("parse");
            assert_eq!(vm.ip(), "", "{nic}");
            assert_eq!(vm.mac(), "m");
            assert!(vm.network_configs[0].is_dhcp());
        }
    }

    #[test]
    fn snapshot_record_reads_blob_id_set() {
        let s: SnapshotRecord = serde_json::from_str(
            r#"{"id":"sid","name":"vk-a","image":"ubuntu","image_digest":"sha256:ab","image_type":"oci",
                "image_blob_ids":{"ab":{},"cd":{}},"hypervisor":"cloud-hypervisor","nics":1,"cpu":2}"#,
        )
        .expect("parse");
        assert_eq!(s.image_blob_ids.0.len(), 2);
        assert_eq!(s.hypervisor, HYPERVISOR_CH);
        assert!(s.created_at.is_none());
    }

    #[test]
    fn stale_create_outcome_wire_names() {
        for o in [
            StaleCreateOutcome::Collected,
            StaleCreateOutcome::Busy,
            StaleCreateOutcome::NotCreating,
            StaleCreateOutcome::NotFound,
        ] {
            let text = serde_json::to_value(o).expect("print");
            assert_eq!(
                StaleCreateOutcome::from_wire(text.as_str().unwrap_or("")),
                Some(o)
            );
            assert_eq!(text.as_str(), Some(o.as_wire()));
        }
        assert_eq!(StaleCreateOutcome::from_wire(""), None);
    }
}
