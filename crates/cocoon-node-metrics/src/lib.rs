//! The node agent's Prometheus metrics (`contract.md` §11.2): every `cocoon_vk_*` family,
//! registered once per process and rendered in the OpenMetrics text format on `/metrics`.
//!
//! Event-driven families are plain fields that the pod side increments through the small
//! helpers below. The per-VM and node collector (`cocoon_vk_vm_*`, `cocoon_vk_node_*`) is
//! computed at scrape time: the node figures come from `/proc` and statfs of the cocoon root
//! directory, the per-VM figures from a [`VmSampleSource`] the pod side installs with
//! [`NodeMetrics::set_vm_source`]. Label names are the spec's, in the spec's order.
//!
//! The node agent re-exports this crate as `cocoon_node::metrics`; the kubelet API and the
//! metrics listener serve it as a [`MetricsText`].

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use cocoon_api::contract::metrics::node as names;
use cocoon_api::process::encode_one;
use cocoon_kubelet::MetricsText;
use cocoon_node_registration::capacity::HostReader;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `op`, `result`, `reason` of `cocoon_vk_pod_lifecycle_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LifecycleLabels {
    pub op: String,
    pub result: String,
    pub reason: String,
}

/// `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// `direction` of `cocoon_vk_snapshot_transfer_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

/// `op` of `cocoon_vk_startup_resume_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
}

/// `verdict` of `cocoon_vk_hibernate_evidence_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    pub verdict: String,
}

/// `mode`, `backend` of `cocoon_vk_vm_boot_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BootLabels {
    pub mode: String,
    pub backend: String,
}

/// `phase`, `result` of `cocoon_vk_hibernate_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HibernateLabels {
    pub phase: String,
    pub result: String,
}

/// `outcome` of `cocoon_vk_stale_create_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

/// `kind`, `result` of `cocoon_vk_postclone_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PostcloneLabels {
    pub kind: String,
    pub result: String,
}

/// `namespace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

/// `vm`, `pod`, `namespace`, `backend` of the per-VM collector.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VmLabels {
    pub vm: String,
    pub pod: String,
    pub namespace: String,
    pub backend: String,
}

/// One VM's figures at scrape time (the per-VM collector of §11.2).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VmSample {
    /// VM name.
    pub vm: String,
    /// Pod name (empty when the VM is not bound to a pod).
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// Runtime backend (`cloud-hypervisor`, `firecracker`, `sim`, ...).
    pub backend: String,
    /// Hypervisor user + system CPU time in seconds.
    pub cpu_seconds: f64,
    /// Hypervisor resident set size.
    pub memory_rss_bytes: u64,
    /// Actual size of the COW overlay.
    pub disk_cow_bytes: u64,
    /// TAP bytes received (summed over NICs).
    pub network_rx_bytes: u64,
    /// TAP bytes sent (summed over NICs).
    pub network_tx_bytes: u64,
}

/// Where the per-VM collector gets its rows. The pod side implements it over its VM table:
/// copy the table under a read lock and compute outside it, with no cocoon CLI calls, because
/// it runs on every scrape.
pub trait VmSampleSource: Send + Sync + 'static {
    fn vm_samples(&self) -> Vec<VmSample>;
}

/// A histogram family with a fixed bucket layout (the constructor picks the buckets).
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn boot_histogram() -> Histogram {
    Histogram::new(names::VM_BOOT_DURATION_BUCKETS)
}

fn postclone_histogram() -> Histogram {
    Histogram::new(names::POSTCLONE_RETRY_ATTEMPTS_BUCKETS)
}

fn peer_restore_histogram() -> Histogram {
    Histogram::new(names::SNAPSHOT_PEER_RESTORE_DURATION_BUCKETS)
}

/// Strips the `_total` suffix prometheus-client appends to counters by itself.
fn counter_name(full: &str) -> &str {
    full.strip_suffix("_total").unwrap_or(full)
}

/// Every node-agent metric. Cheap to share behind an `Arc`; every field is internally
/// synchronised.
pub struct NodeMetrics {
    registry: Registry,
    vm_source: Arc<RwLock<Option<Arc<dyn VmSampleSource>>>>,

