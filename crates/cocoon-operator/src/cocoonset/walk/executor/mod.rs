//! The executor: the one runner of every step ([`Walk::step`]: plan on the pass's view, apply
//! the writes, fetch the reads, plan again, until the step hands over or ends the pass) and
//! the application of each [`StepPlan`] to the API server and the registry, with the write primitives it is made of
//! (set and pod annotation patches, the status patch, pod deletes and posts, registry tag
//! deletes) and the ownership gate every registry call asks.
//!
//! Writes go out in the plan's order, each durable before the next, and the first error ends
//! the pass (the runtime retries it with backoff). A plan's notes ([`Note`]: log lines,
//! metric increments, Events, the pass's facts for step 14) are applied each once the writes
//! planned before it went through, and are no writes: nothing in them is mirrored, and none
//! fails the pass. What a write changed is mirrored into the
//! walk's view of the set before the next step plans, so a later step observes the earlier
//! steps' results without reading the API again. Its only knowledge is generic: apply a
//! write, fetch a read (the manifest reads of one round at once). What the writes return,
//! the pods it creates and the last status it wrote are kept in the controller's
//! [`WriteMemory`](crate::cocoonset::WriteMemory) for the next passes.
//!
//! This module holds the rounds and the dispatch of each [`Write`]; what the writes are made
//! of is in one submodule per kind: [`set`] (the set's annotations, finalizers and status),
//! [`pods`] (pod deletes, posts and annotation patches), [`registry`] (the ownership gate, the
//! tag reclaim and the teardown GC), [`events`] (Events, metric labels, the backoff), and the
//! reads a step asks for in [`reads`].

use chrono::{DateTime, Utc};
use cocoon_api::contract::{AnnotationCodec, ReclaimRecord, annotations as ann};
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, info, warn};

use self::pods::post_pod;
use super::{Error, Walk};
use crate::cocoonset::steps::{
    Answers, Applied, Counter, Created, Effect, Next, Note, Observed, Read, StepPlan, Write,
};
use crate::metrics::{PhaseLabel, PlacementLabels};

mod events;
mod pods;
mod reads;
mod registry;
mod set;

/// Rounds of plan-and-read one step may take before the walk gives up on it (the planners
/// ask for at most three reads and one post).
const MAX_ROUNDS: usize = 8;

/// One step of the walk as the runner runs it: its name (for the logs) and how it is run.
#[derive(Debug, Clone, Copy)]
pub(in crate::cocoonset::walk) struct Step {
    name: &'static str,
    /// It plans from the view it started from, repeating the writes of its earlier rounds
    /// ([`Walk::run_replayed`]): steps 12 and 13.
    replayed: bool,
    /// A pass it ends comes back no later than the pass's smallest backoff (the reclaim hold
    /// of step 10, a rebuild backoff): step 11.
    sooner: bool,
}

impl Step {
    pub(in crate::cocoonset::walk) const fn new(name: &'static str) -> Self {
        Step {
            name,
            replayed: false,
            sooner: false,
        }
    }

    pub(in crate::cocoonset::walk) const fn replayed(self) -> Self {
        Step {
            replayed: true,
            ..self
        }
    }

    pub(in crate::cocoonset::walk) const fn sooner(self) -> Self {
        Step {
            sooner: true,
            ..self
        }
    }
}

