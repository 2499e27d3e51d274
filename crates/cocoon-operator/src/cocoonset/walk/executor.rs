//! The executor: runs a step's rounds (plan on the pass's view, apply the writes, fetch the
//! reads, plan again: [`Walk::run_step`], [`Walk::run_replayed`]) and applies each
//! [`StepPlan`] to the API server and the registry, with the write primitives it is made of
//! (set and pod annotation patches, the status patch, pod deletes and posts, registry tag
//! deletes) and the ownership gate every registry call asks.
//!
//! Writes go out in the plan's order, each durable before the next, and the first error ends
//! the pass (the runtime retries it with backoff). What a write changed is mirrored into the
//! walk's view of the set before the next step plans, so a later step observes the earlier
//! steps' results without reading the API again. Its only knowledge is generic: apply a
//! write, fetch a read (the manifest reads of one round at once). What the writes return,
//! the pods it creates and the last status it wrote are kept in the controller's
//! [`WriteMemory`](crate::cocoonset::WriteMemory) for the next passes.

use std::time::Duration;

use cocoon_api::contract::events as ev;
use cocoon_api::contract::{
    AnnotationCodec, AnnotationDelta, ReclaimRecord, annotations as ann, annotations_merge_patch,
    diff_annotations, oci, tags,
};
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, error, info, warn};

use super::{Error, Walk};
use crate::cocoonset::steps::create::rules::TagRead;
use crate::cocoonset::steps::status::rules as status_rules;
use crate::cocoonset::steps::teardown::rules::GcItem;
use crate::cocoonset::steps::{
    Answers, Applied, Counter, Created, Next, Observed, Probed, Read, StepPlan, Write,
};
use crate::cocoonset::{Context, POD_WRITES_AT_ONCE, REGISTRY_CALLS_AT_ONCE};
use crate::metrics::{PhaseLabel, PlacementLabels, SetLabels};
use crate::ownership::SetVms;

/// Rounds of plan-and-read one step may take before the walk gives up on it (the planners
/// ask for at most three reads and one post).
const MAX_ROUNDS: usize = 8;

