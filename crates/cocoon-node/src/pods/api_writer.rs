//! The API writer: everything the node agent writes to the Kubernetes API about a pod —
//! annotation patches (§5.1), lifecycle intents and their flush (§5.4), status patches (§12),
//! Events, failOp (§12.3), the kubelet-style rejection and the eviction of §10 — and the
//! namespace read behind a snapshot's owner record.
//!
//! Every write is pinned to the pod's incarnation ([`pin_to_incarnation`]) and mirrored onto
//! the tracked copy in the [`PodStore`].

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, LifecycleState, VmRuntime, annotations_merge_patch,
    apply_delta,
};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tracing::{debug, error, info, warn};

use super::error::{ApiError, PodError};
use super::resources::Rejection;
use super::state::TrackedVm;
use super::store::PodStore;
use super::{Result, annotations, intent, pin_to_incarnation, pod_key, superseded};
use crate::metrics::NodeMetrics;

/// What a namespace read answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceUid {
    /// The namespace's current UID.
    Known(String),
    /// The agent's identity may not read namespaces (403): the UID is not compared on push
    /// nor written; a pull of an artifact recording one is refused.
    Forbidden,
}

/// The client, the Event recorder and the store the writes are mirrored onto.
#[derive(Clone)]
pub(crate) struct ApiWriter {
    client: Client,
    recorder: Recorder,
    store: Arc<PodStore>,
    metrics: Arc<NodeMetrics>,
    /// Delay between annotation patch attempts (§5.1).
    patch_retry: Duration,
}

impl ApiWriter {
    /// A writer through `client` and `recorder`, mirroring onto `store`.
    pub(crate) fn new(
        client: Client,
        recorder: Recorder,
        store: Arc<PodStore>,
        metrics: Arc<NodeMetrics>,
        patch_retry: Duration,
    ) -> Self {
        ApiWriter {
            client,
            recorder,
            store,
            metrics,
            patch_retry,
        }
    }

