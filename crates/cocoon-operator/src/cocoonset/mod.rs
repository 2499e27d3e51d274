//! The CocoonSet controller: keeps each set's main agent, sub-agents and toolboxes in place
//! as placeholder pods, repairs and scales them, reports status, and tears the set down.
//!
//! Where things are:
//! * this file — the shell: the controller's [`Context`], its watches and caches, the
//!   per-pass wrapper (leadership, metrics, retry backoff);
//! * [`steps`] — seed step N in one place, `steps/<name>`: its planner
//!   (`plan(&Observed, ...) -> StepPlan`), its pure rules and their table tests. Teardown (2),
//!   finalizer (3), classify (4), stamp (5), suspend (6), failed_main (7), migrate (8),
//!   release_wake (9), unsuspend (10), main_agent (11), sub_agents (12), toolboxes (13),
//!   status (14); beside them the rules several steps share: `create` (the §7 create
//!   protocol and §8 restore intent) and `triage` (the §6 rebuild budget). A step that needs
//!   a registry probe, a manifest read or a read past the cache asks for it and plans again
//!   on the answer;
//! * `walk` — one pass over one set: the order of the steps and the view every step
//!   observes (`walk/mod.rs`), and the executor that applies a plan's writes in order, each
//!   durable before the next, with the write primitives they are made of, and fetches the
//!   reads a step asks for (`walk/executor/`, one file per kind of write);
//! * [`pods`] — pod construction, drift and classification (§3–§5), and the pod facts the
//!   steps read; [`Timing`] — the loop's intervals and rebuild budget;
//! * [`memory`] — what this controller remembers of its own writes while the caches do not
//!   show them yet, per set, in one [`WriteMemory`].

#[cfg(test)]
mod fixtures;
pub mod memory;
pub mod pods;
#[cfg(test)]
mod pods_tests;
pub mod quantity;
pub mod shared;
pub mod steps;
mod timing;
mod walk;

pub use self::memory::WriteMemory;
pub use self::timing::Timing;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use cocoon_api::contract::labels;
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::CocoonSet;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent, watcher};
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

use crate::controller;
use crate::metrics::{Metrics, SetLabels};
use crate::ownership::LegacyNames;
use crate::registry::{RegistryError, TagRegistry};
use crate::watch_retry;

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
}

