//! Startup reconcile and restart recovery (`node.md` §9): rebuild the tables from the pods
//! bound to this node and `vm list`, reconcile stale `creating` records (§14, see `stale`),
//! apply the orphan policy, and resume owed work.
//!
//! Runs to completion before the node registers and before pod handling starts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::{node as ev, resumed_after_restart_message};
use cocoon_api::contract::{AnnotationCodec, HibernateFlags, Lifecycle, LifecycleState, VmSpec};
use cocoon_runtime::types::{STATE_CREATING, STATE_STOPPED_STALE};
use cocoon_runtime::{RuntimeError, VmRecord};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tracing::{info, warn};

use super::artifacts::Artifacts;
use super::rules::{self, OwedOp};
use super::state::TrackedVm;
use super::store::PodStore;
use super::tenant;
use super::{
    ApiError, Handler, OrphanPolicy, PodError, Result, RuntimeFailure, annotation, pod_key,
};
use crate::metrics::NodeMetrics;

/// What the orphan policy does with one pod-less VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanAction {
    /// Remove it (logged).
    Destroy,
    /// Count, log, and index it by name for adoption.
    AlertAndIndex,
    /// Index it by name silently.
    Index,
}

/// The orphan policy of §9.1 step 7.
pub fn orphan_action(policy: OrphanPolicy) -> OrphanAction {
    match policy {
        OrphanPolicy::Destroy => OrphanAction::Destroy,
        OrphanPolicy::Alert => OrphanAction::AlertAndIndex,
        OrphanPolicy::Keep => OrphanAction::Index,
    }
}

/// Whether a listed VM must be confirmed with `inspect` before the reconcile believes it: a
/// listing may say `running` for a VM whose hypervisor is gone (cocoon v0.3.8's `vm list`
/// does, where `inspect` says `stopped (stale)`). Other states are taken as listed (down).
pub fn needs_liveness_check(listed: &VmRecord) -> bool {
    listed.is_running()
}

/// The record the reconcile indexes for a listed `running` VM, given its `inspect`: the
/// inspected record; `None` when the VM is gone since the listing; the listed record when
/// inspect failed otherwise. Whichever record is kept, `running` with PID 0 is not live and
/// reads `stopped (stale)`.
pub fn confirmed_record(
    listed: VmRecord,
    inspected: std::result::Result<VmRecord, RuntimeError>,
) -> Option<VmRecord> {
    let mut vm = match inspected {
        Ok(fresh) if !fresh.id.is_empty() => fresh,
        Ok(_) => listed,
        Err(e) if e.is_vm_not_found() => return None,
        Err(_) => listed,
    };
    if vm.is_running() && vm.pid == 0 {
        vm.state = STATE_STOPPED_STALE.to_owned();
    }
    Some(vm)
}

/// Counts of a finished reconcile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Pods adopted with a VM.
    pub adopted: usize,
    /// VMs no pod matched.
    pub orphans: usize,
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

