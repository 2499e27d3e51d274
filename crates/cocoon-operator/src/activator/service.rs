//! The leader's controller of the sets' Services and EndpointSlices and of the activator port
//! pool: per set it reads the set, its main pod, its Service and slice, the pool and the fresh
//! activator Leases, asks [`super::plan`] what to write, and writes only that.
//!
//! What it reads is cached where it can be: the operator's Services and slices (by the label
//! `cocoonset.cocoonstack.io/name`; a set with ports still reads its Service by name when the
//! cache has none, to see a foreign one), the pool (as last read or written). Every set is
//! looked at again when the fresh activator addresses change (checked every
//! [`ADDRESS_CHECK`]: Leases expire by time alone) and every [`RESYNC`] (a deleted set frees
//! its pool ports then).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::idle::reasons;
use cocoon_api::contract::labels;
use cocoon_api::crd::set::CocoonSet;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::advertise;
use super::plan::{self, Observed, PortRange, Target, Write};
use crate::controller;
use crate::leader::{Leadership, LostLeadership};
use crate::metrics::Metrics;

const CONTROLLER: &str = "cocoonset-service";
/// How often every set is looked at again.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often the fresh activator addresses are compared with the last ones.
pub const ADDRESS_CHECK: Duration = Duration::from_secs(5);

/// A pass failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    LostLeadership(#[from] LostLeadership),
    #[error("the set has no namespace")]
    NoNamespace,
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::LostLeadership(_) => "leadership",
            Error::NoNamespace => "invalid",
        }
    }
}

/// What the controller needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    leadership: Leadership,
    ports: PortRange,
    /// The operator's namespace (the pool ConfigMap, the activator Leases).
    namespace: String,
    /// The pool ConfigMap as last read or written (`None`: not read yet); pool writes one at
    /// a time.
    pool: tokio::sync::Mutex<Option<Option<ConfigMap>>>,
}

impl Context {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        config: &super::Config,
    ) -> Self {
        Context {
            client,
            recorder,
            metrics,
            leadership: Leadership::always(),
            ports: config.ports,
            namespace: config.namespace.clone(),
            pool: tokio::sync::Mutex::new(None),
        }
    }

    /// Writes only while `leadership` is held.
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    fn write(&self, what: &str) -> Result<(), Error> {
        Ok(self.leadership.may_write(what)?)
    }
}

