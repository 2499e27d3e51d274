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
//! # async fn demo() -> cocoon_runtime::Result<()> {
//! use cocoon_runtime::sim::{SimConfig, SimRuntime};
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

mod config;
mod control;
mod echo;
mod events;
mod guest;
mod handle;
mod images;
mod net;
mod snapshots;
pub mod socket;
#[cfg(test)]
mod socket_tests;
mod state;
mod transfer;
mod vm;

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::watch;

pub use config::SimConfig;
pub use control::{
    Call, CollisionWording, CrashKind, FailRule, ImageKind, Latencies, MAX_LATENCY_SCALE,
    UnknownVerb, Verb,
};
pub use guest::{
    DiskFill, DiskSpec, GuestFs, HOSTNAME_PATH, MEMORY_PAGE, MemoryFill, TOKEN_PATH,
    write_realistic_memory,
};
pub use handle::{OutOfBandVm, SimVmInfo, VmRow};
pub use net::{IpPool, Lease};

use self::control::Control;
use self::state::{Layout, SimVm, State};
use crate::Runtime;
use crate::error::{Result, RuntimeError, classify};
use crate::events::EventStream;
use crate::heal::RetryPolicy;
use crate::io::{ExportHandle, ImportHandle};
use crate::types::{
    CloneRequest, ExecRequest, RunRequest, SnapshotRecord, StaleCreateOutcome, VmRecord, VmStats,
};

/// Largest exec stdin the simulator buffers.
const MAX_EXEC_STDIN: u64 = 64 << 20;
/// Pipe buffer between the async side and the tar thread.
const PIPE_BUFFER: usize = 256 << 10;
/// The `extra` of a verb whose only argument is its subject ([`Inner::begin`]).
const NO_ARGS: serde_json::Value = serde_json::Value::Null;

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
    /// Bytes each running VM's echo served, by VM id (`echo`).
    traffic: Mutex<HashMap<String, Arc<echo::Traffic>>>,
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