    pub pod_lifecycle: Family<LifecycleLabels, Counter>,
    pub snapshot_pull: Family<ResultLabel, Counter>,
    pub snapshot_verify: Family<ResultLabel, Counter>,
    pub snapshot_save: Family<ResultLabel, Counter>,
    pub snapshot_push: Family<ResultLabel, Counter>,
    pub clone_from_dir: Family<ResultLabel, Counter>,
    pub vm_table_size: Gauge,
    pub orphan_vm: Counter,
    pub vm_inspect_transient_fail: Counter,
    pub pod_evict_failure: Counter,
    pub reconcile_adopt_by_name: Counter,
    pub startup_resume: Family<OpLabel, Counter>,
    pub hibernate_evidence: Family<VerdictLabel, Counter>,
    pub vm_boot_duration: HistogramFamily<BootLabels>,
    pub snapshot_save_duration: Histogram,
    pub snapshot_push_duration: Histogram,
    pub snapshot_pull_duration: Histogram,
    pub probe_duration: Histogram,
    pub snapshot_transfer_bytes: Family<DirectionLabel, Counter>,
    pub hibernate: Family<HibernateLabels, Counter>,
    pub wake: Family<ResultLabel, Counter>,
    pub wake_ip_wait: Family<ResultLabel, Counter>,
    pub wake_renew_nudge: Family<ResultLabel, Counter>,
    // Beyond (optional) families: registered so the pod side can use them when it implements
    // the feature; they stay empty otherwise.
    pub stale_create_reconcile: Family<OutcomeLabel, Counter>,
    pub postclone: Family<PostcloneLabels, Counter>,
    pub postclone_retry_attempts: HistogramFamily<ResultLabel>,
    pub snapshot_peer_restore: Family<ResultLabel, Counter>,
    pub snapshot_peer_restore_duration: HistogramFamily<NamespaceLabel>,
    pub lease_release: Family<ResultLabel, Counter>,
}

impl fmt::Debug for NodeMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeMetrics").finish_non_exhaustive()
    }
}

impl NodeMetrics {
    /// All families, with the node collector reading `/proc` and statfs of `cocoon_root_dir`.
    pub fn new(cocoon_root_dir: impl Into<PathBuf>) -> Self {
        Self::with_host(HostReader::new(cocoon_root_dir.into()))
    }

    /// All families, with the node collector reading through `host` (tests point it at a
    /// fake `/proc`).
    pub fn with_host(host: HostReader) -> Self {
        let vm_source: Arc<RwLock<Option<Arc<dyn VmSampleSource>>>> = Arc::default();
        let mut m = NodeMetrics {
            registry: Registry::default(),
            vm_source: vm_source.clone(),
            pod_lifecycle: Family::default(),
            snapshot_pull: Family::default(),
            snapshot_verify: Family::default(),
            snapshot_save: Family::default(),
            snapshot_push: Family::default(),
            clone_from_dir: Family::default(),
            vm_table_size: Gauge::default(),
            orphan_vm: Counter::default(),
            vm_inspect_transient_fail: Counter::default(),
            pod_evict_failure: Counter::default(),
            reconcile_adopt_by_name: Counter::default(),
            startup_resume: Family::default(),
            hibernate_evidence: Family::default(),
            vm_boot_duration: Family::new_with_constructor(boot_histogram),
            snapshot_save_duration: Histogram::new(names::SNAPSHOT_SAVE_DURATION_BUCKETS),
            snapshot_push_duration: Histogram::new(names::SNAPSHOT_TRANSFER_DURATION_BUCKETS),
            snapshot_pull_duration: Histogram::new(names::SNAPSHOT_TRANSFER_DURATION_BUCKETS),
            probe_duration: Histogram::new(names::PROBE_DURATION_BUCKETS),
            snapshot_transfer_bytes: Family::default(),
            hibernate: Family::default(),
            wake: Family::default(),
            wake_ip_wait: Family::default(),
            wake_renew_nudge: Family::default(),
            stale_create_reconcile: Family::default(),
            postclone: Family::default(),
            postclone_retry_attempts: Family::new_with_constructor(postclone_histogram),
            snapshot_peer_restore: Family::default(),
            snapshot_peer_restore_duration: Family::new_with_constructor(peer_restore_histogram),
            lease_release: Family::default(),
        };
        m.register_all();
        m.init_outcomes();
        m.registry
            .register_collector(Box::new(ScrapeCollector { host, vm_source }));
        m.registry
            .register_collector(Box::new(cocoon_api::process::ProcessCollector::new()));
        m
    }