struct Shared {
    ctx: Arc<Context>,
    sets: Store<CocoonSet>,
    leases: Store<Lease>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

/// Runs the controller over every namespace or one, until `shutdown`.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    ctx.metrics
        .init_controller(CONTROLLER, &["kube", "leadership", "invalid"]);
    let client = ctx.client.clone();
    let (sets_api, pods_api, services_api, slices_api): (
        Api<CocoonSet>,
        Api<Pod>,
        Api<Service>,
        Api<EndpointSlice>,
    ) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let ours = watcher::Config::default().labels(labels::COCOONSET_NAME);
    let (services_reader, services_writer) = reflector::store::<Service>();
    let (slices_reader, slices_writer) = reflector::store::<EndpointSlice>();
    // Our Services and slices: a change to one (a user deleted it) looks at its set.
    let services = watcher::watcher(services_api, ours.clone())
        .default_backoff()
        .modify(controller::slim)
        .reflect(services_writer)
        .touched_objects();
    let slices = watcher::watcher(slices_api, ours.clone())
        .default_backoff()
        .modify(controller::slim)
        .reflect(slices_writer)
        .touched_objects();
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ctx.namespace);
    let (lease_reader, lease_writer) = reflector::store::<Lease>();
    let lease_label = format!("{}={}", advertise::COMPONENT_LABEL, advertise::COMPONENT);
    let leases = watcher::watcher(leases_api, watcher::Config::default().labels(&lease_label))
        .default_backoff()
        .reflect(lease_writer)
        .touched_objects()
        .map(|_| ());
    let (reader, writer) = reflector::store::<CocoonSet>();
    let sets = watcher::watcher(sets_api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(controller::slim)
        .reflect(writer)
        .applied_objects();
    // Everything again when the fresh addresses differ from the last ones, and every RESYNC.
    let addresses = {
        let ticks = futures::stream::select(
            leases,
            futures::stream::unfold((), |()| async {
                tokio::time::sleep(ADDRESS_CHECK).await;
                Some(((), ()))
            }),
        );
        let reader = lease_reader.clone();
        ticks
            .scan(Vec::new(), move |last, ()| {
                let now = advertise::fresh_addresses(
                    reader.state().iter().map(|l| l.as_ref()),
                    chrono::Utc::now(),
                );
                let changed = *last != now;
                *last = now;
                futures::future::ready(Some(changed))
            })
            .filter(|changed| futures::future::ready(*changed))
            .map(|_| ())
            .boxed()
    };
    let resync = futures::stream::unfold((), |()| async {
        tokio::time::sleep(RESYNC).await;
        Some(((), ()))
    });
    let standby = crate::leader::StandbyFilter::new(ctx.leadership.clone());
    let triggers = futures::stream::select(
        futures::stream::select(resync, addresses),
        standby.reconcile_all(),
    );
    let shared = Arc::new(Shared {
        ctx,
        sets: reader.clone(),
        leases: lease_reader,
        services: services_reader,
        slices: slices_reader,
    });
    // A main pod's change (Ready, its VM IP) looks at its set at once.
    let main_pods = watcher::Config::default().labels(labels::COCOONSET_NAME);
    let set_of = |labels: &BTreeMap<String, String>, ns: Option<String>| {
        let set = labels.get(labels::COCOONSET_NAME)?;
        Some(ObjectRef::<CocoonSet>::new(set).within(&ns?))
    };
    Controller::for_stream(sets, reader)
        .watches(pods_api, main_pods, move |pod: Pod| {
            set_of(pod.labels(), pod.namespace())
        })
        .watches_stream(services.boxed(), move |s: Service| {
            set_of(s.labels(), s.namespace())
        })
        .watches_stream(slices.boxed(), move |s: EndpointSlice| {
            set_of(s.labels(), s.namespace())
        })
        .reconcile_all_on(triggers)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, shared)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %e, "service reconcile failed");
            }
        })
        .await;
}

