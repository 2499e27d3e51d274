//! The CocoonSet controller: keeps each set's main agent, sub-agents and toolboxes in place
//! as placeholder pods, repairs and scales them, reports status, and tears the set down.
//!
//! Observe → decide → act. [`pods`] and [`plan`] hold the pure rules of `cocoonset.md`
//! (factories, drift, classification, triage, create protocol, status, teardown); this file is
//! the shell that walks the loop's steps 1–14 and applies their decisions. Steps 6 (suspend),
//! 9 (release wake) and 10 (unsuspend/reclaim) are in `flows.rs` over the pure rules of
//! [`suspend`]; step 8 (migration) is in `flows.rs` over the pure rules of [`migrate`].

mod executor;
mod flows;
pub mod migrate;
#[cfg(test)]
mod migrate_tests;
pub mod plan;
pub mod pods;
pub mod quantity;
pub mod steps;
pub mod suspend;
#[cfg(test)]
mod suspend_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, ReclaimRecord, annotations as ann, annotations_merge_patch,
    diff_annotations, labels, oci, tags,
};
use cocoon_api::crd::hibernation::{CocoonHibernation, HibernationPhase};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetStatus, ToolboxSpec};
use cocoon_api::naming::{self, Role};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use self::plan::{CreateFacts, CreatePlan, TagRead, Timing, Triage};
use self::pods::Classified;
use self::steps::{Created, Next, StepPlan};
use crate::metrics::{ControllerLabel, ErrorLabels, Metrics, SetLabels};
use crate::registry::{RegistryError, TagRegistry};
use crate::shell;

const CONTROLLER: &str = "cocoonset";
/// Pod writes of one step that go out together, at most this many at once (the spec's cap
/// on concurrent pod creates).
const POD_WRITES_AT_ONCE: usize = 8;
/// Registry calls of one step over every pod of a set (the suspend gate's probes, reclaim's
/// tag deletes) in flight at once: the same cap.
const REGISTRY_CALLS_AT_ONCE: usize = POD_WRITES_AT_ONCE;

/// A pass failed; the controller logs it and retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A registry call of `step` failed; `what` names the call (and any others of the step
    /// that failed with it), `source` is the first failure.
    #[error("{step}: {what}")]
    Registry {
        step: &'static str,
        what: String,
        #[source]
        source: RegistryError,
    },
    #[error("object has no {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Invalid(String),
    /// Step 8's durable `Migrating` marker could not be written.
    #[error("migrate: patch migrating status: {0}")]
    MigratingStatus(kube::Error),
    /// The lease is no longer held: the write was skipped and the pass ends (no retry).
    #[error(transparent)]
    LostLeadership(#[from] crate::leader::LostLeadership),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) | Error::MigratingStatus(_) => "kube",
            Error::Registry { .. } => "registry",
            Error::Missing(_) | Error::Invalid(_) => "invalid",
            Error::LostLeadership(_) => "leadership",
        }
    }

    /// A registry call `what` of `step` failed.
    fn registry(step: &'static str, what: impl Into<String>, source: RegistryError) -> Self {
        Error::Registry {
            step,
            what: what.into(),
            source,
        }
    }

    /// The failed calls of a step that tries them all (`what`, error), as one error: the first
    /// is the source, the others are named. `Ok` when none failed.
    fn registry_all(
        step: &'static str,
        failures: Vec<(String, RegistryError)>,
    ) -> Result<(), Error> {
        let mut failures = failures.into_iter();
        let Some((what, source)) = failures.next() else {
            return Ok(());
        };
        let rest: Vec<String> = failures.map(|(w, e)| format!("{w}: {e}")).collect();
        let what = if rest.is_empty() {
            what
        } else {
            format!("{what} (and also {})", rest.join("; "))
        };
        Err(Error::registry(step, what, source))
    }

    /// The error with its sources, for the log line.
    fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        out
    }
}

