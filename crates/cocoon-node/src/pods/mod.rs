//! The pod lifecycle of the node agent (`node.md` §3–§12): CreatePod, DeletePod, the
//! hibernate/wake UpdatePod, the startup reconcile, the VM event watcher, probes and status.
//!
//! Shape: pure rules ([`rules`], [`intent`], [`status`], the probe state machine in [`probe`])
//! decide; the [`Handler`] methods in the sibling modules observe (API, runtime, registry) and
//! act. Hibernate, wake, delete and the create's bring-up are planned pipelines (`plan`): pure
//! planners return ordered steps with their compensations, one executor runs them. The
//! [`controller`] feeds pods bound to this node into the handler, serialised per pod.
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
mod clone_gc;
pub mod controller;
mod create;
mod delete;
mod effects;
pub mod events;
mod exec;
mod flights;
pub mod host_reach;
pub mod intent;
pub mod lease_watch;
mod owned;
mod plan;
pub mod probe;
pub mod reconcile;
pub mod resources;
pub mod rules;
pub mod samples;
mod stale;
pub mod state;
pub mod status;
pub mod tenant;
mod transfer;
pub mod unmanaged_ip;
pub use transfer::import_snapshot_from_registry;
mod update;

#[cfg(test)]
mod incarnation_tests;
#[cfg(test)]
mod resources_tests;
#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod tenant_tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, GenerationStamp, Lifecycle, LifecycleState, VmRuntime,
    annotations_merge_patch, apply_delta,
};
use cocoon_registry::RegistryClient;
use cocoon_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

pub use crate::config::OrphanPolicy;
use crate::metrics::NodeMetrics;
use lease_watch::LeaseWatch;
use probe::{ProbeManager, ProbeSchedule};

/// The probe's message while the VM's IP does not resolve yet (§11.1 step 2).
pub(crate) const WAITING_FOR_LEASE: &str = "waiting for dhcp lease";
/// The probe's answer for an unmanaged pod (never probed, ready once admitted).
pub(crate) const UNMANAGED_NOT_PROBED: &str = "unmanaged: not probed";
use state::{Tables, TrackedVm};

/// Errors of pod operations. The text is the contract text of `node.md` §16.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// An operation failed; the message is what the spec prescribes.
    #[error("{0}")]
    Failed(String),
    /// A Kubernetes API call failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// Result of pod operations.
pub type Result<T, E = PodError> = std::result::Result<T, E>;

fn failed(msg: impl Into<String>) -> PodError {
    PodError::Failed(msg.into())
}

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