fn error_policy(set: Arc<CocoonSet>, err: &Error, shared: Arc<Shared>) -> Action {
    controller::count_error(CONTROLLER, &shared.ctx.metrics, err.kind());
    warn!(set = %controller::object_name(set.as_ref()), error = %controller::chain(err), "service reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(set: Arc<CocoonSet>, shared: Arc<Shared>) -> Result<Action, Error> {
    let ctx = &shared.ctx;
    if !ctx.leadership.is_leader() {
        return Ok(Action::await_change());
    }
    match controller::pass(CONTROLLER, &ctx.metrics, set.as_ref(), pass(&set, &shared)).await {
        Err(Error::LostLeadership(_)) => Ok(Action::await_change()),
        other => other,
    }
}

/// Every (namespace, set, port) the cached sets want an activator port for.
fn wanted(sets: &Store<CocoonSet>) -> BTreeSet<Target> {
    sets.state()
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .flat_map(|s| {
            let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
            plan::set_ports(s).into_iter().map(move |port| Target {
                namespace: ns.clone(),
                set: name.clone(),
                port,
            })
        })
        .collect()
}

/// Brings the pool ConfigMap in line with the cached sets and returns it: read once, then
/// written (guarded by its resourceVersion) only when the assignment changes; a conflict
/// forgets the cached copy, so the retry reads it again.
async fn sync_pool(shared: &Shared) -> Result<BTreeMap<u16, Target>, Error> {
    let ctx = &shared.ctx;
    let mut cached = ctx.pool.lock().await;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let existing = match cached.as_ref() {
        Some(cm) => cm.clone(),
        None => {
            let cm = api.get_opt(super::POOL_CONFIGMAP).await?;
            *cached = Some(cm.clone());
            cm
        }
    };
    let current = existing
        .as_ref()
        .and_then(|c| c.data.as_ref())
        .map(plan::decode_pool)
        .unwrap_or_default();
    let got = plan::allocate(&current, &wanted(&shared.sets), ctx.ports);
    if !got.unallocated.is_empty() {
        warn!(count = got.unallocated.len(), first = ?got.unallocated.first(), range = ?ctx.ports, "activator port pool exhausted: some set ports have no activator port");
    }
    if got.ports == current {
        return Ok(current);
    }
    let mut cm = existing.unwrap_or_default();
    cm.metadata.name = Some(super::POOL_CONFIGMAP.into());
    cm.metadata.namespace = Some(ctx.namespace.clone());
    cm.metadata.managed_fields = None;
    cm.data = Some(plan::encode_pool(&got.ports));
    ctx.write("activator port pool")?;
    let written = if cm.metadata.resource_version.is_some() {
        api.replace(super::POOL_CONFIGMAP, &PostParams::default(), &cm)
            .await
    } else {
        api.create(&PostParams::default(), &cm).await
    };
    match written {
        Ok(cm) => *cached = Some(Some(cm)),
        Err(e) => {
            *cached = None;
            return Err(e.into());
        }
    }
    info!(ports = got.ports.len(), "activator port pool written");
    Ok(got.ports)
}

/// The object `name` of `ns` from the cache of ours, else (when `read`) from the API server:
/// a foreign one of that name carries no label of ours.
async fn cached_or_read<K>(
    cache: &Store<K>,
    api: &Api<K>,
    ns: &str,
    name: &str,
    read: bool,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(obj) = cache.get(&ObjectRef::new(name).within(ns)) {
        return Ok(Some(obj.as_ref().clone()));
    }
    if !read {
        return Ok(None);
    }
    Ok(api.get_opt(name).await?)
}

async fn pass(set: &CocoonSet, shared: &Shared) -> Result<Action, Error> {
    let ctx = &shared.ctx;
    let ns = set.namespace().ok_or(Error::NoNamespace)?;
    let name = set.name_any();
    let pool = sync_pool(shared).await?;
    let has_ports = !plan::set_ports(set).is_empty();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let service = cached_or_read(&shared.services, &services, &ns, &name, has_ports).await?;
    let slice_name = plan::slice_name(&name);
    let slice = cached_or_read(&shared.slices, &slices, &ns, &slice_name, has_ports).await?;
    if !has_ports && service.is_none() && slice.is_none() {
        return Ok(Action::await_change());
    }
    let main = if has_ports {
        pods.get_opt(&cocoon_api::naming::pod_name_for_agent(&name, 0))
            .await?
    } else {
        None
    };
    let addresses = advertise::fresh_addresses(
        shared.leases.state().iter().map(|l| l.as_ref()),
        chrono::Utc::now(),
    );
    let activator_ports = plan::ports_of(&pool, &ns, &name);
    let plan = plan::plan(&Observed {
        set,
        main: main.as_ref(),
        service: service.as_ref(),
        slice: slice.as_ref(),
        activator_addresses: &addresses,
        activator_ports: &activator_ports,
    });
    if plan.conflict {
        warn!(namespace = %ns, set = %name, "a Service of the set's name is not the set's: left alone");
        publish(
            ctx,
            set,
            reasons::SERVICE_CONFLICT,
            format!("Service {ns}/{name} exists and is not owned by this CocoonSet: the operator leaves it alone and keeps no Service or EndpointSlice for spec.idle.ports"),
        )
        .await;
    }
    apply(ctx, &services, &name, plan.service, "service").await?;
    apply(
        ctx,
        &slices,
        &plan::slice_name(&name),
        plan.slice,
        "endpointslice",
    )
    .await?;
    Ok(Action::await_change())
}

async fn apply<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    write: Write<K>,
    what: &'static str,
) -> Result<(), Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match write {
        Write::Keep => return Ok(()),
        Write::Create(obj) => {
            ctx.write(what)?;
            api.create(&PostParams::default(), &obj).await?;
        }
        Write::Patch(patch) => {
            ctx.write(what)?;
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Write::Delete => {
            ctx.write(what)?;
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    info!(object = what, name, "written");
    Ok(())
}

async fn publish(ctx: &Context, set: &CocoonSet, reason: &str, message: String) {
    if ctx.write("service event").is_err() {
        return;
    }
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: reason.into(),
        action: cocoon_api::contract::events::event_action(reason, &message),
        note: Some(message),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(error = %e, reason, "failed to publish event");
    }
}
