//! VM verbs (clone, run, inspect, list, remove, start, exec, logs, net resize, stale creates,
//! stats) and the VM records, NICs and DHCP leases behind them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::Backend;
use cocoon_api::naming::is_valid_vm_name;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::control::Verb;
use super::guest::{DiskSpec, GuestFs};
use super::net::Lease;
use super::snapshots::{Hold, find_snapshot_disk};
use super::state::{SimNic, SimVm, State, random_hex};
use super::{
    Inner, MAX_EXEC_STDIN, NO_ARGS, On, blocking, guest, io_err, lock, net, snapshot_not_found,
    to_json, vm_not_found,
};
use crate::args::{exec_args, quantity_bytes};
use crate::error::{Result, RuntimeError, classify};
use crate::tarfmt;
use crate::types::{
    CloneRequest, CloneSource, CpuPolicy, ExecRequest, HYPERVISOR_CH, HYPERVISOR_FC, IdSet,
    RunRequest, STATE_CREATING, STATE_RUNNING, STATE_STOPPED, StaleCreateOutcome, TapStats,
    VmConfig, VmRecord, VmStats,
};

pub(super) const GIB: i64 = 1 << 30;
pub(super) const DEFAULT_CPU: i64 = 2;
pub(super) const DEFAULT_MEMORY: i64 = GIB;
pub(super) const DEFAULT_STORAGE: i64 = 10 * GIB;
pub(super) const MIN_MEMORY: i64 = 512 << 20;
pub(super) const MIN_STORAGE: i64 = 10 * GIB;
pub(super) const QUEUE_SIZE: i64 = 256;
pub(super) const DISK_QUEUE_SIZE: i64 = 128;

/// Marks a VM create as in flight until dropped (for `reconcile_stale_create`'s `busy`).
pub(super) struct Creating {
    inner: Arc<Inner>,
    id: String,
}

impl Drop for Creating {
    fn drop(&mut self) {
        lock(&self.inner.state).creating.remove(&self.id);
    }
}

/// Everything a new VM record needs.
pub(super) struct NewVm {
    pub(super) id: String,
    pub(super) hypervisor: &'static str,
    pub(super) config: VmConfig,
    pub(super) nics: u32,
    pub(super) disk_file: &'static str,
    pub(super) os: String,
    pub(super) cpu_policy: CpuPolicy,
    pub(super) restore_mode: String,
    pub(super) state: String,
}

/// The guest disk file of an image type.
pub(super) fn disk_file_for(image_type: &str) -> &'static str {
    if image_type == crate::types::IMAGE_TYPE_CLOUDIMG {
        "overlay.qcow2"
    } else {
        "cow.raw"
    }
}

/// A Quantity flag value in bytes: default when empty, error when unparsable.
pub(super) fn size_or(flag: &str, raw: &str, default: i64) -> Result<i64> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(default);
    }
    quantity_bytes(raw)
        .filter(|b| *b > 0)
        .ok_or_else(|| RuntimeError::Other(format!("invalid {flag} {raw:?}")))
}

