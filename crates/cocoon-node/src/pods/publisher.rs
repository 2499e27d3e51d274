//! The publisher: a tracked pod's readiness probe (§11), its IP (§11.2, the DHCP lease), its
//! computed status (§12) and the ready publication of §5.3 (status first, then the
//! annotation), including the "ready after IP" wait of §6.9.
//!
//! It reads the [`PodStore`] and writes through the [`ApiWriter`]; the probe loops are the
//! [`ProbeManager`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use cocoon_api::contract::Os;
use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, Lifecycle, LifecycleState, VmSpec};
use cocoon_runtime::VmRecord;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::api_writer::ApiWriter;
use super::lease_watch::LeaseWatch;
use super::plan::follow_up::{self, Background, FollowUp};
use super::probe::{self, ProbeManager};
use super::rules::NicInfo;
use super::state::TrackedVm;
use super::store::PodStore;
use super::{PodConfig, UNMANAGED_NOT_PROBED, WAITING_FOR_LEASE, annotation, read_lease, status};
use crate::metrics::NodeMetrics;

/// Probes, IPs and status publication of the tracked pods.
pub(crate) struct Publisher {
    store: Arc<PodStore>,
    api: ApiWriter,
    probes: Arc<ProbeManager>,
    /// Changes of the lease file, cutting the waits on a DHCP lease short.
    leases: Arc<LeaseWatch>,
    /// `VK_LEASES_PATH`.
    leases_path: std::path::PathBuf,
    /// The ready-after-IP budget and poll.
    ready_ip_wait: Duration,
    ready_ip_poll: Duration,
    metrics: Arc<NodeMetrics>,
    /// `COCOON_ROOT_DIR` (cloud-image detection of the fixup hint).
    cocoon_root_dir: std::path::PathBuf,
    /// Ends the background post-bring-up steps.
    shutdown: CancellationToken,
}

impl Publisher {
    /// A publisher over `store` writing through `api`.
    pub(crate) fn new(
        store: Arc<PodStore>,
        api: ApiWriter,
        probes: Arc<ProbeManager>,
        leases: Arc<LeaseWatch>,
        cfg: &PodConfig,
        metrics: Arc<NodeMetrics>,
        shutdown: CancellationToken,
    ) -> Self {
        Publisher {
            store,
            api,
            probes,
            leases,
            leases_path: cfg.leases_path.clone(),
            ready_ip_wait: cfg.timing.ready_ip_wait,
            ready_ip_poll: cfg.timing.ready_ip_poll,
            metrics,
            cocoon_root_dir: cfg.cocoon_root_dir.clone(),
            shutdown,
        }
    }

    /// The probe loops (closed at agent shutdown).
    pub(crate) fn probes(&self) -> &Arc<ProbeManager> {
        &self.probes
    }

    /// Is `key`'s last probe result ready?
    pub(crate) fn probe_ready(&self, key: &str) -> bool {
        self.probes.result(key).is_some_and(|p| p.ready)
    }

    /// Stops `key`'s probe and forgets everything about it.
    pub(crate) fn forget(&self, key: &str) {
        self.probes.forget(key);
        self.store.forget(key);
    }