impl Walk<'_> {
    /// Runs one step: plans on the pass's view and the step's answers, applies the writes,
    /// and while the step asks for reads ([`Next::Replan`]) fetches them and plans again.
    /// Returns what the pass does next.
    pub(super) async fn run_step<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&Observed<'_>, &Answers) -> StepPlan,
    {
        let mut answers = Answers::default();
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

    /// Runs a step that plans from the view it started from ([`crate::cocoonset::steps::sub_agents`],
    /// [`crate::cocoonset::steps::toolboxes`]): each round its plan repeats every write of the rounds before
    /// and adds the ones its new answers allow; only those are applied, then its reads are
    /// fetched and it plans again. A round that adds no write and asks only for what it
    /// already has does not settle.
    pub(super) async fn run_replayed<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&Observed<'_>, &Answers) -> StepPlan,
    {
        let start = self.cs.clone();
        let mut answers = Answers::default();
        let mut applied: Vec<Write> = Vec::new();
        let mut fetched: Vec<Read> = Vec::new();
        loop {
            let plan = planner(
                &Observed {
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

    /// Applies `plan`'s writes in order; returns what comes next and what the writes
    /// observed.
    pub(super) async fn apply(&mut self, plan: StepPlan) -> Result<Applied, Error> {
        let mut created = Vec::new();
        for write in plan.writes {
            created.extend(self.apply_one(write).await?);
        }
        Ok(Applied {
            next: plan.next,
            created,
        })
    }

    /// [`Walk::apply`] for a step that may end the pass: `Some(action)` when it does.
    pub(super) async fn apply_step(&mut self, plan: StepPlan) -> Result<Option<Action>, Error> {
        Ok(match self.apply(plan).await?.next {
            Next::Continue | Next::Replan => None,
            Next::RequeueAfter(d) => Some(Action::requeue(d)),
            Next::AwaitChange => Some(Action::await_change()),
        })
    }

    /// One write; creates report their outcomes.
    async fn apply_one(&mut self, write: Write) -> Result<Vec<Created>, Error> {
        match write {
            Write::SetAnnotations(delta) => self.patch_set_annotations(delta).await?,
            Write::Finalizers { patch, gone_ok } => self.write_finalizers(patch, gone_ok).await?,
            Write::DeletePod(name) => self.delete_pod(&name).await?,
            Write::PatchPod { name, delta } => self.patch_pod_annotations(&name, &delta).await?,
            Write::GcTags(items) => self.gc_tags(&items).await?,
            Write::DropTag { vm, tag, step } => {
                // Names computed from the set's own pods; the gate is the backstop.
                if !self.own_vm(ann::VM_NAME, &vm).await {
                    return Ok(Vec::new());
                }
                self.ctx.registry_write()?;
                self.ctx.count(|s| &s.registry_calls);
                self.ctx
                    .registry
                    .delete_tag(&vm, tag)
                    .await
                    .map_err(|e| Error::registry(step, format!("delete {vm}:{tag}"), e))?;
            }
            Write::Status(status) => self.write_status(status).await?,
            Write::Phase(phase) => {
                let status = self.status_now(phase);
                self.write_status(status).await?;
            }
            Write::MarkMigrating => {
                let status = self.status_now(Some(CocoonSetPhase::Migrating));
                self.write_status(status).await.map_err(|e| match e {
                    Error::Kube(k) => Error::MigratingStatus(k),
                    other => other,
                })?;
            }
            Write::Record(record) => {
                let delta = record.delta(self.cs.annotations());
                self.patch_set_annotations(delta).await?;
            }
            Write::ClearSuspended => {
                let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
                record.suspended.clear();
                let delta = record.delta(self.cs.annotations());
                self.patch_set_annotations(delta).await?;
            }
            Write::ForgetVms(vms) => self.forget_vms(&vms).await?,
            Write::MarkPods { names, delta } => self.mark_pods(&names, &delta).await?,
            Write::MarkPodsWithPhase {
                names,
                delta,
                phase,
            } => {
                // The status is built before the annotations are mirrored: it does not read
                // them.
                let status = self.status_now(Some(phase));
                let patches = names.iter().map(|n| (n.clone(), delta.clone())).collect();
                self.changed = true;
                let written = self.patch_pods_and_status(patches, status).await;
                for name in &names {
                    self.mirror(name, &delta);
                }
                written?;
            }
            Write::FlagPod { name, delta } => {
                if let Err(e) = self.patch_pod_annotations(&name, &delta).await {
                    if let Error::LostLeadership(l) = e {
                        return Err(l.into());
                    }
                    warn!(pod = %name, error = %e, "could not flag the pod; going on");
                }
            }
            Write::PostPod(pod) => {
                let created = post_pod(self.ctx, &self.pod_api, self.cs.uid(), &pod).await?;
                return Ok(vec![created]);
            }
            Write::PostPods { pods, at_once } => return self.post_pods(&pods, at_once).await,
            Write::Backoff(d) => self.note_backoff(d),
            Write::InvalidSpec(invalid) => self.invalid = Some(invalid),
            Write::Fail(message) => return Err(Error::Invalid(message)),
            Write::ReclaimTags { vms, step } => self.reclaim_tags(&vms, step).await?,
            Write::FailProbe { step } => {
                if let Some((what, e)) = self.probe_error.take() {
                    return Err(Error::registry(step, what, e));
                }
            }
            Write::Log { warn, message } => {
                if warn {
                    warn!(namespace = %self.ns, name = %self.name, "{message}");
                } else {
                    info!(namespace = %self.ns, name = %self.name, "{message}");
                }
            }
            Write::Changed => self.changed = true,
            Write::Event {
                warning,
                reason,
                message,
            } => self.event(warning, reason, message).await,
            Write::Count(counter) => {
                let m = &self.ctx.metrics;
                match counter {
                    Counter::SubagentRebuild => {
                        m.subagent_rebuild.get_or_create(&self.set_labels()).inc();
                    }
                    Counter::SubagentDeadLetter => {
                        m.subagent_dead_letter
                            .get_or_create(&self.set_labels())
                            .inc();
                    }
                    Counter::SlotReleaseWake { placement } => {
                        m.slot_release_wake
                            .get_or_create(&PlacementLabels {
                                namespace: self.ns.clone(),
                                cocoonset: self.name.clone(),
                                placement,
                            })
                            .inc();
                    }
                    Counter::SlotReleasePodsDeleted => {
                        m.slot_release_pods_deleted
                            .get_or_create(&self.set_labels())
                            .inc();
                    }
                    Counter::MigrateUnschedulable => {
                        m.migrate_unschedulable
                            .get_or_create(&self.set_labels())
                            .inc();
                    }
                    Counter::SlotReleaseWakeUnschedulable => {
                        m.slot_release_wake_unschedulable
                            .get_or_create(&self.set_labels())
                            .inc();
                    }
                    Counter::LifecycleStateFailed { phase } => {
                        m.lifecycle_state_failed_observed
                            .get_or_create(&PhaseLabel { phase })
                            .inc();
                    }
                }
            }
        }
        Ok(Vec::new())
    }

    /// Fetches a step's reads into its answers: the manifest reads at once (at most
    /// [`REGISTRY_CALLS_AT_ONCE`] in flight, the first refusal failing the pass once all have
    /// finished), then the others in order.
    pub(super) async fn fetch_all(
        &mut self,
        reads: Vec<Read>,
        answers: &mut Answers,
    ) -> Result<(), Error> {
        let (manifests, others): (Vec<Read>, Vec<Read>) = reads
            .into_iter()
            .partition(|r| matches!(r, Read::Manifest { .. }));
        let mut own = Vec::new();
        for read in manifests {
            if let Read::Manifest { vm, step } = read {
                if self.own_vm(ann::VM_NAME, &vm).await {
                    own.push((vm, step));
                } else {
                    // Not this set's: read as absent, with no registry call.
                    answers.manifests.insert(vm, TagRead::Absent);
                }
            }
        }
        let ctx = self.ctx;
        let calls: Vec<_> = own
            .into_iter()
            .map(|(vm, step)| async move {
                let tag = read_manifest(ctx, &vm, step).await;
                (vm, tag)
            })
            .collect();
        let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, calls).await;
        let mut first_err = None;
        for (vm, tag) in results {
            match tag {
                Ok(tag) => {
                    answers.manifests.insert(vm, tag);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for read in others {
            self.fetch(read, answers).await?;
        }
        Ok(())
    }

    /// Fetches one of a step's reads into its answers.
    async fn fetch(&mut self, read: Read, answers: &mut Answers) -> Result<(), Error> {
        match read {
            Read::Probe { vms, tag, fail } => {
                // A pod's VM name that is not this set's is never probed: it reads as
                // missing (its pod never completes a suspend).
                let mut probed = Probed::default();
                let mut own = Vec::new();
                for vm in vms {
                    if self.own_vm(ann::VM_NAME, &vm).await {
                        own.push(vm);
                    } else {
                        probed.exists.insert(vm, false);
                    }
                }
                let vms = own;
                let ctx = self.ctx;
                let registry = &self.ctx.registry;
                let calls: Vec<_> = vms
                    .iter()
                    .map(|vm| {
                        ctx.count(|s| &s.registry_calls);
                        registry.has_manifest(vm, tag)
                    })
                    .collect();
                let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, calls).await;
                self.probe_error = None;
                for (vm, r) in vms.into_iter().zip(results) {
                    match r {
                        Ok(exists) => {
                            probed.exists.insert(vm, exists);
                        }
                        Err(e) => {
                            if let Some(step) = fail {
                                return Err(Error::registry(step, format!("probe {vm}:{tag}"), e));
                            }
                            let what = format!("probe {vm}:{tag}");
                            probed.exists.insert(vm, false);
                            if probed.error.is_none() {
                                probed.error = Some(format!("{what}: {e}"));
                                self.probe_error = Some((what, e));
                            }
                        }
                    }
                }
                answers.probed = Some(probed);
            }
            Read::Manifest { vm, step } => {
                let tag = if self.own_vm(ann::VM_NAME, &vm).await {
                    read_manifest(self.ctx, &vm, step).await?
                } else {
                    TagRead::Absent
                };
                answers.manifests.insert(vm, tag);
            }
            Read::CachedHibernations => {
                answers.cached_hibernations = Some(self.list_hibernations());
            }
            Read::FreshHibernations => {
                let api: Api<CocoonHibernation> =
                    Api::namespaced(self.ctx.client.clone(), &self.ns);
                self.ctx.count(|s| &s.reads);
                answers.fresh_hibernations = Some(api.list(&ListParams::default()).await?.items);
            }
            Read::Pod(name) => {
                self.ctx.count(|s| &s.reads);
                let pod = self.pod_api.get_opt(&name).await?;
                answers.pods.insert(name, pod);
            }
        }
        Ok(())
    }

    /// Deletes the `:hibernate` tags of `vms` (at most [`REGISTRY_CALLS_AT_ONCE`] at once);
    /// the deleted ones leave the record, then the refusals fail the pass.
    /// A recorded name that is not this set's is reported, never deleted, and leaves the
    /// record (nothing is owed for it).
    async fn reclaim_tags(&mut self, vms: &[String], step: &'static str) -> Result<(), Error> {
        self.ctx.registry_write()?;
        let mut own = Vec::new();
        let mut foreign = Vec::new();
        for vm in vms {
            if self.own_vm(ann::HIBERNATE_RECLAIM, vm).await {
                own.push(vm.clone());
            } else {
                foreign.push(vm.clone());
            }
        }
        let vms = own;
        let ctx = self.ctx;
        let registry = &self.ctx.registry;
        let deletes: Vec<_> = vms
            .iter()
            .map(|vm| {
                ctx.count(|s| &s.registry_calls);
                registry.delete_tag(vm, tags::HIBERNATE)
            })
            .collect();
        let results = crate::watch_retry::at_most(REGISTRY_CALLS_AT_ONCE, deletes).await;
        let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
        for vm in &foreign {
            record.remove_vm(vm);
        }
        let mut failures = Vec::new();
        for (vm, r) in vms.iter().zip(results) {
            match r {
                Ok(()) => record.remove_vm(vm),
                Err(e) => failures.push((format!("delete {vm}:{}", tags::HIBERNATE), e)),
            }
        }
        let delta = record.delta(self.cs.annotations());
        self.patch_set_annotations(delta).await?;
        Error::registry_all(step, failures)
    }

    /// Posts `pods` at once (at most `at_once` in flight); the outcomes in the pods' order,
    /// or the first error once all have finished.
    async fn post_pods(&mut self, pods: &[Pod], at_once: usize) -> Result<Vec<Created>, Error> {
        let (ctx, api, uid) = (self.ctx, self.pod_api.clone(), self.cs.uid());
        let posts: Vec<_> = pods
            .iter()
            .map(|pod| post_pod(ctx, &api, uid.clone(), pod))
            .collect();
        crate::watch_retry::at_most(at_once, posts)
            .await
            .into_iter()
            .collect()
    }

    async fn write_finalizers(
        &mut self,
        patch: serde_json::Value,
        gone_ok: bool,
    ) -> Result<(), Error> {
        self.ctx.write(line!())?;
        match self
            .sets
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => {
                if gone_ok {
                    info!(namespace = %self.ns, name = %self.name, "CocoonSet torn down");
                }
                // The pass goes on from the set as written (step 3 hands over).
                self.versions.extend(patched.resource_version());
                self.cs.metadata.finalizers = patched.metadata.finalizers.clone();
                self.ctx.memory.wrote_set(self.set_base.as_deref(), patched);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 && gone_ok => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every VM is tried, and the failures are returned together: one unreachable repository
    /// does not hold back the others' cleanup on the retry.
    /// A stashed or recorded name that is not this set's is reported and skipped.
    async fn gc_tags(&mut self, items: &[GcItem]) -> Result<(), Error> {
        let record = ReclaimRecord::from_meta(&self.cs.metadata);
        let mut failures = Vec::new();
        for item in items {
            let source = if record.contains_vm(&item.vm) {
                ann::HIBERNATE_RECLAIM
            } else {
                ann::DELETE_VM_NAMES
            };
            if !self.own_vm(source, &item.vm).await {
                continue;
            }
            self.ctx.registry_write()?;
            self.ctx.count(|s| &s.registry_calls);
            if let Err(e) = self
                .ctx
                .registry
                .delete_tag(&item.vm, tags::HIBERNATE)
                .await
            {
                failures.push((format!("delete {}:{}", item.vm, tags::HIBERNATE), e));
                continue;
            }
            if item.drop_latest {
                self.ctx.count(|s| &s.registry_calls);
                if let Err(e) = self.ctx.registry.delete_tag(&item.vm, tags::LATEST).await {
                    error!(vm = %item.vm, error = %e, "could not delete the :latest tag of a deleted CocoonSet; left behind");
                }
            }
        }
        Error::registry_all("teardown GC", failures)
    }
}

// ----- the write primitives the writes are made of ----------------------------------------

impl Walk<'_> {
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
        self.ctx.memory.wrote_set(self.set_base.as_deref(), patched);
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
        let status = status_rules::status_patch(&self.cs, status)?;
        let (_uid, cached) = (self.cs.uid()?, self.cs.resource_version()?);
        let already =
            status_rules::status_already_written(self.last_status.as_ref(), &cached, &status);
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
        self.ctx.memory.wrote_set(self.set_base.as_deref(), written);
        if let Some(uid) = self.cs.uid() {
            let last = self
                .ctx
                .memory
                .wrote_status(&uid, &self.versions, status.clone());
            self.last_status = Some(last);
        }
        self.cs.status = Some(status);
    }

    fn status_now(&self, phase: Option<CocoonSetPhase>) -> CocoonSetStatus {
        // Whole seconds: the API server stores condition times so, and a finer `now` would
        // make a freshly written status differ from its read-back.
        let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_default();
        status_rules::build_status(&self.cs, &self.classified, phase, now)
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

    /// Keeps what a pod patch returned for the next passes
    /// ([`crate::cocoonset::memory::fresh`]).
    fn pod_written(&self, pod: &str, written: Option<Pod>) {
        if self.cs.metadata.deletion_timestamp.is_some() {
            return;
        }
        if let Some(w) = written {
            let base = self.pod_bases.get(pod).map(String::as_str);
            self.ctx.memory.wrote_pod(self.cs.uid().as_deref(), base, w);
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
    async fn patch_pods_and_status(
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
    pub(super) async fn flush_stamps(&mut self) -> Result<(), Error> {
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

impl Walk<'_> {
    /// The ownership gate ([`crate::ownership`]) of this set: its namespace and name, its
    /// spec's and status's toolboxes, its pods.
    fn vm_gate(&self) -> SetVms {
        SetVms::for_set(
            &self.cs,
            self.classified.all_by_name.keys().map(String::as_str),
            self.ctx.legacy_vm_names,
        )
    }

    /// Whether `vm` (read from `source`) is one of this set's VMs. Every registry call of
    /// the CocoonSet controller asks first; a name that is not is reported with a Warning
    /// Event `ForeignVMNameIgnored` once per set, source and name, and no call is made.
    async fn own_vm(&self, source: &'static str, vm: &str) -> bool {
        let gate = self.vm_gate();
        if gate.owns(vm) {
            return true;
        }
        let uid = self.cs.uid().unwrap_or_default();
        if self.ctx.memory.first_foreign_report(&uid, source, vm) {
            warn!(namespace = %self.ns, name = %self.name, vm, source, "a VM name that is not one of this set's VMs: no registry call");
            let message = ev::foreign_vm_name_message(source, vm, &gate.owner());
            self.event(true, ev::operator::FOREIGN_VM_NAME_IGNORED, message)
                .await;
        }
        false
    }
}

/// §7.1: the `:hibernate` manifest of `vm` (absent, or present with its recorded image); a
/// refusal fails the pass with `step` as its context.
async fn read_manifest(ctx: &Context, vm: &str, step: &'static str) -> Result<TagRead, Error> {
    ctx.count(|s| &s.registry_calls);
    match ctx.registry.manifest_annotations(vm, tags::HIBERNATE).await {
        Ok(None) => Ok(TagRead::Absent),
        Ok(Some(a)) => Ok(TagRead::Present {
            base_image: a
                .get(oci::ANNOTATION_BASE_IMAGE)
                .cloned()
                .unwrap_or_default(),
        }),
        Err(e) => {
            let what = format!("get {vm}:{} manifest", tags::HIBERNATE);
            Err(Error::registry(step, what, e))
        }
    }
}

/// Posts a pod; AlreadyExists (the old pod still terminating, or a racing pass) is reported,
/// not failed. A pod created is expected until the cache shows it (`set_uid`: the set's).
async fn post_pod(
    ctx: &Context,
    api: &Api<Pod>,
    set_uid: Option<String>,
    pod: &Pod,
) -> Result<Created, Error> {
    ctx.write(line!())?;
    match api.create(&PostParams::default(), pod).await {
        Ok(created) => {
            if let (Some(set), Some(uid)) = (set_uid, created.uid()) {
                ctx.memory.created(&set, &created.name_any(), &uid);
            }
            Ok(Created::Yes)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyExists),
        Err(e) => Err(Error::Kube(e)),
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
