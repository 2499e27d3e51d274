//! The CocoonHibernation controller: watches the CRs and the pods they name, runs the pure
//! rules of [`decide`] and applies their plans (pod patches, status, events, registry tags).

mod cache;
#[cfg(test)]
mod cache_tests;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod pod_index;

use cache::{container_running, pod_for_cache};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cocoon_api::contract::{annotations as ann, finalizers, tags};
use cocoon_api::crd::hibernation::CocoonHibernation;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::store::WriterDropped;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::{WatchStreamExt, watcher::watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, error, info, warn};

use self::decide::{
    Announced, EventPlan, Finish, Observed, PhaseMetric, PodFacts, PodView, Probe, Timing,
};
use self::pod_index::PodIndex;
use crate::controller::{self, has_finalizer};
use crate::metrics::{Metrics, ResultLabel};
use crate::ownership::LegacyNames;
use crate::registry::{RegistryError, TagDelete, TagRegistry};
use crate::vm_lock::Stripes;
use cocoon_api::contract::owner::{self, Actor};

const CONTROLLER: &str = "cocoonhibernation";

/// A pass failed; the controller logs it and retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A registry call of one step of the pass failed (`step` names it; the registry's own
    /// error is the source).
    #[error("registry: {step}")]
    Registry {
        step: String,
        #[source]
        source: RegistryError,
    },
    /// The plan ended in a probe failure this pass did not see (not expected: the plan
    /// ends in an error only after a failed probe).
    #[error("registry: {0}")]
    Probe(String),
    #[error("object has no {0}")]
    Missing(&'static str),
    /// The caches ended (the controller is shutting down).
    #[error("the controller's caches are closed")]
    CacheClosed(#[from] WriterDropped),
    /// The lease is no longer held: the write was skipped and the pass ends (no retry).
    #[error(transparent)]
    LostLeadership(#[from] crate::leader::LostLeadership),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Registry { .. } | Error::Probe(_) => "registry",
            Error::Missing(_) => "invalid",
            Error::CacheClosed(_) => "cache",
            Error::LostLeadership(_) => "leadership",
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub registry: Arc<dyn TagRegistry>,
    pub timing: Timing,
    stripes: Stripes,
    /// CR UID → the last phase exit announced.
    observed: Mutex<HashMap<String, Announced>>,
    /// Per-CR retry backoff after failed passes.
    retries: crate::watch_retry::RetryBackoff,
    /// Only the Lease holder reconciles; the others keep their caches warm.
    leadership: crate::leader::Leadership,
    /// Whether the ownership gate accepts legacy unhashed VM names ([`crate::ownership`]).
    legacy_vm_names: LegacyNames,
    /// CR UID → the VMs whose `:hibernate` was reported as another owner's (once per CR and
    /// VM; forgotten with the CR).
    foreign_reported: Mutex<HashMap<String, std::collections::BTreeSet<String>>>,
}

/// The caches one run of the controller reads: built by [`run`] before the controller
/// starts, fed by its watches, and only read by its passes.
struct Caches {
    /// The CR cache (deletes look for other holders in it).
    crs: Store<CocoonHibernation>,
    /// The pod cache (passes read the named pod from it).
    pods: Store<Pod>,
    /// The CRs by the pod they name, kept from the CR watch.
    pod_index: PodIndex,
}

/// What every pass of one run gets: the controller's context and the run's caches.
struct Shared {
    ctx: Arc<Context>,
    caches: Caches,
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        registry: Arc<dyn TagRegistry>,
        timing: Timing,
    ) -> Self {
        Context {
            client,
            recorder,
            metrics,
            registry,
            timing,
            stripes: Stripes::default(),
            observed: Mutex::default(),
            retries: crate::watch_retry::RetryBackoff::default(),
            leadership: crate::leader::Leadership::always(),
            legacy_vm_names: LegacyNames::default(),
            foreign_reported: Mutex::default(),
        }
    }

    /// Whether the ownership gate accepts the legacy unhashed VM name of a CR's pod (off by
    /// default; see [`crate::ownership`] for the risk).
    pub fn with_legacy_vm_names(mut self, legacy: LegacyNames) -> Self {
        self.legacy_vm_names = legacy;
        self
    }

    /// The ownership gate of `cr`: `vm` is the VM of `(its namespace, spec.podRef.name)`.
    /// Every registry call of this controller asks it first.
    fn owns(&self, cr: &CocoonHibernation, vm: &str) -> bool {
        crate::ownership::hibernation_owns(
            &cr.namespace().unwrap_or_default(),
            &cr.spec.pod_ref.name,
            vm,
            self.legacy_vm_names,
        )
    }

    /// Reconcile only while `leadership` is held (leader election on).
    pub fn with_leadership(mut self, leadership: crate::leader::Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    /// The write gate, checked right before every API and registry write: a refused
    /// write ends the pass ([`Error::LostLeadership`]).
    fn write(&self, what: &str) -> Result<(), Error> {
        Ok(self.leadership.may_write(what)?)
    }

    fn last_announced(&self, uid: &str) -> Option<Announced> {
        self.observed.lock().ok().and_then(|m| m.get(uid).copied())
    }

    fn remember_announced(&self, uid: &str, at: Announced) {
        if let Ok(mut m) = self.observed.lock() {
            m.insert(uid.to_string(), at);
        }
    }

    fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.observed.lock() {
            m.remove(uid);
        }
        if let Ok(mut m) = self.foreign_reported.lock() {
            m.remove(uid);
        }
    }

    /// Deletes `<vm>:hibernate` of `cr`'s pod (a name [`Context::owns`] accepted) only when
    /// the artifact records that pod or no owner ([`cocoon_api::contract::owner`]); one
    /// recording another owner is kept and reported (Warning `ForeignSnapshotIgnored`, once
    /// per CR and VM).
    async fn delete_own_tag(
        &self,
        cr: &CocoonHibernation,
        vm: &str,
    ) -> Result<TagDelete, RegistryError> {
        let ns = cr.namespace().unwrap_or_default();
        let actor = Actor {
            namespace: &ns,
            namespace_uid: None,
            pod: &cr.spec.pod_ref.name,
        };
        let done = self
            .registry
            .delete_owned_tag(vm, tags::HIBERNATE, actor)
            .await?;
        if let TagDelete::Foreign(recorded) = &done {
            let first = self.foreign_reported.lock().is_ok_and(|mut m| {
                m.entry(cr.uid().unwrap_or_default())
                    .or_default()
                    .insert(vm.to_string())
            });
            if first {
                let artifact = format!("{vm}:{}", tags::HIBERNATE);
                let by = format!("{actor} (CocoonHibernation {ns}/{})", cr.name_any());
                warn!(vm, name = %cr.name_any(), owner = %recorded, "the tag records another owner: not deleted");
                let ev = EventPlan {
                    warning: true,
                    reason: owner::FOREIGN_SNAPSHOT_IGNORED,
                    message: owner::foreign_snapshot_message("delete", &artifact, recorded, &by),
                };
                self.publish(cr, &ev).await;
            }
        }
        Ok(done)
    }

    async fn publish(&self, cr: &CocoonHibernation, ev: &EventPlan) {
        if self.write("cocoonhibernation event").is_err() {
            // The pass's next write ends it.
            return;
        }
        let event = KubeEvent {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.to_string(),
            note: Some(ev.message.clone()),
            action: cocoon_api::contract::events::event_action(ev.reason, &ev.message),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &cr.object_ref(&())).await {
            warn!(error = %e, reason = ev.reason, "failed to publish event");
        }
    }
}

/// Runs the controller until `shutdown` resolves: over every namespace, or over one
/// (`namespace`), which is how tests keep their controllers apart on a shared cluster.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    readiness: Arc<crate::admin::Readiness>,
) {
    let (cr_reader, cr_writer) = reflector::store::<CocoonHibernation>();
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        caches: Caches {
            crs: cr_reader,
            pods: pod_reader,
            pod_index: PodIndex::default(),
        },
    });
    ctx.metrics
        .init_controller(CONTROLLER, &["kube", "registry", "invalid", "cache"]);
    ctx.metrics.count_phases(
        cocoon_api::contract::metrics::operator::KIND_COCOONHIBERNATION,
        shared.caches.crs.clone(),
        |cr| cr.status.as_ref()?.phase.map(|p| p.as_str()),
    );
    let client = ctx.client.clone();
    let (crs, pods): (Api<CocoonHibernation>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    // Ready once both caches hold a complete list.
    let gate = crate::admin::SyncGate::new(2, readiness);
    let (crs_synced, pods_synced) = (gate.part(), gate.part());
    // Standbys keep their caches warm but run no pass until they lead; then every CR once.
    let standby = crate::leader::StandbyFilter::new(ctx.leadership.clone());
    let (cr_standby, pod_standby, lists) = (standby.clone(), standby.clone(), standby.clone());
    let index = shared.clone();
    let cr_events = watcher(crs, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(controller::slim)
        .reflect(cr_writer)
        .inspect(move |ev| {
            if let Ok(ev) = ev {
                index.caches.pod_index.apply(ev);
            }
            if matches!(ev, Ok(WatchEvent::InitDone)) {
                crs_synced();
                lists.list_complete();
            }
        })
        .applied_objects()
        .filter(move |_| futures::future::ready(cr_standby.pass()));
    let controller = Controller::for_stream(cr_events, shared.caches.crs.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency));
    let pod_events = watcher(pods, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(pod_for_cache)
        .reflect(pod_writer)
        .inspect(move |ev| {
            if matches!(ev, Ok(WatchEvent::InitDone)) {
                pods_synced();
            }
        });
    let pod_changes =
        annotation_changes(pod_events).filter(move |_| futures::future::ready(pod_standby.pass()));
    let index = shared.clone();
    controller
        .watches_stream(pod_changes, move |pod| {
            crs_for_pod(&index.caches.pod_index, &pod)
        })
        .reconcile_all_on(standby.reconcile_all())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, shared)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(object = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

/// The CocoonHibernations in the pod's namespace whose `spec.podRef.name` is the pod.
fn crs_for_pod(index: &PodIndex, pod: &Pod) -> Vec<ObjectRef<CocoonHibernation>> {
    index.crs_for(&pod.namespace().unwrap_or_default(), &pod.name_any())
}

/// Passes pod creates and deletes, and updates only when the annotations changed (the
/// lifecycle triple, the hibernate key, the VM id), so status churn wakes nothing.
fn annotation_changes(
    events: impl Stream<Item = Result<WatchEvent<Pod>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    crate::watch_retry::changed_only(events, |pod: &Pod| {
        crate::watch_retry::fingerprint(pod.annotations())
    })
}

fn error_policy(cr: Arc<CocoonHibernation>, err: &Error, shared: Arc<Shared>) -> Action {
    let ctx = &shared.ctx;
    let delay = ctx
        .retries
        .failed(crate::watch_retry::object_key(cr.as_ref()));
    controller::count_error(CONTROLLER, &ctx.metrics, err.kind());
    warn!(name = %cr.name_any(), namespace = ?cr.namespace(), error = %controller::chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(cr: Arc<CocoonHibernation>, shared: Arc<Shared>) -> Result<Action, Error> {
    let (ctx, caches) = (&shared.ctx, &shared.caches);
    if !ctx.leadership.is_leader() {
        // A standby (or a replica that just lost the lease): nothing until it leads, when
        // every CR gets a pass.
        return Ok(Action::await_change());
    }
    let result = match controller::pass(
        CONTROLLER,
        &ctx.metrics,
        cr.as_ref(),
        reconcile_inner(&cr, ctx, caches),
    )
    .await
    {
        // The lease went mid-pass: the write was skipped and the pass ends, no retry.
        Err(Error::LostLeadership(_)) => Ok(Action::await_change()),
        other => other,
    };
    if result.is_ok() {
        ctx.retries
            .succeeded(&crate::watch_retry::object_key(cr.as_ref()));
    }
    result
}

async fn reconcile_inner(
    cr: &CocoonHibernation,
    ctx: &Context,
    caches: &Caches,
) -> Result<Action, Error> {
    let ns = cr.namespace().ok_or(Error::Missing("namespace"))?;
    let name = cr.name_any();
    let crs: Api<CocoonHibernation> = Api::namespaced(ctx.client.clone(), &ns);
    if cr.metadata.deletion_timestamp.is_some() {
        return delete(cr, ctx, caches, &crs).await;
    }
    let has_finalizer = has_finalizer(cr, finalizers::COCOONHIBERNATION);
    let uid = cr.uid().unwrap_or_default();

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = if has_finalizer && !cr.spec.pod_ref.name.is_empty() {
        // From the cache, once it holds a complete list (a pass before that would take a
        // pod not listed yet for a missing one).
        caches.pods.wait_until_ready().await?;
        caches
            .pods
            .get(&ObjectRef::new(&cr.spec.pod_ref.name).within(&ns))
    } else {
        None
    };
    let view = match &pod {
        None => PodView::Missing,
        Some(p) => {
            let mut facts = PodFacts::from_pod(p.annotations(), container_running(p));
            facts.foreign_vm = !facts.vm_name.is_empty() && !ctx.owns(cr, &facts.vm_name);
            PodView::Present(facts)
        }
    };
    // The stripe of the VM is held for the rest of the pass, registry calls included.
    let _guard = match &view {
        PodView::Present(f) if !f.vm_name.is_empty() => Some(ctx.stripes.lock(&f.vm_name).await),
        _ => None,
    };
    // A failed probe's error, returned as the pass's error if the plan ends in it.
    let mut probe_error = None;
    let probe = match decide::probe_needed(cr, &view) {
        None => Probe::NotAsked,
        Some(vm) => match ctx.registry.has_manifest(&vm, tags::HIBERNATE).await {
            Ok(true) => Probe::Present,
            Ok(false) => Probe::Absent,
            Err(e) => {
                let failed = Probe::Failed(format!("probe {vm}:{}: {e}", tags::HIBERNATE));
                probe_error = Some((vm, e));
                failed
            }
        },
    };
    let plan = decide::plan_pass(
        &Observed {
            cr,
            pod: view,
            probe,
            last_announced: ctx.last_announced(&uid),
            now: Timestamp::now(),
        },
        &ctx.timing,
        has_finalizer,
    );

    if plan.add_finalizer {
        let patch = controller::add_finalizer_patch(cr, finalizers::COCOONHIBERNATION);
        ctx.write("cocoonhibernation finalizer add")?;
        crs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if let Some(ev) = &plan.retry_event {
        ctx.publish(cr, ev).await;
    }
    if let Some(ev) = &plan.foreign {
        warn!(namespace = %ns, name = %name, message = %ev.message, "the pod names a VM that is not its own: no registry call");
        ctx.publish(cr, ev).await;
    }
    if let Some(set) = plan.set_hibernate {
        let value = if set {
            json!("true")
        } else {
            serde_json::Value::Null
        };
        let patch = json!({"metadata": {"annotations": {ann::HIBERNATE: value}}});
        ctx.write("pod hibernate annotation")?;
        pods.patch(
            &cr.spec.pod_ref.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    if let Some(a) = &plan.announce {
        ctx.publish(cr, &a.event).await;
        if let Some((which, result, seconds)) = a.metric {
            let family = match which {
                PhaseMetric::Hibernate => &ctx.metrics.hibernate_phase_duration,
                PhaseMetric::Wake => &ctx.metrics.wake_phase_duration,
            };
            family
                .get_or_create(&ResultLabel {
                    result: result.to_string(),
                })
                .observe(seconds);
        }
        ctx.remember_announced(&uid, a.announced);
    }
    if let Some(status) = &plan.status {
        let patch = json!({"status": status});
        ctx.write("cocoonhibernation status")?;
        crs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if let Some(vm) = &plan.drop_tag
        && !drop_woken_tag(ctx, cr, &pods, &cr.spec.pod_ref.name, vm).await?
    {
        return Ok(Action::requeue(ctx.timing.requeue));
    }
    match plan.finish {
        Finish::Done => Ok(Action::await_change()),
        Finish::Requeue(d) => Ok(Action::requeue(d)),
        Finish::Error(e) => Err(match probe_error {
            Some((vm, source)) => Error::Registry {
                step: format!("probe {vm}:{}", tags::HIBERNATE),
                source,
            },
            // The plan ends in an error only after a failed probe.
            None => Error::Probe(e),
        }),
    }
}

/// §5.3's "delete `:hibernate` if present" once the woken VM runs, in an order that cannot
/// lose a snapshot: the tag first, then the pod read again. A tag that exists was pushed
/// after the node agent wrote `hibernating`, so the pod read after it shows whether the VM
/// that runs is one woken from the snapshot or the one it was taken from, whose id the node
/// has not cleared yet. Returns false (tag kept, nothing deleted) in the second case. That
/// read is a GET, not the cache: the cache may not have seen the node's latest write yet.
async fn drop_woken_tag(
    ctx: &Context,
    cr: &CocoonHibernation,
    pods: &Api<Pod>,
    pod_name: &str,
    vm: &str,
) -> Result<bool, Error> {
    if !ctx.owns(cr, vm) {
        // The plan never drops a foreign name; the gate is the backstop.
        return Ok(true);
    }
    let registry = |source: RegistryError| Error::Registry {
        step: format!("delete {vm}:{}", tags::HIBERNATE),
        source,
    };
    if !ctx
        .registry
        .has_manifest(vm, tags::HIBERNATE)
        .await
        .map_err(registry)?
    {
        return Ok(true);
    }
    let woken = pods.get_opt(pod_name).await?.is_some_and(|p| {
        let facts = PodFacts::from_pod(p.annotations(), container_running(&p));
        facts.vm_live && facts.vm_name == vm
    });
    if !woken {
        info!(vm = %vm, pod = %pod_name, "the VM the snapshot came from still runs; :hibernate kept until the woken VM does");
        return Ok(false);
    }
    ctx.write("registry tag delete")?;
    ctx.delete_own_tag(cr, vm).await.map_err(registry)?;
    Ok(true)
}

/// Deletion (`hibernation.md` §6): GC the tag unless another live CR still holds the VM or
/// the pod, then drop the finalizer. Registry failures are logged and never block. The
/// other holders are looked for in the CR cache.
async fn delete(
    cr: &CocoonHibernation,
    ctx: &Context,
    caches: &Caches,
    crs: &Api<CocoonHibernation>,
) -> Result<Action, Error> {
    if !has_finalizer(cr, finalizers::COCOONHIBERNATION) {
        return Ok(Action::await_change());
    }
    let vm = cr
        .status
        .as_ref()
        .map(|s| s.vm_name.clone())
        .unwrap_or_default();
    if !vm.is_empty() {
        let _guard = ctx.stripes.lock(&vm).await;
        caches.crs.wait_until_ready().await?;
        let others: Vec<CocoonHibernation> = caches
            .crs
            .state()
            .iter()
            .filter(|o| o.namespace() == cr.namespace())
            .map(|o| o.as_ref().clone())
            .collect();
        if !ctx.owns(cr, &vm) {
            // status.vmName is not the VM of this CR's pod (written by another operator, or
            // the podRef changed since): reported, never deleted.
            let ev = EventPlan {
                warning: true,
                reason: cocoon_api::contract::events::operator::FOREIGN_VM_NAME_IGNORED,
                message: cocoon_api::contract::events::foreign_vm_name_message(
                    "status.vmName",
                    &vm,
                    &format!(
                        "pod {}/{}",
                        cr.namespace().unwrap_or_default(),
                        cr.spec.pod_ref.name
                    ),
                ),
            };
            warn!(vm = %vm, name = %cr.name_any(), "status.vmName is not the VM of this CR's pod; its tag is left alone");
            ctx.publish(cr, &ev).await;
        } else if decide::another_holder(cr, &others) {
            info!(vm = %vm, name = %cr.name_any(), "another CocoonHibernation still tracks this VM; keeping its :hibernate tag");
        } else {
            ctx.write("registry tag delete")?;
            if let Err(e) = ctx.delete_own_tag(cr, &vm).await {
                error!(vm = %vm, error = %e, "could not delete the :hibernate tag of a deleted CocoonHibernation; teardown GC may reclaim it");
            }
        }
    }
    ctx.forget(&cr.uid().unwrap_or_default());
    let patch = controller::remove_finalizer_patch(cr, finalizers::COCOONHIBERNATION);
    ctx.write("cocoonhibernation finalizer removal")?;
    match crs
        .patch(
            &cr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
