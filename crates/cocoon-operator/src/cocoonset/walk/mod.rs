//! One walk of the seed's steps over one set: the order of steps 2–14 and the in-memory view
//! every step observes (the set with the walk's own writes mirrored in, the step-4
//! classification, the pending step-5 stamps). The executor ([`executor`]) applies what the
//! steps plan, with the API writes it is made of.
//! Every step is a planner of [`steps`]; [`Walk::run_step`] applies its plans and feeds its
//! reads back until it hands over or ends the pass ([`Walk::run_replayed`] for steps 12 and
//! 13, which plan from the view they started from and repeat their earlier writes). The walk
//! has no per-pod loop and no create protocol of its own: a create is the step's planned
//! manifest read, tag drop, record write and post.
//!
//! Crash safety: every durable marker is written before the side effect it guards — the
//! reclaim record before any hibernate annotation (6A.2), `suspending-since` on entry into
//! Suspending (6C), `Migrating` before the migration's quiesce (8.5), the delete stash and
//! the node hint before a seat-release delete (6B.3), the `Waking` status before the wake's
//! create (9.1.4), the first record write before an unsuspend clears any annotation (10.3).
//! A fresh controller with empty memory therefore resumes from the API objects alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use cocoon_api::contract::AnnotationDelta;
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::memory::WrittenStatus;
use super::pods::Classified;
use super::steps::{self, Next};
use super::{Caches, Context, Error};
use crate::registry::RegistryError;

mod executor;

/// How a step ends: hand over to the next one, or end the pass.
enum Step {
    Continue,
    Return(Action),
}

