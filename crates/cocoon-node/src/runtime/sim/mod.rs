//! The simulated runtime (`runtime.md` §7): an in-process backend with the same interface and
//! observable semantics as the `cocoon` CLI, without a hypervisor and without root.
//!
//! It keeps real state on disk, writes real snapshot files and a real lease file, so demos and
//! end-to-end tests run the node agent's own code paths (adoption, hibernate/push/pull/wake,
//! eviction, restart recovery) against it.
//!
//! # Opening
//!
//! ```no_run
//! # async fn demo() -> cocoon_node::runtime::Result<()> {
//! use cocoon_node::runtime::sim::{SimConfig, SimRuntime};
//! let rt = SimRuntime::open(SimConfig::new("/tmp/sim-node-1"))?;
//! let handle = rt.handle(); // test/demo controls
//! # Ok(()) }
//! ```
//!
//! The node agent selects it with `VK_RUNTIME=sim` and `VK_SIM_ROOT=<dir>`
//! ([`BackendChoice`](super::BackendChoice)); [`SimConfig::from_env`] lists the `VK_SIM_*`
//! knobs demos can set. In-process tests drive everything else through [`SimHandle`]; the node
//! agent binary also serves a subset of it (crash, delete, fail a verb, list, call counts) on
//! the Unix socket `<root>/control.sock` for black-box tests and demos ([`socket`], driven by
//! `cocoon-operator sim`).
//!
//! # Layout under the root
//!
//! | path | content |
//! |---|---|
//! | `sim/vms.json` | VM index: records plus simulator state (process alive, NICs, disk file) |
//! | `snapshot/db/snapshots.json` | snapshot index `{"snapshots": {<name>: {...record, "pending", "data_dir"}}}` |
//! | `snapshot/localfile/<key>/` | snapshot data: `config.json`, `state.json`, `memory-ranges`, `cow.raw` or `overlay.qcow2` |
//! | `run/<cloudhypervisor\|firecracker>/<vmID>/` | guest disk (`cow.raw`, or `overlay.qcow2` for cloud images, like cocoon's run dir) and `console.log` |
//! | `sim/images.json`, `sim/images/` | image store (by name and digest) and imported image bytes |
//! | `net/leases.json` | cocoon-net leases (or `SimConfig::lease_path`, i.e. `VK_LEASES_PATH`) |
//! | `control.sock` | the control socket, while a node agent serves it ([`socket`]) |
//!
//! With `COCOON_ROOT_DIR` set to the simulator root, the node agent's cloud-image test
//! (`<root>/run/cloudhypervisor/<vmID>/overlay.qcow2`) sees the simulator's files.
//!
//! # Choices for what §7 leaves open
//!
//! * **Restart.** A simulator reopened on the same root sees the same VMs and snapshots, and
//!   VMs **stay running** (their simulated processes are considered alive).
//!   [`SimHandle::crash`] with [`CrashKind::KillProcess`] makes one read `stopped (stale)`.
//!   Imports that were pending when the previous process ended are discarded.
//! * **Snapshot index keyed by name.** The same snapshot id may exist under two names (an
//!   export re-imported on the same host keeps its id, §7.3). Healing by holder id then refuses
//!   an ambiguous id; that needs the newer wording *and* such a duplicate.
//! * **Interrupted creates.** `run`/`clone` write a `creating` record, then wait their latency.
//!   A call dropped during that wait leaves the `creating` record behind, as a killed `cocoon`
//!   does; [`Runtime::reconcile_stale_create`] collects it. Blocks and injected failures act
//!   before any state change.
//! * **Resources.** `run` applies the defaults (2 vCPU, 1 GiB, 10 GiB, 1 NIC) and raises values
//!   below the minimums (1 vCPU, 512 MiB, 10 GiB) to them; an unparsable quantity is an error.
//! * **Exec on a missing or stopped VM** prints the error to the exec's stderr and returns
//!   `ExitCode(1)`, because that is what `cocoon vm exec` exiting 1 looks like through the CLI
//!   backend.
//! * **Guest model.** The guest disk file holds the guest's files (see `guest`). First boot
//!   writes `/etc/hostname` (the VM name) and a random **state token** at
//!   [`TOKEN_PATH`]; snapshots copy the disk, so a clone or restore carries the same token and
//!   hostname, while a fresh `run` gets a new token. Read it with [`SimHandle::guest_token`] or
//!   `exec cat /var/lib/cocoon-sim/state-token`.
//! * **Exec command set.** argv is run directly, or as a script with `sh -c SCRIPT` (also
//!   `bash -c`). Scripts support newlines and `;`, `&&`, `||`, `|`, redirections `>`, `>>`,
//!   `<`, `2>`, `2>>`, `2>&1`, `/dev/null`, single/double quotes, `$VAR`/`${VAR}` from the exec
//!   env and `$?`. Commands: `true`, `false`, `exit [N]`, `echo [-n]`, `printf FMT ARGS`
//!   (`\n \t \\`, `%s %d %%`), `cat [FILE...|-]`, `tee [-a] FILE`, `rm [-f] FILE...` (with `*`
//!   globs), `touch`, `ls [DIR]`, `test`/`[` (`-f -e -s -n -z = !=`), `hostname`,
//!   `printenv [K]`/`env`. Accepted as no-ops (exit 0): `: sync mkdir systemctl ip cloud-init
//!   ipconfig cmd powershell hostnamectl chmod chown netplan dhclient`. Anything else exits 127
//!   (`command not found`). Writes under `/proc`, `/sys`, `/dev` are discarded. Files are text.
//! * **Networks.** NICs on a network listed in `static_networks` get a static IP from the pool,
//!   reported in the record; all other NICs are DHCP: no IP in the record, a lease written to
//!   the lease file `lease_delay` after boot. MACs are `02:xx:xx:xx:xx:xx`, unique on the host.
//! * **Images.** `ensure_image` "pulls" refs registered with [`SimHandle::add_pullable_image`]
//!   (or `VK_SIM_IMAGES`), or anything in permissive mode; `image_import` detects qcow2
//!   (`QFI\xfb`) and tar (`ustar`) by magic bytes.
//! * **Stats** are synthetic and grow with uptime: RSS, CPU time (5 % of each vCPU) and TAP
//!   counters.

mod control;
mod guest;
mod net;
pub mod socket;
mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cocoon_api::contract::Backend;
use cocoon_api::naming::{is_valid_snapshot_name, is_valid_vm_name};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::io::SyncIoBridge;

pub use control::{
    Call, CollisionWording, CrashKind, FailRule, ImageKind, Latencies, MAX_LATENCY_SCALE,
    UnknownVerb, Verb,
};
pub use guest::{DiskFill, DiskSpec, GuestFs, HOSTNAME_PATH, TOKEN_PATH};
pub use net::{IpPool, Lease};

use self::control::{BlockRule, Control};
use self::state::{Layout, SimImage, SimNic, SimSnapshot, SimVm, State, random_hex};
use super::Runtime;
use super::args::{exec_args, quantity_bytes};
use super::error::{Result, RuntimeError, classify};
use super::events::{EventDiffer, EventStream, VmEvent};
use super::heal::{RawSnapshotVerbs, RetryPolicy, save_healing};
use super::io::{ExportHandle, ImportHandle};
use super::tarfmt;
use super::types::{
    CloneRequest, CloneSource, CpuPolicy, ExecRequest, HYPERVISOR_CH, HYPERVISOR_FC, IdSet,
    RunRequest, STATE_CREATING, STATE_ERROR, STATE_RUNNING, STATE_STOPPED, SnapshotRecord,
    StaleCreateOutcome, TapStats, VmConfig, VmRecord, VmStats,
};

const GIB: i64 = 1 << 30;
const DEFAULT_CPU: i64 = 2;
const DEFAULT_MEMORY: i64 = GIB;
const DEFAULT_STORAGE: i64 = 10 * GIB;
const MIN_MEMORY: i64 = 512 << 20;
const MIN_STORAGE: i64 = 10 * GIB;
const QUEUE_SIZE: i64 = 256;
const DISK_QUEUE_SIZE: i64 = 128;
/// Largest exec stdin the simulator buffers.
const MAX_EXEC_STDIN: u64 = 64 << 20;
/// Pipe buffer between the async side and the tar thread.
const PIPE_BUFFER: usize = 256 << 10;

/// Configuration of the simulator (the knobs that cannot change at run time are here; the
/// rest is also adjustable through [`SimHandle`]).
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
    /// Logical size of a snapshot's `memory-ranges` (sparse, with a small header).
    pub memory_file_size: u64,
    /// Images `ensure_image` can pull.
    pub known_images: BTreeMap<String, ImageKind>,
    /// Pull any image ref.
    pub permissive_pull: bool,
    /// Collision wording of `snapshot save`.
    pub collision_wording: CollisionWording,
    /// §3.3 retry of a locked holder during save healing.
    pub save_retry: RetryPolicy,
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
            known_images: BTreeMap::new(),
            permissive_pull: false,
            collision_wording: CollisionWording::default(),
            save_retry: RetryPolicy::default(),
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
    /// | `VK_SIM_IMAGES` | pullable images, comma separated, `ref` or `ref=cloudimg` |
    /// | `VK_SIM_PERMISSIVE_PULL` | `true`: any ref can be pulled |
    /// | `VK_SIM_STATIC_NETWORKS` | comma-separated static networks |
    /// | `VK_SIM_IP_POOL` | CIDR of the address pool |
    /// | `VK_SIM_COLLISION_WORDING` | `already-exists`, `in-use-by` or `held-by` |
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
fn guess_kind(image: &str) -> ImageKind {
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

/// Out-of-band VM (created behind the node agent's back, e.g. to test the orphan policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBandVm {
    /// VM name.
    pub name: String,
    /// Image reference recorded in `config.image`.
    pub image: String,
    /// vCPUs.
    pub cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Network (static if listed in `static_networks`).
    pub network: String,
    /// Backend.
    pub backend: Option<Backend>,
    /// Stored state (`running`, `stopped`, `creating`, …).
    pub state: String,
}

