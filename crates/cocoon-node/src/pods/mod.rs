//! The pod lifecycle of the node agent (`node.md` §3–§12): CreatePod, DeletePod, the
//! hibernate/wake UpdatePod, the startup reconcile, the VM event watcher, probes and status.
//!
//! Shape: pure rules ([`rules`], [`intent`], [`status`], the probe state machine in [`probe`])
//! decide; the shells observe (API, runtime, registry) and act. Hibernate, wake, delete and
//! the create's bring-up are planned pipelines (`plan`): pure planners return ordered steps
//! with their compensations, one executor runs them. The [`controller`] feeds pods bound to
//! this node into the handler, serialised per pod.
//!
//! The [`Handler`] is a thin composition of parts, each with a narrow interface, and every
//! operation holds the parts it uses: the pod store (`store`: the tables, intents, status
//! locks), the API writer (`api_writer`: annotations, status, Events, failOp, eviction), the
//! artifact side (`artifacts`: runtime, registry, shared pulls, transfer metrics, owner
//! records; the trust gate in `artifacts/owned.rs`) and the publisher (`publisher`: probes,
//! IPs, status and ready publication). Stale-create reconciliation is its own part
//! (`stale::StaleCreates`). Errors are classified once by kind (`error`); the contract's
//! Event reason and message come from `PodError::reason_or` and `PodError::message`.
//!
//! Choices for points the spec leaves open:
//! * Hibernated pods report phase `Running`, Ready `False`, container `waiting` (reason
//!   `Hibernated`); a pod tracked at create without a VM yet reports `Pending`.
//! * A failed hibernate is lifted (§8.1) when the hibernate annotation is removed while the VM
//!   is still live and the `failed` intent came from a hibernate attempt: that removal is a new
//!   attempt, written as `creating`, and `ready` is published (status first) once the probe
//!   reports ready. Other failures stay sticky.
//! * Hint mode (§6.9): the hint annotation is written and `ready` is published when the probe
//!   first succeeds, so the operator's "woken" test stays meaningful.
//! * An agent killed after Remove but before writing `hibernated` is finished at startup: a
//!   pod with the hibernate annotation, no VM and lifecycle `hibernating` gets `hibernated` once
//!   the `:hibernate` tag (or, registry-less, the local snapshot) is confirmed.
//! * Automatic post-clone fixup, SAC, peer restore, the CPU-class gate and the op-retry queue
//!   (all "beyond") are not implemented; the pod controller's per-pod backoff retries failed
//!   operations.
//! * Stale-create reconciliation ("beyond", §14) is implemented ([`stale`]): a `creating`
//!   record left by an agent killed mid-create is collected at startup, so the pod's CreatePod
//!   (retried by the controller's backoff) can take the name again.
//! * Tenant isolation ([`tenant`], not in the spec): a pod may only use its own VM (the
//!   contract's hashed name for its namespace and name, never one another live pod holds),
//!   fork from a VM of its own namespace, and clone from a directory under
//!   `VK_CLONE_FROM_DIR_ROOTS`; images never name a VM's snapshots, clone bases live in their
//!   own host name space, and a pod's VM name, `managed` and pre-assigned id are fixed at
//!   admission. Refusals are failOp with reason `TenantIsolationRefused`. Every lookup by
//!   name, snapshot pull and push goes through the trust gate in `owned` (exact names, owner
//!   annotations); unused clone bases are collected (`clone_gc`, `VK_CLONE_BASE_KEEP`).
//! * Kubelet-grade admission (not in the spec; issue 35): a pod is claimed only if its
//!   requests fit the allocatable the agent publishes next to the pods it runs, else it is
//!   rejected as a kubelet rejects it (`Failed`, `OutOfcpu`…; [`resources`]); an unmanaged
//!   pod's pre-assigned IP must lie in `VK_UNMANAGED_IP_CIDRS` and be used by no other pod
//!   ([`unmanaged_ip`]), and its synthetic record is never probed. The shell is `admission`.

mod admission;
mod api_writer;
#[cfg(test)]
mod api_writer_tests;
mod artifacts;
mod checkpoint;
pub mod controller;
mod create;
mod delete;
mod effects;
mod error;
pub mod events;
mod exec;
mod flights;
pub mod host_reach;
mod idle;
pub mod intent;
pub mod lease_watch;
mod plan;
pub mod probe;
mod publisher;
pub mod reconcile;
pub mod resources;
pub mod rules;
pub mod samples;
mod stale;
pub mod state;
pub mod status;
mod store;
pub mod tenant;
pub mod unmanaged_ip;
pub use artifacts::transfer::{PullSummary, import_snapshot_from_registry};
mod update;