impl From<steps::Next> for Step {
    fn from(next: steps::Next) -> Self {
        match next {
            steps::Next::Continue | steps::Next::Replan => Step::Continue,
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

pub(super) async fn walk(cs: &CocoonSet, ctx: &Context, caches: &Caches) -> Result<Action, Error> {
    let synced = caches.pods_synced.load(Ordering::SeqCst)
        && caches.hibernations_synced.load(Ordering::SeqCst);
    if !synced {
        // Look again shortly instead of holding a concurrency slot.
        return Ok(Action::requeue(Duration::from_millis(300)));
    }
    ctx.count(|s| &s.passes);
    let ns = cs.namespace().ok_or(Error::Missing("namespace"))?;
    // The set and its pods as this controller's own writes left them, where the caches do
    // not show those writes yet, in one read of its memory. Step 4's listing (and step 2's,
    // terminating pods included) comes from the cache.
    let recall = ctx.memory.recall(cs, |cs| {
        steps::classify::owned(cs, caches.pods.state().iter().map(|p| &**p))
    });
    let owned = recall.owned;
    let mut walk = Walk::new(ctx, caches, recall.cs, ns);
    walk.set_base = recall.set_base;
    walk.pod_bases = recall.pod_bases;
    walk.last_status = recall.last_status;
    walk.pod_uids = owned
        .iter()
        .filter_map(|p| Some((p.name_any(), p.metadata.uid.clone()?)))
        .collect();

    // Step 2 — teardown.
    if walk.cs.metadata.deletion_timestamp.is_some() {
        let plan = steps::teardown::plan(&walk.observed(&owned), &recall.deleted);
        return Ok(walk
            .apply_step(plan)
            .await?
            .unwrap_or(Action::await_change()));
    }
    // Step 3 — finalizer.
    if let Some(done) = walk
        .apply_step(steps::finalizer::plan(&walk.observed(&owned)))
        .await?
    {
        return Ok(done);
    }
    // Step 4 — classify, with the pods this controller created a moment ago that the cache does not
    // show yet.
    walk.classified = steps::classify::by_role(&owned);
    walk.classified.pending_creates = recall.pending_creates;
    // Step 5 — stamp: planned here, written with the first patch steps 6–10 make to each pod (the
    // hibernate annotation of a suspend, its clear on unsuspend), the rest right after them.
    walk.stamp_generation();
    let transitions = walk.transitions().await;
    let stamped = walk.flush_stamps().await;
    let step = transitions?;
    stamped?;
    if let Step::Return(a) = step {
        return Ok(a);
    }
    // Step 11 — main agent.
    let (now, st) = (Utc::now(), status_time());
    let next = walk
        .run_step(|o, a| steps::main_agent::plan(o, a, now, st))
        .await?;
    // A pass that ends here still comes back for an earlier step's backoff (the reclaim hold).
    if let Step::Return(a) = Step::from(walk.sooner(next)) {
        return Ok(a);
    }
    // Steps 12 and 13 — sub-agents, toolboxes.
    let now = Utc::now();
    walk.run_replayed(|o, a| steps::sub_agents::plan(o, a, now))
        .await?;
    walk.run_replayed(|o, a| steps::toolboxes::plan(o, a, now))
        .await?;
    // Step 14 — status.
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
    /// The first refusal of the last fed-back [`steps::Read::Probe`] (the call, the error),
    /// for [`steps::Write::FailProbe`].
    probe_error: Option<(String, RegistryError)>,
    /// The resourceVersions the caches showed the set and (by name) its pods at when the
    /// pass began: the base of what its writes return ([`super::memory::fresh`]).
    set_base: Option<String>,
    pod_bases: HashMap<String, String>,
    /// The UIDs of the owned pods the cache showed when the pass began, by name: a delete is
    /// remembered by UID ([`super::memory::deleted`]).
    pod_uids: HashMap<String, String>,
    /// The last status this controller wrote to the set, as the pass began and as its own
    /// status writes leave it.
    last_status: Option<WrittenStatus>,
    /// `<vm>:<tag>` of the tags the running step asked the registry to drop, deleted or kept
    /// by the owner check (moved into its answers after each round: a drop is a registry write
    /// no watch reports).
    dropped: Vec<String>,
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
            probe_error: None,
            set_base: None,
            pod_bases: HashMap::new(),
            pod_uids: HashMap::new(),
            last_status: None,
            dropped: Vec::new(),
        }
    }

    /// Steps 6 to 10, which hand over to step 11 or end the pass.
    async fn transitions(&mut self) -> Result<Step, Error> {
        // Step 6 — suspend.
        let now = Utc::now();
        let next = self
            .run_step(|o, a| steps::suspend::plan(o, a, now))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 7 — failed main.
        let (now, st) = (Utc::now(), status_time());
        let next = self
            .run_step(|o, a| steps::failed_main::plan(o, a, now, st))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 8 — migrate.
        let next = self.run_step(steps::migrate::plan).await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 9 — release wake.
        let now = status_time();
        let next = self
            .run_step(|o, a| steps::release_wake::plan(o, a, now))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 10 — unsuspend bookkeeping, then reclaim.
        self.run_step(steps::unsuspend::bookkeeping).await?;
        let now = Timestamp::now();
        self.run_step(|o, _| steps::unsuspend::reclaim(o, now))
            .await?;
        Ok(Step::Continue)
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

    /// Step 5: the stamps of [`steps::stamp::stamps`], mirrored into the classification; the
    /// writes go out with the walk's next patch of each pod.
    fn stamp_generation(&mut self) {
        self.pending_stamps = steps::stamp::stamps(&self.classified, self.generation());
        for (name, delta) in &self.pending_stamps {
            if let Some(p) = self.classified.all_by_name.get_mut(name) {
                cocoon_api::contract::apply_delta(p.annotations_mut(), delta);
            }
        }
    }

    /// `next`, or the pass's smallest backoff when that comes sooner.
    fn sooner(&self, next: Next) -> Next {
        match (next, self.min_backoff) {
            (Next::RequeueAfter(d), Some(b)) => Next::RequeueAfter(d.min(b)),
            (Next::AwaitChange, Some(b)) => Next::RequeueAfter(b),
            (next, _) => next,
        }
    }
}