/// Write and registry counters, for the settled-pass test and the benchmark.
#[derive(Debug, Default)]
pub struct Stats {
    /// Passes run (after the cache wait).
    pub passes: AtomicU64,
    /// Pod creates, deletes and patches, CocoonSet metadata and status patches.
    pub writes: AtomicU64,
    /// Reads that bypass the cache (the CocoonHibernation list, collision GETs).
    pub reads: AtomicU64,
    /// Registry calls.
    pub registry_calls: AtomicU64,
    /// Time spent in passes, summed over the concurrent workers (microseconds).
    pub busy_micros: AtomicU64,
    /// Passes ended because the lease was lost before one of their writes.
    pub lost_leadership: AtomicU64,
}

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub registry: Arc<dyn TagRegistry>,
    pub timing: Timing,
    pub stats: Stats,
    retries: shell::RetryBackoff,
    /// Only the Lease holder reconciles; the others keep their caches warm.
    leadership: crate::leader::Leadership,
    /// Per set (by UID): the resourceVersions this controller saw or produced up to its last
    /// status write, that write's own included, and the status it wrote; see
    /// [`Walk::status_body`].
    written_status: Mutex<HashMap<String, (Vec<String>, CocoonSetStatus)>>,
    /// Per set (by UID): its metric labels, so its series go when the set does.
    tracked: Mutex<HashMap<String, SetLabels>>,
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
            stats: Stats::default(),
            retries: shell::RetryBackoff::default(),
            leadership: crate::leader::Leadership::always(),
            written_status: Mutex::default(),
            tracked: Mutex::default(),
        }
    }

    /// The write gate of every API write: checked right before the request goes out, and
    /// the write counted; `site` (the caller's line) makes a stray write easy to find in a
    /// debug log. A refused write ends the pass ([`Error::LostLeadership`]).
    fn write(&self, site: u32) -> Result<(), Error> {
        self.leadership.may_write("cocoonset API write")?;
        debug!(site, "cocoonset write");
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The write gate of a registry write (a tag delete).
    fn registry_write(&self) -> Result<(), Error> {
        Ok(self.leadership.may_write("cocoonset registry tag delete")?)
    }

    /// Whether the per-set memory holds anything about the set with this UID (tests).
    pub fn remembers(&self, uid: &str) -> bool {
        let written = self
            .written_status
            .lock()
            .is_ok_and(|m| m.contains_key(uid));
        let tracked = self.tracked.lock().is_ok_and(|m| m.contains_key(uid));
        written || tracked
    }

    fn track(&self, cs: &CocoonSet) {
        if let (Some(uid), Some(ns), Ok(mut m)) = (cs.uid(), cs.namespace(), self.tracked.lock()) {
            m.entry(uid).or_insert_with(|| SetLabels {
                namespace: ns,
                cocoonset: cs.name_any(),
            });
        }
    }

    /// Drops what this controller remembers about a deleted set: its last written status,
    /// its retry backoff and its metric series.
    fn forget_set(&self, cs: &CocoonSet) {
        let key = shell::object_key(cs);
        self.retries.succeeded(&key);
        if let Ok(mut m) = self.written_status.lock() {
            m.remove(&key);
        }
        let labels = self.tracked.lock().ok().and_then(|mut m| m.remove(&key));
        let labels = labels.unwrap_or_else(|| SetLabels {
            namespace: cs.namespace().unwrap_or_default(),
            cocoonset: cs.name_any(),
        });
        self.metrics.forget_set(&labels);
    }

    /// After a complete list: forgets the sets that are gone (their deletes may have
    /// happened while the watch was down, and a relist reports no deletes).
    fn forget_missing(&self, live: &Store<CocoonSet>) {
        let present: BTreeSet<String> = live.state().iter().filter_map(|cs| cs.uid()).collect();
        let gone: Vec<(String, SetLabels)> = self
            .tracked
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(uid, _)| !present.contains(*uid))
                    .map(|(u, l)| (u.clone(), l.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (uid, labels) in gone {
            if let Ok(mut m) = self.tracked.lock() {
                m.remove(&uid);
            }
            if let Ok(mut m) = self.written_status.lock() {
                m.remove(&uid);
            }
            self.retries.succeeded(&uid);
            self.metrics.forget_set(&labels);
        }
        if let Ok(mut m) = self.written_status.lock() {
            m.retain(|uid, _| present.contains(uid));
        }
    }

    /// Reconcile only while `leadership` is held (leader election on).
    pub fn with_leadership(mut self, leadership: crate::leader::Leadership) -> Self {
        self.leadership = leadership;
        self
    }
}

/// The caches one run of the controller reads: built by [`run`] before the controller
/// starts, then only read by its passes.
struct Caches {
    pods: Store<Pod>,
    hibernations: Store<CocoonHibernation>,
    /// Set once the pod cache delivered its first complete list. A flag rather than
    /// `Store::wait_until_ready`: waiters parked on that before the list completed were seen
    /// never to wake (three sets of a hundred stuck, each holding a concurrency slot).
    pods_synced: AtomicBool,
    /// Set once the CocoonHibernation cache delivered its first complete list.
    hibernations_synced: AtomicBool,
}

/// What every pass of one run gets: the controller's context and the run's caches.
struct Shared {
    ctx: Arc<Context>,
    caches: Caches,
}

/// Runs the controller until `shutdown` resolves, over every namespace or over one (tests).
/// `readiness` is set once both the CocoonSet and the pod caches have synced.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    readiness: Arc<crate::admin::Readiness>,
) {
    let client = ctx.client.clone();
    let (sets, pods): (Api<CocoonSet>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (set_reader, set_writer) = reflector::store::<CocoonSet>();
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let (hib_reader, hib_writer) = reflector::store::<CocoonHibernation>();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        caches: Caches {
            pods: pod_reader,
            hibernations: hib_reader,
            pods_synced: AtomicBool::new(false),
            hibernations_synced: AtomicBool::new(false),
        },
    });
    // Ready once both caches delivered their first complete list.
    let gate = crate::admin::SyncGate::new(2, readiness);
    let (sets_synced, pods_synced) = (gate.part(), gate.part());
    let pods_flag = shared.clone();
    // Standbys keep their caches warm but run no pass until they lead; then every set once.
    let standby = crate::leader::StandbyFilter::new(ctx.leadership.clone());
    let (sets_standby, pods_standby, lists) = (standby.clone(), standby.clone(), standby.clone());
    let (forget, live) = (ctx.clone(), set_reader.clone());
    let set_events = set_changes(
        watcher(sets, watcher::Config::default().any_semantic())
            .default_backoff()
            .reflect(set_writer)
            .inspect(move |ev| match ev {
                Ok(watcher::Event::InitDone) => {
                    sets_synced();
                    forget.forget_missing(&live);
                    lists.list_complete();
                }
                Ok(watcher::Event::Delete(cs)) => forget.forget_set(cs),
                _ => {}
            }),
    )
    .filter(move |_| futures::future::ready(sets_standby.pass()));
    // Only pods carrying the set label are cached: ownership is then checked per pass.
    let pod_config = watcher::Config::default()
        .labels(labels::COCOONSET_NAME)
        .any_semantic();
    let pod_events = pod_changes(
        watcher(pods, pod_config)
            .default_backoff()
            .reflect(pod_writer)
            .inspect(move |ev| {
                if matches!(ev, Ok(watcher::Event::InitDone)) {
                    pods_flag.caches.pods_synced.store(true, Ordering::SeqCst);
                    pods_synced();
                }
            }),
    )
    .filter(move |_| futures::future::ready(pods_standby.pass()));
    // The CocoonHibernations steps 8 and 10 consult, from a cache like every other read.
    let hibernations: Api<CocoonHibernation> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let hib_flag = shared.clone();
    let hib_cache = watcher(hibernations, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(hib_writer)
        .for_each(move |ev| {
            if matches!(ev, Ok(watcher::Event::InitDone)) {
                hib_flag
                    .caches
                    .hibernations_synced
                    .store(true, Ordering::SeqCst);
            }
            futures::future::ready(())
        });
    let controller = Controller::for_stream(set_events, set_reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .owns_stream(pod_events)
        .reconcile_all_on(standby.reconcile_all())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, shared)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(object = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        });
    // The controller ends at shutdown; the cache's watch would run on, so it is dropped then.
    futures::pin_mut!(controller, hib_cache);
    futures::future::select(controller, hib_cache).await;
}