#[cfg(test)]
mod resources_tests;
#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod tenant_tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cocoon_registry::RegistryClient;
use cocoon_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::events::Recorder;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use crate::config::OrphanPolicy;
use crate::metrics::NodeMetrics;
use lease_watch::LeaseWatch;
use probe::{ProbeManager, ProbeSchedule};

/// The probe's message while the VM's IP does not resolve yet (§11.1 step 2).
pub(crate) const WAITING_FOR_LEASE: &str = "waiting for dhcp lease";
/// The probe's answer for an unmanaged pod (never probed, ready once admitted).
pub(crate) const UNMANAGED_NOT_PROBED: &str = "unmanaged: not probed";
use state::TrackedVm;

pub use error::{ApiError, PodError, Refused, RegistryFailure, RuntimeFailure};

/// Result of pod operations.
pub type Result<T, E = PodError> = std::result::Result<T, E>;

/// Timing knobs (spec defaults from `node.md` §15 in [`Timing::default`]); tests shorten them.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Restart cooldown (30 s).
    pub restart_cooldown: Duration,
    /// Probe schedule.
    pub probe: ProbeSchedule,
    /// Lifecycle reconciler period (15 s).
    pub lifecycle_reconcile: Duration,
    /// Status drift reconciler: first pass (10 s) and period (30 s).
    pub drift_first: Duration,
    /// See `drift_first`.
    pub drift_every: Duration,
    /// Ready-after-IP budget (45 s) and poll (200 ms).
    pub ready_ip_wait: Duration,
    /// See `ready_ip_wait`.
    pub ready_ip_poll: Duration,
    /// Annotation patch retry delay (500 ms, 3 attempts).
    pub patch_retry: Duration,
    /// Event watcher start backoff: 1 s doubling to 60 s.
    pub watch_backoff_start: Duration,
    /// See `watch_backoff_start`.
    pub watch_backoff_max: Duration,
    /// Clean-close reconnect delay (2 s).
    pub watch_reconnect: Duration,
    /// Pod controller per-pod retry backoff: start and cap (chosen: 1 s doubling to 60 s).
    pub retry_start: Duration,
    /// See `retry_start`.
    pub retry_max: Duration,
    /// Deferred recheck: 1 s doubling to 30 s within 30 min.
    pub recheck_start: Duration,
    /// See `recheck_start`.
    pub recheck_max: Duration,
    /// See `recheck_start`.
    pub recheck_budget: Duration,
    /// Per-VM metric rows are refreshed this often (chosen: 15 s, a common scrape interval).
    pub vm_stats_every: Duration,
    /// Stale-create watcher (§14): 1 s doubling to 30 s within 30 min.
    pub stale_create_start: Duration,
    /// See `stale_create_start`.
    pub stale_create_max: Duration,
    /// See `stale_create_start`.
    pub stale_create_budget: Duration,
    /// Activity publication and the exec wake hold (`VK_ACTIVITY_INTERVAL`,
    /// `VK_ACTIVITY_CPU_THRESHOLD`, `VK_EXEC_WAKE_WAIT`; issue 39).
    pub activity: crate::activity::ActivityConfig,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            restart_cooldown: Duration::from_secs(30),
            probe: ProbeSchedule::default(),
            lifecycle_reconcile: Duration::from_secs(15),
            drift_first: Duration::from_secs(10),
            drift_every: Duration::from_secs(30),
            ready_ip_wait: Duration::from_secs(45),
            ready_ip_poll: Duration::from_millis(200),
            patch_retry: Duration::from_millis(500),
            watch_backoff_start: Duration::from_secs(1),
            watch_backoff_max: Duration::from_secs(60),
            watch_reconnect: Duration::from_secs(2),
            retry_start: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            recheck_start: Duration::from_secs(1),
            recheck_max: Duration::from_secs(30),
            recheck_budget: Duration::from_secs(30 * 60),
            vm_stats_every: Duration::from_secs(15),
            stale_create_start: Duration::from_secs(1),
            stale_create_max: Duration::from_secs(30),
            stale_create_budget: Duration::from_secs(30 * 60),
            activity: crate::activity::ActivityConfig::default(),
        }
    }
}