/// What a verb acts on, as [`Inner::begin`] records and matches the call.
enum On<'a> {
    /// Nothing in particular (`list`, `snapshot list`, the event stream): no targets.
    Nothing,
    /// A VM reference (id, name or id prefix): targets are the reference and the id and name
    /// it resolves to; args start with `"vm"`.
    Vm(&'a str),
    /// A snapshot name: the target; args start with `"name"`.
    Snapshot(&'a str),
    /// A snapshot saved from a VM: the name, then the VM's targets; args `"name"`, `"vm"`.
    SnapshotOf { name: &'a str, vm: &'a str },
    /// An image reference: the target; args start with `"image"`.
    Image(&'a str),
    /// A new VM: its name and its source (image or snapshot); the args are the request alone.
    New { name: &'a str, source: &'a str },
}

/// A call past its prologue ([`Inner::begin`]).
struct Begun<'a> {
    inner: &'a Inner,
    verb: Verb,
    /// The names the call was matched by (injected failures, blocks).
    targets: Vec<String>,
}

impl Begun<'_> {
    /// Waits the verb's configured latency.
    async fn pace(&self) {
        self.inner.pace(self.verb).await;
    }
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

    /// Every verb's prologue: names the call's targets after its subject, then refreshes the
    /// leases, records the call, applies an injected failure and waits out a block. `extra`
    /// holds the verb's own arguments (an object, or null); the recorded args are the
    /// subject's fields followed by them. Latencies are applied by each verb at its own point
    /// ([`Begun::pace`]).
    async fn begin(&self, verb: Verb, on: On<'_>, extra: serde_json::Value) -> Result<Begun<'_>> {
        let (targets, fields) = match on {
            On::Nothing => (Vec::new(), Vec::new()),
            On::Vm(r) => (self.vm_targets(r), vec![("vm", r)]),
            On::Snapshot(name) => (vec![name.to_owned()], vec![("name", name)]),
            On::SnapshotOf { name, vm } => {
                let mut t = vec![name.to_owned()];
                t.extend(self.vm_targets(vm));
                (t, vec![("name", name), ("vm", vm)])
            }
            On::Image(r) => (vec![r.to_owned()], vec![("image", r)]),
            On::New { name, source } => (vec![name.to_owned(), source.to_owned()], Vec::new()),
        };
        let args = if fields.is_empty() {
            extra
        } else {
            let mut m: serde_json::Map<String, serde_json::Value> = fields
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into()))
                .collect();
            if let serde_json::Value::Object(e) = extra {
                m.extend(e);
            }
            serde_json::Value::Object(m)
        };
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
                    return Ok(Begun {
                        inner: self,
                        verb,
                        targets,
                    });
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

    /// The VM `r` names (id, name or unique id prefix), as it is now.
    fn vm(&self, r: &str) -> Result<SimVm> {
        self.st()
            .resolve_vm(r)
            .cloned()
            .ok_or_else(|| vm_not_found(r))
    }

    /// Waits `verb`'s configured latency.
    async fn pace(&self, verb: Verb) {
        self.delay(self.latency(verb)).await;
    }

    fn latency(&self, verb: Verb) -> Duration {
        self.ctl().latency(verb)
    }

    async fn delay(&self, d: Duration) {
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
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
            memory_fill: cfg.memory_fill,
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
            traffic: Mutex::new(HashMap::new()),
        });
        echo::start(&inner, cfg.echo_ports.clone());
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
        vm::clone_vm(&self.inner, req).await
    }

    async fn run(&self, req: RunRequest) -> Result<VmRecord> {
        vm::run(&self.inner, req).await
    }

    async fn inspect(&self, vm: &str) -> Result<VmRecord> {
        vm::inspect(&self.inner, vm).await
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        vm::list(&self.inner).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        vm::remove(&self.inner, id).await
    }

    async fn stop(&self, id: &str, timeout: std::time::Duration) -> Result<()> {
        vm::stop(&self.inner, id, timeout).await
    }

    async fn start(&self, id: &str) -> Result<()> {
        vm::start(&self.inner, id).await
    }

    async fn exec(&self, req: ExecRequest) -> Result<()> {
        vm::exec(&self.inner, req).await
    }

    async fn logs_capped(&self, id: &str, tail: Option<u64>, max_bytes: usize) -> Result<Vec<u8>> {
        vm::logs(&self.inner, id, tail, max_bytes).await
    }

    async fn net_resize(&self, id: &str, nics: u32) -> Result<()> {
        vm::net_resize(&self.inner, id, nics).await
    }

    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()> {
        snapshots::snapshot_save(&self.inner, name, vm_id).await
    }

    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()> {
        snapshots::snapshot_remove_if_exists(&self.inner, name).await
    }

    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord> {
        snapshots::snapshot_inspect(&self.inner, name).await
    }

    async fn snapshot_list(&self) -> Result<Vec<SnapshotRecord>> {
        snapshots::snapshot_list(&self.inner).await
    }

    async fn snapshot_import(&self, name: &str) -> Result<ImportHandle> {
        snapshots::snapshot_import(&self.inner, name).await
    }

    async fn snapshot_export(&self, name: &str) -> Result<ExportHandle> {
        snapshots::snapshot_export(&self.inner, name).await
    }

    async fn ensure_image(&self, image: &str, force: bool) -> Result<()> {
        images::ensure_image(&self.inner, image, force).await
    }

    async fn image_present(&self, name_or_digest: &str) -> Result<()> {
        images::image_present(&self.inner, name_or_digest).await
    }

    async fn image_import(&self, name: &str) -> Result<ImportHandle> {
        images::image_import(&self.inner, name).await
    }

    async fn watch_events(&self) -> Result<EventStream> {
        events::watch_events(&self.inner).await
    }

    async fn reconcile_stale_create(&self, id: &str) -> Result<StaleCreateOutcome> {
        vm::reconcile_stale_create(&self.inner, id).await
    }

    async fn vm_stats(&self, vm: &VmRecord) -> Result<VmStats> {
        vm::vm_stats(&self.inner, vm).await
    }
}