impl Default for OutOfBandVm {
    fn default() -> Self {
        OutOfBandVm {
            name: String::new(),
            image: "out-of-band".into(),
            cpu: DEFAULT_CPU,
            memory: DEFAULT_MEMORY,
            network: String::new(),
            backend: None,
            state: STATE_RUNNING.into(),
        }
    }
}

/// One VM of [`SimHandle::vm_rows`] (also a row of the control socket's `list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmRow {
    /// VM name.
    pub name: String,
    /// VM id.
    pub id: String,
    /// The state `inspect` reports (`running`, `stopped`, `error`, `stopped (stale)`, …).
    pub state: String,
    /// The simulated hypervisor process is alive.
    pub alive: bool,
}

/// What the simulator knows about a VM beyond its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimVmInfo {
    /// The reported record's id.
    pub id: String,
    /// The simulated hypervisor process is alive.
    pub alive: bool,
    /// CPU policy the VM was created with.
    pub cpu_policy: CpuPolicy,
    /// Restore mode of the clone that created it (empty for `run`).
    pub restore_mode: String,
    /// Guest OS as requested at `run`.
    pub os: String,
    /// The guest disk file.
    pub disk_path: PathBuf,
    /// `net_resize` is broken until the next start.
    pub net_resize_broken: bool,
}

/// The simulated runtime. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct SimRuntime {
    inner: Arc<Inner>,
}

/// Test and demo controls of one [`SimRuntime`]. Cheap to clone.
#[derive(Clone)]
pub struct SimHandle {
    inner: Arc<Inner>,
}

struct Inner {
    layout: Layout,
    lease_path: PathBuf,
    pool: IpPool,
    static_networks: BTreeSet<String>,
    lease_delay: Duration,
    lease_ttl: Duration,
    tick: Duration,
    save_retry: RetryPolicy,
    state: Mutex<State>,
    ctl: Mutex<Control>,
    /// Bumped on every call and control change (blocked calls and waiters watch it).
    ctl_tx: watch::Sender<u64>,
    /// Bumped on every VM-list change (event streams tick on it).
    change_tx: watch::Sender<u64>,
    /// Bumped to close every open event stream.
    close_tx: watch::Sender<u64>,
    /// Per-VM guest-disk locks (exec writes vs. snapshot copies).
    disk_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent-enough simulator state; keep going.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_err(context: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Other(format!("{context}: {e}"))
}

async fn blocking<T: Send + 'static>(
    context: &str,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io_err(context, e))?
        .map_err(|e| io_err(context, e))
}

fn to_json(v: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn vm_not_found(r: &str) -> RuntimeError {
    RuntimeError::VmNotFound(format!("VM not found: {r}"))
}

fn snapshot_not_found(r: &str) -> RuntimeError {
    RuntimeError::SnapshotNotFound(format!("snapshot not found: {r}"))
}

/// A Read/Write adapter that paces bytes to a rate and can be aborted (import/export).
struct Throttle<T> {
    inner: T,
    rate: u64,
    owed: Duration,
    abort: Option<Arc<AtomicBool>>,
}

impl<T> Throttle<T> {
    fn new(inner: T, rate: u64, abort: Option<Arc<AtomicBool>>) -> Self {
        Throttle {
            inner,
            rate,
            owed: Duration::ZERO,
            abort,
        }
    }

    fn check(&self) -> io::Result<()> {
        match &self.abort {
            Some(a) if a.load(Ordering::SeqCst) => {
                // Not `Interrupted`: std's write_all/read_exact retry that kind forever.
                Err(io::Error::new(io::ErrorKind::ConnectionAborted, "aborted"))
            }
            _ => Ok(()),
        }
    }

    /// Sleeps off the time `n` bytes take at the rate, in slices of at least 2 ms (shorter
    /// sleeps would cost more than they pace).
    fn pace(&mut self, n: usize) {
        if self.rate == 0 || n == 0 {
            return;
        }
        self.owed += Duration::from_secs_f64(n as f64 / self.rate as f64);
        if self.owed >= Duration::from_millis(2) {
            std::thread::sleep(self.owed);
            self.owed = Duration::ZERO;
        }
    }
}

impl<T: Write> Write for Throttle<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        let n = self.inner.write(buf)?;
        self.pace(n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<T: Read> Read for Throttle<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let n = self.inner.read(buf)?;
        self.pace(n);
        Ok(n)
    }
}

/// Marks a snapshot as held (clone, export) until dropped.
struct Hold {
    inner: Arc<Inner>,
    name: String,
    kind: &'static str,
}

impl Hold {
    fn new(inner: &Arc<Inner>, st: &mut State, name: &str, kind: &'static str) -> Self {
        st.holds.entry(name.to_owned()).or_default().push(kind);
        Hold {
            inner: inner.clone(),
            name: name.to_owned(),
            kind,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        if let Some(h) = st.holds.get_mut(&self.name) {
            if let Some(i) = h.iter().position(|k| *k == self.kind) {
                h.remove(i);
            }
            if h.is_empty() {
                st.holds.remove(&self.name);
            }
        }
    }
}

/// Marks a VM create as in flight until dropped (for `reconcile_stale_create`'s `busy`).
struct Creating {
    inner: Arc<Inner>,
    id: String,
}

impl Drop for Creating {
    fn drop(&mut self) {
        lock(&self.inner.state).creating.remove(&self.id);
    }
}

/// Counts a call as blocked until dropped.
struct BlockedCount<'a> {
    inner: &'a Inner,
    verb: Verb,
}

impl Drop for BlockedCount<'_> {
    fn drop(&mut self) {
        if let Some(n) = lock(&self.inner.ctl).blocked_now.get_mut(&self.verb) {
            *n = n.saturating_sub(1);
        }
        self.inner.ctl_tx.send_modify(|v| *v += 1);
    }
}

/// Sets the abort flag when the completion future is dropped before it finished.
/// The handle of a simulated import. Its completion is created outside the future, so that
/// dropping it unpolled aborts the transfer too, as dropping the CLI's completion kills its child.
fn import_handle(
    sink: tokio::io::DuplexStream,
    task: tokio::task::JoinHandle<Result<()>>,
    aborted: Arc<AtomicBool>,
    label: String,
) -> ImportHandle {
    let guard = AbortOnDrop(Some(aborted));
    let done = async move {
        let mut guard = guard;
        let res = task.await.map_err(|e| io_err(&label, e));
        guard.0 = None;
        res?
    };
    ImportHandle {
        sink: Box::pin(sink),
        done: Box::pin(done),
    }
}

struct AbortOnDrop(Option<Arc<AtomicBool>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.store(true, Ordering::SeqCst);
        }
    }
}

/// Everything a new VM record needs.
struct NewVm {
    id: String,
    hypervisor: &'static str,
    config: VmConfig,
    nics: u32,
    disk_file: &'static str,
    os: String,
    cpu_policy: CpuPolicy,
    restore_mode: String,
    state: String,
}

/// The guest disk file of an image type.
fn disk_file_for(image_type: &str) -> &'static str {
    if image_type == super::types::IMAGE_TYPE_CLOUDIMG {
        "overlay.qcow2"
    } else {
        "cow.raw"
    }
}

/// The disk file of a snapshot directory: `overlay.qcow2`, `cow.raw`, else the first
/// `*.qcow2`/`*.raw` by name.
fn find_snapshot_disk(dir: &Path) -> Option<PathBuf> {
    for name in ["overlay.qcow2", "cow.raw"] {
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".qcow2") || n.ends_with(".raw"))
        .collect();
    names.sort();
    names.first().map(|n| dir.join(n))
}

/// A Quantity flag value in bytes: default when empty, error when unparsable.
fn size_or(flag: &str, raw: &str, default: i64) -> Result<i64> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(default);
    }
    quantity_bytes(raw)
        .filter(|b| *b > 0)
        .ok_or_else(|| RuntimeError::Other(format!("invalid {flag} {raw:?}")))
}

