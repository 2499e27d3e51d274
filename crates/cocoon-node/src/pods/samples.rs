//! Per-VM metric rows (`contract.md` §11.2 `cocoon_vk_vm_*`): a background sampler asks the
//! runtime for each tracked VM's usage (`Runtime::vm_stats`) and keeps the rows, which the
//! scrape-time collector reads through [`VmSampleSource`] without touching the runtime.
//!
//! Rows: CPU time and RSS of the hypervisor, TAP counters summed over NICs, and the actual
//! (allocated) size of the VM's COW overlay, the `cow` storage entry of the VM record. The
//! `backend` label is the VM's hypervisor (`cloud-hypervisor`, `firecracker`), or the runtime's
//! name when the record has none. Unmanaged pods (synthetic records) have no row.

use std::sync::{Arc, RwLock};

use cocoon_runtime::{Runtime, VmRecord};
use tracing::debug;

use super::Handler;
use super::store::PodStore;
use crate::metrics::{VmSample, VmSampleSource};

/// The latest rows, shared between the sampler and the collector.
#[derive(Debug, Default)]
pub struct VmSamples {
    rows: RwLock<Vec<VmSample>>,
}

impl VmSamples {
    fn replace(&self, rows: Vec<VmSample>) {
        *self.rows.write().unwrap_or_else(|p| p.into_inner()) = rows;
    }
}

impl VmSampleSource for VmSamples {
    fn vm_samples(&self) -> Vec<VmSample> {
        self.rows.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Allocated bytes of the record's COW overlay file; 0 when there is none.
fn cow_bytes(record: &VmRecord) -> u64 {
    use std::os::unix::fs::MetadataExt;
    record
        .storage_configs
        .iter()
        .filter(|s| s.role == "cow" && !s.path.is_empty())
        .filter_map(|s| std::fs::metadata(&s.path).ok())
        .map(|m| m.blocks().saturating_mul(512))
        .sum()
}

/// One sample per tracked pod with a live, managed VM. A VM whose stats cannot be read
/// (stopped, gone) is left out of this round.
pub(crate) async fn sample_vms(store: &PodStore, rt: &dyn Runtime) -> Vec<VmSample> {
    let mut rows = Vec::new();
    for key in store.tracked_keys() {
        let (Some(vm), Some(pod)) = (store.tracked_vm(&key), store.tracked_pod(&key)) else {
            continue;
        };
        if vm.synthetic {
            continue;
        }
        let stats = match rt.vm_stats(&vm.record).await {
            Ok(s) => s,
            Err(e) => {
                debug!(pod = %key, error = %e, "VM stats unavailable");
                continue;
            }
        };
        #[allow(clippy::cast_precision_loss)]
        let cpu_seconds = stats.cpu_time_ns as f64 / 1e9;
        let backend = if vm.record.hypervisor.is_empty() {
            rt.backend_name().to_owned()
        } else {
            vm.record.hypervisor.clone()
        };
        rows.push(VmSample {
            vm: vm.name().to_owned(),
            pod: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            backend,
            cpu_seconds,
            memory_rss_bytes: stats.rss_bytes,
            disk_cow_bytes: cow_bytes(&vm.record),
            network_rx_bytes: stats.taps.iter().map(|t| t.rx_bytes).sum(),
            network_tx_bytes: stats.taps.iter().map(|t| t.tx_bytes).sum(),
        });
    }
    rows
}

impl Handler {
    /// Installs the per-VM rows as the metrics' VM source and refreshes them every
    /// `timing.vm_stats_every` until shutdown.
    pub(crate) async fn run_vm_sampler(self: Arc<Self>) {
        let samples = Arc::new(VmSamples::default());
        self.metrics.set_vm_source(samples.clone());
        loop {
            samples.replace(sample_vms(&self.store, self.artifacts.rt().as_ref()).await);
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(self.cfg.timing.vm_stats_every) => {}
            }
        }
    }
}