/// §1 primary watch: creates, deletes, and updates that change the generation or the status
/// (or start the deletion). Annotation-only patches and relists wake nothing.
fn set_changes(
    events: impl Stream<Item = Result<WatchEvent<CocoonSet>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<CocoonSet, watcher::Error>> + Send + 'static {
    shell::changed_only(events, |cs: &CocoonSet| {
        shell::fingerprint((
            cs.metadata.generation,
            serde_json::to_string(&cs.status).unwrap_or_default(),
            cs.metadata.deletion_timestamp.is_some(),
        ))
    })
}

/// §1 owned pods: create, delete, and updates that start the deletion or change the phase,
/// the Ready condition, labels or annotations. Other node-agent status churn is dropped.
fn pod_changes(
    events: impl Stream<Item = Result<WatchEvent<Pod>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    shell::changed_only(events, |pod: &Pod| {
        shell::fingerprint((
            pod.metadata.deletion_timestamp.is_some(),
            pods::pod_phase(pod),
            pods::is_ready(pod),
            pod.labels(),
            pod.annotations(),
        ))
    })
}

fn error_policy(cs: Arc<CocoonSet>, err: &Error, shared: Arc<Shared>) -> Action {
    let ctx = &shared.ctx;
    let delay = ctx.retries.failed(shell::object_key(cs.as_ref()));
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            controller: CONTROLLER.into(),
            kind: err.kind().into(),
        })
        .inc();
    warn!(name = %cs.name_any(), namespace = ?cs.namespace(), error = %err.chain(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(cs: Arc<CocoonSet>, shared: Arc<Shared>) -> Result<Action, Error> {
    let ctx = &shared.ctx;
    if !ctx.leadership.is_leader() {
        // A standby (or a replica that just lost the lease): nothing until it leads, when
        // every set gets a pass.
        return Ok(Action::await_change());
    }
    ctx.track(&cs);
    let started = Instant::now();
    let result = match reconcile_inner(&cs, ctx, &shared.caches).await {
        // The lease went mid-pass: the write was skipped and the pass ends, no retry.
        Err(Error::LostLeadership(_)) => {
            ctx.stats.lost_leadership.fetch_add(1, Ordering::Relaxed);
            Ok(Action::await_change())
        }
        other => other,
    };
    ctx.stats.busy_micros.fetch_add(
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    ctx.metrics
        .reconcile_duration
        .get_or_create(&ControllerLabel {
            controller: CONTROLLER.into(),
        })
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.retries.succeeded(&shell::object_key(cs.as_ref()));
    }
    result
}

/// How a step ends: hand over to the next one, or end the pass.
enum Step {
    Continue,
    Return(Action),
}

impl From<steps::Next> for Step {
    fn from(next: steps::Next) -> Self {
        match next {
            steps::Next::Continue => Step::Continue,
            steps::Next::RequeueAfter(d) => Step::Return(Action::requeue(d)),
            steps::Next::AwaitChange => Step::Return(Action::await_change()),
        }
    }
}

/// Now in whole seconds: the API server stores condition times so, and a finer `now` would
/// make a freshly written status differ from its read-back.
fn status_time() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default()
}

async fn reconcile_inner(cs: &CocoonSet, ctx: &Context, caches: &Caches) -> Result<Action, Error> {
    let synced = caches.pods_synced.load(Ordering::SeqCst)
        && caches.hibernations_synced.load(Ordering::SeqCst);
    if !synced {
        // Look again shortly instead of holding a concurrency slot.
        return Ok(Action::requeue(Duration::from_millis(300)));
    }
    ctx.stats.passes.fetch_add(1, Ordering::Relaxed);
    let ns = cs.namespace().ok_or(Error::Missing("namespace"))?;
    // Step 4's listing (and step 2's, terminating pods included) comes from the cache.
    let owned = steps::classify::owned(cs, caches.pods.state().iter().map(|p| &**p));
    let mut walk = Walk::new(ctx, caches, cs.clone(), ns);

    // Step 2.
    if cs.metadata.deletion_timestamp.is_some() {
        walk.forget_written_status();
        let plan = steps::teardown::plan(&walk.observed(&owned));
        return Ok(walk
            .apply_step(plan)
            .await?
            .unwrap_or(Action::await_change()));
    }
    // Step 3.
    if let Some(done) = walk
        .apply_step(steps::finalizer::plan(&walk.observed(&owned)))
        .await?
    {
        return Ok(done);
    }
    // Step 4.
    walk.classified = steps::classify::plan(&owned);
    // Step 5: planned here, written with the first patch steps 6–10 make to each pod (the
    // hibernate annotation of a suspend, its clear on unsuspend), the rest right after them.
    walk.stamp_generation();
    let transitions = walk.transitions().await;
    let stamped = walk.flush_stamps().await;
    let step = transitions?;
    stamped?;
    if let Step::Return(a) = step {
        return Ok(a);
    }
    // Step 11.
    if let Step::Return(a) = walk.main_agent().await? {
        return Ok(a);
    }
    // Steps 12 and 13.
    walk.sub_agents().await?;
    walk.toolboxes().await?;
    // Step 14.
    let now = status_time();
    let progress = steps::status::Progress {
        changed: walk.changed,
        min_backoff: walk.min_backoff,
        invalid: walk.invalid.clone(),
    };
    let plan = steps::status::plan(&walk.observed(&[]), &progress, now);
    Ok(walk
        .apply_step(plan)
        .await?
        .unwrap_or(Action::await_change()))
}

/// The state of one pass: the in-memory mirror of the set (its annotation writes applied),
/// the step-4 classification, and what the pass has done so far.
struct Walk<'a> {
    ctx: &'a Context,
    caches: &'a Caches,
    cs: CocoonSet,
    ns: String,
    name: String,
    sets: Api<CocoonSet>,
    pod_api: Api<Pod>,
    classified: Classified,
    changed: bool,
    min_backoff: Option<Duration>,
    /// Step 13.1 found the spec invalid: reported by step 14.
    invalid: Option<steps::toolboxes::InvalidSpec>,
    /// Step 5's generation stamps not written yet, by pod name: each rides on the pass's
    /// next patch of that pod, and [`Walk::flush_stamps`] writes what is left after step 10.
    pending_stamps: BTreeMap<String, AnnotationDelta>,
    /// The set's resourceVersions this pass has seen: the cached one it started from, then
    /// the ones its own metadata patches produced.
    versions: Vec<String>,
}