impl Inner {
    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn ctl(&self) -> MutexGuard<'_, Control> {
        lock(&self.ctl)
    }

    fn bump_ctl(&self) {
        self.ctl_tx.send_modify(|v| *v += 1);
    }

    /// Signals a VM-list change: event streams tick now.
    fn changed(&self) {
        self.change_tx.send_modify(|v| *v += 1);
    }

    fn save_vms(&self, st: &State) -> Result<()> {
        st.save_vms(&self.layout)
            .map_err(|e| io_err("save VM index", e))
    }

    fn save_snapshots(&self, st: &State) -> Result<()> {
        st.save_snapshots(&self.layout)
            .map_err(|e| io_err("save snapshot index", e))
    }

    fn disk_lock(&self, id: &str) -> Arc<Mutex<()>> {
        lock(&self.disk_locks)
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    fn vm_dir(&self, vm: &SimVm) -> PathBuf {
        self.layout.vm_dir(&vm.record.hypervisor, &vm.record.id)
    }

    fn disk_path(&self, vm: &SimVm) -> PathBuf {
        self.vm_dir(vm).join(&vm.disk_file)
    }

    /// Appends a line to the VM's console log (best effort: the log is diagnostic).
    fn console(&self, vm: &SimVm, line: &str) {
        let path = self.vm_dir(vm).join("console.log");
        let stamp = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "[{stamp}] {line}"));
        if let Err(e) = res {
            tracing::debug!(path = %path.display(), error = %e, "console log write failed");
        }
    }

    /// The names a call is matched by: the reference, then the resolved VM id and name.
    fn vm_targets(&self, r: &str) -> Vec<String> {
        let mut t = vec![r.to_owned()];
        if let Some(vm) = self.st().resolve_vm(r) {
            t.push(vm.record.id.clone());
            t.push(vm.record.config.name.clone());
        }
        t
    }

    /// Call entry: refresh leases, record the call, apply an injected failure, wait out a
    /// block. Latencies are applied by each operation at its own point.
    async fn enter(&self, verb: Verb, targets: Vec<String>, args: serde_json::Value) -> Result<()> {
        self.refresh_leases();
        let (failure, start_gen) = {
            let mut c = self.ctl();
            let failure = c.take_failure(verb, &targets);
            c.calls.push(control::Call {
                verb,
                targets: targets.clone(),
                args,
            });
            (failure, c.cancel_gen.get(&verb).copied().unwrap_or(0))
        };
        self.bump_ctl();
        if let Some(message) = failure {
            return Err(classify(message));
        }
        let mut rx = self.ctl_tx.subscribe();
        let mut counted: Option<BlockedCount<'_>> = None;
        loop {
            {
                let mut c = self.ctl();
                if c.cancel_gen.get(&verb).copied().unwrap_or(0) > start_gen {
                    return Err(RuntimeError::Cancelled(format!(
                        "{verb:?} cancelled by the simulator"
                    )));
                }
                if !c.is_blocked(verb, &targets) {
                    return Ok(());
                }
                if counted.is_none() {
                    *c.blocked_now.entry(verb).or_default() += 1;
                    counted = Some(BlockedCount { inner: self, verb });
                }
            }
            self.bump_ctl();
            if rx.changed().await.is_err() {
                return Err(RuntimeError::Cancelled("simulator shut down".into()));
            }
        }
    }

    fn latency(&self, verb: Verb) -> Duration {
        self.ctl().latency(verb)
    }

    async fn delay(&self, d: Duration) {
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Rewrites the lease file if the set of due, non-withheld DHCP leases changed.
    fn refresh_leases(&self) {
        let (all, withheld) = {
            let c = self.ctl();
            (c.withhold_all_leases, c.withhold_leases.clone())
        };
        let now = Utc::now();
        let ttl = chrono::Duration::from_std(self.lease_ttl).unwrap_or(chrono::Duration::hours(1));
        let mut st = self.st();
        let mut leases = Vec::new();
        for vm in st.vms.values() {
            if all || withheld.contains(&vm.record.id) || withheld.contains(&vm.record.config.name)
            {
                continue;
            }
            for nic in vm.nics.iter().filter(|n| !n.is_static) {
                let Some(due) = nic.lease_due.filter(|d| *d <= now) else {
                    continue;
                };
                // Renewed by whole periods, so the expiry is stable between renewals.
                let mut expiry = due + ttl;
                if ttl > chrono::Duration::zero() {
                    while expiry <= now {
                        expiry += ttl;
                    }
                }
                leases.push(Lease {
                    mac: nic.mac.to_ascii_lowercase(),
                    ip: nic.ip.clone(),
                    expiry: expiry.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                });
            }
        }
        if st.last_leases.as_ref() == Some(&leases) {
            return;
        }
        match net::write_leases(&self.lease_path, &leases) {
            Ok(()) => st.last_leases = Some(leases),
            Err(e) => {
                tracing::warn!(path = %self.lease_path.display(), error = %e, "write lease file")
            }
        }
    }

    /// Refreshes the lease file at `due` (or as soon as possible outside a runtime: the next
    /// call refreshes it anyway).
    fn schedule_leases(self: &Arc<Self>, due: DateTime<Utc>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(self);
        let wait = (due - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        rt.spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(inner) = weak.upgrade() {
                inner.refresh_leases();
            }
        });
    }

    /// New NICs `from..from+count` for `vm_id` on `network`, with unique MACs and pool IPs.
    fn make_nics(
        &self,
        st: &State,
        vm_id: &str,
        network: &str,
        from: usize,
        count: usize,
    ) -> Result<Vec<SimNic>> {
        let mut macs = st.macs();
        let mut ips = st.ips();
        let is_static = self.static_networks.contains(network);
        (from..from + count)
            .map(|i| {
                let mac = net::new_mac(&macs, || {
                    let mut b = [0u8; 5];
                    if getrandom::fill(&mut b).is_err() {
                        let h = Sha256::digest(random_hex(8).as_bytes());
                        b.copy_from_slice(&h[..5]);
                    }
                    b
                });
                macs.insert(mac.clone());
                let ip = self
                    .pool
                    .allocate(&ips)
                    .ok_or_else(|| RuntimeError::Other("simulated IP pool exhausted".into()))?;
                ips.insert(ip);
                Ok(SimNic {
                    mac,
                    tap: format!("tap{}-{i}", &vm_id[..vm_id.len().min(8)]),
                    ip: ip.to_string(),
                    is_static,
                    lease_due: None,
                })
            })
            .collect()
    }

    fn sync_nics(&self, vm: &mut SimVm) {
        vm.sync_nics(
            &self.pool.gateway().to_string(),
            i64::from(self.pool.prefix),
            vm.record.config.cpu.max(1),
        );
    }

    /// Inserts a VM record (state from `new.state`) after the name checks; creates its dir.
    fn insert_vm(&self, new: NewVm) -> Result<SimVm> {
        let name = new.config.name.clone();
        if !is_valid_vm_name(&name) {
            return Err(RuntimeError::Other(format!(
                "invalid VM name {name:?}: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{{0,62}}$"
            )));
        }
        let mut st = self.st();
        if st.vms.values().any(|v| v.record.config.name == name) {
            return Err(classify(format!("VM name {name:?} already exists")));
        }
        let nics = self.make_nics(&st, &new.id, &new.config.network, 0, new.nics as usize)?;
        let now = Utc::now();
        let mut vm = SimVm {
            record: VmRecord {
                id: new.id.clone(),
                hypervisor: new.hypervisor.to_owned(),
                state: new.state,
                config: new.config,
                pid: 0,
                socket_path: String::new(),
                network_configs: Vec::new(),
                storage_configs: Vec::new(),
                first_booted: false,
                snapshot_ids: IdSet::default(),
                created_at: Some(now),
                updated_at: Some(now),
                started_at: None,
                stopped_at: None,
                extra: serde_json::Map::new(),
            },
            alive: false,
            nics,
            disk_file: new.disk_file.to_owned(),
            os: new.os,
            cpu_policy: new.cpu_policy,
            restore_mode: new.restore_mode,
            net_resize_broken: false,
        };
        let dir = self.vm_dir(&vm);
        vm.record.socket_path = dir.join("api.sock").display().to_string();
        vm.record.storage_configs = vec![super::types::StorageConfig {
            path: dir.join(&vm.disk_file).display().to_string(),
            ro: false,
            serial: "cow".into(),
            role: "cow".into(),
            extra: serde_json::Map::new(),
        }];
        self.sync_nics(&mut vm);
        std::fs::create_dir_all(&dir).map_err(|e| io_err("create VM dir", e))?;
        st.vms.insert(vm.record.id.clone(), vm.clone());
        self.save_vms(&st)?;
        drop(st);
        self.changed();
        Ok(vm)
    }

    /// Removes a VM record, its leases and its directory.
    fn delete_vm(&self, id: &str) -> Result<()> {
        let mut st = self.st();
        let vm = st.vms.remove(id).ok_or_else(|| vm_not_found(id))?;
        self.save_vms(&st)?;
        drop(st);
        lock(&self.disk_locks).remove(id);
        let _ = std::fs::remove_dir_all(self.vm_dir(&vm));
        self.refresh_leases();
        self.changed();
        Ok(())
    }

    /// Marks a VM running with a fresh PID and schedules its DHCP leases.
    fn boot(self: &Arc<Self>, id: &str, line: &str) -> Result<VmRecord> {
        let due = Utc::now()
            + chrono::Duration::from_std(self.lease_delay).unwrap_or(chrono::Duration::zero());
        let vm = {
            let mut st = self.st();
            let pid = st.take_pid();
            let vm = st.vms.get_mut(id).ok_or_else(|| vm_not_found(id))?;
            let now = Utc::now();
            vm.record.state = STATE_RUNNING.into();
            vm.record.pid = pid;
            vm.record.first_booted = true;
            vm.record.started_at = Some(now);
            vm.record.updated_at = Some(now);
            vm.alive = true;
            vm.net_resize_broken = false;
            for nic in vm
                .nics
                .iter_mut()
                .filter(|n| !n.is_static && n.lease_due.is_none())
            {
                nic.lease_due = Some(due);
            }
            let vm = vm.clone();
            self.save_vms(&st)?;
            vm
        };
        self.console(&vm, line);
        self.changed();
        self.schedule_leases(due);
        Ok(vm.reported())
    }

    fn creating(self: &Arc<Self>, id: &str) -> Creating {
        self.st().creating.insert(id.to_owned());
        Creating {
            inner: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Registers a pulled image (synthetic bytes: the digest is the ref's hash unless given).
    fn register_pulled(&self, name: &str, digest: &str, kind: ImageKind) -> Result<()> {
        let digest = if digest.is_empty() {
            format!("sha256:{}", hex::encode(Sha256::digest(name.as_bytes())))
        } else {
            digest.to_owned()
        };
        let mut st = self.st();
        st.images.insert(
            name.to_owned(),
            SimImage {
                name: name.to_owned(),
                digest,
                image_type: kind.image_type().to_owned(),
                size: 0,
            },
        );
        st.save_images(&self.layout)
            .map_err(|e| io_err("save image index", e))
    }

    /// `--pull` of a clone: fetch the snapshot's base image if missing; a failure only warns.
    async fn auto_pull(&self, snap: &SnapshotRecord) {
        if snap.image.is_empty() {
            return;
        }
        let present = {
            let st = self.st();
            st.find_image(&snap.image_digest).is_some() || st.find_image(&snap.image).is_some()
        };
        if present {
            return;
        }
        let kind = {
            let c = self.ctl();
            c.known_images
                .get(&snap.image)
                .copied()
                .or_else(|| c.permissive_pull.then(|| guess_kind(&snap.image)))
        };
        match kind {
            Some(kind) => {
                self.delay(self.latency(Verb::EnsureImage)).await;
                if let Err(e) = self.register_pulled(&snap.image, &snap.image_digest, kind) {
                    tracing::warn!(image = %snap.image, error = %e, "simulated auto-pull failed");
                }
            }
            None => tracing::warn!(
                image = %snap.image,
                "simulated auto-pull of the snapshot base image failed (unknown image); continuing"
            ),
        }
    }

    fn list_reported(&self) -> Vec<VmRecord> {
        let st = self.st();
        let mut vms: Vec<VmRecord> = st.vms.values().map(SimVm::reported).collect();
        vms.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        vms
    }

    /// `snapshot rm`, not-found counting as success.
    async fn rm_if_exists(&self, name: &str) -> Result<()> {
        match self.raw_rm(name).await {
            Err(RuntimeError::SnapshotNotFound(_)) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Commits or discards a finished snapshot import (runs on the tar thread).
    fn finish_import(
        &self,
        name: &str,
        dir: &Path,
        res: io::Result<tarfmt::Envelope>,
        aborted: bool,
    ) -> Result<()> {
        let res = match res {
            Ok(_) if aborted => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "aborted")),
            r => r,
        };
        let mut st = self.st();
        match res {
            Ok(env) => {
                let mut record = env.config;
                record.name = name.to_owned();
                record.created_at = Some(Utc::now());
                st.snapshots.insert(
                    name.to_owned(),
                    SimSnapshot {
                        record,
                        pending: false,
                        data_dir: dir.to_path_buf(),
                    },
                );
                self.save_snapshots(&st)
            }
            Err(e) => {
                if st.snapshots.get(name).is_some_and(|s| s.pending) {
                    st.snapshots.remove(name);
                }
                drop(st);
                let _ = std::fs::remove_dir_all(dir);
                Err(RuntimeError::Other(format!("snapshot import {name}: {e}")))
            }
        }
    }

    fn synthetic_stats(vm: &SimVm, now: DateTime<Utc>) -> VmStats {
        let running = vm.record.state == STATE_RUNNING && vm.alive;
        let up_ms = vm
            .record
            .started_at
            .filter(|_| running)
            .map(|s| (now - s).num_milliseconds().max(0) as u64)
            .unwrap_or(0);
        let taps = vm
            .nics
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let k = i as u64 + 1;
                let (rx, tx) = (up_ms * 12 * k, up_ms * 8 * k);
                TapStats {
                    tap: n.tap.clone(),
                    rx_bytes: rx,
                    tx_bytes: tx,
                    rx_packets: rx.div_ceil(600),
                    tx_packets: tx.div_ceil(600),
                }
            })
            .collect();
        if !running {
            return VmStats {
                pid: 0,
                taps,
                ..VmStats::default()
            };
        }
        let mem = vm.record.config.memory.max(0) as u64;
        let rss = ((mem / 4).max(64 << 20) + (up_ms / 1000) * 4096).min(mem.max(64 << 20));
        let cpus = vm.record.config.cpu.max(1) as u64;
        VmStats {
            pid: vm.record.pid,
            rss_bytes: rss,
            // 5 % of every vCPU since the last start.
            cpu_time_ns: up_ms * 1_000_000 * cpus / 20,
            taps,
        }
    }
}

