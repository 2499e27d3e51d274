//! The pod store: the in-memory tables of `node.md` §4 ([`Tables`]), the lifecycle intents
//! of §5.4 kept in them, the per-pod status locks, and the "a VM name was freed" signal.
//!
//! Every part of the handler that reads or writes the tables goes through this one object;
//! the lock is held only for map operations, never across an await.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use cocoon_api::contract::{
    AnnotationCodec, GenerationStamp, Lifecycle, LifecycleState, VmSpec, apply_delta,
};
use cocoon_runtime::VmRecord;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{debug, info};

use super::artifacts::clone_gc::clone_base_of;
use super::flights::{FlightLock, Flights};
use super::resources::{self, Allocatable, Amounts, Rejection};
use super::state::{Tables, TrackedVm};
use super::{annotations, intent, pod_key, uid};
use crate::metrics::NodeMetrics;

/// The tables, the status locks and the names-freed signal.
pub(crate) struct PodStore {
    tables: Mutex<Tables>,
    /// The status locks, by pod key ([`PodStore::status_lock`]).
    status_locks: Flights,
    /// Bumped whenever a stale create resolves (its VM name freed, or indexed for adoption):
    /// pod operations waiting out a retry backoff try again at once.
    names_freed: tokio::sync::watch::Sender<u64>,
    /// For the VM table gauge.
    metrics: Arc<NodeMetrics>,
}

impl PodStore {
    /// An empty store.
    pub(crate) fn new(metrics: Arc<NodeMetrics>) -> Self {
        PodStore {
            tables: Mutex::new(Tables::default()),
            status_locks: Flights::default(),
            names_freed: tokio::sync::watch::Sender::new(0),
            metrics,
        }
    }

    /// The tables, locked (never hold the guard across an await).
    pub(crate) fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock under which a pod's status is computed and written. Publications come from
    /// several tasks (the probe loop, the bring-up, the lifecycle reconciler, the drift
    /// check); computing inside the lock makes the last write the newest view, where two
    /// racing writes could otherwise leave a stale status until the drift check.
    pub(crate) fn status_lock(&self, key: &str) -> FlightLock {
        self.status_locks.get(&format!("status:{key}"))
    }

    /// Tells pod operations in a retry backoff that a VM name may have become free.
    pub(crate) fn name_freed(&self) {
        self.names_freed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes each time [`PodStore::name_freed`] is called.
    pub(crate) fn names_freed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.names_freed.subscribe()
    }

    /// Tracked pod copy.
    pub(crate) fn tracked_pod(&self, key: &str) -> Option<Pod> {
        self.tables().pods.get(key).cloned()
    }

    /// Tracked VM of a pod.
    pub(crate) fn tracked_vm(&self, key: &str) -> Option<TrackedVm> {
        self.tables().vms_by_pod.get(key).cloned()
    }

    /// True when `key` is tracked.
    pub(crate) fn is_tracked(&self, key: &str) -> bool {
        self.tables().pods.contains_key(key)
    }

    /// Tracked pod keys.
    pub(crate) fn tracked_keys(&self) -> Vec<String> {
        self.tables().pods.keys().cloned().collect()
    }

    /// Tracks `vm` for `key` and refreshes the VM table gauge.
    pub(crate) fn track_vm(&self, key: &str, vm: TrackedVm) {
        let mut t = self.tables();
        t.track_vm(key, vm);
        self.metrics.set_vm_table_size(t.vms_by_pod.len());
    }

    /// Forgets everything about `key` (the probe is the caller's) and refreshes the gauge.
    pub(crate) fn forget(&self, key: &str) {
        let mut t = self.tables();
        t.forget(key);
        self.metrics.set_vm_table_size(t.vms_by_pod.len());
    }

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

    /// The state of `key`'s lifecycle intent.
    pub(crate) fn intent_state(&self, key: &str) -> Option<LifecycleState> {
        self.tables()
            .intents
            .get(key)
            .and_then(|i| i.lifecycle.state)
    }

    /// Does the tracked copy of `pod` carry annotation `k`?
    pub(crate) fn tracked_has(&self, pod: &Pod, k: &str) -> bool {
        self.tables()
            .pods
            .get(&pod_key(pod))
            .is_some_and(|p| annotations(p).contains_key(k))
    }

    /// The admitted pod holding VM `vm` (by the VM name it was admitted with or the VM tracked
    /// for it). A pod still being checked, or refused, is never one: a tenant's decoy pod
    /// naming another namespace's VM must not receive that VM's transfer Events.
    pub(crate) fn pod_of_vm(&self, vm: &str) -> Option<Pod> {
        let t = self.tables();
        t.holders_of(vm, None).into_iter().find_map(|h| {
            t.pods
                .get(&format!("{}/{}", h.namespace, h.name))
                .filter(|p| p.metadata.uid.as_deref() == Some(h.uid.as_str()))
                .cloned()
        })
    }

    /// The clone bases the tracked pods use.
    pub(crate) fn clone_bases_in_use(&self) -> HashSet<String> {
        self.tables()
            .pods
            .values()
            .filter_map(|p| clone_base_of(&VmSpec::from_meta(&p.metadata).image))
            .collect()
    }

    /// Claims the pod (tracked with no VM, its start time kept) if its requests fit `alloc`
    /// next to the other tracked pods that are not terminal; the kubelet's rejection
    /// otherwise, with nothing tracked. No `alloc`: no resource check.
    pub(crate) fn claim_if_fits(
        &self,
        key: &str,
        pod: &Pod,
        alloc: Option<&Allocatable>,
    ) -> Result<(), Rejection> {
        let mut t = self.tables();
        if let Some(alloc) = alloc {
            let wanted = super::admission::requests_of(pod)?;
            let uid = pod.metadata.uid.as_deref();
            let running: Vec<Amounts> = t
                .pods
                .values()
                .filter(|p| p.metadata.uid.as_deref() != uid && !super::admission::terminal(p))
                .map(|p| super::admission::requests_of(p).unwrap_or_default())
                .collect();
            let used = Amounts::total(&running);
            resources::fit(&wanted, &used, running.len() as u128, alloc)?;
        }
        t.pods.insert(key.to_owned(), pod.clone());
        t.start_times
            .entry(key.to_owned())
            .or_insert_with(|| Time(k8s_openapi::jiff::Timestamp::now()));
        Ok(())
    }

    /// Claims `key` for an operation resumed at startup; false when already claimed.
    pub(crate) fn claim_resumed(&self, key: &str) -> bool {
        self.tables().resumed.insert(key.to_owned())
    }

    /// A VM no pod tracks, kept by name (an orphan, or a finished create) for adoption.
    pub(crate) fn index_by_name(&self, vm: &VmRecord) {
        self.tables()
            .vms_by_name
            .insert(vm.name().to_owned(), TrackedVm::new(vm.clone()));
    }

    /// A finished create found running: index it by name, so the pod's CreatePod adopts it.
    pub(crate) fn index_for_adoption(&self, vm: VmRecord) {
        let mut t = self.tables();
        if t.key_for_vm(&vm.id, vm.name()).is_some() {
            return;
        }
        info!(vm = %vm.name(), id = %vm.id, "stale create finished running; indexed for adoption");
        t.vms_by_name
            .insert(vm.name().to_owned(), TrackedVm::new(vm));
    }
}