    fn register_all(&mut self) {
        let r = &mut self.registry;
        r.register(
            counter_name(names::POD_LIFECYCLE_TOTAL),
            "Pod lifecycle operations by outcome",
            self.pod_lifecycle.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_PULL_TOTAL),
            "Snapshot pulls (a local hit counts as ok)",
            self.snapshot_pull.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_VERIFY_TOTAL),
            "Wake-time verifications of the local snapshot copy",
            self.snapshot_verify.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_SAVE_TOTAL),
            "Snapshot saves",
            self.snapshot_save.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_PUSH_TOTAL),
            "Snapshot pushes",
            self.snapshot_push.clone(),
        );
        r.register(
            counter_name(names::CLONE_FROM_DIR_TOTAL),
            "Clones from a local snapshot directory",
            self.clone_from_dir.clone(),
        );
        r.register(
            names::VM_TABLE_SIZE,
            "VMs tracked by the node agent",
            self.vm_table_size.clone(),
        );
        r.register(
            counter_name(names::ORPHAN_VM_TOTAL),
            "Orphan VMs seen under the alert policy",
            self.orphan_vm.clone(),
        );
        r.register(
            counter_name(names::VM_INSPECT_TRANSIENT_FAIL_TOTAL),
            "Transient VM inspect failures",
            self.vm_inspect_transient_fail.clone(),
        );
        r.register(
            counter_name(names::POD_EVICT_FAILURE_TOTAL),
            "Failed pod evictions",
            self.pod_evict_failure.clone(),
        );
        r.register(
            counter_name(names::RECONCILE_ADOPT_BY_NAME_TOTAL),
            "VMs adopted by name during reconcile",
            self.reconcile_adopt_by_name.clone(),
        );
        r.register(
            counter_name(names::STARTUP_RESUME_TOTAL),
            "Interrupted work resumed at startup",
            self.startup_resume.clone(),
        );
        r.register(
            counter_name(names::HIBERNATE_EVIDENCE_TOTAL),
            "Hibernate evidence verdicts",
            self.hibernate_evidence.clone(),
        );
        r.register(
            names::VM_BOOT_DURATION_SECONDS,
            "VM bring-up duration",
            self.vm_boot_duration.clone(),
        );
        r.register(
            names::SNAPSHOT_SAVE_DURATION_SECONDS,
            "Snapshot save duration",
            self.snapshot_save_duration.clone(),
        );
        r.register(
            names::SNAPSHOT_PUSH_DURATION_SECONDS,
            "Snapshot push duration",
            self.snapshot_push_duration.clone(),
        );
        r.register(
            names::SNAPSHOT_PULL_DURATION_SECONDS,
            "Snapshot pull duration",
            self.snapshot_pull_duration.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_TRANSFER_BYTES_TOTAL),
            "Registry bytes moved by snapshot pushes and pulls",
            self.snapshot_transfer_bytes.clone(),
        );
        r.register(
            names::PROBE_DURATION_SECONDS,
            "Readiness probe duration",
            self.probe_duration.clone(),
        );
        r.register(
            counter_name(names::HIBERNATE_TOTAL),
            "Hibernate steps by phase and outcome",
            self.hibernate.clone(),
        );
        r.register(
            counter_name(names::WAKE_TOTAL),
            "Wakes by outcome",
            self.wake.clone(),
        );
        r.register(
            counter_name(names::WAKE_IP_WAIT_TOTAL),
            "Clone and wake IP waits by outcome",
            self.wake_ip_wait.clone(),
        );
        r.register(
            counter_name(names::WAKE_RENEW_NUDGE_TOTAL),
            "Windows DHCP renew nudges",
            self.wake_renew_nudge.clone(),
        );
        r.register(
            counter_name(names::STALE_CREATE_RECONCILE_TOTAL),
            "Stale-create reconciliations by outcome",
            self.stale_create_reconcile.clone(),
        );
        r.register(
            counter_name(names::POSTCLONE_TOTAL),
            "Post-clone network fixups",
            self.postclone.clone(),
        );
        r.register(
            names::POSTCLONE_RETRY_ATTEMPTS,
            "Attempts a post-clone fixup needed",
            self.postclone_retry_attempts.clone(),
        );
        r.register(
            counter_name(names::SNAPSHOT_PEER_RESTORE_TOTAL),
            "Snapshot restores from a peer node",
            self.snapshot_peer_restore.clone(),
        );
        r.register(
            names::SNAPSHOT_PEER_RESTORE_DURATION_SECONDS,
            "Peer restore duration",
            self.snapshot_peer_restore_duration.clone(),
        );
        r.register(
            counter_name(names::LEASE_RELEASE_TOTAL),
            "DHCP lease releases",
            self.lease_release.clone(),
        );
    }

    /// Creates the snapshot and wake outcome series at 0 (`ok` and `failed`), and both
    /// transfer directions: the families are in the scrape from the start, and `increase()` in
    /// an alert sees the very first failure.
    fn init_outcomes(&self) {
        for family in [
            &self.snapshot_pull,
            &self.snapshot_save,
            &self.snapshot_push,
            &self.wake,
        ] {
            for result in [names::RESULT_OK, names::RESULT_FAILED] {
                let _ = family.get_or_create(&ResultLabel {
                    result: result.into(),
                });
            }
        }
        for direction in [names::DIRECTION_PUSH, names::DIRECTION_PULL] {
            let _ = self.snapshot_transfer_bytes.get_or_create(&DirectionLabel {
                direction: direction.into(),
            });
        }
    }

    /// Installs (or replaces) the per-VM row source of the scrape-time collector.
    pub fn set_vm_source(&self, source: Arc<dyn VmSampleSource>) {
        // A poisoned lock only means a panicking writer; the slot is a plain pointer.
        let mut slot = self.vm_source.write().unwrap_or_else(|e| e.into_inner());
        *slot = Some(source);
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // Writing into a String cannot fail; a collector error is the only source.
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }

    /// `cocoon_vk_pod_lifecycle_total{op,result,reason}` += 1.
    pub fn pod_lifecycle(&self, op: &str, result: &str, reason: &str) {
        self.pod_lifecycle
            .get_or_create(&LifecycleLabels {
                op: op.into(),
                result: result.into(),
                reason: reason.into(),
            })
            .inc();
    }

    fn by_result(family: &Family<ResultLabel, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// `cocoon_vk_snapshot_pull_total{result}` += 1.
    pub fn snapshot_pull(&self, result: &str) {
        Self::by_result(&self.snapshot_pull, result);
    }

    /// `cocoon_vk_snapshot_verify_total{result}` += 1 (`ok`/`stale`/`error`).
    pub fn snapshot_verify(&self, result: &str) {
        Self::by_result(&self.snapshot_verify, result);
    }

    /// `cocoon_vk_snapshot_save_total{result}` += 1.
    pub fn snapshot_save(&self, result: &str) {
        Self::by_result(&self.snapshot_save, result);
    }

    /// `cocoon_vk_snapshot_push_total{result}` += 1.
    pub fn snapshot_push(&self, result: &str) {
        Self::by_result(&self.snapshot_push, result);
    }

    /// `cocoon_vk_clone_from_dir_total{result}` += 1.
    pub fn clone_from_dir(&self, result: &str) {
        Self::by_result(&self.clone_from_dir, result);
    }

    /// `cocoon_vk_wake_total{result}` += 1.
    pub fn wake(&self, result: &str) {
        Self::by_result(&self.wake, result);
    }

    /// `cocoon_vk_wake_ip_wait_total{result}` += 1 (`ok`/`timeout`).
    pub fn wake_ip_wait(&self, result: &str) {
        Self::by_result(&self.wake_ip_wait, result);
    }

    /// `cocoon_vk_wake_renew_nudge_total{result}` += 1.
    pub fn wake_renew_nudge(&self, result: &str) {
        Self::by_result(&self.wake_renew_nudge, result);
    }

    /// `cocoon_vk_lease_release_total{result}` += 1.
    pub fn lease_release(&self, result: &str) {
        Self::by_result(&self.lease_release, result);
    }

    /// `cocoon_vk_snapshot_peer_restore_total{result}` += 1.
    pub fn snapshot_peer_restore(&self, result: &str) {
        Self::by_result(&self.snapshot_peer_restore, result);
    }

    /// `cocoon_vk_snapshot_transfer_bytes_total{direction}` += `bytes`.
    pub fn snapshot_transfer_bytes(&self, direction: &str, bytes: u64) {
        self.snapshot_transfer_bytes
            .get_or_create(&DirectionLabel {
                direction: direction.into(),
            })
            .inc_by(bytes);
    }

    /// `cocoon_vk_vm_table_size` = `n`.
    pub fn set_vm_table_size(&self, n: usize) {
        self.vm_table_size.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `cocoon_vk_startup_resume_total{op}` += 1.
    pub fn startup_resume(&self, op: &str) {
        self.startup_resume
            .get_or_create(&OpLabel { op: op.into() })
            .inc();
    }

    /// `cocoon_vk_hibernate_evidence_total{verdict}` += 1.
    pub fn hibernate_evidence(&self, verdict: &str) {
        self.hibernate_evidence
            .get_or_create(&VerdictLabel {
                verdict: verdict.into(),
            })
            .inc();
    }

    /// `cocoon_vk_hibernate_total{phase,result}` += 1.
    pub fn hibernate(&self, phase: &str, result: &str) {
        self.hibernate
            .get_or_create(&HibernateLabels {
                phase: phase.into(),
                result: result.into(),
            })
            .inc();
    }

    /// `cocoon_vk_vm_boot_duration_seconds{mode,backend}` observes `seconds`.
    pub fn vm_boot(&self, mode: &str, backend: &str, seconds: f64) {
        self.vm_boot_duration
            .get_or_create(&BootLabels {
                mode: mode.into(),
                backend: backend.into(),
            })
            .observe(seconds);
    }

    /// `cocoon_vk_stale_create_reconcile_total{outcome}` += 1.
    pub fn stale_create_reconcile(&self, outcome: &str) {
        self.stale_create_reconcile
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// `cocoon_vk_postclone_total{kind,result}` += 1.
    pub fn postclone(&self, kind: &str, result: &str) {
        self.postclone
            .get_or_create(&PostcloneLabels {
                kind: kind.into(),
                result: result.into(),
            })
            .inc();
    }
}

impl MetricsText for NodeMetrics {
    fn render(&self) -> String {
        NodeMetrics::render(self)
    }
}

/// The scrape-time collector: node figures from the host, VM rows from the installed source.
struct ScrapeCollector {
    host: HostReader,
    vm_source: Arc<RwLock<Option<Arc<dyn VmSampleSource>>>>,
}

impl fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScrapeCollector")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

fn encode_rows<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[VmSample],
    metric_of: impl Fn(&VmSample) -> M,
    sample_metric: M,
) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut me = encoder.encode_descriptor(name, help, None, sample_metric.metric_type())?;
    for row in rows {
        let labels = VmLabels {
            vm: row.vm.clone(),
            pod: row.pod.clone(),
            namespace: row.namespace.clone(),
            backend: row.backend.clone(),
        };
        let fe = me.encode_family(&labels)?;
        metric_of(row).encode(fe)?;
    }
    Ok(())
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        // Node figures: each source is optional; a missing one (for example no /proc/stat in a
        // container) just leaves its series out instead of failing the whole scrape.
        if let Some(cpu) = self.host.node_cpu_seconds() {
            encode_one(
                &mut encoder,
                counter_name(names::NODE_CPU_SECONDS_TOTAL),
                "Host CPU time spent busy",
                &ConstCounter::new(cpu),
            )?;
        }
        if let Some(used) = self.host.memory_used_bytes() {
            encode_one(
                &mut encoder,
                names::NODE_MEMORY_USED_BYTES,
                "Host memory in use (MemTotal - MemAvailable)",
                &ConstGauge::new(i64::try_from(used).unwrap_or(i64::MAX)),
            )?;
        }
        if let Ok(fs) = self.host.root_fs() {
            encode_one(
                &mut encoder,
                names::NODE_STORAGE_AVAILABLE_BYTES,
                "Bytes available on the cocoon root filesystem",
                &ConstGauge::new(i64::try_from(fs.available_bytes).unwrap_or(i64::MAX)),
            )?;
            encode_one(
                &mut encoder,
                names::NODE_STORAGE_TOTAL_BYTES,
                "Size of the cocoon root filesystem",
                &ConstGauge::new(i64::try_from(fs.total_bytes).unwrap_or(i64::MAX)),
            )?;
        }

        // Copy the source pointer out of the lock so a slow source never blocks set_vm_source.
        let source = self
            .vm_source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rows = source.map(|s| s.vm_samples()).unwrap_or_default();
        encode_rows(
            &mut encoder,
            counter_name(names::VM_CPU_SECONDS_TOTAL),
            "Hypervisor CPU time of the VM",
            &rows,
            |r| ConstCounter::new(r.cpu_seconds),
            ConstCounter::new(0.0),
        )?;
        encode_rows(
            &mut encoder,
            names::VM_MEMORY_RSS_BYTES,
            "Hypervisor resident set size of the VM",
            &rows,
            |r| ConstGauge::new(i64::try_from(r.memory_rss_bytes).unwrap_or(i64::MAX)),
            ConstGauge::new(0i64),
        )?;
        encode_rows(
            &mut encoder,
            names::VM_DISK_COW_BYTES,
            "Actual size of the VM's COW overlay",
            &rows,
            |r| ConstGauge::new(i64::try_from(r.disk_cow_bytes).unwrap_or(i64::MAX)),
            ConstGauge::new(0i64),
        )?;
        encode_rows(
            &mut encoder,
            counter_name(names::VM_NETWORK_RX_BYTES_TOTAL),
            "TAP bytes received by the VM",
            &rows,
            |r| ConstCounter::new(r.network_rx_bytes),
            ConstCounter::new(0u64),
        )?;
        encode_rows(
            &mut encoder,
            counter_name(names::VM_NETWORK_TX_BYTES_TOTAL),
            "TAP bytes sent by the VM",
            &rows,
            |r| ConstCounter::new(r.network_tx_bytes),
            ConstCounter::new(0u64),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TwoVms;
    impl VmSampleSource for TwoVms {
        fn vm_samples(&self) -> Vec<VmSample> {
            vec![VmSample {
                vm: "vk-ns-a-0".into(),
                pod: "a-0".into(),
                namespace: "ns".into(),
                backend: "sim".into(),
                cpu_seconds: 1.5,
                memory_rss_bytes: 1024,
                disk_cow_bytes: 2048,
                network_rx_bytes: 10,
                network_tx_bytes: 20,
            }]
        }
    }

    #[test]
    fn renders_spec_names_labels_and_buckets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = NodeMetrics::new(dir.path());
        m.pod_lifecycle("create", "ok", "");
        m.vm_boot("run", "sim", 0.7);
        m.snapshot_pull_duration.observe(3.0);
        m.snapshot_transfer_bytes("push", 4096);
        m.set_vm_table_size(3);
        m.orphan_vm.inc();
        m.set_vm_source(Arc::new(TwoVms));
        let text = m.render();
        for want in [
            "cocoon_vk_pod_lifecycle_total{op=\"create\",result=\"ok\",reason=\"\"} 1",
            "cocoon_vk_vm_boot_duration_seconds_bucket{le=\"1.0\",mode=\"run\",backend=\"sim\"} 1",
            "cocoon_vk_vm_boot_duration_seconds_bucket{le=\"0.5\",mode=\"run\",backend=\"sim\"} 0",
            "cocoon_vk_snapshot_pull_duration_seconds_bucket{le=\"5.0\"} 1",
            "cocoon_vk_vm_table_size 3",
            "cocoon_vk_orphan_vm_total 1",
            "# TYPE cocoon_vk_probe_duration_seconds histogram",
            "cocoon_vk_vm_cpu_seconds_total{vm=\"vk-ns-a-0\",pod=\"a-0\",namespace=\"ns\",backend=\"sim\"} 1.5",
            "cocoon_vk_vm_memory_rss_bytes{vm=\"vk-ns-a-0\",pod=\"a-0\",namespace=\"ns\",backend=\"sim\"} 1024",
            "cocoon_vk_vm_network_tx_bytes_total{vm=\"vk-ns-a-0\"",
            "cocoon_vk_node_storage_total_bytes ",
            "cocoon_vk_snapshot_transfer_bytes_total{direction=\"push\"} 4096",
            "# TYPE process_cpu_seconds counter",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_start_time_seconds ",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