/// Why the walk stops before its end: a step ended the pass, or failed.
#[derive(Debug)]
pub(in crate::cocoonset::walk) enum Stop {
    End(Action),
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

/// The clock of one step, read once when it starts: every round of the step plans on the
/// same instant.
#[derive(Debug, Clone, Copy)]
pub(in crate::cocoonset::walk) struct Now {
    pub utc: DateTime<Utc>,
    /// Now in whole seconds: the API server stores condition times so, and a finer `now`
    /// would make a freshly written status differ from its read-back.
    pub status: Timestamp,
    pub precise: Timestamp,
}

impl Now {
    fn read() -> Self {
        let precise = Timestamp::now();
        Now {
            utc: Utc::now(),
            status: Timestamp::from_second(precise.as_second()).unwrap_or_default(),
            precise,
        }
    }
}

impl Walk<'_> {
    /// Runs one step of the walk: plans on the pass's view, the step's answers and the
    /// step's clock, applies the plan, and while the step asks for reads ([`Next::Replan`])
    /// fetches them and plans again. `Ok`: the step handed over to the next one. A step that
    /// ends the pass or fails first writes step 5's stamps still pending (steps 6–10); its
    /// own error comes before theirs.
    pub(in crate::cocoonset::walk) async fn step<F>(
        &mut self,
        step: Step,
        planner: F,
    ) -> Result<(), Stop>
    where
        F: FnMut(&Observed<'_>, &Answers, &Now) -> StepPlan,
    {
        let ran = if step.replayed {
            self.run_replayed(planner).await
        } else {
            self.run_rounds(planner).await
        };
        let next = match ran {
            Ok(next) if step.sooner => self.sooner(next),
            Ok(next) => next,
            Err(e) => {
                let _ = self.flush_stamps().await;
                return Err(Stop::Failed(e));
            }
        };
        let action = match next {
            Next::Continue | Next::Replan => return Ok(()),
            Next::RequeueAfter(d) => Action::requeue(d),
            Next::AwaitChange => Action::await_change(),
        };
        self.flush_stamps().await?;
        debug!(namespace = %self.ns, name = %self.name, step = step.name, ?next, "the step ends the pass");
        Err(Stop::End(action))
    }

    /// `next`, or the pass's smallest backoff when that comes sooner.
    fn sooner(&self, next: Next) -> Next {
        match (next, self.min_backoff) {
            (Next::RequeueAfter(d), Some(b)) => Next::RequeueAfter(d.min(b)),
            (Next::AwaitChange, Some(b)) => Next::RequeueAfter(b),
            (next, _) => next,
        }
    }

    /// The rounds of a step: plans on the pass's view and the step's answers, applies the
    /// writes, and while the step asks for reads ([`Next::Replan`]) fetches them and plans
    /// again. Returns what the pass does next.
    async fn run_rounds<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&Observed<'_>, &Answers, &Now) -> StepPlan,
    {
        let now = Now::read();
        let mut answers = Answers::default();
        for _ in 0..MAX_ROUNDS {
            let plan = planner(&self.observed(), &answers, &now);
            let reads = plan.reads.clone();
            let applied = self.apply(plan).await?;
            answers.created.extend(applied.created);
            answers.dropped.extend(self.dropped.drain(..));
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
    async fn run_replayed<F>(&mut self, mut planner: F) -> Result<Next, Error>
    where
        F: FnMut(&Observed<'_>, &Answers, &Now) -> StepPlan,
    {
        let now = Now::read();
        let start = self.cs.clone();
        let mut answers = Answers::default();
        let mut applied: Vec<Effect> = Vec::new();
        let mut fetched: Vec<Read> = Vec::new();
        loop {
            let plan = planner(
                &Observed {
                    cs: &start,
                    ..self.observed()
                },
                &answers,
                &now,
            );
            let effects = plan.effects();
            if !effects.starts_with(&applied) {
                return Err(Error::Invalid(format!(
                    "a step of set {}/{} planned its earlier writes differently",
                    self.ns, self.name
                )));
            }
            let new = effects[applied.len()..].to_vec();
            let stuck = new.is_empty() && plan.reads.iter().all(|r| fetched.contains(r));
            if plan.next == Next::Replan && stuck {
                return Err(Error::Invalid(format!(
                    "a step of set {}/{} did not settle",
                    self.ns, self.name
                )));
            }
            applied.extend(new.iter().cloned());
            let next = StepPlan::of(new, plan.next);
            let done = self.apply(next).await?;
            answers.created.extend(done.created);
            if done.next != Next::Replan {
                return Ok(done.next);
            }
            fetched.extend(plan.reads.iter().cloned());
            self.fetch_all(plan.reads, &mut answers).await?;
        }
    }

    /// Applies `plan`'s writes in order, each note once the writes planned before it went
    /// through; returns what comes next and what the writes observed.
    async fn apply(&mut self, plan: StepPlan) -> Result<Applied, Error> {
        let mut created = Vec::new();
        let mut notes = plan.noted.into_iter().peekable();
        for (i, write) in plan.writes.into_iter().enumerate() {
            while let Some((_, note)) = notes.next_if(|(at, _)| *at <= i) {
                self.note(note).await;
            }
            created.extend(self.apply_one(write).await?);
        }
        for (_, note) in notes {
            self.note(note).await;
        }
        Ok(Applied {
            next: plan.next,
            created,
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
                self.delete_own_tag(&vm, tag)
                    .await
                    .map_err(|e| Error::registry(step, format!("delete {vm}:{tag}"), e))?;
                self.dropped.push(format!("{vm}:{tag}"));
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
            Write::Fail(message) => return Err(Error::Invalid(message)),
            Write::ReclaimTags { vms, step } => self.reclaim_tags(&vms, step).await?,
            Write::SpecPatch {
                patch,
                field_manager,
            } => self.patch_spec(patch, field_manager).await?,
            Write::FailProbe { step } => {
                if let Some((what, e)) = self.probe_error.take() {
                    return Err(Error::registry(step, what, e));
                }
            }
        }
        Ok(Vec::new())
    }

    /// One note: nothing in it is a write, and nothing in it fails the pass.
    async fn note(&mut self, note: Note) {
        match note {
            Note::Backoff(d) => self.note_backoff(d),
            Note::InvalidSpec(invalid) => self.invalid = Some(invalid),
            Note::Log { warn, message } => {
                if warn {
                    warn!(namespace = %self.ns, name = %self.name, "{message}");
                } else {
                    info!(namespace = %self.ns, name = %self.name, "{message}");
                }
            }
            Note::Changed => self.changed = true,
            Note::Event {
                warning,
                reason,
                message,
            } => self.event(warning, reason, message).await,
            Note::Count(counter) => {
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
                    Counter::IdleSuspend => {
                        m.idle_suspends.inc();
                    }
                    Counter::IdleWake { trigger } => {
                        m.idle_wakes
                            .get_or_create(&crate::metrics::TriggerLabel {
                                trigger: trigger.to_owned(),
                            })
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
    }
}