#[async_trait]
impl RawSnapshotVerbs for Inner {
    async fn raw_save(&self, name: &str, vm_ref: &str) -> Result<()> {
        if !is_valid_snapshot_name(name) {
            return Err(RuntimeError::Other(format!(
                "invalid snapshot name {name:?}"
            )));
        }
        let wording = self.ctl().wording;
        let vm = {
            let st = self.st();
            let vm = st
                .resolve_vm(vm_ref)
                .cloned()
                .ok_or_else(|| vm_not_found(vm_ref))?;
            if let Some(s) = st.snapshots.get(name) {
                return Err(classify(wording.message(name, &s.record.id)));
            }
            vm
        };
        if !(vm.record.state == STATE_RUNNING && vm.alive) {
            return Err(RuntimeError::Other(format!(
                "snapshot save {name}: vm {} is not running (state {})",
                vm.record.id,
                vm.reported().state
            )));
        }
        let (base, per_gib, mem_size) = {
            let c = self.ctl();
            (
                c.latencies.save,
                c.latencies.save_per_gib,
                c.memory_file_size,
            )
        };
        let gib = vm.record.config.memory.max(0) as f64 / GIB as f64;
        self.delay(base + per_gib.mul_f64(gib)).await;

        let snap_id = random_hex(16);
        let cfg = &vm.record.config;
        let digest_hex = cfg
            .image_digest
            .strip_prefix("sha256:")
            .unwrap_or(&cfg.image_digest);
        let record = SnapshotRecord {
            cpu: cfg.cpu,
            memory: cfg.memory,
            storage: cfg.storage,
            queue_size: cfg.queue_size,
            disk_queue_size: cfg.disk_queue_size,
            image: cfg.image.clone(),
            image_digest: cfg.image_digest.clone(),
            image_type: cfg.image_type.clone(),
            network: cfg.network.clone(),
            no_direct_io: cfg.no_direct_io,
            windows: cfg.windows,
            id: snap_id.clone(),
            name: name.to_owned(),
            description: String::new(),
            image_blob_ids: if digest_hex.is_empty() {
                IdSet::default()
            } else {
                IdSet::from_iter([digest_hex])
            },
            hypervisor: vm.record.hypervisor.clone(),
            nics: vm.nics.len() as i64,
            created_at: Some(Utc::now()),
            extra: serde_json::Map::new(),
        };
        let dir = self.layout.snapshot_data().join(random_hex(16));
        let disk = self.disk_path(&vm);
        let disk_lock = self.disk_lock(&vm.record.id);
        let disk_name = vm.disk_file.clone();
        let vm_config =
            serde_json::to_vec_pretty(&vm.record.config).map_err(|e| io_err("encode config", e))?;
        let device_state = serde_json::to_vec_pretty(&serde_json::json!({
            "vm_id": vm.record.id,
            "snapshot_id": snap_id,
            "macs": vm.nics.iter().map(|n| n.mac.clone()).collect::<Vec<_>>(),
            "saved_at": Utc::now(),
        }))
        .map_err(|e| io_err("encode state", e))?;
        let target = dir.clone();
        let memory_header = format!("COCOON-SIM-MEMORY {snap_id}\n");
        blocking("snapshot save", move || {
            std::fs::create_dir_all(&target)?;
            {
                let _g = lock(&disk_lock);
                guest::copy_sparse(&disk, &target.join(&disk_name))?;
            }
            std::fs::write(target.join("config.json"), vm_config)?;
            std::fs::write(target.join("state.json"), device_state)?;
            let mut mem = std::fs::File::create(target.join("memory-ranges"))?;
            mem.write_all(memory_header.as_bytes())?;
            mem.set_len(mem_size.max(64))?;
            mem.sync_all()
        })
        .await
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;

        let mut st = self.st();
        // A concurrent save may have taken the name meanwhile: same answer as up front.
        if let Some(s) = st.snapshots.get(name) {
            let msg = wording.message(name, &s.record.id);
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(classify(msg));
        }
        st.snapshots.insert(
            name.to_owned(),
            SimSnapshot {
                record,
                pending: false,
                data_dir: dir,
            },
        );
        if let Some(v) = st.vms.get_mut(&vm.record.id) {
            v.record.snapshot_ids.0.insert(snap_id);
        }
        self.save_snapshots(&st)?;
        self.save_vms(&st)?;
        drop(st);
        self.console(&vm, &format!("snapshot saved as {name}"));
        Ok(())
    }

    async fn raw_rm(&self, r: &str) -> Result<()> {
        self.delay(self.latency(Verb::SnapshotRemove)).await;
        let dir = {
            let mut st = self.st();
            if st.snapshots.get(r).is_some_and(|s| s.pending) {
                return Err(classify(format!(
                    "snapshot {r:?} is in use by an active import"
                )));
            }
            let name = st
                .resolve_snapshot(r)
                .map(|s| s.record.name.clone())
                .ok_or_else(|| snapshot_not_found(r))?;
            if let Some(kind) = st.holds.get(&name).and_then(|h| h.first()) {
                return Err(classify(format!(
                    "snapshot {name:?} is in use by an active {kind}"
                )));
            }
            let snap = st
                .snapshots
                .remove(&name)
                .ok_or_else(|| snapshot_not_found(r))?;
            self.save_snapshots(&st)?;
            snap.data_dir
        };
        let _ = blocking("remove snapshot data", move || std::fs::remove_dir_all(dir)).await;
        Ok(())
    }
}