impl Handler {
    /// The startup reconcile (§9.1). Either list failing is fatal.
    pub async fn startup_reconcile(self: &Arc<Self>) -> Result<ReconcileReport> {
        let node = self.cfg.node_name.clone();
        let api: Api<Pod> = Api::all(self.api.client().clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let (pods, vms) = tokio::join!(api.list(&lp), self.artifacts.rt().list());
        let pods = pods.map_err(|source| ApiError::List {
            what: format!("pods on {node}"),
            source,
        })?;
        let vms = vms.map_err(|e| RuntimeFailure::during("list local VMs", e))?;
        let vms = self.artifacts.confirm_listed_running(vms).await;
        // A `creating` record belongs to an interrupted create; it is neither adopted nor an
        // orphan, and this agent never removes it. Stale-create reconciliation (§14) asks the
        // runtime to collect it; records that left `creating` meanwhile rejoin the listing.
        let (creating, mut vms): (Vec<VmRecord>, Vec<VmRecord>) =
            vms.into_iter().partition(|v| v.state == STATE_CREATING);
        vms.extend(
            super::stale::StaleCreates::of(self)
                .reconcile_stale_creates(creating)
                .await,
        );
        let by_id: HashMap<&str, &VmRecord> = vms.iter().map(|v| (v.id.as_str(), v)).collect();
        let by_name: HashMap<&str, &VmRecord> = vms.iter().map(|v| (v.name(), v)).collect();
        let mut matched: HashSet<String> = HashSet::new();
        let legacy = self.cfg.tenant.accept_legacy_vm_names;
        let mut adopted = Vec::new();
        let mut without_vm = Vec::new();
        for pod in pods.items.into_iter().filter(|p| !terminal(p)) {
            let key = pod_key(&pod);
            let spec = VmSpec::from_meta(&pod.metadata);
            let hib = HibernateFlags::from_meta(&pod.metadata).hibernate;
            let vm_id = annotation(&pod, ann::VM_ID).unwrap_or("").to_owned();
            let found = if vm_id.is_empty() {
                by_name
                    .get(spec.vm_name.as_str())
                    .filter(|_| !spec.vm_name.is_empty() && spec.managed)
                    .copied()
            } else if spec.managed {
                by_id.get(vm_id.as_str()).copied()
            } else {
                // An unmanaged pod's VM is never a runtime VM (CreatePod refuses an id that
                // resolves to one); it is re-created synthetic by CreatePod.
                None
            };
            // Tenant isolation: only the pod's own VM is adopted (see `tenant`).
            let (ns, name) = (
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default(),
            );
            let found = match found {
                Some(vm) => {
                    let how = if vm_id.is_empty() {
                        tenant::Found::ByName
                    } else {
                        tenant::Found::ById(vm.name())
                    };
                    if tenant::reconcile_may_track(ns, name, &spec.vm_name, how, legacy) {
                        Some(vm)
                    } else {
                        warn!(pod = %key, vm = %vm.name(), id = %vm.id, "not adopting a VM that is not this pod's (tenant isolation); CreatePod decides");
                        None
                    }
                }
                None => None,
            };
            let hib = hib
                && spec.managed
                && (tenant::reconcile_may_track(
                    ns,
                    name,
                    &spec.vm_name,
                    tenant::Found::HibernatedWithoutVm,
                    legacy,
                ) || {
                    warn!(pod = %key, vm = %spec.vm_name, "not tracking a hibernated pod whose VM name is not its own (tenant isolation); CreatePod decides");
                    false
                });
            match found {
                Some(vm) if !matched.contains(&vm.id) => {
                    matched.insert(vm.id.clone());
                    {
                        let mut t = self.store.tables();
                        t.pods.insert(key.clone(), pod.clone());
                        t.admit(&key, &pod);
                    }
                    self.store.seed_intent(&pod);
                    let tv = TrackedVm::new(vm.clone());
                    self.store.track_vm(&key, tv.clone());
                    if vm_id.is_empty() {
                        self.metrics.reconcile_adopt_by_name.inc();
                        self.api.write_runtime(&pod, &tv, 0).await;
                    }
                    adopted.push(key);
                }
                _ if hib => {
                    if !vm_id.is_empty() {
                        // A stale hibernate: the VM is gone, the annotations are not.
                        if let Err(e) = self.api.clear_runtime(&pod).await {
                            warn!(pod = %key, error = %e, "clearing stale runtime annotations failed");
                        }
                    }
                    {
                        let mut t = self.store.tables();
                        t.pods.insert(key.clone(), pod.clone());
                        t.admit(&key, &pod);
                    }
                    self.store.seed_intent(&pod);
                    without_vm.push(key);
                }
                _ if !vm_id.is_empty() && !spec.managed => {
                    // Unmanaged VMs are not in the runtime; CreatePod re-adopts them.
                }
                _ if !vm_id.is_empty() => {
                    warn!(
                        "pod {key} annotates VMID {vm_id} but no such VM exists locally; CreatePod will recreate"
                    );
                }
                _ => {}
            }
        }
        // First probes, bounded parallelism 8 (delays registration by design).
        futures::stream::iter(adopted.clone())
            .for_each_concurrent(8, |k| {
                let me = self.clone();
                async move { me.publisher.start_probe(&k).await }
            })
            .await;
        let mut orphans = 0;
        for vm in vms.iter().filter(|v| !matched.contains(&v.id)) {
            orphans += 1;
            apply_orphan_policy(
                self.cfg.orphan_policy,
                &self.artifacts,
                &self.store,
                &self.metrics,
                vm,
            )
            .await;
        }
        for key in adopted.iter().chain(without_vm.iter()) {
            self.publisher.notify(key).await;
        }
        self.dispatch_owed(&adopted, &without_vm).await;
        self.artifacts.collect_clone_bases(&self.store).await;
        info!(
            "startup reconcile: {} pods adopted, {} orphan VMs",
            adopted.len(),
            orphans
        );
        Ok(ReconcileReport {
            adopted: adopted.len(),
            orphans,
        })
    }

    /// §9.3: decide and start the owed operation of every tracked pod.
    async fn dispatch_owed(self: &Arc<Self>, with_vm: &[String], without_vm: &[String]) {
        for key in with_vm {
            let (Some(pod), Some(vm)) = (self.tracked_pod(key), self.tracked_vm(key)) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let spec = VmSpec::from_meta(&pod.metadata);
            let hib = HibernateFlags::from_meta(&pod.metadata).hibernate && spec.managed;
            let lifecycle = annotation(&pod, ann::LIFECYCLE_STATE).unwrap_or("");
            let marker = annotation(&pod, ann::POST_CLONE_STATE).unwrap_or("");
            let any_static = vm.record.network_configs.iter().any(|n| !n.is_dhcp());
            let op = rules::owed_op(
                hib,
                lifecycle,
                marker,
                rules::post_clone_needed(&spec, any_static),
            );
            if op == OwedOp::None || !claim(&self.store, &self.metrics, key, op.as_str()) {
                continue;
            }
            self.api
                .event(
                    &pod,
                    false,
                    ev::RESUMED_AFTER_RESTART,
                    &resumed_after_restart_message(op.as_str()),
                )
                .await;
            let me = self.clone();
            let key = key.clone();
            self.spawn(async move {
                me.run_owed(&key, pod, spec, vm, op).await;
                me.store.tables().resumed.remove(&key);
                me.publisher.notify(&key).await;
            });
        }
        for key in without_vm {
            let Some(pod) = self.tracked_pod(key) else {
                continue;
            };
            let l = Lifecycle::from_meta(&pod.metadata);
            if l.state != Some(LifecycleState::Hibernating)
                || !claim(&self.store, &self.metrics, key, "finish_hibernate")
            {
                continue;
            }
            let me = self.clone();
            let key = key.clone();
            self.spawn(async move {
                me.finish_hibernate(&key, &pod).await;
                me.store.tables().resumed.remove(&key);
                me.publisher.notify(&key).await;
            });
        }
    }

    async fn run_owed(
        self: &Arc<Self>,
        key: &str,
        pod: Pod,
        spec: VmSpec,
        vm: TrackedVm,
        op: OwedOp,
    ) {
        match op {
            OwedOp::None => {}
            OwedOp::Hibernate => {
                if !vm.record.is_running()
                    && let Err(e) = self.artifacts.rt().start(vm.id()).await
                {
                    let err =
                        PodError::from(RuntimeFailure::during(format!("start vm {}", vm.id()), e));
                    self.api
                        .fail_with(&pod, ev::OP_RECONCILE, ev::RESUME_START_FAILED, &err)
                        .await;
                    return;
                }
                if let Err(e) = self.hibernate(key, &pod, &spec, vm).await {
                    warn!(pod = %key, error = %e, "resumed hibernate failed");
                }
            }
            OwedOp::ReadyWait | OwedOp::PostClone => {
                let me = self.clone();
                let id = vm.id().to_owned();
                me.publisher.ready_after_ip(key, &id, false).await;
            }
        }
    }

    /// An agent killed after Remove and before `hibernated`: confirm the snapshot and finish.
    async fn finish_hibernate(&self, key: &str, pod: &Pod) {
        let vm = VmSpec::from_meta(&pod.metadata).vm_name;
        let evidence = match self.artifacts.owner_of(pod).await {
            Ok(owner) => self.artifacts.hibernate_evidence(&vm, &owner).await,
            Err(e) => Err(e.to_string()),
        };
        match evidence {
            Ok(rules::Evidence::Found { .. }) => {
                self.api
                    .set_lifecycle(pod, LifecycleState::Hibernated, "")
                    .await;
                info!(pod = %key, "finished a hibernate interrupted after the VM was removed");
            }
            Ok(rules::Evidence::None) => {
                let msg =
                    format!("hibernate of {vm} was interrupted and no hibernate snapshot exists");
                self.api
                    .fail_op(pod, ev::RESUME_CLASSIFY_FAILED, ev::OP_RECONCILE, &msg)
                    .await;
            }
            Err(e) => warn!(pod = %key, error = %e, "cannot confirm an interrupted hibernate yet"),
        }
    }
}

/// The orphan policy of §9.1 step 7 for one VM that no pod matched.
pub(crate) async fn apply_orphan_policy(
    policy: OrphanPolicy,
    artifacts: &Artifacts,
    store: &PodStore,
    metrics: &NodeMetrics,
    vm: &VmRecord,
) {
    match orphan_action(policy) {
        OrphanAction::Destroy => {
            warn!(name = %vm.name(), id = %vm.id, "destroying orphan VM");
            if let Err(e) = artifacts.rt().remove(&vm.id).await {
                warn!(id = %vm.id, error = %e, "removing orphan VM failed");
            }
        }
        action => {
            if action == OrphanAction::AlertAndIndex {
                metrics.orphan_vm.inc();
                warn!(
                    "orphan VM detected: name={} id={} state={} ip={} (set VK_ORPHAN_POLICY=destroy to auto-clean)",
                    vm.name(),
                    vm.id,
                    vm.state,
                    vm.ip()
                );
            }
            store.index_by_name(vm);
        }
    }
}

/// Claims `key` for an operation resumed at startup (once per pod), counted.
fn claim(store: &PodStore, metrics: &NodeMetrics, key: &str, op: &str) -> bool {
    if !store.claim_resumed(key) {
        return false;
    }
    warn!(pod = %key, op, "resuming an operation interrupted by a restart");
    metrics.startup_resume(op);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_policy_actions() {
        assert_eq!(orphan_action(OrphanPolicy::Destroy), OrphanAction::Destroy);
        assert_eq!(
            orphan_action(OrphanPolicy::Alert),
            OrphanAction::AlertAndIndex
        );
        assert_eq!(orphan_action(OrphanPolicy::Keep), OrphanAction::Index);
        assert_eq!(
            orphan_action(OrphanPolicy::parse("bogus")),
            OrphanAction::AlertAndIndex
        );
    }

    fn vm(state: &str, pid: i64) -> VmRecord {
        VmRecord {
            id: "TMZ7IBM3A3KJGYMV6K3ZZMS2EZ".into(),
            state: state.into(),
            pid,
            ..VmRecord::default()
        }
    }

    #[test]
    fn only_listed_running_vms_are_confirmed() {
        let cases: &[(&str, bool)] = &[
            ("running", true),
            ("stopped (stale)", false),
            ("stopped", false),
            ("error", false),
            ("created", false),
        ];
        for (state, want) in cases {
            assert_eq!(needs_liveness_check(&vm(state, 0)), *want, "{state}");
        }
    }

    #[test]
    fn a_listed_running_vm_is_live_only_when_inspect_and_pid_agree() {
        let not_found = || Err(RuntimeError::VmNotFound("Error: vm x: VM not found".into()));
        let transient = || Err(RuntimeError::Other("dial: connection refused".into()));
        type Case = (
            VmRecord,
            std::result::Result<VmRecord, RuntimeError>,
            Option<(&'static str, i64)>,
        );
        let cases: Vec<Case> = vec![
            // v0.3.8: listed running with pid 0, inspect says stale.
            (
                vm("running", 0),
                Ok(vm("stopped (stale)", 0)),
                Some(("stopped (stale)", 0)),
            ),
            // Confirmed.
            (
                vm("running", 41),
                Ok(vm("running", 42)),
                Some(("running", 42)),
            ),
            // Inspect says running, but pid 0 is not a live process.
            (
                vm("running", 41),
                Ok(vm("running", 0)),
                Some(("stopped (stale)", 0)),
            ),
            (
                vm("running", 41),
                Ok(vm("stopped", 0)),
                Some(("stopped", 0)),
            ),
            // Gone since the listing.
            (vm("running", 41), not_found(), None),
            // Cannot confirm: the listing stands, but pid 0 is still not live.
            (vm("running", 41), transient(), Some(("running", 41))),
            (vm("running", 0), transient(), Some(("stopped (stale)", 0))),
            // An empty inspect record does not replace the listing.
            (
                vm("running", 41),
                Ok(VmRecord::default()),
                Some(("running", 41)),
            ),
        ];
        for (listed, inspected, want) in cases {
            let what = format!("{listed:?} / {inspected:?}");
            let got = confirmed_record(listed, inspected);
            assert_eq!(
                got.as_ref().map(|v| (v.state.as_str(), v.pid)),
                want,
                "{what}"
            );
        }
    }
}
