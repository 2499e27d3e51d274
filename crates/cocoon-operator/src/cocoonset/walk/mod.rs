//! One walk of the seed's steps over one set: the order of steps 2–14 (and the idle step of
//! issue 39 between 5 and 6) and the in-memory view
//! every step observes (the set with the walk's own writes mirrored in, the step-4
//! classification, the pending step-5 stamps). The executor ([`executor`]) applies what the
//! steps plan, with the API writes it is made of.
//! Every step is a planner of [`steps`] run in one form, [`Walk::step`]: the one runner
//! applies its plans and feeds its reads back until it hands over or ends the pass. How a
//! step is run is a property of its [`Step`] (replayed for steps 12 and 13, which plan from
//! the view they started from and repeat their earlier writes; the pass's smallest backoff
//! for a pass that step 11 ends), so [`Walk::steps`] is the flat list of the seed's steps.
//! The walk has no per-pod loop and no create protocol of its own: a create is the step's
//! planned manifest read, tag drop, record write and post.
//!
//! Crash safety: every durable marker is written before the side effect it guards — the
//! reclaim record before any hibernate annotation (6A.2), `suspending-since` on entry into
//! Suspending (6C), `Migrating` before the migration's quiesce (8.5), the delete stash and
//! the node hint before a seat-release delete (6B.3), the `Waking` status before the wake's
//! create (9.1.4), the first record write before an unsuspend clears any annotation (10.3).
//! A fresh controller with empty memory therefore resumes from the API objects alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use cocoon_api::contract::AnnotationDelta;
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use self::executor::{Step, Stop};
use super::memory::WrittenStatus;
use super::pods::Classified;
use super::shared::unsuspend;
use super::steps::{self, StepPlan};
use super::{Caches, Context, Error};
use crate::registry::RegistryError;

mod executor;

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
    let mut walk = Walk::new(ctx, caches, recall.cs, ns);
    walk.set_base = recall.set_base;
    walk.pod_bases = recall.pod_bases;
    walk.last_status = recall.last_status;
    walk.pod_uids = recall
        .owned
        .iter()
        .filter_map(|p| Some((p.name_any(), p.metadata.uid.clone()?)))
        .collect();
    walk.owned = recall.owned;
    match walk.steps(&recall.deleted, recall.pending_creates).await {
        Ok(()) => Ok(Action::await_change()),
        Err(Stop::End(action)) => Ok(action),
        Err(Stop::Failed(e)) => Err(e),
    }
}

impl Walk<'_> {
    /// The seed's steps 2–14 in order, each handing over to the next or ending the pass.
    /// `deleted`: the UIDs of the pods this controller deleted a moment ago (step 2);
    /// `pending_creates`: the pods it created a moment ago that the cache does not show yet
    /// (step 4).
    async fn steps(
        &mut self,
        deleted: &BTreeSet<String>,
        pending_creates: BTreeMap<String, Duration>,
    ) -> Result<(), Stop> {
        let deleting = self.cs.metadata.deletion_timestamp.is_some();
        // Step 2 ends every pass over a set being deleted (its plan never hands over).
        self.step(Step::new("2 teardown"), |o, _, _| match deleting {
            true => steps::teardown::plan(o, deleted),
            false => StepPlan::proceed(),
        })
        .await?;
        self.step(Step::new("3 finalizer"), |o, _, _| {
            steps::finalizer::plan(o)
        })
        .await?;
        self.classify(pending_creates);
        self.stamp_generation();
        self.step(Step::new("5.9 idle"), |o, _, t| {
            steps::idle::plan(o, t.utc, t.status)
        })
        .await?;
        self.step(Step::new("6 suspend"), |o, a, t| {
            steps::suspend::plan(o, a, t.utc)
        })
        .await?;
        self.step(Step::new("7 failed main"), |o, a, t| {
            steps::failed_main::plan(o, a, t.utc, t.status)
        })
        .await?;
        self.step(Step::new("8 migrate"), |o, a, _| steps::migrate::plan(o, a))
            .await?;
        self.step(Step::new("9 release wake"), |o, a, t| {
            steps::release_wake::plan(o, a, t.status)
        })
        .await?;
        self.step(Step::new("10 unsuspend"), |o, a, _| {
            unsuspend::bookkeeping(o, a)
        })
        .await?;
        self.step(Step::new("10.6 reclaim"), |o, _, t| {
            steps::unsuspend::reclaim(o, t.precise)
        })
        .await?;
        // Step 5's stamps that rode on no patch of steps 6–10.
        self.flush_stamps().await?;
        self.step(Step::new("11 main agent").sooner(), |o, a, t| {
            steps::main_agent::plan(o, a, t.utc, t.status)
        })
        .await?;
        self.step(Step::new("12 sub-agents").replayed(), |o, a, t| {
            steps::sub_agents::plan(o, a, t.utc)
        })
        .await?;
        self.step(Step::new("13 toolboxes").replayed(), |o, a, t| {
            steps::toolboxes::plan(o, a, t.utc)
        })
        .await?;
        let progress = self.progress();
        self.step(Step::new("14 status"), |o, _, t| {
            steps::status::plan(o, &progress, t.status)
        })
        .await
    }
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
    /// The controller-owned pods the cache showed when the pass began (terminating ones
    /// included): what step 2 observes, and step 4 classifies.
    owned: Vec<Pod>,
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
            owned: Vec::new(),
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

    fn generation(&self) -> i64 {
        self.cs.metadata.generation.unwrap_or(0)
    }

    /// What the next step observes: the set as this walk knows it, the owned pods from the
    /// cache and the step-4 classification.
    fn observed(&self) -> steps::Observed<'_> {
        steps::Observed {
            cs: &self.cs,
            ns: &self.ns,
            owned: &self.owned,
            classified: &self.classified,
            timing: &self.ctx.timing,
        }
    }

    /// Step 4: the owned pods by role, with the pods this controller created a moment ago
    /// that the cache does not show yet.
    fn classify(&mut self, pending_creates: BTreeMap<String, Duration>) {
        self.classified = steps::classify::by_role(&self.owned);
        self.classified.pending_creates = pending_creates;
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

    /// What steps 11–13 left for step 14.
    fn progress(&self) -> steps::status::Progress {
        steps::status::Progress {
            changed: self.changed,
            min_backoff: self.min_backoff,
            invalid: self.invalid.clone(),
        }
    }
}