impl<'a> Walk<'a> {
    fn new(ctx: &'a Context, caches: &'a Caches, cs: CocoonSet, ns: String) -> Self {
        let name = cs.name_any();
        let cs_version = cs.resource_version();
        Walk {
            sets: Api::namespaced(ctx.client.clone(), &ns),
            pod_api: Api::namespaced(ctx.client.clone(), &ns),
            ctx,
            caches,
            cs,
            ns,
            name,
            classified: Classified::default(),
            changed: false,
            min_backoff: None,
            invalid: None,
            versions: cs_version.into_iter().collect(),
            pending_stamps: BTreeMap::new(),
        }
    }

    /// Steps 6 to 10, which hand over to step 11 or end the pass.
    async fn transitions(&mut self) -> Result<Step, Error> {
        // Step 6 (part 2).
        if let Step::Return(a) = self.suspend().await? {
            return Ok(Step::Return(a));
        }
        // Step 7.
        if let Step::Return(a) = self.failed_state().await? {
            return Ok(Step::Return(a));
        }
        // Step 8 (part 3).
        if let Step::Return(a) = self.migrate().await? {
            return Ok(Step::Return(a));
        }
        // Step 9 (part 2).
        if let Step::Return(a) = self.release_wake().await? {
            return Ok(Step::Return(a));
        }
        // Step 10 (part 2).
        self.unsuspend_and_reclaim().await
    }

    fn generation(&self) -> i64 {
        self.cs.metadata.generation.unwrap_or(0)
    }