impl Inner {
    /// Rewrites the lease file if the set of due, non-withheld DHCP leases changed.
    pub(super) fn refresh_leases(&self) {
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
    pub(super) fn schedule_leases(self: &Arc<Self>, due: DateTime<Utc>) {
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
    pub(super) fn make_nics(
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

    pub(super) fn sync_nics(&self, vm: &mut SimVm) {
        vm.sync_nics(
            &self.pool.gateway().to_string(),
            i64::from(self.pool.prefix),
            vm.record.config.cpu.max(1),
        );
    }

    /// Inserts a VM record (state from `new.state`) after the name checks; creates its dir.
    pub(super) fn insert_vm(&self, new: NewVm) -> Result<SimVm> {
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
        vm.record.storage_configs = vec![crate::types::StorageConfig {
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
    pub(super) fn delete_vm(&self, id: &str) -> Result<()> {
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
    /// The guest of `id` shut down: record `stopped`, PID 0, process gone.
    pub(super) fn shut_down(self: &Arc<Self>, id: &str, line: &str) -> Result<()> {
        let vm = {
            let mut st = self.st();
            let vm = st.vms.get_mut(id).ok_or_else(|| vm_not_found(id))?;
            let now = Utc::now();
            vm.record.state = STATE_STOPPED.into();
            vm.record.pid = 0;
            vm.record.stopped_at = Some(now);
            vm.record.updated_at = Some(now);
            vm.alive = false;
            let vm = vm.clone();
            self.save_vms(&st)?;
            vm
        };
        self.console(&vm, line);
        self.changed();
        Ok(())
    }

    pub(super) fn boot(self: &Arc<Self>, id: &str, line: &str) -> Result<VmRecord> {
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

    pub(super) fn creating(self: &Arc<Self>, id: &str) -> Creating {
        self.st().creating.insert(id.to_owned());
        Creating {
            inner: self.clone(),
            id: id.to_owned(),
        }
    }

    pub(super) fn list_reported(&self) -> Vec<VmRecord> {
        let st = self.st();
        let mut vms: Vec<VmRecord> = st.vms.values().map(SimVm::reported).collect();
        vms.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        vms
    }

    /// The stats of `vm` now: [`Inner::synthetic_stats`] plus the bytes its echo served (on
    /// its first TAP) and, while it runs, its busy CPU time.
    pub(super) fn stats_now(&self, vm: &SimVm) -> VmStats {
        let now = Utc::now();
        let mut stats = Inner::synthetic_stats(vm, now);
        let (rx, tx) = super::echo::traffic_of(self, &vm.record.id);
        if let Some(tap) = stats.taps.first_mut() {
            tap.rx_bytes = rx;
            tap.tx_bytes = tx;
            tap.rx_packets = rx.div_ceil(1500);
            tap.tx_packets = tx.div_ceil(1500);
        }
        if stats.pid != 0 || (vm.alive && vm.record.state == STATE_RUNNING) {
            let cpus = vm.record.config.cpu.max(1) as u64;
            let busy = self
                .ctl()
                .busy
                .get(&vm.record.id)
                .map_or(0, |b| b.ns(now, cpus));
            stats.cpu_time_ns = stats.cpu_time_ns.saturating_add(busy);
        }
        stats
    }

    pub(super) fn synthetic_stats(vm: &SimVm, now: DateTime<Utc>) -> VmStats {
        let running = vm.record.state == STATE_RUNNING && vm.alive;
        let up_ms = vm
            .record
            .started_at
            .filter(|_| running)
            .map(|s| (now - s).num_milliseconds().max(0) as u64)
            .unwrap_or(0);
        // An idle guest moves no bytes: the TAP counters are what its echo served (`echo`).
        let taps = vm
            .nics
            .iter()
            .map(|n| TapStats {
                tap: n.tap.clone(),
                ..TapStats::default()
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
            // 1 % of every vCPU since the last start: an idle guest, below the node agent's
            // activity threshold (200m) up to 20 vCPUs.
            cpu_time_ns: up_ms * 1_000_000 * cpus / 100,
            taps,
        }
    }
}

pub(super) async fn clone_vm(inner: &Arc<Inner>, req: CloneRequest) -> Result<VmRecord> {
    let source = req.from.label();
    let call = inner
        .begin(
            Verb::Clone,
            On::New {
                name: &req.to,
                source: &source,
            },
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
                RuntimeError::Other(format!("cocoon vm clone --from-dir {}: {e}", dir.display()))
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
    call.pace().await;
    drop(hold);
    let line = if restored {
        format!("boot: restored from snapshot {source}")
    } else {
        format!("boot: first boot from snapshot {source} (no guest state in it)")
    };
    inner.boot(&id, &line)
}

pub(super) async fn run(inner: &Arc<Inner>, req: RunRequest) -> Result<VmRecord> {
    let call = inner
        .begin(
            Verb::Run,
            On::New {
                name: &req.name,
                source: &req.image,
            },
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
    call.pace().await;
    inner.boot(
        &id,
        &format!("boot: first boot of {name} from image {}", req.image),
    )
}

pub(super) async fn inspect(inner: &Arc<Inner>, vm: &str) -> Result<VmRecord> {
    inner
        .begin(Verb::Inspect, On::Vm(vm), NO_ARGS)
        .await?
        .pace()
        .await;
    inner.vm(vm).map(|v| v.reported())
}

pub(super) async fn list(inner: &Arc<Inner>) -> Result<Vec<VmRecord>> {
    inner
        .begin(Verb::List, On::Nothing, NO_ARGS)
        .await?
        .pace()
        .await;
    Ok(inner.list_reported())
}

pub(super) async fn remove(inner: &Arc<Inner>, id: &str) -> Result<()> {
    let call = inner.begin(Verb::Remove, On::Vm(id), NO_ARGS).await?;
    let resolved = inner
        .st()
        .resolve_vm_id(id)
        .ok_or_else(|| vm_not_found(id))?;
    call.pace().await;
    inner.delete_vm(&resolved).map_err(|e| match e {
        RuntimeError::VmNotFound(_) => vm_not_found(id),
        e => e,
    })?;
    // A failure injected after the effect: the VM is gone, the call still fails.
    let late = inner.ctl().take_failure_after(Verb::Remove, &call.targets);
    match late {
        Some(message) => Err(classify(message)),
        None => Ok(()),
    }
}

/// `vm stop --timeout`: a running guest shuts down (record `stopped`, process gone) after
/// the verb's latency; a stopped one stays stopped. A guest set to ignore shutdown
/// ([`super::SimHandle::ignore_shutdown`]) never answers: the call stays pending until the
/// caller drops it, the way a wedged guest holds `cocoon vm stop` until its deadline.
pub(super) async fn stop(inner: &Arc<Inner>, id: &str, timeout: Duration) -> Result<()> {
    let args = serde_json::json!({ "timeout_secs": timeout.as_secs() });
    let call = inner.begin(Verb::Stop, On::Vm(id), args).await?;
    let vm = inner.vm(id)?;
    call.pace().await;
    let ignores = {
        let c = inner.ctl();
        c.ignore_shutdown.contains(&vm.record.id) || c.ignore_shutdown.contains(vm.record.name())
    };
    if !vm.alive {
        return Ok(());
    }
    if ignores {
        std::future::pending::<()>().await;
    }
    inner.shut_down(&vm.record.id, "stop: guest shut down (simulated)")
}

pub(super) async fn start(inner: &Arc<Inner>, id: &str) -> Result<()> {
    let call = inner.begin(Verb::Start, On::Vm(id), NO_ARGS).await?;
    let vm = inner.vm(id)?;
    if vm.record.state == STATE_CREATING {
        return Err(RuntimeError::Other(format!(
            "vm {} is still being created",
            vm.record.id
        )));
    }
    call.pace().await;
    if vm.record.state == STATE_RUNNING && vm.alive {
        return Ok(());
    }
    inner
        .boot(&vm.record.id, "boot: restart in place")
        .map(drop)
}

pub(super) async fn exec(inner: &Arc<Inner>, req: ExecRequest) -> Result<()> {
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
    let call = inner
        .begin(
            Verb::Exec,
            On::Vm(&id),
            serde_json::json!({ "argv": argv, "env": env, "stdin": stdin.is_some() }),
        )
        .await?;
    let vm = inner.vm(&id).ok();
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
    call.pace().await;
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

pub(super) async fn logs(
    inner: &Arc<Inner>,
    id: &str,
    tail: Option<u64>,
    max_bytes: usize,
) -> Result<Vec<u8>> {
    inner
        .begin(Verb::Logs, On::Vm(id), serde_json::json!({ "tail": tail }))
        .await?
        .pace()
        .await;
    let vm = inner.vm(id)?;
    let path = inner.vm_dir(&vm).join("console.log");
    // As the real backend: only the newest `max_bytes` of the log are ever held, however much
    // the guest printed (the read starts that far from the end, at a line start when there is
    // one, or inside an over-long line, whose start is then dropped).
    let raw = read_last_bytes(&path, max_bytes).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&raw);
    let lines: Vec<&str> = text.lines().collect();
    let keep = tail.map_or(lines.len(), |n| {
        lines.len().min(usize::try_from(n).unwrap_or(usize::MAX))
    });
    let mut out = lines[lines.len() - keep..].join("\n");
    if !out.is_empty() && out.len() < max_bytes {
        out.push('\n');
    }
    Ok(out.into_bytes())
}

/// The last `max_bytes` bytes of `path`; when that cuts into a line, from the next line start
/// on (if a newline follows within them).
async fn read_last_bytes(path: &std::path::Path, max_bytes: usize) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(path).await?;
    let len = f.metadata().await?.len();
    let max = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    let start = len.saturating_sub(max);
    f.seek(std::io::SeekFrom::Start(start)).await?;
    let mut buf = Vec::with_capacity(usize::try_from(len - start).unwrap_or(0));
    (&mut f).take(max).read_to_end(&mut buf).await?;
    if start > 0 {
        // Was the byte before the window a newline? Then the window starts at a line start.
        let mut prev = [0u8; 1];
        f.seek(std::io::SeekFrom::Start(start - 1)).await?;
        f.read_exact(&mut prev).await?;
        if prev[0] != b'\n'
            && let Some(i) = buf.iter().position(|&b| b == b'\n')
            && i + 1 < buf.len()
        {
            buf.drain(..=i);
        }
    }
    Ok(buf)
}

pub(super) async fn net_resize(inner: &Arc<Inner>, id: &str, nics: u32) -> Result<()> {
    let call = inner
        .begin(
            Verb::NetResize,
            On::Vm(id),
            serde_json::json!({ "nics": nics }),
        )
        .await?;
    let vm = inner.vm(id)?;
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
    call.pace().await;
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

pub(super) async fn reconcile_stale_create(
    inner: &Arc<Inner>,
    id: &str,
) -> Result<StaleCreateOutcome> {
    inner
        .begin(Verb::ReconcileStaleCreate, On::Vm(id), NO_ARGS)
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

pub(super) async fn vm_stats(inner: &Arc<Inner>, vm: &VmRecord) -> Result<VmStats> {
    inner.begin(Verb::Stats, On::Vm(&vm.id), NO_ARGS).await?;
    let v = inner.vm(&vm.id)?;
    Ok(inner.stats_now(&v))
}