/// Pass, write and registry counters for tests and benchmarks. A production controller keeps
/// none: a test or a bench hands them in with [`Context::with_stats`].
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
    /// The counters a test or bench asked for ([`Context::with_stats`]); none in production.
    stats: Option<Arc<Stats>>,
    retries: watch_retry::RetryBackoff,
    /// Only the Lease holder reconciles; the others keep their caches warm.
    leadership: crate::leader::Leadership,
    /// What this controller remembers of its own writes and reports, per set.
    memory: WriteMemory,
    /// Whether the ownership gate accepts legacy unhashed VM names ([`crate::ownership`]).
    legacy_vm_names: LegacyNames,
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
            stats: None,
            retries: watch_retry::RetryBackoff::default(),
            leadership: crate::leader::Leadership::always(),
            memory: WriteMemory::default(),
            legacy_vm_names: LegacyNames::default(),
        }
    }

    /// Whether the ownership gate accepts the legacy unhashed VM names of a set's own pods
    /// (off by default; see [`crate::ownership`] for the risk).
    pub fn with_legacy_vm_names(mut self, legacy: LegacyNames) -> Self {
        self.legacy_vm_names = legacy;
        self
    }

    /// The write gate of every API write: checked right before the request goes out, and
    /// the write counted; `site` (the caller's line) makes a stray write easy to find in a
    /// debug log. A refused write ends the pass ([`Error::LostLeadership`]).
    fn write(&self, site: u32) -> Result<(), Error> {
        self.leadership.may_write("cocoonset API write")?;
        debug!(site, "cocoonset write");
        self.count(|s| &s.writes);
        Ok(())
    }

    /// Counts into `stats` for a test or a bench ([`Stats`]).
    pub fn with_stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// One more of `counter`, when a test or bench keeps [`Stats`].
    fn count(&self, counter: fn(&Stats) -> &AtomicU64) {
        self.count_by(counter, 1);
    }

    fn count_by(&self, counter: fn(&Stats) -> &AtomicU64, n: u64) {
        if let Some(s) = &self.stats {
            counter(s).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The write gate of a registry write (a tag delete).
    fn registry_write(&self) -> Result<(), Error> {
        Ok(self.leadership.may_write("cocoonset registry tag delete")?)
    }

    /// Whether the per-set memory holds anything about the set with this UID (tests).
    pub fn remembers(&self, uid: &str) -> bool {
        self.memory.remembers(uid)
    }

    /// Pods created and not yet seen in the cache, over all sets (tests).
    pub fn expected_creates(&self) -> usize {
        self.memory.expected_creates()
    }

    /// Remembers the metric labels of `cs`, whose series start at zero the first time.
    fn track(&self, cs: &CocoonSet) {
        if let Some(labels) = self.memory.track(cs) {
            self.metrics.init_set(&labels);
        }
    }

    /// Drops what this controller remembers about a deleted set: its memory of its writes,
    /// its retry backoff and its metric series.
    fn forget_set(&self, cs: &CocoonSet) {
        let key = watch_retry::object_key(cs);
        self.retries.succeeded(&key);
        let labels = self.memory.forget(&key).unwrap_or_else(|| SetLabels {
            namespace: cs.namespace().unwrap_or_default(),
            cocoonset: cs.name_any(),
        });
        self.metrics.forget_set(&labels);
    }

    /// After a complete list: forgets the sets that are gone (their deletes may have
    /// happened while the watch was down, and a relist reports no deletes).
    fn forget_missing(&self, live: &Store<CocoonSet>) {
        let present: BTreeSet<String> = live.state().iter().filter_map(|cs| cs.uid()).collect();
        for (uid, labels) in self.memory.forget_all_but(&present) {
            self.retries.succeeded(&uid);
            self.metrics.forget_set(&labels);
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
    /// The CocoonCheckpoints `spec.agent.fromCheckpoint` names (step 11).
    checkpoints: Store<CocoonCheckpoint>,
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
    let (ckpt_reader, ckpt_writer) = reflector::store::<CocoonCheckpoint>();
    ctx.metrics
        .init_controller(CONTROLLER, &["kube", "registry", "invalid"]);
    ctx.metrics.count_phases(
        cocoon_api::contract::metrics::operator::KIND_COCOONSET,
        set_reader.clone(),
        |set| set.status.as_ref()?.phase.map(|p| p.as_str()),
    );
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        caches: Caches {
            pods: pod_reader,
            hibernations: hib_reader,
            checkpoints: ckpt_reader,
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
            .modify(crate::controller::slim)
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
            .modify(crate::controller::slim)
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
        .modify(crate::controller::slim)
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
    // The CocoonCheckpoints sets start from (`spec.agent.fromCheckpoint`): cached for step
    // 11, and a checkpoint's change requeues the sets of its namespace naming it, so a set
    // waiting for one starts as soon as it is Ready.
    let checkpoints: Api<CocoonCheckpoint> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let ckpt_standby = standby.clone();
    let ckpt_events = watcher(checkpoints, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(crate::controller::slim)
        .reflect(ckpt_writer)
        .applied_objects()
        .filter(move |_| futures::future::ready(ckpt_standby.pass()));
    let naming_sets = set_reader.clone();
    let controller = Controller::for_stream(set_events, set_reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .owns_stream(pod_events)
        .watches_stream(ckpt_events, move |ckpt: CocoonCheckpoint| {
            sets_naming_checkpoint(&naming_sets.state(), &ckpt)
        })
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

/// The sets of `ckpt`'s namespace whose `spec.agent.fromCheckpoint` names it.
fn sets_naming_checkpoint(
    sets: &[Arc<CocoonSet>],
    ckpt: &CocoonCheckpoint,
) -> Vec<reflector::ObjectRef<CocoonSet>> {
    let ns = ckpt.namespace();
    let name = ckpt.name_any();
    sets.iter()
        .filter(|cs| cs.namespace() == ns)
        .filter(|cs| cs.spec.agent.from_checkpoint.as_deref() == Some(name.as_str()))
        .map(|cs| reflector::ObjectRef::from_obj(cs.as_ref()))
        .collect()
}

/// §1 primary watch: creates, deletes, and updates that change the generation or the status
/// (or start the deletion). Annotation-only patches and relists wake nothing.
fn set_changes(
    events: impl Stream<Item = Result<WatchEvent<CocoonSet>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<CocoonSet, watcher::Error>> + Send + 'static {
    watch_retry::changed_only(events, |cs: &CocoonSet| {
        watch_retry::fingerprint((
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
    watch_retry::changed_only(events, |pod: &Pod| {
        watch_retry::fingerprint((
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
    let delay = ctx.retries.failed(watch_retry::object_key(cs.as_ref()));
    controller::count_error(CONTROLLER, &ctx.metrics, err.kind());
    warn!(name = %cs.name_any(), namespace = ?cs.namespace(), error = %controller::chain(err), retry_in = ?delay, "reconcile failed");
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
    let walked = walk::walk(&cs, ctx, &shared.caches);
    let result = match controller::pass(CONTROLLER, &ctx.metrics, cs.as_ref(), walked).await {
        // The lease went mid-pass: the write was skipped and the pass ends, no retry.
        Err(Error::LostLeadership(_)) => {
            ctx.count(|s| &s.lost_leadership);
            Ok(Action::await_change())
        }
        other => other,
    };
    ctx.count_by(
        |s| &s.busy_micros,
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    if result.is_ok() {
        ctx.retries.succeeded(&watch_retry::object_key(cs.as_ref()));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> RegistryError {
        RegistryError::Transport {
            message: message.into(),
            timeout: false,
        }
    }

    #[test]
    fn a_registry_error_keeps_the_client_error_as_its_source_and_names_step_and_call_once() {
        let e = Error::registry("migrate", "probe ns-demo-0:hibernate", refused("refused"));
        assert_eq!(
            controller::chain(&e),
            "migrate: probe ns-demo-0:hibernate: transport: refused"
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<RegistryError>());
        assert!(
            matches!(
                source,
                Some(RegistryError::Transport { timeout: false, .. })
            ),
            "{source:?}"
        );
        assert_eq!(e.kind(), "registry");
    }

    #[test]
    fn a_step_that_tries_every_call_names_the_others_beside_the_first() {
        let failures = vec![
            ("delete a:hibernate".to_string(), refused("one")),
            ("delete b:hibernate".to_string(), refused("two")),
        ];
        let e = Error::registry_all("reclaim", failures).expect_err("two failed");
        assert_eq!(
            controller::chain(&e),
            "reclaim: delete a:hibernate (and also delete b:hibernate: transport: two): transport: one"
        );
        assert!(Error::registry_all("reclaim", Vec::new()).is_ok());
    }
}
