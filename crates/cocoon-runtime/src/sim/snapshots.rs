//! Snapshot verbs: save (with healing), remove, inspect, list, import, export.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use chrono::Utc;
use cocoon_api::naming::is_valid_snapshot_name;
use tokio_util::io::SyncIoBridge;

use super::control::Verb;
use super::guest::{MEMORY_PAGE, MemoryFill, write_realistic_memory};
use super::state::{SimSnapshot, State, random_hex};
use super::transfer::{AbortOnDrop, Throttle, import_handle};
use super::vm::GIB;
use super::{
    Inner, NO_ARGS, On, PIPE_BUFFER, blocking, guest, io_err, lock, snapshot_not_found,
    vm_not_found,
};
use crate::error::{Result, RuntimeError, classify};
use crate::heal::{RawSnapshotVerbs, save_healing};
use crate::io::{ExportHandle, ImportHandle};
use crate::tarfmt;
use crate::types::{IdSet, STATE_RUNNING, SnapshotRecord};

/// Marks a snapshot as held (clone, export) until dropped.
pub(super) struct Hold {
    inner: Arc<Inner>,
    name: String,
    kind: &'static str,
}

impl Hold {
    pub(super) fn new(inner: &Arc<Inner>, st: &mut State, name: &str, kind: &'static str) -> Self {
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

/// The disk file of a snapshot directory: `overlay.qcow2`, `cow.raw`, else the first
/// `*.qcow2`/`*.raw` by name.
pub(super) fn find_snapshot_disk(dir: &Path) -> Option<PathBuf> {
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

impl Inner {
    /// `snapshot rm`, not-found counting as success.
    pub(super) async fn rm_if_exists(&self, name: &str) -> Result<()> {
        match self.raw_rm(name).await {
            Err(RuntimeError::SnapshotNotFound(_)) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Commits or discards a finished snapshot import (runs on the tar thread).
    pub(super) fn finish_import(
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
        let (base, per_gib, mem_size, mem_fill) = {
            let c = self.ctl();
            (
                c.latencies.save,
                c.latencies.save_per_gib,
                c.memory_file_size,
                c.memory_fill,
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
        let snap_id_seed = snap_id.clone();
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
            let size = mem_size.max(64);
            if mem_fill == MemoryFill::Realistic && size > MEMORY_PAGE as u64 {
                // The header's page, then the pages of a real guest's image.
                use std::io::Seek as _;
                mem.set_len(MEMORY_PAGE as u64)?;
                mem.seek(std::io::SeekFrom::Start(MEMORY_PAGE as u64))?;
                let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut mem);
                let seed = snap_id_seed
                    .get(..16)
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .unwrap_or(1);
                write_realistic_memory(&mut w, size - MEMORY_PAGE as u64, seed)?;
                w.flush()?;
            }
            mem.set_len(size)?;
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
        self.pace(Verb::SnapshotRemove).await;
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

pub(super) async fn snapshot_save(inner: &Arc<Inner>, name: &str, vm_id: &str) -> Result<()> {
    inner
        .begin(
            Verb::SnapshotSave,
            On::SnapshotOf { name, vm: vm_id },
            NO_ARGS,
        )
        .await?;
    save_healing(inner.as_ref(), name, vm_id, inner.save_retry).await
}

pub(super) async fn snapshot_remove_if_exists(inner: &Arc<Inner>, name: &str) -> Result<()> {
    inner
        .begin(Verb::SnapshotRemove, On::Snapshot(name), NO_ARGS)
        .await?;
    inner.rm_if_exists(name).await
}

pub(super) async fn snapshot_inspect(inner: &Arc<Inner>, name: &str) -> Result<SnapshotRecord> {
    inner
        .begin(Verb::SnapshotInspect, On::Snapshot(name), NO_ARGS)
        .await?
        .pace()
        .await;
    inner
        .st()
        .resolve_snapshot(name)
        .map(|s| s.record.clone())
        .ok_or_else(|| snapshot_not_found(name))
}

pub(super) async fn snapshot_list(inner: &Arc<Inner>) -> Result<Vec<SnapshotRecord>> {
    inner
        .begin(Verb::SnapshotList, On::Nothing, NO_ARGS)
        .await?
        .pace()
        .await;
    Ok(inner
        .st()
        .snapshots
        .values()
        .filter(|s| !s.pending)
        .map(|s| s.record.clone())
        .collect())
}

pub(super) async fn snapshot_import(inner: &Arc<Inner>, name: &str) -> Result<ImportHandle> {
    inner
        .begin(Verb::SnapshotImport, On::Snapshot(name), NO_ARGS)
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
        let res = tarfmt::read_snapshot_tar(Throttle::new(bridge, rate, Some(flag.clone())), &dir);
        task_inner.finish_import(&task_name, &dir, res, flag.load(Ordering::SeqCst))
    });
    Ok(import_handle(
        sink,
        task,
        aborted,
        format!("snapshot import {name}"),
    ))
}

pub(super) async fn snapshot_export(inner: &Arc<Inner>, name: &str) -> Result<ExportHandle> {
    inner
        .begin(Verb::SnapshotExport, On::Snapshot(name), NO_ARGS)
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
