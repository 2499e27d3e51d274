//! The CocoonCheckpoint controller (issue 38), up to the hand-off to the node agent: it adds
//! its finalizer, validates the source, records the derived artifact in the status and puts
//! the request on the source pod ([`decide`] holds the rules); on delete it removes the
//! artifact (owner-checked) and then its finalizer. The node agent's side (`Saving`,
//! `Pushing`, `Ready`) is described in docs/checkpoints.md.
//!
//! Leader-only like the CocoonHibernation controller: a standby keeps its watch and runs no
//! pass; every write passes the leadership gate.

pub mod decide;
#[cfg(test)]
mod decide_tests;

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::checkpoint::{
    self as ckpt, CheckpointRequest, FINALIZER, REQUEST_ANNOTATION,
};
use cocoon_api::contract::{annotations as ann, owner};
use cocoon_api::crd::checkpoint::{CocoonCheckpoint, Source};
use cocoon_api::crd::set::CocoonSet;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::store::WriterDropped;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use self::decide::{EventPlan, Observed, PodFacts, RequestChange, SourceView};
use crate::controller::{self, has_finalizer};
use crate::metrics::Metrics;
use crate::registry::{RegistryError, TagDelete, TagRegistry};

const CONTROLLER: &str = "cocooncheckpoint";
/// How soon a checkpoint waiting for a busy pod looks again.
const BUSY_REQUEUE: Duration = Duration::from_secs(5);