impl SimRuntime {
    /// Opens (or creates) the simulator state under `cfg.root`.
    pub fn open(cfg: SimConfig) -> Result<Self> {
        let layout = Layout {
            root: cfg.root.clone(),
        };
        for dir in [layout.snapshot_data(), layout.image_blobs(), layout.tmp()] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| io_err(&format!("create {}", dir.display()), e))?;
        }
        let state = State::load(&layout).map_err(|e| io_err("load simulator state", e))?;
        // Data dirs no committed snapshot points at are leftovers of interrupted imports/saves.
        let referenced: BTreeSet<PathBuf> = state
            .snapshots
            .values()
            .map(|s| s.data_dir.clone())
            .collect();
        if let Ok(entries) = std::fs::read_dir(layout.snapshot_data()) {
            for e in entries.flatten() {
                if !referenced.contains(&e.path()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(layout.tmp()) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let control = Control {
            latencies: cfg.latencies.clone(),
            disk: cfg.disk,
            memory_file_size: cfg.memory_file_size,
            known_images: cfg.known_images.clone(),
            permissive_pull: cfg.permissive_pull,
            wording: cfg.collision_wording,
            ..Control::default()
        };
        let inner = Arc::new(Inner {
            layout,
            lease_path: cfg.lease_path,
            pool: cfg.ip_pool,
            static_networks: cfg.static_networks,
            lease_delay: cfg.lease_delay,
            lease_ttl: cfg.lease_ttl,
            tick: cfg.tick_interval,
            save_retry: cfg.save_retry,
            state: Mutex::new(state),
            ctl: Mutex::new(control),
            ctl_tx: watch::Sender::new(0),
            change_tx: watch::Sender::new(0),
            close_tx: watch::Sender::new(0),
            disk_locks: Mutex::new(HashMap::new()),
        });
        inner.refresh_leases();
        // Leases still in the future (a restart during the lease delay) get their timer back.
        let pending: Vec<DateTime<Utc>> = inner
            .st()
            .vms
            .values()
            .flat_map(|v| v.nics.iter().filter_map(|n| n.lease_due))
            .filter(|d| *d > Utc::now())
            .collect();
        for due in pending {
            inner.schedule_leases(due);
        }
        Ok(SimRuntime { inner })
    }

    /// The control handle.
    pub fn handle(&self) -> SimHandle {
        SimHandle {
            inner: self.inner.clone(),
        }
    }
}

#[async_trait]
impl Runtime for SimRuntime {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    async fn clone_vm(&self, req: CloneRequest) -> Result<VmRecord> {
        let inner = &self.inner;
        let source = req.from.label();
        inner
            .enter(
                Verb::Clone,
                vec![req.to.clone(), source.clone()],
                to_json(&req),
            )
            .await?;
        if !matches!(req.restore_mode.as_str(), "" | "copy" | "ondemand" | "mmap") {
            return Err(RuntimeError::Other(format!(
                "invalid --restore-mode {:?}: want copy, ondemand or mmap",
                req.restore_mode
            )));
        }
        let (snap, data_dir, hold) = match &req.from {
            CloneSource::Snapshot(name) => {
                let mut st = inner.st();
                let s = st
                    .resolve_snapshot(name)
                    .cloned()
                    .ok_or_else(|| snapshot_not_found(name))?;
                let hold = Hold::new(inner, &mut st, &s.record.name, "clone");
                (s.record, s.data_dir, Some(hold))
            }
            CloneSource::Dir(dir) => {
                let path = dir.join(tarfmt::ENVELOPE_NAME);
                let env = blocking("clone from dir", move || {
                    tarfmt::parse_envelope(&std::fs::read(&path)?)
                })
                .await
                .map_err(|e| {
                    RuntimeError::Other(format!(
                        "cocoon vm clone --from-dir {}: {e}",
                        dir.display()
                    ))
                })?;
                (env.config, dir.clone(), None)
            }
        };
        let hypervisor = if snap.hypervisor == HYPERVISOR_FC {
            HYPERVISOR_FC
        } else {
            HYPERVISOR_CH
        };
        if let Some(b) = req
            .backend
            .filter(|b| !snap.hypervisor.is_empty() && b.as_str() != hypervisor)
        {
            return Err(RuntimeError::Other(format!(
                "snapshot {source} was taken with {hypervisor}, cannot restore it on {b}"
            )));
        }
        if req.pull || matches!(req.from, CloneSource::Dir(_)) {
            inner.auto_pull(&snap).await;
        }
        let id = random_hex(16);
        let name = if req.to.is_empty() {
            format!("cocoon-clone-{id}")
        } else {
            req.to.clone()
        };
        let nics = match req.nics.filter(|_| hypervisor != HYPERVISOR_FC) {
            Some(n) => n,
            None => u32::try_from(snap.nics.max(0)).unwrap_or(1),
        };
        let network = if req.network.is_empty() {
            snap.network.clone()
        } else {
            req.network.clone()
        };
        let disk_file = disk_file_for(&snap.image_type);
        let vm = inner.insert_vm(NewVm {
            id: id.clone(),
            hypervisor,
            config: VmConfig {
                cpu: snap.cpu.max(1),
                memory: snap.memory,
                storage: snap.storage,
                queue_size: if snap.queue_size > 0 {
                    snap.queue_size
                } else {
                    QUEUE_SIZE
                },
                disk_queue_size: if snap.disk_queue_size > 0 {
                    snap.disk_queue_size
                } else {
                    DISK_QUEUE_SIZE
                },
                image: snap.image.clone(),
                image_digest: snap.image_digest.clone(),
                image_type: snap.image_type.clone(),
                network,
                no_direct_io: req.no_direct_io || snap.no_direct_io,
                windows: snap.windows,
                name: name.clone(),
                extra: serde_json::Map::new(),
            },
            nics,
            disk_file,
            os: String::new(),
            cpu_policy: req.cpu_policy,
            restore_mode: req.restore_mode.clone(),
            state: STATE_CREATING.into(),
        })?;
        let _creating = inner.creating(&id);
        let target = inner.disk_path(&vm);
        let spec = inner.ctl().disk;
        let copied = blocking("restore guest disk", move || {
            if let Some(src) = find_snapshot_disk(&data_dir) {
                let size = guest::copy_sparse(&src, &target)?;
                if guest::read_guest(&target)?.is_some() {
                    return Ok(true);
                }
                // A disk from elsewhere: keep its size, give it a first-boot guest.
                let fs = GuestFs::first_boot(&name, &random_hex(16));
                guest::create_disk(&target, &fs, DiskSpec { size, ..spec }, 1)?;
                return Ok(false);
            }
            let fs = GuestFs::first_boot(&name, &random_hex(16));
            guest::create_disk(&target, &fs, spec, 1)?;
            Ok(false)
        })
        .await;
        let restored = match copied {
            Ok(r) => r,
            Err(e) => {
                let _ = inner.delete_vm(&id);
                return Err(e);
            }
        };
        inner.delay(inner.latency(Verb::Clone)).await;
        drop(hold);
        let line = if restored {
            format!("boot: restored from snapshot {source}")
        } else {
            format!("boot: first boot from snapshot {source} (no guest state in it)")
        };
        inner.boot(&id, &line)
    }

    async fn run(&self, req: RunRequest) -> Result<VmRecord> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Run,
                vec![req.name.clone(), req.image.clone()],
                to_json(&req),
            )
            .await?;
        if req.image.is_empty() {
            return Err(RuntimeError::Other("cocoon vm run: empty image".into()));
        }
        let image = inner.st().find_image(&req.image).cloned().ok_or_else(|| {
            RuntimeError::ImageNotFound(format!("image {} not found in any backend", req.image))
        })?;
        let memory = size_or("--memory", &req.memory, DEFAULT_MEMORY)?.max(MIN_MEMORY);
        let storage = size_or("--storage", &req.storage, DEFAULT_STORAGE)?.max(MIN_STORAGE);
        let cpu = if req.cpu == 0 {
            DEFAULT_CPU
        } else {
            i64::from(req.cpu)
        };
        let id = random_hex(16);
        let name = if req.name.is_empty() {
            format!("cocoon-{id}")
        } else {
            req.name.clone()
        };
        let hypervisor = if req.backend == Some(Backend::Firecracker) {
            HYPERVISOR_FC
        } else {
            HYPERVISOR_CH
        };
        let vm = inner.insert_vm(NewVm {
            id: id.clone(),
            hypervisor,
            config: VmConfig {
                cpu,
                memory,
                storage,
                queue_size: QUEUE_SIZE,
                disk_queue_size: DISK_QUEUE_SIZE,
                image: req.image.clone(),
                image_digest: image.digest.clone(),
                image_type: image.image_type.clone(),
                network: req.network.clone(),
                no_direct_io: req.no_direct_io,
                windows: req.is_windows(),
                name: name.clone(),
                extra: serde_json::Map::new(),
            },
            nics: 1,
            disk_file: disk_file_for(&image.image_type),
            os: req.os.clone(),
            cpu_policy: req.cpu_policy,
            restore_mode: String::new(),
            state: STATE_CREATING.into(),
        })?;
        let _creating = inner.creating(&id);
        let disk = inner.disk_path(&vm);
        let spec = inner.ctl().disk;
        let token = random_hex(16);
        let seed = u64::from_str_radix(&token[..16], 16).unwrap_or(1);
        let fs = GuestFs::first_boot(&name, &token);
        if let Err(e) = blocking("create guest disk", move || {
            guest::create_disk(&disk, &fs, spec, seed)
        })
        .await
        {
            let _ = inner.delete_vm(&id);
            return Err(e);
        }
        inner.delay(inner.latency(Verb::Run)).await;
        inner.boot(
            &id,
            &format!("boot: first boot of {name} from image {}", req.image),
        )
    }

    async fn inspect(&self, vm: &str) -> Result<VmRecord> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Inspect,
                inner.vm_targets(vm),
                serde_json::json!({ "vm": vm }),
            )
            .await?;
        inner.delay(inner.latency(Verb::Inspect)).await;
        inner
            .st()
            .resolve_vm(vm)
            .map(SimVm::reported)
            .ok_or_else(|| vm_not_found(vm))
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        let inner = &self.inner;
        inner
            .enter(Verb::List, Vec::new(), serde_json::Value::Null)
            .await?;
        inner.delay(inner.latency(Verb::List)).await;
        Ok(inner.list_reported())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Remove,
                inner.vm_targets(id),
                serde_json::json!({ "vm": id }),
            )
            .await?;
        let resolved = inner
            .st()
            .resolve_vm_id(id)
            .ok_or_else(|| vm_not_found(id))?;
        inner.delay(inner.latency(Verb::Remove)).await;
        inner.delete_vm(&resolved).map_err(|e| match e {
            RuntimeError::VmNotFound(_) => vm_not_found(id),
            e => e,
        })
    }

    async fn start(&self, id: &str) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Start,
                inner.vm_targets(id),
                serde_json::json!({ "vm": id }),
            )
            .await?;
        let vm = inner
            .st()
            .resolve_vm(id)
            .cloned()
            .ok_or_else(|| vm_not_found(id))?;
        if vm.record.state == STATE_CREATING {
            return Err(RuntimeError::Other(format!(
                "vm {} is still being created",
                vm.record.id
            )));
        }
        inner.delay(inner.latency(Verb::Start)).await;
        if vm.record.state == STATE_RUNNING && vm.alive {
            return Ok(());
        }
        inner
            .boot(&vm.record.id, "boot: restart in place")
            .map(drop)
    }

    async fn exec(&self, req: ExecRequest) -> Result<()> {
        let inner = &self.inner;
        let ExecRequest {
            id,
            argv,
            env,
            stdin,
            stdout,
            stderr,
        } = req;
        // Same validation as the CLI argv, before anything runs.
        exec_args(&id, &argv, &env, stdin.is_some())?;
        inner
            .enter(
                Verb::Exec,
                inner.vm_targets(&id),
                serde_json::json!({ "vm": id, "argv": argv, "env": env, "stdin": stdin.is_some() }),
            )
            .await?;
        let vm = inner.st().resolve_vm(&id).cloned();
        let refuse = match &vm {
            None => Some(format!("Error: VM not found: {id}\n")),
            Some(v) if !(v.record.state == STATE_RUNNING && v.alive) => Some(format!(
                "Error: vm {} is not running (state {})\n",
                v.record.id,
                v.reported().state
            )),
            Some(_) => None,
        };
        let (mut stdout, mut stderr) = (stdout, stderr);
        use tokio::io::AsyncWriteExt;
        if let (Some(msg), Some(w)) = (&refuse, stderr.as_mut()) {
            let _ = w.write_all(msg.as_bytes()).await;
            let _ = w.flush().await;
        }
        let Some(vm) = vm.filter(|_| refuse.is_none()) else {
            return Err(RuntimeError::exit(&id, 1));
        };
        inner.delay(inner.latency(Verb::Exec)).await;
        let mut input = Vec::new();
        if let Some(r) = stdin {
            r.take(MAX_EXEC_STDIN)
                .read_to_end(&mut input)
                .await
                .map_err(|e| io_err(&format!("cocoon vm exec {id}: read stdin"), e))?;
        }
        let disk = inner.disk_path(&vm);
        let disk_lock = inner.disk_lock(&vm.record.id);
        let cmd = argv.clone();
        let result = blocking("exec", move || {
            let _g = lock(&disk_lock);
            let mut fs = guest::read_guest(&disk)?.unwrap_or_default();
            let mut r = guest::run(&mut fs, &env, &cmd, &input);
            if r.modified
                && let Err(e) = guest::write_guest(&disk, &fs)
            {
                r.stderr
                    .extend_from_slice(format!("write: {e}\n").as_bytes());
                r.code = 1;
            }
            Ok(r)
        })
        .await?;
        for (sink, bytes) in [
            (stdout.as_mut(), &result.stdout),
            (stderr.as_mut(), &result.stderr),
        ] {
            if let Some(w) = sink {
                w.write_all(bytes)
                    .await
                    .map_err(|e| io_err(&format!("cocoon vm exec {id}: copy output"), e))?;
                let _ = w.flush().await;
            }
        }
        inner.console(&vm, &format!("exec {argv:?} → exit {}", result.code));
        match result.code {
            0 => Ok(()),
            code => Err(RuntimeError::exit(&id, code)),
        }
    }

    async fn logs(&self, id: &str, tail: Option<u64>) -> Result<Vec<u8>> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Logs,
                inner.vm_targets(id),
                serde_json::json!({ "vm": id, "tail": tail }),
            )
            .await?;
        inner.delay(inner.latency(Verb::Logs)).await;
        let vm = inner
            .st()
            .resolve_vm(id)
            .cloned()
            .ok_or_else(|| vm_not_found(id))?;
        let path = inner.vm_dir(&vm).join("console.log");
        let text = tokio::fs::read_to_string(&path).await.unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let keep = tail.map_or(lines.len(), |n| {
            lines.len().min(usize::try_from(n).unwrap_or(usize::MAX))
        });
        let mut out = lines[lines.len() - keep..].join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        Ok(out.into_bytes())
    }

    async fn net_resize(&self, id: &str, nics: u32) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::NetResize,
                inner.vm_targets(id),
                serde_json::json!({ "vm": id, "nics": nics }),
            )
            .await?;
        let vm = inner
            .st()
            .resolve_vm(id)
            .cloned()
            .ok_or_else(|| vm_not_found(id))?;
        if vm.record.hypervisor == HYPERVISOR_FC {
            return Err(RuntimeError::Unsupported(format!(
                "cocoon vm net {id}: NIC hot-resize is only supported for cloud-hypervisor"
            )));
        }
        if vm.net_resize_broken {
            return Err(RuntimeError::Other(format!(
                "cocoon vm net {id}: hot-plug failed: device busy (simulated; start the VM to clear)"
            )));
        }
        inner.delay(inner.latency(Verb::NetResize)).await;
        let due = Utc::now()
            + chrono::Duration::from_std(inner.lease_delay).unwrap_or(chrono::Duration::zero());
        {
            let mut st = inner.st();
            let want = nics as usize;
            let have = st
                .vms
                .get(&vm.record.id)
                .map(|v| v.nics.len())
                .ok_or_else(|| vm_not_found(id))?;
            let added = if want > have {
                inner.make_nics(
                    &st,
                    &vm.record.id,
                    &vm.record.config.network,
                    have,
                    want - have,
                )?
            } else {
                Vec::new()
            };
            let running = vm.record.state == STATE_RUNNING && vm.alive;
            let v = st
                .vms
                .get_mut(&vm.record.id)
                .ok_or_else(|| vm_not_found(id))?;
            v.nics.truncate(want);
            for mut nic in added {
                if running && !nic.is_static {
                    nic.lease_due = Some(due);
                }
                v.nics.push(nic);
            }
            v.record.updated_at = Some(Utc::now());
            inner.sync_nics(v);
            inner.save_vms(&st)?;
        }
        inner.console(&vm, &format!("net: resized to {nics} NIC(s)"));
        inner.refresh_leases();
        inner.changed();
        inner.schedule_leases(due);
        Ok(())
    }

    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()> {
        let inner = &self.inner;
        let mut targets = inner.vm_targets(vm_id);
        targets.insert(0, name.to_owned());
        inner
            .enter(
                Verb::SnapshotSave,
                targets,
                serde_json::json!({ "name": name, "vm": vm_id }),
            )
            .await?;
        save_healing(inner.as_ref(), name, vm_id, inner.save_retry).await
    }

    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::SnapshotRemove,
                vec![name.to_owned()],
                serde_json::json!({ "name": name }),
            )
            .await?;
        inner.rm_if_exists(name).await
    }

    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::SnapshotInspect,
                vec![name.to_owned()],
                serde_json::json!({ "name": name }),
            )
            .await?;
        inner.delay(inner.latency(Verb::SnapshotInspect)).await;
        inner
            .st()
            .resolve_snapshot(name)
            .map(|s| s.record.clone())
            .ok_or_else(|| snapshot_not_found(name))
    }

    async fn snapshot_list(&self) -> Result<Vec<SnapshotRecord>> {
        let inner = &self.inner;
        inner
            .enter(Verb::SnapshotList, Vec::new(), serde_json::Value::Null)
            .await?;
        inner.delay(inner.latency(Verb::SnapshotList)).await;
        Ok(inner
            .st()
            .snapshots
            .values()
            .filter(|s| !s.pending)
            .map(|s| s.record.clone())
            .collect())
    }

    async fn snapshot_import(&self, name: &str) -> Result<ImportHandle> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::SnapshotImport,
                vec![name.to_owned()],
                serde_json::json!({ "name": name }),
            )
            .await?;
        if !is_valid_snapshot_name(name) {
            return Err(RuntimeError::Other(format!(
                "invalid snapshot name {name:?}"
            )));
        }
        inner.rm_if_exists(name).await?;
        let dir = inner.layout.snapshot_data().join(random_hex(16));
        std::fs::create_dir_all(&dir).map_err(|e| io_err("create snapshot dir", e))?;
        {
            let mut st = inner.st();
            if st.snapshots.contains_key(name) {
                drop(st);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(classify(format!("snapshot name {name:?} already exists")));
            }
            st.snapshots.insert(
                name.to_owned(),
                SimSnapshot {
                    record: SnapshotRecord {
                        name: name.to_owned(),
                        ..SnapshotRecord::default()
                    },
                    pending: true,
                    data_dir: dir.clone(),
                },
            );
        }
        let rate = inner.ctl().latencies.import_bytes_per_sec;
        let aborted = Arc::new(AtomicBool::new(false));
        let (sink, reader) = tokio::io::duplex(PIPE_BUFFER);
        let bridge = SyncIoBridge::new(reader);
        let (task_inner, task_name, flag) = (inner.clone(), name.to_owned(), aborted.clone());
        let task = tokio::task::spawn_blocking(move || {
            let res =
                tarfmt::read_snapshot_tar(Throttle::new(bridge, rate, Some(flag.clone())), &dir);
            task_inner.finish_import(&task_name, &dir, res, flag.load(Ordering::SeqCst))
        });
        Ok(import_handle(
            sink,
            task,
            aborted,
            format!("snapshot import {name}"),
        ))
    }

    async fn snapshot_export(&self, name: &str) -> Result<ExportHandle> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::SnapshotExport,
                vec![name.to_owned()],
                serde_json::json!({ "name": name }),
            )
            .await?;
        let (record, dir, hold) = {
            let mut st = inner.st();
            let s = st
                .resolve_snapshot(name)
                .cloned()
                .ok_or_else(|| snapshot_not_found(name))?;
            let hold = Hold::new(inner, &mut st, &s.record.name, "export");
            (s.record, s.data_dir, hold)
        };
        let rate = inner.ctl().latencies.export_bytes_per_sec;
        let (reader, writer) = tokio::io::duplex(PIPE_BUFFER);
        let bridge = SyncIoBridge::new(writer);
        let aborted = Arc::new(AtomicBool::new(false));
        let flag = aborted.clone();
        let task = tokio::task::spawn_blocking(move || {
            // The hold lasts as long as the stream is being produced.
            let _hold = hold;
            tarfmt::write_snapshot_tar(Throttle::new(bridge, rate, Some(flag)), &record, &dir)
        });
        let label = name.to_owned();
        // Dropping the completion stops the producer, as killing the CLI child does.
        let guard = AbortOnDrop(Some(aborted));
        let done = async move {
            let mut guard = guard;
            let res = task.await;
            guard.0 = None;
            res.map_err(|e| io_err(&format!("snapshot export {label}"), e))?
                .map_err(|e| io_err(&format!("snapshot export {label}"), e))
        };
        Ok(ExportHandle {
            stream: Box::pin(reader),
            done: Box::pin(done),
        })
    }

    async fn ensure_image(&self, image: &str, force: bool) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::EnsureImage,
                vec![image.to_owned()],
                serde_json::json!({ "image": image, "force": force }),
            )
            .await?;
        if image.is_empty() {
            return Err(RuntimeError::Other("cocoon image pull: empty image".into()));
        }
        if !force && inner.st().find_image(image).is_some() {
            return Ok(());
        }
        let kind = {
            let c = inner.ctl();
            c.known_images
                .get(image)
                .copied()
                .or_else(|| c.permissive_pull.then(|| guess_kind(image)))
        };
        let Some(kind) = kind else {
            return Err(RuntimeError::Other(format!(
                "cocoon image pull {image}: manifest unknown (the simulator was not told about this image)"
            )));
        };
        inner.delay(inner.latency(Verb::EnsureImage)).await;
        inner.register_pulled(image, "", kind)
    }

    async fn image_present(&self, name_or_digest: &str) -> Result<()> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::ImagePresent,
                vec![name_or_digest.to_owned()],
                serde_json::json!({ "image": name_or_digest }),
            )
            .await?;
        inner.delay(inner.latency(Verb::ImagePresent)).await;
        match inner.st().find_image(name_or_digest) {
            Some(_) => Ok(()),
            None => Err(RuntimeError::ImageNotFound(format!(
                "image {name_or_digest} not found in any backend"
            ))),
        }
    }

    async fn image_import(&self, name: &str) -> Result<ImportHandle> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::ImageImport,
                vec![name.to_owned()],
                serde_json::json!({ "image": name }),
            )
            .await?;
        if name.is_empty() {
            return Err(RuntimeError::Other(
                "cocoon image import: empty name".into(),
            ));
        }
        let rate = inner.ctl().latencies.import_bytes_per_sec;
        let aborted = Arc::new(AtomicBool::new(false));
        let (sink, reader) = tokio::io::duplex(PIPE_BUFFER);
        let bridge = SyncIoBridge::new(reader);
        let (task_inner, task_name, flag) = (inner.clone(), name.to_owned(), aborted.clone());
        let task = tokio::task::spawn_blocking(move || -> Result<()> {
            let tmp = task_inner.layout.tmp().join(random_hex(8));
            let res = (|| -> io::Result<(String, String, u64)> {
                let mut input = Throttle::new(bridge, rate, Some(flag.clone()));
                let mut file = std::fs::File::create(&tmp)?;
                let mut hasher = Sha256::new();
                let mut head = Vec::new();
                let mut total = 0u64;
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = input.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    if head.len() < 512 {
                        head.extend_from_slice(&buf[..n.min(512 - head.len())]);
                    }
                    hasher.update(&buf[..n]);
                    file.write_all(&buf[..n])?;
                    total += n as u64;
                }
                file.sync_all()?;
                let kind = if head.starts_with(b"QFI\xfb") {
                    super::types::IMAGE_TYPE_CLOUDIMG
                } else if head.get(257..262) == Some(b"ustar") {
                    super::types::IMAGE_TYPE_OCI
                } else if total == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "empty image stream",
                    ));
                } else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "unrecognized image format (want qcow2 or tar)",
                    ));
                };
                if flag.load(Ordering::SeqCst) {
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "aborted"));
                }
                let hex = hex::encode(hasher.finalize());
                std::fs::rename(&tmp, task_inner.layout.image_blobs().join(&hex))?;
                Ok((format!("sha256:{hex}"), kind.to_owned(), total))
            })();
            match res {
                Ok((digest, image_type, size)) => {
                    let mut st = task_inner.st();
                    st.images.insert(
                        task_name.clone(),
                        SimImage {
                            name: task_name.clone(),
                            digest,
                            image_type,
                            size,
                        },
                    );
                    st.save_images(&task_inner.layout)
                        .map_err(|e| io_err("save image index", e))
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    Err(RuntimeError::Other(format!(
                        "cocoon image import {task_name}: {e}"
                    )))
                }
            }
        });
        Ok(import_handle(
            sink,
            task,
            aborted,
            format!("cocoon image import {name}"),
        ))
    }

    async fn watch_events(&self) -> Result<EventStream> {
        let inner = &self.inner;
        inner
            .enter(Verb::WatchEvents, Vec::new(), serde_json::Value::Null)
            .await?;
        struct Watch {
            inner: Weak<Inner>,
            changes: watch::Receiver<u64>,
            close: watch::Receiver<u64>,
            differ: EventDiffer,
            queue: VecDeque<VmEvent>,
            first: bool,
            tick: Duration,
        }
        let w = Watch {
            inner: Arc::downgrade(inner),
            changes: inner.change_tx.subscribe(),
            close: inner.close_tx.subscribe(),
            differ: EventDiffer::new(),
            queue: VecDeque::new(),
            first: true,
            tick: inner.tick,
        };
        Ok(Box::pin(futures::stream::unfold(w, |mut w| async move {
            loop {
                if w.close.has_changed().unwrap_or(true) {
                    return None;
                }
                if let Some(ev) = w.queue.pop_front() {
                    return Some((Ok(ev), w));
                }
                if !w.first {
                    tokio::select! {
                        () = tokio::time::sleep(w.tick) => {}
                        r = w.changes.changed() => if r.is_err() { return None; },
                        _ = w.close.changed() => return None,
                    }
                }
                w.first = false;
                let inner = w.inner.upgrade()?;
                // Mark the current version seen before listing, so a change that lands during
                // the listing still wakes the next tick.
                w.changes.borrow_and_update();
                let vms = inner.list_reported();
                drop(inner);
                w.queue.extend(w.differ.tick(&vms));
            }
        })))
    }

    async fn reconcile_stale_create(&self, id: &str) -> Result<StaleCreateOutcome> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::ReconcileStaleCreate,
                inner.vm_targets(id),
                serde_json::json!({ "vm": id }),
            )
            .await?;
        if let Some(o) = inner.ctl().stale_create_script.pop_front() {
            return Ok(o);
        }
        let (resolved, state, busy) = {
            let st = inner.st();
            match st.resolve_vm(id) {
                None => return Ok(StaleCreateOutcome::NotFound),
                Some(v) => (
                    v.record.id.clone(),
                    v.record.state.clone(),
                    st.creating.contains(&v.record.id),
                ),
            }
        };
        if state != STATE_CREATING {
            return Ok(StaleCreateOutcome::NotCreating);
        }
        if busy {
            return Ok(StaleCreateOutcome::Busy);
        }
        inner.delete_vm(&resolved)?;
        Ok(StaleCreateOutcome::Collected)
    }

    async fn vm_stats(&self, vm: &VmRecord) -> Result<VmStats> {
        let inner = &self.inner;
        inner
            .enter(
                Verb::Stats,
                inner.vm_targets(&vm.id),
                serde_json::json!({ "vm": vm.id }),
            )
            .await?;
        let st = inner.st();
        let v = st.resolve_vm(&vm.id).ok_or_else(|| vm_not_found(&vm.id))?;
        Ok(Inner::synthetic_stats(v, Utc::now()))
    }
}

