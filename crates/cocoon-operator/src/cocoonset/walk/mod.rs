//! One walk of the seed's steps over one set: the order of steps 2–14, the in-memory view
//! every step observes (the set with the walk's own writes mirrored in, the step-4
//! classification, the pending step-5 stamps), and the API writes the executor is made of.
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
use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, ReclaimRecord, annotations_merge_patch, diff_annotations,
};
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::plan;
use super::pods::Classified;
use super::steps::{Next, StepPlan};
use crate::metrics::SetLabels;
use crate::registry::RegistryError;

use super::{Caches, Context, Error, POD_WRITES_AT_ONCE, steps};

mod executor;

/// Rounds of plan-and-read one step may take before the walk gives up on it (the planners
/// ask for at most three reads and one post).
const MAX_ROUNDS: usize = 8;

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
    // The set and (below) its pods as this controller's own writes left them, where the
    // caches do not show those writes yet.
    let set_base = cs.resource_version();
    let cs = &ctx.fresh_set(cs);
    // Step 4's listing (and step 2's, terminating pods included) comes from the cache.
    let mut owned = steps::classify::owned(cs, caches.pods.state().iter().map(|p| &**p));
    let pod_bases = owned
        .iter()
        .filter_map(|p| Some((p.name_any(), p.resource_version()?)))
        .collect();
    ctx.fresh_pods(cs, &mut owned);
    let mut walk = Walk::new(ctx, caches, cs.clone(), ns);
    walk.set_base = set_base;
    walk.pod_bases = pod_bases;

    // Step 2.
    if cs.metadata.deletion_timestamp.is_some() {
        walk.forget_written_status();
        ctx.forget_expected(cs);
        if let Some(uid) = cs.uid() {
            ctx.forget_fresh(&uid);
        }
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
    // Step 4, with the pods this controller created a moment ago that the cache does not
    // show yet.
    walk.classified = steps::classify::plan(&owned);
    walk.classified.pending_creates = ctx.pending_creates(cs, &owned);
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
    let (now, st) = (Utc::now(), status_time());
    let next = walk
        .run_step(|o, a| steps::main::plan(o, a, now, st))
        .await?;
    // A pass that ends here still comes back for an earlier step's backoff (the reclaim hold).
    if let Step::Return(a) = Step::from(walk.sooner(next)) {
        return Ok(a);
    }
    // Steps 12 and 13.
    let now = Utc::now();
    walk.run_replayed(|o, a| steps::sub_agents::plan(o, a, now))
        .await?;
    walk.run_replayed(|o, a| steps::toolboxes::plan(o, a, now))
        .await?;
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
    /// The first refusal of the last fed-back [`steps::Read::Probe`] (the call, the error),
    /// for [`steps::Write::FailProbe`].
    probe_error: Option<(String, RegistryError)>,
    /// The resourceVersions the caches showed the set and (by name) its pods at when the
    /// pass began: the base of what its writes return ([`super::fresh`]).
    set_base: Option<String>,
    pod_bases: HashMap<String, String>,
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
        }
    }

    /// Steps 6 to 10, which hand over to step 11 or end the pass.
    async fn transitions(&mut self) -> Result<Step, Error> {
        // Step 6.
        let now = Utc::now();
        let next = self
            .run_step(|o, a| steps::suspend::plan(o, a, now))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 7.
        let (now, st) = (Utc::now(), status_time());
        let next = self
            .run_step(|o, a| steps::failed_main::step(o, a, now, st))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 8.
        let next = self.run_step(steps::migrate::plan).await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 9.
        let now = status_time();
        let next = self
            .run_step(|o, a| steps::release_wake::plan(o, a, now))
            .await?;
        if let Step::Return(a) = Step::from(next) {
            return Ok(Step::Return(a));
        }
        // Step 10.
        self.run_step(steps::unsuspend::bookkeeping).await?;
        let now = Timestamp::now();
        self.run_step(|o, _| steps::unsuspend::reclaim(o, now))
            .await?;
        Ok(Step::Continue)
    }

    /// Runs one step: plans on the pass's view and the step's answers, applies the writes,
    /// and while the step asks for reads ([`Next::Replan`]) fetches them and plans again.
    /// Returns what the pass does next.
    async fn run_step<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&steps::Observed<'_>, &steps::Answers) -> StepPlan,
    {
        let mut answers = steps::Answers::default();
        for _ in 0..MAX_ROUNDS {
            let plan = planner(&self.observed(&[]), &answers);
            let reads = plan.reads.clone();
            let applied = self.apply(plan).await?;
            answers.created.extend(applied.created);
            if applied.next != Next::Replan {
                return Ok(applied.next);
            }
            self.fetch_all(reads, &mut answers).await?;
        }
        Err(Error::Invalid(format!(
            "a step of set {}/{} did not settle in {MAX_ROUNDS} rounds",
            self.ns, self.name
        )))
    }

    /// Runs a step that plans from the view it started from ([`steps::sub_agents`],
    /// [`steps::toolboxes`]): each round its plan repeats every write of the rounds before
    /// and adds the ones its new answers allow; only those are applied, then its reads are
    /// fetched and it plans again. A round that adds no write and asks only for what it
    /// already has does not settle.
    async fn run_replayed<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&steps::Observed<'_>, &steps::Answers) -> StepPlan,
    {
        let start = self.cs.clone();
        let mut answers = steps::Answers::default();
        let mut applied: Vec<steps::Write> = Vec::new();
        let mut fetched: Vec<steps::Read> = Vec::new();
        loop {
            let plan = planner(
                &steps::Observed {
                    cs: &start,
                    ..self.observed(&[])
                },
                &answers,
            );
            if !plan.writes.starts_with(&applied) {
                return Err(Error::Invalid(format!(
                    "a step of set {}/{} planned its earlier writes differently",
                    self.ns, self.name
                )));
            }
            let new = plan.writes[applied.len()..].to_vec();
            let stuck = new.is_empty() && plan.reads.iter().all(|r| fetched.contains(r));
            if plan.next == Next::Replan && stuck {
                return Err(Error::Invalid(format!(
                    "a step of set {}/{} did not settle",
                    self.ns, self.name
                )));
            }
            applied.extend(new.iter().cloned());
            let next = StepPlan {
                writes: new,
                reads: Vec::new(),
                next: plan.next,
            };
            let done = self.apply(next).await?;
            answers.created.extend(done.created);
            if done.next != Next::Replan {
                return Ok(done.next);
            }
            fetched.extend(plan.reads.iter().cloned());
            self.fetch_all(plan.reads, &mut answers).await?;
        }
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

    /// `next`, or the pass's smallest backoff when that comes sooner.
    fn sooner(&self, next: Next) -> Next {
        match (next, self.min_backoff) {
            (Next::RequeueAfter(d), Some(b)) => Next::RequeueAfter(d.min(b)),
            (Next::AwaitChange, Some(b)) => Next::RequeueAfter(b),
            (next, _) => next,
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
        self.ctx.wrote_set(self.set_base.as_deref(), patched);
        cocoon_api::contract::apply_delta(self.cs.annotations_mut(), &delta);
        Ok(())
    }

    async fn write_status(&mut self, status: CocoonSetStatus) -> Result<(), Error> {
        let Some((body, status)) = self.status_body(status) else {
            return Ok(());
        };
        let written = send_status(self.ctx, &self.sets, &self.name, &body).await?;
        self.status_written(status, written);
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

    /// Records a status patch that succeeded (`written`: the set it returned), in this pass
    /// and for the next ones.
    fn status_written(&mut self, status: CocoonSetStatus, written: CocoonSet) {
        self.versions.extend(written.resource_version());
        self.ctx.wrote_set(self.set_base.as_deref(), written);
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
        let written = patch_pod(self.ctx, &self.pod_api, pod, &delta).await?;
        self.pod_written(pod, written);
        Ok(())
    }

    /// Keeps what a pod patch returned for the next passes ([`super::fresh`]).
    fn pod_written(&self, pod: &str, written: Option<Pod>) {
        if self.cs.metadata.deletion_timestamp.is_some() {
            return;
        }
        if let Some(w) = written {
            let base = self.pod_bases.get(pod).map(String::as_str);
            self.ctx.wrote_pod(self.cs.uid().as_deref(), base, w);
        }
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
        let results: Vec<Result<Option<Pod>, Error>> = futures::stream::iter(writes)
            .buffer_unordered(POD_WRITES_AT_ONCE)
            .collect()
            .await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(Some(written)) => {
                    let name = written.name_any();
                    self.pod_written(&name, Some(written));
                }
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
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

    /// Patches several pods' annotations with the same delta (all at once) and mirrors it
    /// into the classification.
    async fn mark_pods(&mut self, names: &[String], delta: &AnnotationDelta) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        let patches = names.iter().map(|n| (n.clone(), delta.clone())).collect();
        // Some may have landed even when one failed: the pass reports the error either way.
        self.changed = true;
        self.patch_pods(patches).await?;
        for name in names {
            self.mirror(name, delta);
        }
        Ok(())
    }

    /// Mirrors a pod annotation patch into this pass's classification.
    fn mirror(&mut self, name: &str, delta: &AnnotationDelta) {
        let mirror = |p: &mut Pod| cocoon_api::contract::apply_delta(p.annotations_mut(), delta);
        if let Some(p) = self.classified.all_by_name.get_mut(name) {
            mirror(p);
        }
        for p in self
            .classified
            .main
            .iter_mut()
            .chain(self.classified.sub.values_mut())
            .chain(self.classified.toolbox.values_mut())
        {
            if p.name_any() == name {
                mirror(p);
            }
        }
    }

    /// The set's namespace's CocoonHibernations, from the cache.
    fn list_hibernations(&self) -> Vec<CocoonHibernation> {
        self.caches
            .hibernations
            .state()
            .iter()
            .filter(|h| h.metadata.namespace.as_deref() == Some(self.ns.as_str()))
            .map(|h| (**h).clone())
            .collect()
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
}

/// One status merge patch; returns the set it produced.
async fn send_status(
    ctx: &Context,
    sets: &Api<CocoonSet>,
    name: &str,
    body: &Value,
) -> Result<CocoonSet, Error> {
    ctx.write(line!())?;
    Ok(sets
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await?)
}

/// One pod annotation merge patch (nothing when the delta is empty).
async fn patch_pod(
    ctx: &Context,
    api: &Api<Pod>,
    pod: &str,
    delta: &AnnotationDelta,
) -> Result<Option<Pod>, Error> {
    let Some(patch) = annotations_merge_patch(delta) else {
        return Ok(None);
    };
    ctx.write(line!())?;
    Ok(Some(
        api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await?,
    ))
}