/// The pod handler: the in-memory tables plus everything CreatePod/DeletePod/UpdatePod and the
/// background loops talk to.
pub struct Handler {
    pub(crate) cfg: PodConfig,
    pub(crate) client: Client,
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) registry: Option<RegistryClient>,
    recorder: Recorder,
    tables: Mutex<Tables>,
    pub(crate) probes: Arc<ProbeManager>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) shutdown: CancellationToken,
    flights: flights::Flights,
    /// Registry pulls in flight, by destination snapshot (see `shared_pull`).
    pulls: Arc<Mutex<HashMap<String, transfer::SharedPull>>>,
    /// Bumped whenever a stale create resolves (its VM name freed, or indexed for adoption):
    /// pod operations waiting out a retry backoff try again at once.
    names_freed: tokio::sync::watch::Sender<u64>,
    /// Changes of the lease file, cutting the waits on a DHCP lease short.
    pub(crate) leases: Arc<LeaseWatch>,
    /// Heartbeats of this agent's main loops, for the systemd watchdog ([`crate::systemd`]).
    pub liveness: crate::systemd::Liveness,
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
        Arc::new(Handler {
            cfg,
            client,
            rt,
            registry,
            recorder,
            tables: Mutex::new(Tables::default()),
            probes,
            metrics,
            shutdown,
            flights: flights::Flights::default(),
            pulls: Arc::default(),
            names_freed: tokio::sync::watch::Sender::new(0),
            leases,
            liveness: crate::systemd::Liveness::default(),
        })
    }

    pub(crate) fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `fut` in the background until it ends or the agent shuts down.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = fut => {}
            }
        });
    }

    /// A per-key lock for single flights: the holder re-checks the local store, so concurrent
    /// callers end up doing the work once ([`flights`]).
    pub(crate) fn flight(&self, key: &str) -> flights::FlightLock {
        self.flights.get(key)
    }

    /// Tells pod operations in a retry backoff that a VM name may have become free.
    pub(crate) fn name_freed(&self) {
        self.names_freed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes each time [`Handler::name_freed`] is called.
    pub(crate) fn names_freed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.names_freed.subscribe()
    }

    fn update_table_gauge(&self, t: &Tables) {
        self.metrics.set_vm_table_size(t.vms_by_pod.len());
    }

    /// Tracked pod copy.
    pub fn tracked_pod(&self, key: &str) -> Option<Pod> {
        self.tables().pods.get(key).cloned()
    }

    /// Tracked VM of a pod.
    pub fn tracked_vm(&self, key: &str) -> Option<TrackedVm> {
        self.tables().vms_by_pod.get(key).cloned()
    }

    /// True when `key` is tracked.
    pub fn is_tracked(&self, key: &str) -> bool {
        self.tables().pods.contains_key(key)
    }

    /// Tracked pod keys.
    pub fn tracked_keys(&self) -> Vec<String> {
        self.tables().pods.keys().cloned().collect()
    }

    pub(crate) fn track_vm(&self, key: &str, vm: TrackedVm) {
        let mut t = self.tables();
        t.track_vm(key, vm);
        self.update_table_gauge(&t);
    }

    pub(crate) fn forget(&self, key: &str) {
        self.probes.forget(key);
        let mut t = self.tables();
        t.forget(key);
        self.update_table_gauge(&t);
    }

    fn api(&self, pod: &Pod) -> Api<Pod> {
        Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    // ---- annotations -------------------------------------------------------------------

    /// One annotation merge patch with the 5 s timeout of §5.1. Sent to the `status`
    /// subresource, which stores metadata annotations too: a node identity
    /// (`system:node:<name>`) may write a pod only there (NodeRestriction refuses every
    /// update of the pod itself), and the shipped ValidatingAdmissionPolicy holds it to the
    /// annotation keys the contract lets a node write.
    async fn patch_annotations_once(&self, pod: &Pod, delta: &AnnotationDelta) -> Result<()> {
        let Some(mut patch) = annotations_merge_patch(delta) else {
            return Ok(());
        };
        pin_to_incarnation(&mut patch, pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let api = self.api(pod);
        let pp = PatchParams::default();
        let body = Patch::Merge(&patch);
        match tokio::time::timeout(Duration::from_secs(5), api.patch_status(name, &pp, &body)).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(failed("annotation patch timed out")),
        }
    }

    /// Patches annotations with 3 attempts 500 ms apart and mirrors them onto the tracked copy.
    pub(crate) async fn patch_annotations(&self, pod: &Pod, delta: AnnotationDelta) -> Result<()> {
        let key = pod_key(pod);
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(self.cfg.timing.patch_retry).await;
            }
            match self.patch_annotations_once(pod, &delta).await {
                Ok(()) => {
                    let mut t = self.tables();
                    if let Some(p) = t.pods.get_mut(&key) {
                        apply_delta(p.metadata.annotations.get_or_insert_default(), &delta);
                    }
                    return Ok(());
                }
                Err(PodError::Kube(e)) if superseded(&e) => return Err(e.into()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| failed("annotation patch failed")))
    }

    /// Writes `id`/`ip` (and `vnc-port` when non-zero) in one patch; a failure is only logged.
    pub(crate) async fn write_runtime(&self, pod: &Pod, vm: &TrackedVm, vnc_port: i32) {
        let delta = VmRuntime {
            id: vm.id().to_owned(),
            ip: vm.ip.clone(),
            vnc_port,
        }
        .desired();
        if let Err(e) = self.patch_annotations(pod, delta).await {
            warn!(pod = %pod_key(pod), error = %e, "writing runtime annotations failed");
        }
    }

    /// Clears `id`, `ip` and `post-clone-state` in one patch.
    pub(crate) async fn clear_runtime(&self, pod: &Pod) -> Result<()> {
        let delta: AnnotationDelta = [ann::VM_ID, ann::VM_IP, ann::POST_CLONE_STATE]
            .into_iter()
            .filter(|k| annotations(pod).contains_key(*k) || self.tracked_has(pod, k))
            .map(|k| (k.to_owned(), None))
            .collect();
        self.patch_annotations(pod, delta).await
    }

    fn tracked_has(&self, pod: &Pod, k: &str) -> bool {
        self.tables()
            .pods
            .get(&pod_key(pod))
            .is_some_and(|p| annotations(p).contains_key(k))
    }

    // ---- events ------------------------------------------------------------------------

    /// Emits an Event on the pod; failures are logged.
    pub(crate) async fn event(&self, pod: &Pod, warning: bool, reason: &str, message: &str) {
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(message.to_owned()),
            action: cocoon_api::contract::events::event_action(reason, message),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            debug!(error = %e, reason, "publishing event failed");
        }
    }

    /// failOp (§12.3): counter, Warning Event `<op>: <err>`, lifecycle `failed`, error log.
    pub(crate) async fn fail_op(&self, pod: &Pod, reason: &str, op: &str, err: &str) {
        use cocoon_api::contract::metrics::node as m;
        self.metrics.pod_lifecycle(op, m::RESULT_FAILED, "");
        error!(pod = %pod_key(pod), reason, op, error = err, "pod operation failed");
        self.event(
            pod,
            true,
            reason,
            &cocoon_api::contract::events::node_failure_message(op, err),
        )
        .await;
        self.set_lifecycle(pod, LifecycleState::Failed, err).await;
    }

    // ---- lifecycle intent (§5.4) -------------------------------------------------------

    /// Records a lifecycle write as the pod's intent (rules of §5.4) and applies it to the
    /// tracked copy; returns false when dropped. Does not flush.
    pub(crate) fn store_intent(&self, pod: &Pod, state: LifecycleState, message: &str) -> bool {
        let key = pod_key(pod);
        let uid = uid(pod);
        let mut t = self.tables();
        let tracked_gen = t
            .pods
            .get(&key)
            .map_or(0, |p| GenerationStamp::from_meta(&p.metadata).0);
        let generation = GenerationStamp::from_meta(&pod.metadata).0.max(tracked_gen);
        let tracked_uid = t.tracked_uid(&key).map(str::to_owned);
        if let Err(why) = intent::accept(
            tracked_uid.as_deref(),
            t.intents.get(&key),
            &uid,
            state,
            generation,
        ) {
            debug!(pod = %key, ?why, state = %state, "lifecycle write dropped");
            return false;
        }
        let lifecycle = match state {
            LifecycleState::Failed => Lifecycle::failed(generation, message),
            s => Lifecycle::new(s, generation, message),
        };
        let flushed = t
            .intents
            .get(&key)
            .filter(|i| i.uid == uid)
            .map(|i| i.flushed.clone())
            .unwrap_or_default();
        let delta = lifecycle.desired();
        if let Some(p) = t.pods.get_mut(&key) {
            apply_delta(p.metadata.annotations.get_or_insert_default(), &delta);
        }
        t.intents.insert(
            key,
            intent::Intent {
                uid,
                lifecycle,
                flushed,
                failed_by_hibernate: false,
            },
        );
        true
    }

    /// Stores and flushes a lifecycle write (one patch with all three keys).
    pub(crate) async fn set_lifecycle(&self, pod: &Pod, state: LifecycleState, message: &str) {
        if self.store_intent(pod, state, message) {
            self.flush(&pod_key(pod), pod).await;
        }
    }

    /// Flushes the intent of `key` (§5.4): up to 3 attempts, each checking it still owns the
    /// write; superseded errors drop the intent.
    pub(crate) async fn flush(&self, key: &str, pod: &Pod) {
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(self.cfg.timing.patch_retry).await;
            }
            let Some(want) = self.tables().intents.get(key).map(|i| i.lifecycle.clone()) else {
                return;
            };
            let snap = intent::snapshot(&want);
            // Always all three keys: the operator's gates depend on the triple's atomicity.
            let delta = want.desired();
            match self.patch_annotations_once(pod, &delta).await {
                Ok(()) => {
                    let mut t = self.tables();
                    if let Some(i) = t.intents.get_mut(key)
                        && intent::snapshot(&i.lifecycle) == snap
                    {
                        i.flushed = snap;
                    }
                    if let Some(p) = t.pods.get_mut(key) {
                        apply_delta(p.metadata.annotations.get_or_insert_default(), &delta);
                    }
                    return;
                }
                Err(PodError::Kube(e)) if superseded(&e) => {
                    debug!(pod = %key, error = %e, "lifecycle write superseded");
                    self.tables().intents.remove(key);
                    return;
                }
                Err(e) => warn!(pod = %key, error = %e, attempt, "lifecycle patch failed"),
            }
        }
    }

    /// Seeds the intent from the pod's own annotations (startup): intent = annotations =
    /// flushed, so no patch is sent.
    pub(crate) fn seed_intent(&self, pod: &Pod) {
        let l = Lifecycle::from_meta(&pod.metadata);
        if l.state.is_none() {
            return;
        }
        let snap = intent::snapshot(&l);
        self.tables().intents.insert(
            pod_key(pod),
            intent::Intent {
                uid: uid(pod),
                lifecycle: l,
                flushed: snap,
                failed_by_hibernate: false,
            },
        );
    }

    pub(crate) fn intent_state(&self, key: &str) -> Option<LifecycleState> {
        self.tables()
            .intents
            .get(key)
            .and_then(|i| i.lifecycle.state)
    }

    // ---- status (§12) ------------------------------------------------------------------

    /// Computes the status of a tracked pod; `bypass` is the single §5.3 publication.
    pub(crate) fn compute_status(
        &self,
        key: &str,
        bypass: bool,
    ) -> Option<(Pod, k8s_openapi::api::core::v1::PodStatus)> {
        let probe = self.probes.result(key);
        let t = self.tables();
        let pod = t.pods.get(key)?.clone();
        let vm = t.vms_by_pod.get(key);
        let lifecycle_ready = bypass
            || t.intents
                .get(key)
                .and_then(|i| i.lifecycle.state)
                .or_else(|| Lifecycle::from_meta(&pod.metadata).state)
                == Some(LifecycleState::Ready);
        let start = t.start_times.get(key).cloned();
        let input = status::StatusInput {
            vm_ip: vm.map(|v| v.ip.as_str()),
            probe_ready: probe.is_some_and(|p| p.ready),
            lifecycle_ready,
            hibernated: cocoon_api::contract::HibernateFlags::from_meta(&pod.metadata).hibernate,
            start_time: start.or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone())),
            vm_started: vm.map(|v| v.started.clone()),
            previous: pod.status.as_ref(),
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        let st = status::compute(&input);
        Some((pod, st))
    }

    /// Writes a status to the pod's status subresource (merge patch; absent IP fields are
    /// removed explicitly, since a merge patch would keep them).
    pub(crate) async fn write_status(
        &self,
        pod: &Pod,
        st: &k8s_openapi::api::core::v1::PodStatus,
    ) -> Result<()> {
        let mut body = serde_json::to_value(st).map_err(|e| failed(e.to_string()))?;
        if let Value::Object(m) = &mut body {
            for k in ["podIP", "podIPs", "reason", "message"] {
                m.entry(k).or_insert(Value::Null);
            }
        }
        let mut patch = json!({ "status": body });
        pin_to_incarnation(&mut patch, pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let api = self.api(pod);
        let pp = PatchParams::default();
        let body = Patch::Merge(&patch);
        let res = tokio::time::timeout(Duration::from_secs(5), api.patch_status(name, &pp, &body))
            .await
            .map_err(|_| failed("status patch timed out"))?;
        match res {
            Ok(_) => {
                let key = pod_key(pod);
                if let Some(p) = self.tables().pods.get_mut(&key) {
                    p.status = Some(st.clone());
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The lock under which a pod's status is computed and written. Publications come from
    /// several tasks (the probe loop, the bring-up, the lifecycle reconciler, the drift
    /// check); computing inside the lock makes the last write the newest view, where two
    /// racing writes could otherwise leave a stale status until the drift check.
    pub(crate) fn status_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.flight(&format!("status:{key}"))
    }

    /// Recomputes and publishes the status of a tracked pod.
    pub(crate) async fn notify(&self, key: &str) {
        let lock = self.status_lock(key);
        let _publishing = lock.lock().await;
        let Some((pod, st)) = self.compute_status(key, false) else {
            return;
        };
        if let Err(e) = self.write_status(&pod, &st).await {
            debug!(pod = %key, error = %e, "status write failed");
        }
    }

    /// The ready publication of §5.3: status first, then the annotation.
    pub(crate) async fn publish_ready(&self, key: &str) -> bool {
        let Some(pod) = self.tracked_pod(key) else {
            return false;
        };
        if !self.store_intent(&pod, LifecycleState::Ready, "") {
            return false;
        }
        let lock = self.status_lock(key);
        let publishing = lock.lock().await;
        let Some((pod, st)) = self.compute_status(key, true) else {
            return false;
        };
        if let Err(e) = self.write_status(&pod, &st).await {
            warn!(pod = %key, error = %e, "ready status write failed; the lifecycle reconciler retries");
            return false;
        }
        drop(publishing);
        // The DHCP lease may have landed after the create wrote the runtime annotations and
        // before the first probe (which then never reports a transition): publish the address
        // with the ready state, so `vm.cocoonstack.io/ip` never stays empty on a ready VM.
        let ip = self.resolve_ip(key);
        if !ip.is_empty()
            && annotation(&pod, ann::VM_IP) != Some(ip.as_str())
            && let Some(vm) = self.tracked_vm(key).filter(|v| !v.synthetic)
        {
            self.write_runtime(&pod, &vm, 0).await;
        }
        self.flush(key, &pod).await;
        true
    }

    // ---- probes and IPs (§11) ----------------------------------------------------------

    /// Resolves the IP of a tracked VM (§11.2) and caches it.
    pub(crate) fn resolve_ip(&self, key: &str) -> String {
        let Some(vm) = self.tracked_vm(key) else {
            return String::new();
        };
        if vm.synthetic
            || !vm
                .record
                .network_configs
                .first()
                .is_none_or(|n| n.is_dhcp())
        {
            return vm.ip.clone();
        }
        let mac = vm.record.mac().to_ascii_lowercase();
        if mac.is_empty() {
            return vm.ip.clone();
        }
        match read_lease(&self.cfg.leases_path, &mac) {
            Ok(Some(ip)) => {
                let mut t = self.tables();
                if let Some(cur) = t.vms_by_pod.get(key)
                    && cur.id() == vm.id()
                {
                    let mut updated = cur.clone();
                    updated.ip = ip.clone();
                    t.track_vm(key, updated);
                    ip
                } else {
                    String::new()
                }
            }
            Ok(None) | Err(_) => vm.ip.clone(),
        }
    }

    /// Starts the readiness probe of a tracked pod (first probe synchronous).
    pub(crate) async fn start_probe(self: &Arc<Self>, key: &str) {
        if self
            .tracked_pod(key)
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        {
            return;
        }
        let me = self.clone();
        let k = key.to_owned();
        let probe: probe::ProbeFn = Arc::new(move || {
            let me = me.clone();
            let k = k.clone();
            Box::pin(async move { me.probe_once(&k).await })
        });
        let me = self.clone();
        let k = key.to_owned();
        let on_update: probe::UpdateFn = Arc::new(move || {
            let me = me.clone();
            let k = k.clone();
            Box::pin(async move { me.on_probe_update(&k).await })
        });
        self.probes.start(key, probe, on_update).await;
    }

    async fn probe_once(&self, key: &str) -> (bool, String) {
        let Some(pod) = self.tracked_pod(key) else {
            return (false, "vm gone".into());
        };
        let Some(vm) = self.tracked_vm(key) else {
            return (false, "vm gone".into());
        };
        // An unmanaged pod's synthetic record is never probed: its IP is not this node's to
        // reach (a probe-port would be a port scan from the host). It is ready once admitted.
        if vm.synthetic {
            return (true, UNMANAGED_NOT_PROBED.into());
        }
        let ip = self.resolve_ip(key);
        if ip.is_empty() {
            return (false, WAITING_FOR_LEASE.into());
        }
        let port = cocoon_api::contract::VmSpec::from_meta(&pod.metadata).probe_port;
        if port > 0 {
            return match tokio::net::TcpStream::connect((ip.as_str(), port as u16)).await {
                Ok(_) => (true, "tcp ok".into()),
                Err(e) => (false, format!("tcp probe {port}: {e}")),
            };
        }
        // No raw-socket pinger: readiness degrades to "an IP was resolved" (§11.1).
        (true, "ping ok".into())
    }

    async fn on_probe_update(self: &Arc<Self>, key: &str) {
        // Pods waiting on the probe (hint mode, a lifted hibernate failure) publish ready when
        // it first succeeds; any other flip only refreshes the status.
        let probe_ready = self.probes.result(key).is_some_and(|p| p.ready);
        // A DHCP IP usually resolves after the create wrote the runtime annotations: publish it
        // once the probe sees it, so consumers of `vm.cocoonstack.io/ip` get it too.
        if probe_ready
            && let (Some(pod), Some(vm)) = (self.tracked_pod(key), self.tracked_vm(key))
            && !vm.ip.is_empty()
            && annotation(&pod, ann::VM_IP) != Some(vm.ip.as_str())
        {
            self.write_runtime(&pod, &vm, 0).await;
        }
        if probe_ready && self.tables().ready_pending.remove(key) {
            self.publish_ready(key).await;
            return;
        }
        self.notify(key).await;
    }
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