/// Polls `cond` on every control change until it holds or `timeout` passes.
async fn wait_ctl(inner: &Inner, timeout: Duration, cond: impl Fn(&Control) -> bool) -> bool {
    let mut rx = inner.ctl_tx.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond(&inner.ctl()) {
            return true;
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => return cond(&inner.ctl()),
        }
    }
}

impl SimHandle {
    fn vm_id(&self, r: &str) -> Result<String> {
        self.inner
            .st()
            .resolve_vm_id(r)
            .ok_or_else(|| vm_not_found(r))
    }

    fn mutate_vm(&self, r: &str, f: impl FnOnce(&mut SimVm)) -> Result<VmRecord> {
        let id = self.vm_id(r)?;
        let vm = {
            let mut st = self.inner.st();
            let vm = st.vms.get_mut(&id).ok_or_else(|| vm_not_found(r))?;
            f(vm);
            vm.record.updated_at = Some(Utc::now());
            let vm = vm.clone();
            self.inner.save_vms(&st)?;
            vm
        };
        self.inner.changed();
        Ok(vm.reported())
    }

    /// The state root.
    pub fn root(&self) -> &Path {
        &self.inner.layout.root
    }

    /// The lease file.
    pub fn lease_path(&self) -> &Path {
        &self.inner.lease_path
    }