    /// The API client (for reads: the pod listings of the controller and the reconcile).
    pub(crate) fn client(&self) -> &Client {
        &self.client
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
            Err(_) => Err(ApiError::TimedOut("annotation patch").into()),
        }
    }

    /// Patches annotations with 3 attempts 500 ms apart and mirrors them onto the tracked copy.
    pub(crate) async fn patch_annotations(&self, pod: &Pod, delta: AnnotationDelta) -> Result<()> {
        let key = pod_key(pod);
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(self.patch_retry).await;
            }
            match self.patch_annotations_once(pod, &delta).await {
                Ok(()) => {
                    let mut t = self.store.tables();
                    if let Some(p) = t.pods.get_mut(&key) {
                        apply_delta(p.metadata.annotations.get_or_insert_default(), &delta);
                    }
                    return Ok(());
                }
                Err(PodError::Api(ApiError::Kube(e))) if superseded(&e) => return Err(e.into()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(ApiError::Failed("annotation patch").into()))
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
            .filter(|k| annotations(pod).contains_key(*k) || self.store.tracked_has(pod, k))
            .map(|k| (k.to_owned(), None))
            .collect();
        self.patch_annotations(pod, delta).await
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

    /// A Normal `SnapshotPushed` / `SnapshotPulled` Event on the pod of VM `vm` saying how
    /// much moved (additive to the Go contract; the plugin shows it).
    pub(crate) async fn transfer_event(
        &self,
        vm: &str,
        push: bool,
        format: &str,
        moved: u64,
        total: u64,
        took: Duration,
    ) {
        use cocoon_api::contract::events::{node as reasons, snapshot_transfer_message};
        let Some(pod) = self.store.pod_of_vm(vm) else {
            return;
        };
        let (verb, reason) = if push {
            ("pushed", reasons::SNAPSHOT_PUSHED)
        } else {
            ("pulled", reasons::SNAPSHOT_PULLED)
        };
        let message = snapshot_transfer_message(verb, moved, total, format, took);
        info!(vm, %message, "snapshot transfer");
        self.event(&pod, false, reason, &message).await;
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

    /// failOp of a classified error, the one place an error becomes the contract's Event
    /// reason ([`PodError::reason_or`]: `fallback` unless the error names one) and message
    /// ([`PodError::message`]).
    pub(crate) async fn fail_with(
        &self,
        pod: &Pod,
        op: &str,
        fallback: &'static str,
        err: &PodError,
    ) {
        self.fail_op(pod, err.reason_or(fallback), op, &err.message())
            .await;
    }

    // ---- lifecycle intent (§5.4) -------------------------------------------------------

    /// Stores and flushes a lifecycle write (one patch with all three keys).
    pub(crate) async fn set_lifecycle(&self, pod: &Pod, state: LifecycleState, message: &str) {
        if self.store.store_intent(pod, state, message) {
            self.flush(&pod_key(pod), pod).await;
        }
    }

    /// Flushes the intent of `key` (§5.4): up to 3 attempts, each checking it still owns the
    /// write; superseded errors drop the intent.
    pub(crate) async fn flush(&self, key: &str, pod: &Pod) {
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(self.patch_retry).await;
            }
            let Some(want) = self
                .store
                .tables()
                .intents
                .get(key)
                .map(|i| i.lifecycle.clone())
            else {
                return;
            };
            let snap = intent::snapshot(&want);
            // Always all three keys: the operator's gates depend on the triple's atomicity.
            let delta = want.desired();
            match self.patch_annotations_once(pod, &delta).await {
                Ok(()) => {
                    let mut t = self.store.tables();
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
                Err(PodError::Api(ApiError::Kube(e))) if superseded(&e) => {
                    debug!(pod = %key, error = %e, "lifecycle write superseded");
                    self.store.tables().intents.remove(key);
                    return;
                }
                Err(e) => warn!(pod = %key, error = %e, attempt, "lifecycle patch failed"),
            }
        }
    }

    // ---- status (§12) ------------------------------------------------------------------

    /// Writes a status to the pod's status subresource (merge patch; absent IP fields are
    /// removed explicitly, since a merge patch would keep them).
    pub(crate) async fn write_status(&self, pod: &Pod, st: &PodStatus) -> Result<()> {
        let mut body = serde_json::to_value(st).map_err(ApiError::Encode)?;
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
            .map_err(|_| ApiError::TimedOut("status patch"))?;
        match res {
            Ok(_) => {
                let key = pod_key(pod);
                if let Some(p) = self.store.tables().pods.get_mut(&key) {
                    p.status = Some(st.clone());
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Rejects the pod as a kubelet does: a Warning Event (the reason, the kubelet's
    /// message) and the status phase `Failed` with `Pod was rejected: <message>`. The
    /// controller leaves a terminal pod alone; a failed status write is retried.
    pub(crate) async fn reject_pod(&self, pod: &Pod, r: &Rejection) -> Result<()> {
        use cocoon_api::contract::events::node as ev;
        use cocoon_api::contract::metrics::node as m;
        warn!(pod = %pod_key(pod), reason = %r.reason, message = %r.message, "pod rejected at admission");
        self.metrics
            .pod_lifecycle(ev::OP_CREATE, m::RESULT_FAILED, "");
        self.event(pod, true, &r.reason, &r.message).await;
        let st = PodStatus {
            phase: Some("Failed".into()),
            reason: Some(r.reason.clone()),
            message: Some(r.status_message()),
            qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
            start_time: pod.status.as_ref().and_then(|s| s.start_time.clone()),
            ..Default::default()
        };
        self.write_status(pod, &st).await
    }

    /// The DELETE of evictPod (§10), pinned to this incarnation, 2 attempts; true when
    /// nothing of ours is left (deleted, gone, or replaced by a newer incarnation).
    pub(crate) async fn delete_incarnation(&self, key: &str, pod: &Pod) -> bool {
        let api = self.api(pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        for attempt in 1..=2u32 {
            // Only this incarnation: a recreated pod of the same name is not ours to evict.
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: pod.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await {
                Ok(_) => return true,
                // Gone (404), or already replaced by a newer incarnation (409): nothing of
                // ours is left to evict; the status write after it is pinned and lands nowhere.
                Err(e) if superseded(&e) => return true,
                Err(e) => {
                    warn!(pod = %key, error = %e, attempt, "evicting pod failed");
                    tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                }
            }
        }
        false
    }

    /// The current UID of namespace `ns` (recorded with every snapshot an owner pushes).
    pub(crate) async fn namespace_uid(&self, ns: &str) -> Result<NamespaceUid, ApiError> {
        use k8s_openapi::api::core::v1::Namespace;
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.get(ns).await {
            Ok(n) => n
                .metadata
                .uid
                .filter(|u| !u.is_empty())
                .map(NamespaceUid::Known)
                .ok_or_else(|| ApiError::NoNamespaceUid(ns.to_owned())),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                debug!(
                    namespace = ns,
                    "may not read namespaces: owner recorded without the namespace uid"
                );
                Ok(NamespaceUid::Forbidden)
            }
            Err(e) => Err(ApiError::ReadNamespace(ns.to_owned(), e)),
        }
    }
}