    /// What the next step observes: the set as this walk knows it, `owned` from the cache
    /// and the step-4 classification.
    fn observed<'o>(&'o self, owned: &'o [Pod]) -> steps::Observed<'o> {
        steps::Observed {
            cs: &self.cs,
            ns: &self.ns,
            owned,
            classified: &self.classified,
            timing: &self.ctx.timing,
        }
    }

    /// A deleted set's last written status is no longer needed to skip a write.
    fn forget_written_status(&self) {
        if let (Some(uid), Ok(mut m)) = (self.cs.uid(), self.ctx.written_status.lock()) {
            m.remove(&uid);
        }
    }

    /// Step 5: the stamps of [`steps::stamp::plan`], mirrored into the classification; the
    /// writes go out with the walk's next patch of each pod.
    fn stamp_generation(&mut self) {
        self.pending_stamps = steps::stamp::plan(&self.classified, self.generation());
        for (name, delta) in &self.pending_stamps {
            if let Some(p) = self.classified.all_by_name.get_mut(name) {
                cocoon_api::contract::apply_delta(p.annotations_mut(), delta);
            }
        }
    }

    fn set_labels(&self) -> SetLabels {
        SetLabels {
            namespace: self.ns.clone(),
            cocoonset: self.name.clone(),
        }
    }

    fn note_backoff(&mut self, d: Duration) {
        self.min_backoff = Some(self.min_backoff.map_or(d, |m| m.min(d)));
    }