    /// Adds a failure rule.
    pub fn fail(&self, rule: FailRule) {
        self.inner.ctl().fail_rules.push(rule);
        self.inner.bump_ctl();
    }

    /// Fails the next `n` calls of `verb` with `message`.
    pub fn fail_next(&self, verb: Verb, n: u32, message: &str) {
        self.fail(FailRule::new(verb, message).times(n));
    }

    /// Fails every call of `verb` with `message` until [`clear_failures`](Self::clear_failures).
    pub fn fail_always(&self, verb: Verb, message: &str) {
        self.fail(FailRule::new(verb, message));
    }

    /// Removes every failure rule.
    pub fn clear_failures(&self) {
        self.inner.ctl().fail_rules.clear();
        self.inner.bump_ctl();
    }

    /// The next `n` inspects fail with a transient (unclassified) error.
    pub fn fail_inspect_transient(&self, n: u32) {
        self.fail_next(
            Verb::Inspect,
            n,
            "simulated transient error: connection reset by peer",
        );
    }

    /// The next `n` `watch_events` calls fail to start.
    pub fn fail_watch_start(&self, n: u32) {
        self.fail_next(
            Verb::WatchEvents,
            n,
            "simulated: cannot start the event watcher",
        );
    }

    /// Blocks every call of `verb` (optionally only those naming `target`) until
    /// [`unblock`](Self::unblock) or [`cancel_blocked`](Self::cancel_blocked), or until the
    /// caller drops it.
    pub fn block(&self, verb: Verb, target: Option<&str>) {
        self.inner.ctl().blocks.push(BlockRule {
            verb,
            target: target.map(str::to_owned),
        });
        self.inner.bump_ctl();
    }

    /// Lifts the blocks of `verb`; waiting calls proceed.
    pub fn unblock(&self, verb: Verb) {
        self.inner.ctl().blocks.retain(|b| b.verb != verb);
        self.inner.bump_ctl();
    }

    /// Lifts the blocks of `verb`; waiting calls fail with `Cancelled`.
    pub fn cancel_blocked(&self, verb: Verb) {
        {
            let mut c = self.inner.ctl();
            c.blocks.retain(|b| b.verb != verb);
            *c.cancel_gen.entry(verb).or_default() += 1;
        }
        self.inner.bump_ctl();
    }