/// A pass failed; the controller logs it and retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Deleting the artifact failed; the finalizer stays until it succeeds.
    #[error("registry: delete {artifact}")]
    Registry {
        artifact: String,
        #[source]
        source: RegistryError,
    },
    #[error("object has no {0}")]
    Missing(&'static str),
    /// The cache ended (the controller is shutting down).
    #[error("the controller's cache is closed")]
    CacheClosed(#[from] WriterDropped),
    /// The lease is no longer held: the write was skipped and the pass ends (no retry).
    #[error(transparent)]
    LostLeadership(#[from] crate::leader::LostLeadership),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Registry { .. } => "registry",
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
    retries: crate::watch_retry::RetryBackoff,
    leadership: crate::leader::Leadership,
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        registry: Arc<dyn TagRegistry>,
    ) -> Self {
        Context {
            client,
            recorder,
            metrics,
            registry,
            retries: crate::watch_retry::RetryBackoff::default(),
            leadership: crate::leader::Leadership::always(),
        }
    }

    /// Reconcile only while `leadership` is held (leader election on).
    pub fn with_leadership(mut self, leadership: crate::leader::Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    fn write(&self, what: &str) -> Result<(), Error> {
        Ok(self.leadership.may_write(what)?)
    }

    async fn publish(&self, cr: &CocoonCheckpoint, ev: &EventPlan) {
        if self.write("cocooncheckpoint event").is_err() {
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

/// What every pass gets: the context and the CR cache (another checkpoint's state is read
/// from it).
struct Shared {
    ctx: Arc<Context>,
    cache: Store<CocoonCheckpoint>,
}

/// Runs the controller until `shutdown` resolves, over every namespace or over one.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    readiness: Arc<crate::admin::Readiness>,
) {
    ctx.metrics
        .init_controller(CONTROLLER, &["kube", "registry", "invalid", "cache"]);
    let crs: Api<CocoonCheckpoint> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let standby = crate::leader::StandbyFilter::new(ctx.leadership.clone());
    let (pass_filter, lists) = (standby.clone(), standby.clone());
    let (reader, writer) = kube::runtime::reflector::store::<CocoonCheckpoint>();
    let gate = crate::admin::SyncGate::new(1, readiness);
    let synced = gate.part();
    use kube::runtime::WatchStreamExt;
    let events = watcher::watcher(crs, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(controller::slim)
        .reflect(writer)
        .inspect(move |ev| {
            if matches!(ev, Ok(watcher::Event::InitDone)) {
                synced();
                lists.list_complete();
            }
        })
        .applied_objects()
        .filter(move |_| futures::future::ready(pass_filter.pass()));
    let shared = Arc::new(Shared {
        ctx,
        cache: reader.clone(),
    });
    Controller::for_stream(events, reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
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

fn error_policy(cr: Arc<CocoonCheckpoint>, err: &Error, shared: Arc<Shared>) -> Action {
    let ctx = &shared.ctx;
    let delay = ctx
        .retries
        .failed(crate::watch_retry::object_key(cr.as_ref()));
    controller::count_error(CONTROLLER, &ctx.metrics, err.kind());
    warn!(name = %cr.name_any(), namespace = ?cr.namespace(), error = %controller::chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(cr: Arc<CocoonCheckpoint>, shared: Arc<Shared>) -> Result<Action, Error> {
    let ctx = &shared.ctx;
    if !ctx.leadership.is_leader() {
        return Ok(Action::await_change());
    }
    let result =
        match controller::pass(CONTROLLER, &ctx.metrics, cr.as_ref(), pass(&cr, &shared)).await {
            Err(Error::LostLeadership(_)) => Ok(Action::await_change()),
            other => other,
        };
    if result.is_ok() {
        ctx.retries
            .succeeded(&crate::watch_retry::object_key(cr.as_ref()));
    }
    result
}

/// The facts of one pod.
fn pod_facts(pod: &Pod, set_uid: Option<&str>) -> PodFacts {
    let a = pod.annotations();
    PodFacts {
        name: pod.name_any(),
        managed: a.get(ann::MANAGED).is_some_and(|v| v == ann::TRUE),
        running: pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Running"),
        vm_name: a.get(ann::VM_NAME).cloned().unwrap_or_default(),
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        request: a
            .get(REQUEST_ANNOTATION)
            .and_then(|v| CheckpointRequest::parse(v).ok()),
        owned_by_set: set_uid.is_some_and(|uid| {
            pod.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "CocoonSet" && o.uid == uid)
        }),
    }
}

/// Reads the source of `cr` (the pod, or the set and its main pod).
async fn observe_source(
    cr: &CocoonCheckpoint,
    ns: &str,
    client: &Client,
) -> Result<SourceView, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // A CR past validation reads the pod it recorded.
    let recorded = cr
        .status
        .as_ref()
        .map(|s| s.pod_name.clone())
        .filter(|p| !p.is_empty());
    let (pod_name, set_uid) = match (recorded, cr.spec.source.one()) {
        (Some(p), _) => (p, None),
        (None, None) => return Ok(SourceView::Unnamed),
        (None, Some(Source::Pod(p))) => (p.to_owned(), None),
        (None, Some(Source::CocoonSet(set))) => {
            let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
            let Some(cs) = sets.get_opt(set).await? else {
                return Ok(SourceView::SetMissing);
            };
            (
                cocoon_api::naming::pod_name_for_agent(set, 0),
                Some(cs.uid().unwrap_or_default()),
            )
        }
    };
    Ok(match pods.get_opt(&pod_name).await? {
        Some(pod) => SourceView::Pod(pod_facts(&pod, set_uid.as_deref())),
        None if set_uid.is_some() => SourceView::MainMissing,
        None => SourceView::PodMissing,
    })
}

/// Whether another checkpoint's request on the pod is still in flight (its CR is in the
/// cache with that UID, not being deleted, and neither `Ready` nor `Failed`).
fn other_in_flight(
    cr: &CocoonCheckpoint,
    ns: &str,
    source: &SourceView,
    cache: &Store<CocoonCheckpoint>,
) -> bool {
    let SourceView::Pod(p) = source else {
        return false;
    };
    let Some(req) = &p.request else {
        return false;
    };
    if Some(req.uid.as_str()) == cr.metadata.uid.as_deref() {
        return false;
    }
    cache
        .get(&ObjectRef::new(&req.name).within(ns))
        .is_some_and(|other| {
            other.metadata.uid.as_deref() == Some(req.uid.as_str())
                && other.metadata.deletion_timestamp.is_none()
                && !other.phase().is_some_and(|p| p.is_final())
        })
}

async fn pass(cr: &CocoonCheckpoint, shared: &Shared) -> Result<Action, Error> {
    let ctx = &shared.ctx;
    let ns = cr.namespace().ok_or(Error::Missing("namespace"))?;
    let name = cr.name_any();
    let crs: Api<CocoonCheckpoint> = Api::namespaced(ctx.client.clone(), &ns);
    if cr.metadata.deletion_timestamp.is_some() {
        return delete(cr, ctx, &ns, &crs).await;
    }
    let has_finalizer = has_finalizer(cr, FINALIZER);
    let source = if has_finalizer {
        observe_source(cr, &ns, &ctx.client).await?
    } else {
        SourceView::Unnamed
    };
    shared.cache.wait_until_ready().await?;
    let other_request_in_flight = other_in_flight(cr, &ns, &source, &shared.cache);
    let plan = decide::plan_pass(
        &Observed {
            cr,
            source,
            other_request_in_flight,
            now: Timestamp::now(),
        },
        has_finalizer,
    );
    if plan.add_finalizer {
        let patch = controller::add_finalizer_patch(cr, FINALIZER);
        ctx.write("cocooncheckpoint finalizer add")?;
        crs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if let Some(status) = &plan.status {
        ctx.write("cocooncheckpoint status")?;
        crs.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await?;
        info!(namespace = %ns, name = %name, phase = ?status.phase, "checkpoint status written");
    }
    if let Some(ev) = &plan.event {
        if ev.warning {
            warn!(namespace = %ns, name = %name, message = %ev.message, "checkpoint refused");
        }
        ctx.publish(cr, ev).await;
    }
    if let Some(change) = &plan.request {
        write_request(ctx, &ns, change).await?;
    }
    Ok(if plan.requeue {
        Action::requeue(BUSY_REQUEUE)
    } else {
        Action::await_change()
    })
}

/// Writes or clears the request annotation on the source pod. A pod that is gone needs no
/// clearing.
async fn write_request(ctx: &Context, ns: &str, change: &RequestChange) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let (pod, value) = match change {
        RequestChange::Write { pod, request } => (pod, json!(request.to_annotation())),
        RequestChange::Clear { pod } => (pod, serde_json::Value::Null),
    };
    let patch = json!({"metadata": {"annotations": {REQUEST_ANNOTATION: value}}});
    ctx.write("pod checkpoint request")?;
    match pods
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletion: the artifact (the name derived from the CR, owner-checked) first, then the
/// request if the pod still carries this CR's, then the finalizer. A registry failure keeps
/// the finalizer (the CR is the only record of the artifact) and retries.
async fn delete(
    cr: &CocoonCheckpoint,
    ctx: &Context,
    ns: &str,
    crs: &Api<CocoonCheckpoint>,
) -> Result<Action, Error> {
    if !has_finalizer(cr, FINALIZER) {
        return Ok(Action::await_change());
    }
    let name = cr.name_any();
    if let Some(artifact) = decide::artifact_to_delete(cr) {
        let owner_pod = ckpt::owner_pod(&name);
        let actor = ckpt::checkpoint_actor(ns, &owner_pod);
        ctx.write("registry checkpoint delete")?;
        let done = ctx
            .registry
            .delete_owned_tag(&artifact.repository, &artifact.tag, actor)
            .await
            .map_err(|source| Error::Registry {
                artifact: artifact.to_string(),
                source,
            })?;
        match done {
            TagDelete::Deleted => {
                info!(namespace = %ns, name = %name, artifact = %artifact, "checkpoint artifact deleted")
            }
            TagDelete::Absent => {
                debug!(namespace = %ns, name = %name, artifact = %artifact, "no checkpoint artifact to delete")
            }
            TagDelete::Foreign(recorded) => {
                let by = format!("CocoonCheckpoint {ns}/{name}");
                let message = owner::foreign_snapshot_message(
                    "delete",
                    &artifact.to_string(),
                    &recorded,
                    &by,
                );
                warn!(namespace = %ns, name = %name, owner = %recorded, "the checkpoint artifact records another owner: not deleted");
                let ev = EventPlan {
                    warning: true,
                    reason: owner::FOREIGN_SNAPSHOT_IGNORED,
                    message,
                };
                ctx.publish(cr, &ev).await;
            }
        }
    }
    let pod = cr
        .status
        .as_ref()
        .map(|s| s.pod_name.clone())
        .unwrap_or_default();
    if !pod.is_empty() {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        if let Some(p) = pods.get_opt(&pod).await? {
            let facts = pod_facts(&p, None);
            if facts
                .request
                .is_some_and(|r| Some(r.uid.as_str()) == cr.metadata.uid.as_deref())
            {
                write_request(ctx, ns, &RequestChange::Clear { pod }).await?;
            }
        }
    }
    let patch = controller::remove_finalizer_patch(cr, FINALIZER);
    ctx.write("cocooncheckpoint finalizer removal")?;
    match crs
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