    /// Computes the status of a tracked pod; `bypass` is the single §5.3 publication.
    pub(crate) fn compute_status(&self, key: &str, bypass: bool) -> Option<(Pod, PodStatus)> {
        let probe = self.probes.result(key);
        let t = self.store.tables();
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
            hibernated: HibernateFlags::from_meta(&pod.metadata).hibernate,
            start_time: start.or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone())),
            vm_started: vm.map(|v| v.started.clone()),
            previous: pod.status.as_ref(),
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        let st = status::compute(&input);
        Some((pod, st))
    }

    /// Recomputes and publishes the status of a tracked pod.
    pub(crate) async fn notify(&self, key: &str) {
        let lock = self.store.status_lock(key);
        let _publishing = lock.lock().await;
        let Some((pod, st)) = self.compute_status(key, false) else {
            return;
        };
        if let Err(e) = self.api.write_status(&pod, &st).await {
            debug!(pod = %key, error = %e, "status write failed");
        }
    }

    /// The ready publication of §5.3: status first, then the annotation.
    pub(crate) async fn publish_ready(&self, key: &str) -> bool {
        let Some(pod) = self.store.tracked_pod(key) else {
            return false;
        };
        if !self.store.store_intent(&pod, LifecycleState::Ready, "") {
            return false;
        }
        let lock = self.store.status_lock(key);
        let publishing = lock.lock().await;
        let Some((pod, st)) = self.compute_status(key, true) else {
            return false;
        };
        if let Err(e) = self.api.write_status(&pod, &st).await {
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
            && let Some(vm) = self.store.tracked_vm(key).filter(|v| !v.synthetic)
        {
            self.api.write_runtime(&pod, &vm, 0).await;
        }
        self.api.flush(key, &pod).await;
        true
    }

    /// Resolves the IP of a tracked VM (§11.2) and caches it.
    pub(crate) fn resolve_ip(&self, key: &str) -> String {
        let Some(vm) = self.store.tracked_vm(key) else {
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
        match read_lease(&self.leases_path, &mac) {
            Ok(Some(ip)) => {
                let mut t = self.store.tables();
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
            .store
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
        let Some(pod) = self.store.tracked_pod(key) else {
            return (false, "vm gone".into());
        };
        let Some(vm) = self.store.tracked_vm(key) else {
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
        let port = VmSpec::from_meta(&pod.metadata).probe_port;
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
        let probe_ready = self.probe_ready(key);
        // A DHCP IP usually resolves after the create wrote the runtime annotations: publish it
        // once the probe sees it, so consumers of `vm.cocoonstack.io/ip` get it too.
        if probe_ready
            && let (Some(pod), Some(vm)) = (self.store.tracked_pod(key), self.store.tracked_vm(key))
            && !vm.ip.is_empty()
            && annotation(&pod, ann::VM_IP) != Some(vm.ip.as_str())
        {
            self.api.write_runtime(&pod, &vm, 0).await;
        }
        if probe_ready && self.store.tables().ready_pending.remove(key) {
            self.publish_ready(key).await;
            return;
        }
        self.notify(key).await;
    }

    /// `ready` is published when the probe first succeeds (hint mode, a lifted hibernate
    /// failure): now, if it already has.
    pub(crate) async fn ready_when_probed(&self, key: &str) {
        self.store.tables().ready_pending.insert(key.to_owned());
        if self.probe_ready(key) && self.store.tables().ready_pending.remove(key) {
            self.publish_ready(key).await;
        }
    }

    /// "Ready after IP" (§6.9): poll for the IP, then publish `ready`; a timeout fails.
    pub(crate) async fn ready_after_ip(&self, key: &str, vm_id: &str, wake: bool) {
        let deadline = Instant::now() + self.ready_ip_wait;
        loop {
            // Taken before the IP is resolved: a lease that lands meanwhile ends the wait.
            let mut lease = self.leases.wait();
            let still_ours = self.store.tracked_vm(key).is_some_and(|v| v.id() == vm_id)
                && self
                    .store
                    .tracked_pod(key)
                    .is_some_and(|p| !HibernateFlags::from_meta(&p.metadata).hibernate);
            if !still_ours {
                return;
            }
            if !self.resolve_ip(key).is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let Some(pod) = self.store.tracked_pod(key) else {
                    return;
                };
                let vm = VmSpec::from_meta(&pod.metadata).vm_name;
                let (reason, msg) = follow_up::ip_wait_timeout(wake, &vm, self.ready_ip_wait);
                self.metrics.wake_ip_wait("timeout");
                if wake {
                    self.metrics.wake(m::RESULT_FAILED);
                }
                self.api.event(&pod, true, reason, &msg).await;
                self.api
                    .set_lifecycle(&pod, LifecycleState::Failed, &msg)
                    .await;
                self.notify(key).await;
                return;
            }
            // The 200 ms poll of §6.9, cut short by a change of the lease file.
            tokio::select! {
                _ = tokio::time::sleep(self.ready_ip_poll) => {}
                _ = lease.changed() => {}
            }
        }
        if let Some(pod) = self.store.tracked_pod(key) {
            // Persist the resolved IP for consumers of the runtime annotations.
            if let Some(vm) = self.store.tracked_vm(key) {
                self.api.write_runtime(&pod, &vm, 0).await;
            }
        }
        self.publish_ready(key).await;
        self.metrics.wake_ip_wait(m::RESULT_OK);
        if wake {
            self.metrics.wake(m::RESULT_OK);
        }
    }

    /// Steps 9–15 of §6.1 (shared with wake): IP, runtime annotations, tracking, probe, status,
    /// and `ready` now or from the background step.
    pub(crate) async fn finish_bring_up(
        self: &Arc<Self>,
        key: &str,
        pod: &Pod,
        spec: &VmSpec,
        vm: VmRecord,
        follow: FollowUp,
    ) {
        let mut tv = TrackedVm::new(vm);
        let vm_id = tv.id().to_owned();
        self.store.track_vm(key, tv.clone());
        if tv.ip.is_empty() {
            tv.ip = self.resolve_ip(key);
        }
        self.api.write_runtime(pod, &tv, 0).await;
        {
            let mut t = self.store.tables();
            t.start_times
                .insert(key.to_owned(), Time(k8s_openapi::jiff::Timestamp::now()));
        }
        if follow != FollowUp::None {
            let me = self.clone();
            let (k, s) = (key.to_owned(), spec.clone());
            super::spawn_until(&self.shutdown, async move {
                me.post_bring_up(&k, &s, &vm_id, follow).await
            });
        }
        self.start_probe(key).await;
        let failed_now = self.store.intent_state(key) == Some(LifecycleState::Failed);
        if follow_up::ready_now(follow, failed_now) {
            self.publish_ready(key).await;
        } else {
            self.notify(key).await;
        }
    }

    /// The post-restore / post-clone step (§6.9, §8.3), in the background.
    async fn post_bring_up(
        self: &Arc<Self>,
        key: &str,
        spec: &VmSpec,
        vm_id: &str,
        follow: FollowUp,
    ) {
        let Some(vm) = self.store.tracked_vm(key) else {
            return;
        };
        let any_static = vm.record.network_configs.iter().any(|n| !n.is_dhcp());
        match follow_up::background(spec, follow, any_static) {
            Background::Hint => self.write_hint(key, spec, &vm).await,
            Background::ReadyAfterIp { wake } => self.ready_after_ip(key, vm_id, wake).await,
        }
    }

    /// Hint mode (§6.9): write the fixup as a base64 annotation; `ready` follows the probe.
    async fn write_hint(&self, key: &str, spec: &VmSpec, vm: &TrackedVm) {
        let Some(pod) = self.store.tracked_pod(key) else {
            return;
        };
        let nics: Vec<NicInfo> = vm
            .record
            .network_configs
            .iter()
            .map(|n| NicInfo {
                mac: n.mac.clone(),
                ip: n.static_ip().to_owned(),
                prefix: n.network.as_ref().map_or(0, |x| x.prefix),
                gateway: n
                    .network
                    .as_ref()
                    .map(|x| x.gateway.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let overlay = self
            .cocoon_root_dir
            .join("run/cloudhypervisor")
            .join(vm.id())
            .join("overlay.qcow2");
        let windows = spec.effective_os() == Os::Windows;
        let overlay = !windows && overlay.exists();
        let hint = follow_up::hint(spec, vm.name(), overlay, &nics);
        let encoded = base64::engine::general_purpose::STANDARD.encode(hint.as_bytes());
        warn!(pod = %key, vm = %vm.name(), "VM needs manual network setup; see the post-clone-hint annotation");
        let delta = [(ann::POST_CLONE_HINT.to_owned(), Some(encoded))].into();
        if let Err(e) = self.api.patch_annotations(&pod, delta).await {
            warn!(pod = %key, error = %e, "writing the post-clone hint failed");
        }
        self.ready_when_probed(key).await;
    }
}