    async fn event(&self, warning: bool, reason: &str, message: String) {
        if self.ctx.leadership.may_write("cocoonset event").is_err() {
            // The pass's next write ends it.
            return;
        }
        let event = KubeEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            action: cocoon_api::contract::events::event_action(reason, &message),
            note: Some(message),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&event, &self.cs.object_ref(&()))
            .await
        {
            warn!(error = %e, reason, "failed to publish event");
        }
    }

    // ----- writes ------------------------------------------------------------------------

    /// Merge-patches the set's annotations with `delta` (when it changes anything) and
    /// mirrors it into the in-memory copy. The rest of the pass reads the mirror, so this
    /// write alone asks for no follow-up pass (an annotation-only change of the set wakes no
    /// watch, and waiting out `requeue_after_write` for it cost every wake a second).
    async fn patch_set_annotations(&mut self, delta: AnnotationDelta) -> Result<(), Error> {
        let current = self.cs.annotations().clone();
        let delta = diff_annotations(&current, &delta);
        let Some(patch) = annotations_merge_patch(&delta) else {
            return Ok(());
        };
        self.ctx.write(line!())?;
        debug!(name = %self.name, %patch, "patching the set's annotations");
        let patched = self
            .sets
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.versions.extend(patched.resource_version());
        cocoon_api::contract::apply_delta(self.cs.annotations_mut(), &delta);
        Ok(())
    }

    async fn write_status(&mut self, status: CocoonSetStatus) -> Result<(), Error> {
        let Some((body, status)) = self.status_body(status) else {
            return Ok(());
        };
        let version = send_status(self.ctx, &self.sets, &self.name, &body).await?;
        self.status_written(status, version);
        Ok(())
    }

    /// The merge-patch body of `status`, or `None` when the set already carries it, or when
    /// this controller already wrote exactly that status and the cache still shows a version
    /// of the set from before that write: it has not caught up yet, and writing it again
    /// would cost a round trip for nothing. (The write's own watch event brings the next
    /// pass.)
    fn status_body(&self, status: CocoonSetStatus) -> Option<(Value, CocoonSetStatus)> {
        let status = plan::status_patch(&self.cs, status)?;
        let (uid, cached) = (self.cs.uid()?, self.cs.resource_version()?);
        let already = self
            .ctx
            .written_status
            .lock()
            .ok()
            .is_some_and(|m| plan::status_already_written(m.get(&uid), &cached, &status));
        if already {
            debug!(name = %self.name, "status already written; the cache has not caught up");
            return None;
        }
        let mut body = serde_json::to_value(&status).unwrap_or(Value::Null);
        // A merge patch keeps keys it does not name: emptied fields are cleared explicitly.
        if let Value::Object(m) = &mut body {
            for key in [
                "observedGeneration",
                "phase",
                "agents",
                "toolboxes",
                "conditions",
            ] {
                m.entry(key).or_insert(Value::Null);
            }
        }
        debug!(name = %self.name, status = %body, "patching the set's status");
        Some((json!({ "status": body }), status))
    }

    /// Records a status patch that succeeded, in this pass and for the next ones.
    fn status_written(&mut self, status: CocoonSetStatus, version: Option<String>) {
        self.versions.extend(version);
        if let (Some(uid), Ok(mut m)) = (self.cs.uid(), self.ctx.written_status.lock()) {
            let seen = plan::versions_seen(m.remove(&uid).map(|(v, _)| v), &self.versions);
            m.insert(uid, (seen, status.clone()));
        }
        self.cs.status = Some(status);
    }

    fn status_now(&self, phase: Option<CocoonSetPhase>) -> CocoonSetStatus {
        // Whole seconds: the API server stores condition times so, and a finer `now` would
        // make a freshly written status differ from its read-back.
        let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default();
        plan::build_status(&self.cs, &self.classified, phase, now)
    }

    async fn delete_pod(&mut self, name: &str) -> Result<(), Error> {
        self.pending_stamps.remove(name);
        self.ctx.write(line!())?;
        match self.pod_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Patches a pod's annotations, carrying its pending generation stamp along.
    async fn patch_pod_annotations(
        &mut self,
        pod: &str,
        delta: &AnnotationDelta,
    ) -> Result<(), Error> {
        let delta = self.with_stamp(pod, delta);
        patch_pod(self.ctx, &self.pod_api, pod, &delta).await
    }

    /// Patches several pods at once (at most [`POD_WRITES_AT_ONCE`] in flight), each with
    /// its pending generation stamp; the first error is returned once all have finished.
    async fn patch_pods(&mut self, patches: Vec<(String, AnnotationDelta)>) -> Result<(), Error> {
        let patches: Vec<(String, AnnotationDelta)> = patches
            .into_iter()
            .map(|(pod, delta)| {
                let delta = self.with_stamp(&pod, &delta);
                (pod, delta)
            })
            .collect();
        let (ctx, api) = (self.ctx, &self.pod_api);
        // Futures collected first: a `map` closure inside the stream type trips the
        // higher-ranked `Send` check of the controller's future.
        let writes: Vec<_> = patches
            .iter()
            .map(|(pod, delta)| patch_pod(ctx, api, pod, delta))
            .collect();
        let results: Vec<Result<(), Error>> = futures::stream::iter(writes)
            .buffer_unordered(POD_WRITES_AT_ONCE)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// [`Walk::patch_pods`] and a status write at once, for steps where nothing orders the
    /// two: one round trip of the pass instead of two. The status is taken as written only
    /// if its patch succeeded; the first error is returned once both have finished.
    pub(super) async fn patch_pods_and_status(
        &mut self,
        patches: Vec<(String, AnnotationDelta)>,
        status: CocoonSetStatus,
    ) -> Result<(), Error> {
        let Some((body, status)) = self.status_body(status) else {
            return self.patch_pods(patches).await;
        };
        let (ctx, sets, name) = (self.ctx, self.sets.clone(), self.name.clone());
        let (pods, written) = futures::join!(
            self.patch_pods(patches),
            send_status(ctx, &sets, &name, &body)
        );
        let written = written.map(|version| self.status_written(status, version));
        pods.and(written)
    }

    /// `delta` plus the pod's pending generation stamp, which is then no longer pending.
    fn with_stamp(&mut self, pod: &str, delta: &AnnotationDelta) -> AnnotationDelta {
        let mut out = self.pending_stamps.remove(pod).unwrap_or_default();
        out.extend(delta.iter().map(|(k, v)| (k.clone(), v.clone())));
        out
    }

    /// Writes the generation stamps no earlier patch of this pass carried.
    async fn flush_stamps(&mut self) -> Result<(), Error> {
        let pending: Vec<(String, AnnotationDelta)> = std::mem::take(&mut self.pending_stamps)
            .into_iter()
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.patch_pods(pending).await
    }

    /// Stashes the VM names of pods about to be deleted (scale-down, toolbox removal).
    async fn stash<'p>(&mut self, doomed: impl IntoIterator<Item = &'p Pod>) -> Result<(), Error> {
        let names = plan::stash_names(&self.cs, doomed);
        let delta = names.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await
    }

    // Steps 6, 8, 9 and 10 live in `flows.rs`.

    // ----- step 7 ----------------------------------------------------------------------

    async fn failed_state(&mut self) -> Result<Step, Error> {
        let decision = steps::failed_main::plan(&self.observed(&[]));
        let Some(main) = self.classified.main.clone() else {
            return Ok(Step::Continue);
        };
        let plan = match decision {
            steps::failed_main::FailedMain::Proceed(plan) => plan,
            steps::failed_main::FailedMain::ClearThenReport => {
                self.clear_leftover_hibernate(&main).await?;
                steps::failed_main::report(&self.observed(&[]), &main, status_time())
            }
            steps::failed_main::FailedMain::ClearThenRebuild { reason } => {
                self.clear_leftover_hibernate(&main).await?;
                let decision = self.triage_pod(&main, Some(reason)).await?;
                steps::failed_main::after_triage(
                    &self.observed(&[]),
                    &decision,
                    &main,
                    status_time(),
                )
            }
        };
        Ok(Step::from(self.apply(plan).await?.next))
    }

    // ----- §6 triage applied -------------------------------------------------------------

    /// Triage one existing pod ([`steps::triage`]) and apply the decision; returns it.
    async fn triage_pod(&mut self, pod: &Pod, reason: Option<String>) -> Result<Triage, Error> {
        let name = pod.name_any();
        let triaged = steps::triage::plan(&self.observed(&[]), pod, reason, Utc::now());
        match &triaged.decision {
            Triage::DeadLetter { reason } => {
                warn!(namespace = %self.ns, pod = %name, generation = self.generation(), %reason, "rebuild budget spent: dead-lettered until the spec changes");
            }
            Triage::Rebuild { attempt, reason } => {
                info!(namespace = %self.ns, pod = %name, attempt, %reason, "rebuilding");
            }
            _ => {}
        }
        if let Some(d) = triaged.backoff {
            self.note_backoff(d);
        }
        self.apply(StepPlan::then(triaged.writes, Next::Continue))
            .await?;
        self.changed |= triaged.changed;
        Ok(triaged.decision)
    }

    /// For a missing pod: false when its budget is spent at this generation
    /// ([`steps::triage::may_recreate`]).
    async fn may_recreate(&mut self, pod_name: &str) -> Result<bool, Error> {
        match steps::triage::may_recreate(&self.observed(&[]), pod_name) {
            None => Ok(false),
            Some(writes) => {
                self.apply(StepPlan::then(writes, Next::Continue)).await?;
                Ok(true)
            }
        }
    }

    // ----- §7/§8 create protocol ---------------------------------------------------------

    /// The pods a Hibernated or Waking CocoonHibernation names (from the cache).
    fn cr_restorable(&self) -> BTreeSet<String> {
        self.list_hibernations()
            .into_iter()
            .filter(|h| {
                matches!(
                    h.status.as_ref().and_then(|s| s.phase),
                    Some(HibernationPhase::Hibernated | HibernationPhase::Waking)
                )
            })
            .map(|h| h.spec.pod_ref.name)
            .collect()
    }

    /// The create facts of `pod` (its role, VM and restore intent); the image and the tag
    /// are filled in by [`create_through_protocol`].
    fn facts_for(
        &self,
        pod: &Pod,
        role: Role,
        restorable: &BTreeSet<String>,
        unconditional: bool,
    ) -> CreateFacts<'static> {
        steps::create_facts(&self.observed(&[]), pod, role, restorable, unconditional)
    }

    /// Removes VMs from the reclaim record (the image rule and the sub-agent pre-create drop).
    async fn forget_vms(&mut self, vms: &[String]) -> Result<(), Error> {
        if vms.is_empty() {
            return Ok(());
        }
        let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
        for vm in vms {
            record.remove_vm(vm);
        }
        let delta = record.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await
    }

    // ----- step 11 ---------------------------------------------------------------------

    async fn main_agent(&mut self) -> Result<Step, Error> {
        let restorable = if self.classified.main.is_none() {
            self.cr_restorable()
        } else {
            BTreeSet::new()
        };
        let plan = steps::main::plan(&self.observed(&[]), &restorable, Utc::now(), status_time());
        let applied = self.apply(plan).await?;
        let next = steps::main::after_create(applied.next, &applied.created, &self.ctx.timing);
        Ok(Step::from(next))
    }

    // ----- step 12 ---------------------------------------------------------------------

    async fn sub_agents(&mut self) -> Result<(), Error> {
        let Some(survey) = steps::sub_agents::survey(&self.observed(&[])) else {
            return Ok(());
        };
        // One pod at a time: each triage and budget check reads the history the last wrote.
        for (pod, reason) in &survey.existing {
            self.triage_pod(pod, reason.clone()).await?;
        }
        let mut missing = Vec::new();
        for slot in survey.missing {
            if self
                .may_recreate(&naming::pod_name_for_agent(&self.name, slot))
                .await?
            {
                missing.push(slot);
            }
        }
        let restorable = if missing.is_empty() {
            BTreeSet::new()
        } else {
            self.cr_restorable()
        };
        if let Some(create) = steps::sub_agents::creates(&self.observed(&[]), &missing, &restorable)
        {
            let applied = self
                .apply(StepPlan::then(vec![create], Next::Continue))
                .await?;
            self.changed |= applied.created.contains(&Created::Yes);
        }
        let remove = steps::sub_agents::remove(&self.observed(&[]), &survey.extras);
        self.changed |= !remove.is_empty();
        self.apply(StepPlan::then(remove, Next::Continue)).await?;
        Ok(())
    }

    // ----- step 13 ---------------------------------------------------------------------

    async fn toolboxes(&mut self) -> Result<(), Error> {
        if let Err(invalid) = steps::toolboxes::validate(&self.cs.spec.toolboxes) {
            warn!(namespace = %self.ns, name = %self.name, error = %invalid, "invalid spec: waiting for a change");
            self.invalid = Some(invalid);
            return Ok(());
        }
        let (each, leaving) = steps::toolboxes::survey(&self.observed(&[]));
        for toolbox in each {
            match toolbox {
                steps::toolboxes::Toolbox::Collision(message) => {
                    return Err(Error::Invalid(message));
                }
                steps::toolboxes::Toolbox::Existing(pod, reason) => {
                    self.triage_pod(&pod, reason).await?;
                }
                steps::toolboxes::Toolbox::Missing(t, pod_name) => {
                    if !self.may_recreate(&pod_name).await? {
                        continue;
                    }
                    let restorable = self.cr_restorable();
                    let create = steps::toolboxes::create(&self.observed(&[]), &t, &restorable);
                    let applied = self
                        .apply(StepPlan::then(vec![create], Next::Continue))
                        .await?;
                    match applied.created.last() {
                        Some(Created::Yes) => self.changed = true,
                        Some(Created::AlreadyExists) => {
                            self.check_toolbox_collision(&t, &pod_name).await?
                        }
                        None => {}
                    }
                }
            }
        }
        let remove = steps::sub_agents::remove(&self.observed(&[]), &leaving);
        self.changed |= !remove.is_empty();
        self.apply(StepPlan::then(remove, Next::Continue)).await?;
        Ok(())
    }

    /// An AlreadyExists toolbox create is fine only for our own toolbox pod.
    async fn check_toolbox_collision(&self, t: &ToolboxSpec, pod_name: &str) -> Result<(), Error> {
        self.ctx.stats.reads.fetch_add(1, Ordering::Relaxed);
        let live = self.pod_api.get(pod_name).await?;
        let role = live.labels().get(labels::ROLE).cloned().unwrap_or_default();
        if role == Role::Toolbox.as_str() && pods::is_owned(&self.cs, &live) {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "create toolbox {}: name collision with existing pod {}/{pod_name} (role={role})",
            t.name, self.ns
        )))
    }
}