    /// How many calls of `verb` are waiting on a block now.
    pub fn blocked(&self, verb: Verb) -> usize {
        self.inner
            .ctl()
            .blocked_now
            .get(&verb)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until at least `n` calls of `verb` are blocked; false on timeout.
    pub async fn wait_blocked(&self, verb: Verb, n: usize, timeout: Duration) -> bool {
        wait_ctl(&self.inner, timeout, |c| {
            c.blocked_now.get(&verb).copied().unwrap_or(0) >= n
        })
        .await
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.ctl().calls.clone()
    }

    /// The calls of one verb.
    pub fn calls_of(&self, verb: Verb) -> Vec<Call> {
        self.inner
            .ctl()
            .calls
            .iter()
            .filter(|c| c.verb == verb)
            .cloned()
            .collect()
    }

    /// How many calls of `verb` so far.
    pub fn call_count(&self, verb: Verb) -> usize {
        self.inner
            .ctl()
            .calls
            .iter()
            .filter(|c| c.verb == verb)
            .count()
    }

    /// Forgets the call log.
    pub fn clear_calls(&self) {
        self.inner.ctl().calls.clear();
        self.inner.bump_ctl();
    }

    /// Waits until `verb` has been called at least `n` times; false on timeout.
    pub async fn wait_calls(&self, verb: Verb, n: usize, timeout: Duration) -> bool {
        wait_ctl(&self.inner, timeout, |c| {
            c.calls.iter().filter(|x| x.verb == verb).count() >= n
        })
        .await
    }

    /// Crashes a VM (see [`CrashKind`]); event streams tick at once.
    pub fn crash(&self, vm: &str, kind: CrashKind) -> Result<VmRecord> {
        let rec = self.mutate_vm(vm, |v| {
            v.alive = false;
            let now = Utc::now();
            match kind {
                CrashKind::Stopped => {
                    v.record.state = STATE_STOPPED.into();
                    v.record.pid = 0;
                    v.record.stopped_at = Some(now);
                }
                CrashKind::Error => {
                    v.record.state = STATE_ERROR.into();
                    v.record.pid = 0;
                    v.record.stopped_at = Some(now);
                }
                CrashKind::KillProcess => {}
            }
        })?;
        if let Some(v) = self.inner.st().vms.get(&rec.id).cloned() {
            self.inner
                .console(&v, &format!("crash: {kind:?} (simulated)"));
        }
        Ok(rec)
    }

    /// Deletes a VM behind the agent's back.
    pub fn delete_vm(&self, vm: &str) -> Result<()> {
        let id = self.vm_id(vm)?;
        self.inner.delete_vm(&id)
    }

    /// Creates a VM behind the agent's back (no image check, no latency).
    pub fn create_vm(&self, spec: OutOfBandVm) -> Result<VmRecord> {
        let id = random_hex(16);
        let hypervisor = if spec.backend == Some(Backend::Firecracker) {
            HYPERVISOR_FC
        } else {
            HYPERVISOR_CH
        };
        let vm = self.inner.insert_vm(NewVm {
            id: id.clone(),
            hypervisor,
            config: VmConfig {
                cpu: spec.cpu,
                memory: spec.memory,
                storage: DEFAULT_STORAGE,
                queue_size: QUEUE_SIZE,
                disk_queue_size: DISK_QUEUE_SIZE,
                image: spec.image,
                image_type: super::types::IMAGE_TYPE_OCI.into(),
                network: spec.network,
                name: spec.name.clone(),
                ..VmConfig::default()
            },
            nics: 1,
            disk_file: "cow.raw",
            os: String::new(),
            cpu_policy: CpuPolicy::default(),
            restore_mode: String::new(),
            state: STATE_CREATING.into(),
        })?;
        let disk = self.inner.disk_path(&vm);
        guest::create_disk(
            &disk,
            &GuestFs::first_boot(&spec.name, &random_hex(16)),
            DiskSpec {
                size: 0,
                fill: DiskFill::Sparse,
            },
            1,
        )
        .map_err(|e| io_err("create guest disk", e))?;
        if spec.state == STATE_RUNNING {
            return self.inner.boot(&id, "boot: created out of band");
        }
        self.mutate_vm(&id, |v| v.record.state = spec.state)
    }

    /// Ends every open event stream (the node reconnects after 2 s).
    pub fn close_event_streams(&self) {
        self.inner.close_tx.send_modify(|v| *v += 1);
    }

    /// Makes `net_resize` on `vm` fail until its next `start`.
    pub fn break_net_resize_until_start(&self, vm: &str) -> Result<()> {
        self.mutate_vm(vm, |v| v.net_resize_broken = true).map(drop)
    }

    /// Withholds (or releases) DHCP leases: of one VM (by name or id), or of all with `None`.
    pub fn withhold_leases(&self, vm: Option<&str>, withhold: bool) {
        {
            let mut c = self.inner.ctl();
            match (vm, withhold) {
                (None, w) => c.withhold_all_leases = w,
                (Some(v), true) => {
                    c.withhold_leases.insert(v.to_owned());
                }
                (Some(v), false) => {
                    c.withhold_leases.remove(v);
                }
            }
        }
        self.inner.refresh_leases();
    }

    /// The leases currently in the lease file.
    pub fn leases(&self) -> Vec<Lease> {
        self.inner.refresh_leases();
        self.inner.st().last_leases.clone().unwrap_or_default()
    }

    /// Switches the collision wording of `snapshot save`.
    pub fn set_collision_wording(&self, w: CollisionWording) {
        self.inner.ctl().wording = w;
    }

    /// Replaces the latencies.
    pub fn set_latencies(&self, l: Latencies) {
        self.inner.ctl().latencies = l;
    }

    /// The latencies in force.
    pub fn latencies(&self) -> Latencies {
        self.inner.ctl().latencies.clone()
    }

    /// Size and fill of guest disks created from now on.
    pub fn set_disk(&self, spec: DiskSpec) {
        self.inner.ctl().disk = spec;
    }

    /// Lets `ensure_image` pull `image`.
    pub fn add_pullable_image(&self, image: &str, kind: ImageKind) {
        self.inner.ctl().known_images.insert(image.to_owned(), kind);
    }

    /// Puts `image` straight into the local store (as if pulled earlier).
    pub fn install_image(&self, image: &str, kind: ImageKind) -> Result<()> {
        self.inner.register_pulled(image, "", kind)
    }

    /// Permissive pulls on/off.
    pub fn set_permissive_pull(&self, on: bool) {
        self.inner.ctl().permissive_pull = on;
    }

    /// The next `reconcile_stale_create` answers `outcome` (queued, one per call).
    pub fn script_stale_create(&self, outcome: StaleCreateOutcome) {
        self.inner.ctl().stale_create_script.push_back(outcome);
    }

    /// The guest files of a VM.
    pub fn guest_fs(&self, vm: &str) -> Result<GuestFs> {
        let v = self
            .inner
            .st()
            .resolve_vm(vm)
            .cloned()
            .ok_or_else(|| vm_not_found(vm))?;
        let disk_lock = self.inner.disk_lock(&v.record.id);
        let _g = lock(&disk_lock);
        guest::read_guest(&self.inner.disk_path(&v))
            .map_err(|e| io_err("read guest disk", e))
            .map(Option::unwrap_or_default)
    }

    /// The state token of a VM's guest (same for a VM and every clone or restore of it).
    pub fn guest_token(&self, vm: &str) -> Result<String> {
        self.guest_fs(vm)?
            .token()
            .ok_or_else(|| RuntimeError::Other(format!("vm {vm} has no state token")))
    }

    /// One guest file (`None` if absent).
    pub fn guest_file(&self, vm: &str, path: &str) -> Result<Option<String>> {
        Ok(self.guest_fs(vm)?.files.get(path).cloned())
    }

    /// What the simulator knows about a VM beyond its record.
    pub fn vm_info(&self, vm: &str) -> Result<SimVmInfo> {
        let v = self
            .inner
            .st()
            .resolve_vm(vm)
            .cloned()
            .ok_or_else(|| vm_not_found(vm))?;
        Ok(SimVmInfo {
            id: v.record.id.clone(),
            alive: v.alive,
            cpu_policy: v.cpu_policy,
            restore_mode: v.restore_mode.clone(),
            os: v.os.clone(),
            disk_path: self.inner.disk_path(&v),
            net_resize_broken: v.net_resize_broken,
        })
    }

    /// Every VM as `list` would report it (sorted by name, then id), with whether its
    /// simulated process is alive; no call is recorded.
    pub fn vm_rows(&self) -> Vec<VmRow> {
        let mut rows: Vec<VmRow> = self
            .inner
            .st()
            .vms
            .values()
            .map(|v| {
                let r = v.reported();
                VmRow {
                    name: r.config.name.clone(),
                    id: r.id.clone(),
                    state: r.state.clone(),
                    alive: v.alive,
                }
            })
            .collect();
        rows.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        rows
    }

    /// How many calls of each verb so far (verbs never called are absent).
    pub fn call_counts(&self) -> BTreeMap<Verb, usize> {
        let mut counts = BTreeMap::new();
        for c in &self.inner.ctl().calls {
            *counts.entry(c.verb).or_default() += 1;
        }
        counts
    }

    /// Synthetic stats of a VM (as [`Runtime::vm_stats`], without recording a call).
    pub fn stats(&self, vm: &str) -> Result<VmStats> {
        let st = self.inner.st();
        let v = st.resolve_vm(vm).ok_or_else(|| vm_not_found(vm))?;
        Ok(Inner::synthetic_stats(v, Utc::now()))
    }

    /// The data directory of a committed snapshot.
    pub fn snapshot_dir(&self, name: &str) -> Option<PathBuf> {
        self.inner
            .st()
            .resolve_snapshot(name)
            .map(|s| s.data_dir.clone())
    }

    /// Names currently held (clone/export) → hold kinds.
    pub fn snapshot_holds(&self) -> BTreeMap<String, Vec<String>> {
        self.inner
            .st()
            .holds
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
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
}