/// What the pod handler needs from the configuration.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// `VK_NODE_NAME`.
    pub node_name: String,
    /// `VK_ORPHAN_POLICY`.
    pub orphan_policy: OrphanPolicy,
    /// `VK_LEASES_PATH`.
    pub leases_path: PathBuf,
    /// `VK_RESTORE_MODE`.
    pub restore_mode: String,
    /// `COCOON_ROOT_DIR` (cloud-image detection of the fixup script).
    pub cocoon_root_dir: PathBuf,
    /// `VK_CLONE_FROM_DIR_ROOTS`: the only directories `clone-from-dir` may name (empty:
    /// every `clone-from-dir` is refused; see [`tenant`]).
    pub clone_from_dir_roots: Vec<PathBuf>,
    /// Tenant-isolation knobs beyond the spec (legacy names, clone-base collection).
    pub tenant: TenantConfig,
    /// Timing knobs.
    pub timing: Timing,
    /// `VK_RUN_IMAGE_URL_ALLOW` / `VK_NETWORK_ALLOW` (default: no URL image, only the
    /// default network; see [`host_reach`]).
    pub host_reach: host_reach::HostReach,
}

/// Tenant-isolation knobs of the node agent (not in the spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// `VK_ACCEPT_LEGACY_VM_NAMES`: accept the legacy unhashed VM name `vk-<ns>-<pod>` for
    /// new pods (mixed fleets with the Go operator; see [`tenant`] for the risk). Default off.
    pub accept_legacy_vm_names: bool,
    /// `VK_CLONE_BASE_KEEP`: clone-base snapshots no tracked pod uses that stay on the node
    /// (the newest ones); older unused ones are removed (see `clone_gc`). Default 4.
    pub clone_base_keep: usize,
    /// `VK_UNMANAGED_IP_CIDRS`: the ranges an unmanaged pod's pre-assigned IP must lie in
    /// (empty, the default: every unmanaged pod with a pre-assigned IP is refused; see
    /// [`unmanaged_ip`]).
    pub unmanaged_ip_ranges: Vec<unmanaged_ip::IpRange>,
    /// The allocatable the agent publishes on its Node, against which pods are admitted
    /// ([`resources`]). Filled from the Node registration by
    /// [`crate::agent::run_agent`] when unset; `None` (an agent that registers no Node, as
    /// most tests run) admits without a resource check.
    pub allocatable: Option<resources::Allocatable>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            accept_legacy_vm_names: false,
            clone_base_keep: cocoon_api::contract::env::node::DEFAULT_CLONE_BASE_KEEP,
            unmanaged_ip_ranges: Vec::new(),
            allocatable: None,
        }
    }
}

/// `<namespace>/<name>`.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn annotations(pod: &Pod) -> &std::collections::BTreeMap<String, String> {
    cocoon_api::contract::meta_annotations(&pod.metadata)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    annotations(pod).get(key).map(String::as_str)
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Is the API error one that means "a newer write or another incarnation owns this"?
fn superseded(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 404 | 409 | 422))
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Pins a merge patch to this incarnation of the pod, as the kubelet's status manager does: the
/// API server refuses (409) a patch whose `metadata.uid` is not the stored object's, so a write
/// computed for a deleted pod never lands on a new pod of the same name.
pub(crate) fn pin_to_incarnation(patch: &mut Value, pod: &Pod) {
    let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return;
    };
    if let Value::Object(top) = patch
        && let Value::Object(meta) = top
            .entry("metadata")
            .or_insert_with(|| Value::Object(serde_json::Map::new()))
    {
        meta.insert("uid".into(), Value::String(uid.to_owned()));
    }
}

/// The pod handler: a thin composition of the parts CreatePod/DeletePod/UpdatePod and the
/// background loops use — the `PodStore` (tables, intents, status locks),
/// the `ApiWriter` (annotations, status, Events, failOp), the
/// `Artifacts` (runtime, registry, pulls, owner records) and the
/// `Publisher` (probes, IPs, status publication). Each operation
/// takes the parts it uses.
pub struct Handler {
    pub(crate) cfg: PodConfig,
    pub(crate) store: Arc<store::PodStore>,
    pub(crate) api: api_writer::ApiWriter,
    pub(crate) artifacts: Arc<artifacts::Artifacts>,
    pub(crate) publisher: Arc<publisher::Publisher>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) shutdown: CancellationToken,
    /// Pods with a checkpoint in flight ([`checkpoint`]).
    pub(crate) checkpoints: checkpoint::InFlight,
    /// Heartbeats of this agent's main loops, for the systemd watchdog ([`crate::systemd`]).
    pub liveness: crate::systemd::Liveness,
    /// Open exec sessions and followed logs per pod: activity (issue 39).
    pub sessions: crate::activity::Sessions,
    /// One `wake-request` write per pod per few seconds (`idle`).
    pub(crate) wake_gate: crate::activity::WakeGate,
}

