//! The test and demo control handle ([`SimHandle`]) and the types it reports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use cocoon_api::contract::Backend;

use super::control::{
    BlockRule, Call, CollisionWording, Control, CrashKind, FailRule, ImageKind, Latencies, Verb,
};
use super::guest::{DiskFill, DiskSpec, GuestFs};
use super::net::Lease;
use super::state::{SimVm, random_hex};
use super::vm::{DEFAULT_CPU, DEFAULT_MEMORY, DEFAULT_STORAGE, DISK_QUEUE_SIZE, NewVm, QUEUE_SIZE};
use super::{Inner, SimHandle, guest, io_err, lock, vm_not_found};
use crate::error::{Result, RuntimeError};
use crate::types::{
    CpuPolicy, HYPERVISOR_CH, HYPERVISOR_FC, STATE_CREATING, STATE_ERROR, STATE_RUNNING,
    STATE_STOPPED, StaleCreateOutcome, VmConfig, VmRecord, VmStats,
};

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

/// Polls `cond` on every control change until it holds or `timeout` passes.
pub(super) async fn wait_ctl(
    inner: &Inner,
    timeout: Duration,
    cond: impl Fn(&Control) -> bool,
) -> bool {
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

    /// The guest of `vm` (id or name) ignores `stop` (`true`) or answers it again (`false`):
    /// an ignoring guest never shuts down, so the `stop` call stays pending until its caller
    /// drops it (issue 40's "guest that does not stop in time").
    pub fn ignore_shutdown(&self, vm: &str, ignore: bool) {
        {
            let mut c = self.inner.ctl();
            if ignore {
                c.ignore_shutdown.insert(vm.to_owned());
            } else {
                c.ignore_shutdown.remove(vm);
            }
        }
        self.inner.bump_ctl();
    }

    /// Marks `vm` (id or name) busy (its guest uses every vCPU: the stats' CPU time grows by a
    /// second per vCPU per second) or idle again (the time used so far stays counted).
    pub fn set_busy(&self, vm: &str, busy: bool) -> Result<()> {
        let v = self.inner.vm(vm)?;
        let cpus = v.record.config.cpu.max(1) as u64;
        let ids: std::collections::BTreeSet<String> = self.inner.st().vms.keys().cloned().collect();
        {
            let mut c = self.inner.ctl();
            c.busy.retain(|id, _| ids.contains(id));
            c.busy
                .entry(v.record.id.clone())
                .or_default()
                .set(busy, Utc::now(), cpus);
        }
        self.inner.bump_ctl();
        Ok(())
    }

    /// The guest prints `bytes` on its console, as is (no timestamp, no newline added): what
    /// a guest writing to its serial console does; `vm logs` reads it back.
    pub fn guest_print(&self, vm: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write as _;
        let v = self
            .inner
            .st()
            .resolve_vm(vm)
            .cloned()
            .ok_or_else(|| vm_not_found(vm))?;
        let path = self.inner.vm_dir(&v).join("console.log");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| io_err("write console log", e))
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
                image_type: crate::types::IMAGE_TYPE_OCI.into(),
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

    /// Synthetic stats of a VM (as [`Runtime::vm_stats`](crate::Runtime::vm_stats), without
    /// recording a call).
    pub fn stats(&self, vm: &str) -> Result<VmStats> {
        let v = self.inner.vm(vm)?;
        Ok(self.inner.stats_now(&v))
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