/// One status merge patch; returns the resourceVersion it produced.
async fn send_status(
    ctx: &Context,
    sets: &Api<CocoonSet>,
    name: &str,
    body: &Value,
) -> Result<Option<String>, Error> {
    ctx.write(line!())?;
    let patched = sets
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await?;
    Ok(patched.resource_version())
}

/// One pod annotation merge patch (nothing when the delta is empty).
async fn patch_pod(
    ctx: &Context,
    api: &Api<Pod>,
    pod: &str,
    delta: &AnnotationDelta,
) -> Result<(), Error> {
    let Some(patch) = annotations_merge_patch(delta) else {
        return Ok(());
    };
    ctx.write(line!())?;
    api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// §7 for one pod: read the `:hibernate` manifest (unless skipped), drop the tag when the
/// plan says so, mark for restore, create. Returns the outcome and the VM to forget from the
/// record (applied by the caller once all creates are done).
async fn create_through_protocol(
    ctx: &Context,
    api: &Api<Pod>,
    mut pod: Pod,
    facts: CreateFacts<'static>,
    step: &'static str,
) -> (Result<Created, Error>, Option<String>) {
    let (_, decision) = match prepare_create(ctx, &mut pod, facts, step).await {
        Ok(x) => x,
        Err(e) => return (Err(e), None),
    };
    let forget = decision.forget.then(|| pods::vm_name(&pod).to_string());
    (post_pod(ctx, api, &pod).await, forget)
}

/// §7 steps 1–4: read the tag, drop it under the image rule or the sub-agent pre-create drop
/// (an error fails the pass, nothing is created), and mark the pod for restore. Returns what
/// the read found and the plan, so the wake can tell "no snapshot" from "restore".
async fn prepare_create(
    ctx: &Context,
    pod: &mut Pod,
    facts: CreateFacts<'static>,
    step: &'static str,
) -> Result<(TagRead, CreatePlan), Error> {
    let vm = pods::vm_name(pod).to_string();
    let image = pod
        .annotations()
        .get(ann::IMAGE)
        .cloned()
        .unwrap_or_default();
    let skip_registry = !pods::is_managed(pod) || vm.is_empty();
    let tag = if skip_registry {
        TagRead::Skipped
    } else {
        ctx.stats.registry_calls.fetch_add(1, Ordering::Relaxed);
        match ctx
            .registry
            .manifest_annotations(&vm, tags::HIBERNATE)
            .await
        {
            Ok(None) => TagRead::Absent,
            Ok(Some(a)) => TagRead::Present {
                base_image: a
                    .get(oci::ANNOTATION_BASE_IMAGE)
                    .cloned()
                    .unwrap_or_default(),
            },
            Err(e) => {
                let what = format!("get {vm}:{} manifest", tags::HIBERNATE);
                return Err(Error::registry(step, what, e));
            }
        }
    };
    let decision: CreatePlan = plan::plan_create(&CreateFacts {
        image: &image,
        tag: tag.clone(),
        ..facts
    });
    if decision.drop_tag {
        ctx.registry_write()?;
        ctx.stats.registry_calls.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = ctx.registry.delete_tag(&vm, tags::HIBERNATE).await {
            let what = format!("delete {vm}:{}", tags::HIBERNATE);
            return Err(Error::registry(step, what, e));
        }
        info!(vm = %vm, "dropped a :hibernate tag the new pod could not boot over");
    }
    if decision.restore {
        pods::mark_restore(pod);
    }
    Ok((tag, decision))
}

/// Posts a pod; AlreadyExists (the old pod still terminating, or a racing pass) is reported,
/// not failed.
async fn post_pod(ctx: &Context, api: &Api<Pod>, pod: &Pod) -> Result<Created, Error> {
    ctx.write(line!())?;
    match api.create(&PostParams::default(), pod).await {
        Ok(_) => Ok(Created::Yes),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyExists),
        Err(e) => Err(Error::Kube(e)),
    }
}