impl Handler {
    /// A handler whose background work ends with `shutdown`.
    pub fn new(
        cfg: PodConfig,
        client: Client,
        rt: Arc<dyn Runtime>,
        registry: Option<RegistryClient>,
        recorder: Recorder,
        metrics: Arc<NodeMetrics>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let m = metrics.clone();
        let leases = LeaseWatch::new(
            cfg.leases_path.clone(),
            lease_watch::CHECK_EVERY,
            shutdown.clone(),
        );
        let l = leases.clone();
        let nudge = probe::Nudge {
            start: Arc::new(move || {
                let mut w = l.wait();
                Box::pin(async move { w.changed().await })
            }),
            when: |message| message == WAITING_FOR_LEASE,
        };
        let probes = Arc::new(
            ProbeManager::new(
                cfg.timing.probe,
                shutdown.clone(),
                Arc::new(move |d: Duration| m.probe_duration.observe(d.as_secs_f64())),
            )
            .with_nudge(nudge),
        );
        let store = Arc::new(store::PodStore::new(metrics.clone()));
        let api = api_writer::ApiWriter::new(
            client,
            recorder,
            store.clone(),
            metrics.clone(),
            cfg.timing.patch_retry,
        );
        let artifacts = Arc::new(artifacts::Artifacts::new(
            rt,
            registry,
            metrics.clone(),
            shutdown.clone(),
            api.clone(),
            cfg.host_reach.run_image_urls.clone(),
            cfg.tenant.clone_base_keep,
        ));
        let publisher = Arc::new(publisher::Publisher::new(
            store.clone(),
            api.clone(),
            probes,
            leases,
            &cfg,
            metrics.clone(),
            shutdown.clone(),
        ));
        Arc::new(Handler {
            cfg,
            store,
            api,
            artifacts,
            publisher,
            metrics,
            shutdown,
            checkpoints: checkpoint::InFlight::default(),
            liveness: crate::systemd::Liveness::default(),
            sessions: crate::activity::Sessions::default(),
            wake_gate: crate::activity::WakeGate::default(),
        })
    }

    /// Runs `fut` in the background until it ends or the agent shuts down.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        spawn_until(&self.shutdown, fut);
    }

    /// Tracked pod copy.
    pub fn tracked_pod(&self, key: &str) -> Option<Pod> {
        self.store.tracked_pod(key)
    }

    /// Tracked VM of a pod.
    pub fn tracked_vm(&self, key: &str) -> Option<TrackedVm> {
        self.store.tracked_vm(key)
    }

    /// True when `key` is tracked.
    pub fn is_tracked(&self, key: &str) -> bool {
        self.store.is_tracked(key)
    }

    /// Tracked pod keys.
    pub fn tracked_keys(&self) -> Vec<String> {
        self.store.tracked_keys()
    }

    /// Pulls `<repo>:<tag>` into the local snapshot `local` once for all concurrent callers
    /// (`Artifacts::shared_pull`).
    pub async fn shared_pull(
        &self,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> std::result::Result<PullSummary, Arc<RegistryFailure>> {
        self.artifacts.shared_pull(repo, tag, local).await
    }
}

/// Runs `fut` in the background until it ends or `stop` fires.
pub(crate) fn spawn_until<F>(stop: &CancellationToken, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = fut => {}
        }
    });
}

/// Looks up the lease of `mac` in the cocoon-net lease file.
fn read_lease(path: &std::path::Path, mac: &str) -> std::io::Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Lease {
        mac: String,
        ip: String,
    }
    let bytes = std::fs::read(path)?;
    let leases: Vec<Lease> = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    Ok(leases
        .into_iter()
        .find(|l| l.mac.eq_ignore_ascii_case(mac))
        .map(|l| l.ip))
}
