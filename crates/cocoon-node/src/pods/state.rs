//! The in-memory tables of `node.md` §4: tracked pods, VMs by pod and by name, restart times,
//! resumed-op claims and lifecycle intents. Rebuilt from the API and the runtime on restart.
//!
//! Everything sits behind one mutex held only for map operations (never across an await).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use cocoon_api::contract::{AnnotationCodec, VmSpec};
use cocoon_runtime::VmRecord;

use super::intent::Intent;
use super::tenant::{Admitted, Holder, SourceHolder, SourceVm};

/// A tracked VM: the runtime record plus the cached IP (§11.2).
#[derive(Debug, Clone)]
pub struct TrackedVm {
    /// Runtime record (id, name, hypervisor, state, NICs, PID).
    pub record: VmRecord,
    /// Cached IP: the static IP, a lease, or the pre-assigned IP of an unmanaged pod.
    pub ip: String,
    /// Synthetic record of an unmanaged pod (never touched in the runtime).
    pub synthetic: bool,
    /// When this agent saw the VM start.
    pub started: Time,
}

impl TrackedVm {
    /// Wraps a runtime record.
    pub fn new(record: VmRecord) -> Self {
        let ip = record.ip().to_owned();
        TrackedVm {
            record,
            ip,
            synthetic: false,
            started: Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }

    /// VM id.
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// VM name.
    pub fn name(&self) -> &str {
        self.record.name()
    }
}

/// The tables of §4, keyed by `<namespace>/<name>`.
#[derive(Default)]
pub struct Tables {
    /// Tracked pods (latest copy).
    pub pods: HashMap<String, Pod>,
    /// Pod key → VM.
    pub vms_by_pod: HashMap<String, TrackedVm>,
    /// VM name → VM (includes orphans kept for adoption).
    pub vms_by_name: HashMap<String, TrackedVm>,
    /// VM id → time of the last in-place restart.
    pub last_restart: HashMap<String, Instant>,
    /// VM ids with a deferred recheck running.
    pub pending_recheck: HashSet<String>,
    /// Pod keys claimed by a resumed startup operation.
    pub resumed: HashSet<String>,
    /// Lifecycle intents.
    pub intents: HashMap<String, Intent>,
    /// Kept `status.startTime` per pod.
    pub start_times: HashMap<String, Time>,
    /// Pods whose `ready` is published when the probe first succeeds (hint mode, lifted
    /// hibernate failure).
    pub ready_pending: HashSet<String>,
    /// Pod keys restoring via a derived marker (in memory only).
    pub derived_restore: HashSet<String>,
    /// Pod keys an eviction (§10) is deleting: DeletePod leaves them to it, so that the
    /// eviction's `Failed` status is the last word and not DeletePod's `Succeeded`.
    pub evicting: HashSet<String>,
    /// What each tracked pod was admitted as (tenant isolation): set once it passed the
    /// CreatePod check or the startup reconcile's, fixed from then on. Only admitted pods
    /// are holders.
    pub admitted: HashMap<String, Admitted>,
}

impl Tables {
    /// The tracked pod of `key` (the same pod as `pod`, by UID) is being deleted from now
    /// on: the VM event handler, which reads the tracked copy, then leaves the VM to the
    /// delete (a guest the delete stops is never restarted in place). Keeps `pod`'s
    /// `deletionTimestamp`, or now when it has none (the pod already vanished).
    pub fn mark_deleting(&mut self, key: &str, pod: &Pod) {
        let Some(tracked) = self.pods.get_mut(key) else {
            return;
        };
        if tracked.metadata.uid != pod.metadata.uid || tracked.metadata.deletion_timestamp.is_some()
        {
            return;
        }
        tracked.metadata.deletion_timestamp = Some(
            pod.metadata
                .deletion_timestamp
                .clone()
                .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now())),
        );
    }

    /// Tracks `vm` for `key` in both maps (copy-on-write replacement).
    pub fn track_vm(&mut self, key: &str, vm: TrackedVm) {
        self.vms_by_name.insert(vm.name().to_owned(), vm.clone());
        self.vms_by_pod.insert(key.to_owned(), vm);
    }

    /// Drops the VM of `key` from both maps.
    pub fn untrack_vm(&mut self, key: &str) -> Option<TrackedVm> {
        let vm = self.vms_by_pod.remove(key)?;
        if self
            .vms_by_name
            .get(vm.name())
            .is_some_and(|v| v.id() == vm.id())
        {
            self.vms_by_name.remove(vm.name());
        }
        Some(vm)
    }

    /// Forgets a pod: VM tables, intent, start time, markers.
    pub fn forget(&mut self, key: &str) {
        self.untrack_vm(key);
        self.pods.remove(key);
        self.admitted.remove(key);
        self.intents.remove(key);
        self.start_times.remove(key);
        self.ready_pending.remove(key);
        self.derived_restore.remove(key);
    }

    /// Admits the tracked pod `pod` (tenant isolation): fixes its VM name, `managed` and an
    /// unmanaged pod's pre-assigned id ([`Admitted`]).
    pub fn admit(&mut self, key: &str, pod: &Pod) {
        let spec = VmSpec::from_meta(&pod.metadata);
        let pre_id = if spec.managed {
            String::new()
        } else {
            cocoon_api::contract::VmRuntime::from_meta(&pod.metadata).id
        };
        self.admitted.insert(
            key.to_owned(),
            Admitted {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                vm_name: spec.vm_name,
                managed: spec.managed,
                pre_id,
            },
        );
    }

    /// What the pod under `key` was admitted as, for this incarnation (`uid`).
    pub fn admitted_as(&self, key: &str, uid: &str) -> Option<&Admitted> {
        self.admitted.get(key).filter(|a| a.uid == uid)
    }

    /// UID of the tracked pod under `key`.
    pub fn tracked_uid(&self, key: &str) -> Option<&str> {
        self.pods.get(key).and_then(|p| p.metadata.uid.as_deref())
    }

    /// The admitted pods (other than `except_key`) that hold VM name `vm`: by the VM name
    /// they were admitted with (hibernated and unmanaged pods included) or by the VM tracked
    /// for them (tenant isolation, see `tenant`). A pod still being checked holds nothing.
    pub fn holders_of(&self, vm: &str, except_key: Option<&str>) -> Vec<Holder> {
        if vm.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<Holder> = self
            .admitted
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != except_key)
            .filter(|(k, a)| {
                a.vm_name == vm || self.vms_by_pod.get(*k).is_some_and(|v| v.name() == vm)
            })
            .map(|(k, a)| {
                let (ns, name) = k.split_once('/').unwrap_or(("", k));
                Holder {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                    uid: a.uid.clone(),
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// [`Tables::holders_of`] `src` as the fork rule sees them ([`SourceHolder`]): with each
    /// one's admitted `managed` and its tracked VM record, synthetic or not.
    pub fn fork_holders_of(&self, src: &str, except_key: Option<&str>) -> Vec<SourceHolder> {
        self.holders_of(src, except_key)
            .into_iter()
            .map(|holder| {
                let key = format!("{}/{}", holder.namespace, holder.name);
                let managed = self.admitted.get(&key).is_some_and(|a| a.managed);
                let vm = self.vms_by_pod.get(&key).map(|v| SourceVm {
                    id: v.id().to_owned(),
                    name: v.name().to_owned(),
                    synthetic: v.synthetic,
                });
                SourceHolder {
                    holder,
                    managed,
                    vm,
                }
            })
            .collect()
    }

    /// The pod key tracking VM `id` or `name` (a name match needs both names non-empty).
    pub fn key_for_vm(&self, id: &str, name: &str) -> Option<String> {
        self.vms_by_pod
            .iter()
            .find(|(_, v)| {
                (!id.is_empty() && v.id() == id) || (!name.is_empty() && v.name() == name)
            })
            .map(|(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str, vm: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid,
                         "annotations": {"vm.cocoonstack.io/name": vm}},
        }))
        .expect("pod")
    }

    /// Issue 26 item 4: a pod the agent tracks but has not admitted (its CreatePod is still
    /// checking it, or refusing it) holds nothing, even when its annotation names the VM;
    /// once admitted it holds the name it was admitted with; forgotten, nothing again.
    #[test]
    fn only_admitted_pods_hold_a_vm_name() {
        let mut t = Tables::default();
        let victim = "vk-a-main-123abc";
        t.pods
            .insert("b/thief".into(), pod("b", "thief", "u-thief", victim));
        assert!(
            t.holders_of(victim, None).is_empty(),
            "tracked, not admitted"
        );

        let own = pod("a", "main", "u-main", victim);
        t.pods.insert("a/main".into(), own.clone());
        t.admit("a/main", &own);
        let holders = t.holders_of(victim, None);
        assert_eq!(
            holders
                .iter()
                .map(|h| (h.namespace.as_str(), h.name.as_str(), h.uid.as_str()))
                .collect::<Vec<_>>(),
            vec![("a", "main", "u-main")]
        );
        assert!(
            t.holders_of(victim, Some("a/main")).is_empty(),
            "except itself"
        );
        assert!(
            t.holders_of("", None).is_empty(),
            "an empty name is nobody's"
        );

        t.forget("a/main");
        assert!(t.holders_of(victim, None).is_empty(), "forgotten");
    }

    /// Issue 35 item 1: the fork rule sees an unmanaged holder as unmanaged, with its
    /// synthetic record (whose id is the tenant's pre-assigned one), and a managed holder with
    /// its runtime record.
    #[test]
    fn fork_holders_carry_managed_and_the_tracked_record() {
        let mut t = Tables::default();
        let decoy_vm = "vk-a-decoy-111111";
        let mut decoy = pod("a", "decoy", "u-decoy", decoy_vm);
        decoy.metadata.annotations.get_or_insert_default().insert(
            cocoon_api::contract::annotations::VM_ID.into(),
            "vk-b-main-222222".into(),
        );
        t.pods.insert("a/decoy".into(), decoy.clone());
        t.admit("a/decoy", &decoy);
        let mut record = VmRecord {
            id: "vk-b-main-222222".into(),
            ..Default::default()
        };
        record.config.name = decoy_vm.into();
        let mut synthetic = TrackedVm::new(record);
        synthetic.synthetic = true;
        t.track_vm("a/decoy", synthetic);

        let got = t.fork_holders_of(decoy_vm, None);
        assert_eq!(got.len(), 1);
        assert!(!got[0].managed, "admitted unmanaged");
        assert_eq!(
            got[0].vm,
            Some(SourceVm {
                id: "vk-b-main-222222".into(),
                name: decoy_vm.into(),
                synthetic: true,
            })
        );
        assert!(t.fork_holders_of(decoy_vm, Some("a/decoy")).is_empty());

        let mut main = pod("a", "main", "u-main", "vk-a-main-333333");
        main.metadata.annotations.get_or_insert_default().insert(
            cocoon_api::contract::annotations::MANAGED.into(),
            "true".into(),
        );
        t.pods.insert("a/main".into(), main.clone());
        t.admit("a/main", &main);
        let got = t.fork_holders_of("vk-a-main-333333", None);
        assert_eq!(got.len(), 1);
        assert!(got[0].managed && got[0].vm.is_none(), "managed, no VM yet");
    }

    /// Issue 40: once its delete starts, the tracked copy says the pod is going, so the VM
    /// event handler leaves the guest the delete stops alone; another pod of the name is not
    /// touched, and a timestamp already there stays.
    #[test]
    fn a_pod_being_deleted_is_marked_on_its_tracked_copy_only() {
        let mut t = Tables::default();
        let tracked = pod("a", "main", "u-main", "vk-a");
        t.pods.insert("a/main".into(), tracked.clone());
        t.mark_deleting("a/main", &pod("a", "main", "u-other", "vk-a"));
        assert!(
            t.pods["a/main"].metadata.deletion_timestamp.is_none(),
            "other UID"
        );
        let mut deleting = tracked.clone();
        let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        deleting.metadata.deletion_timestamp = Some(at.clone());
        t.mark_deleting("a/main", &deleting);
        assert_eq!(
            t.pods["a/main"].metadata.deletion_timestamp,
            Some(at.clone())
        );
        t.mark_deleting("a/main", &tracked);
        assert_eq!(
            t.pods["a/main"].metadata.deletion_timestamp,
            Some(at),
            "kept"
        );
        t.mark_deleting("a/gone", &tracked);
        assert!(!t.pods.contains_key("a/gone"));
    }
}
