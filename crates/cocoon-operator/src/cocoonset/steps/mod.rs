//! The seed's reconcile steps as pure planners, one module per step: teardown (2),
//! finalizer (3), classify (4), stamp (5), idle (issue 39, between 5 and 6), suspend (6), failed_main (7), migrate (8),
//! release_wake (9), unsuspend (10), main_agent (11), sub_agents (12), toolboxes (13) and
//! status (14). A step with rules of its own is a folder: `mod.rs` the planner, `rules.rs`
//! the pure rules, `rules_tests.rs` their table tests. The rules several steps share are in
//! [`crate::cocoonset::shared`].
//!
//! Each step reads what the pass has observed so far ([`Observed`]) and returns a
//! [`StepPlan`]: the writes to make, in order, its notes (log lines, metric increments,
//! Events, facts for step 14: [`Note`]), the reads it needs, and what the pass does next. The executor (`walk/executor/`) applies the writes one after another, each
//! durable before the next, stops at the first error, and mirrors what they changed into
//! the pass's view before the next step plans. A step that needs a registry probe, a manifest
//! read or a read past the cache asks for it ([`Read`], [`Next::Replan`]): the executor
//! fetches it into the step's [`Answers`] and the step plans again on them. No planner talks
//! to the API server or the registry.

pub mod classify;
pub mod failed_main;
pub mod finalizer;
pub mod idle;
pub mod main_agent;
#[cfg(test)]
mod main_agent_tests;
pub mod migrate;
pub mod release_wake;
pub mod stamp;
pub mod status;
pub mod sub_agents;
pub mod suspend;
pub mod teardown;
pub mod toolboxes;
pub mod unsuspend;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cocoon_api::contract::{AnnotationCodec, AnnotationDelta, ReclaimRecord, apply_delta};
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use cocoon_api::crd::hibernation::CocoonHibernation;
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use self::teardown::rules::GcItem;
use super::Timing;
use super::pods::Classified;
use super::shared::create::rules::TagRead;

/// What a step sees: the set as this pass knows it (its own writes mirrored in), the
/// controller-owned pods from the cache (terminating ones included), their step-4
/// classification, and the timing.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub cs: &'a CocoonSet,
    pub ns: &'a str,
    pub owned: &'a [Pod],
    pub classified: &'a Classified,
    pub timing: &'a Timing,
}

impl Observed<'_> {
    pub fn generation(&self) -> i64 {
        self.cs.metadata.generation.unwrap_or(0)
    }
}

/// One write of a step. The executor applies them in the plan's order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Merge-patch the set's annotations (nothing when the delta changes nothing).
    SetAnnotations(AnnotationDelta),
    /// A finalizer merge patch of the shared helper ([`crate::controller`]), which replaces
    /// the list under a resourceVersion precondition. `gone_ok`: a set already gone counts
    /// as done (the last finalizer's removal).
    Finalizers {
        patch: serde_json::Value,
        gone_ok: bool,
    },
    /// Delete a pod (NotFound is success).
    DeletePod(String),
    /// Merge-patch a pod's annotations; its pending step-5 stamp rides along.
    PatchPod {
        name: String,
        delta: AnnotationDelta,
    },
    /// Delete `<vm>:<tag>` from the registry (absent is success); a refusal fails the pass
    /// with `step` as its context.
    DropTag {
        vm: String,
        tag: &'static str,
        step: &'static str,
    },
    /// Step 2.4's registry GC: every VM's `:hibernate` tag is tried and the failures are
    /// returned together; `:latest` (where listed) is best-effort.
    GcTags(Vec<GcItem>),
    /// Merge-patch the set's status (nothing when it already carries it).
    Status(CocoonSetStatus),
    /// [`Write::Status`] of the status for this phase, built from the pass's view as it is
    /// when the write goes out (the writes before it mirrored in).
    Phase(Option<CocoonSetPhase>),
    /// Step 8's durable marker: [`Write::Phase`] `Migrating`; its failure is reported as
    /// the marker's.
    MarkMigrating,
    /// Set the reclaim record to this one (a merge patch of what differs from the set's
    /// annotations as they are when the write goes out).
    Record(ReclaimRecord),
    /// Clear the reclaim record's suspended list (the record as it is when the write goes
    /// out).
    ClearSuspended,
    /// Remove these VMs from the reclaim record (nothing when none is recorded).
    ForgetVms(Vec<String>),
    /// Merge-patch several pods' annotations with the same delta, all at once (at most
    /// [`crate::cocoonset::POD_WRITES_AT_ONCE`] in flight), and mirror it into the
    /// classification; the first error once all have finished.
    MarkPods {
        names: Vec<String>,
        delta: AnnotationDelta,
    },
    /// [`Write::MarkPods`] and a [`Write::Phase`] status at once, where nothing orders the
    /// two (the status is built before the delta is mirrored).
    MarkPodsWithPhase {
        names: Vec<String>,
        delta: AnnotationDelta,
        phase: CocoonSetPhase,
    },
    /// [`Write::PatchPod`], best effort: a refusal is logged and the plan goes on (a lost
    /// lease still ends the pass).
    FlagPod {
        name: String,
        delta: AnnotationDelta,
    },
    /// Post a pod as it is (the create protocol's reads and drops already planned); its
    /// outcome is fed back ([`Answers::created`]).
    PostPod(Box<Pod>),
    /// [`Write::PostPod`] of several pods at once, at most `at_once` in flight; the outcomes
    /// are fed back in the pods' order once all have finished, then the first error, if
    /// any, fails the pass.
    PostPods { pods: Vec<Pod>, at_once: usize },
    /// Fail the pass with this message (a name collision).
    Fail(String),
    /// Delete `<vm>:hibernate` of each VM (at most
    /// [`crate::cocoonset::REGISTRY_CALLS_AT_ONCE`] in flight); the deleted ones leave the
    /// reclaim record, then the refusals fail the pass with `step` as their context.
    ReclaimTags {
        vms: Vec<String>,
        step: &'static str,
    },
    /// Fail the pass with the first registry error of the step's last [`Read::Probe`], the
    /// failed call and `step` as its context (nothing when it had none).
    FailProbe { step: &'static str },
    /// Merge-patch the set (its spec) with `patch` as `field_manager`, under the
    /// resourceVersion precondition the patch carries (the executor puts in the newest
    /// version the pass knows): a conflict is someone's write in between, logged, and the
    /// plan goes on (the idle suspend and the exec wake, issue 39).
    SpecPatch {
        patch: serde_json::Value,
        field_manager: &'static str,
    },
}

/// What a step tells beside its writes: a log line, a metric increment, an Event, or a fact
/// of the pass for step 14. The executor applies each once the writes planned before it
/// went through; none is a write of the set, its pods or the registry, none is mirrored into
/// the pass's view, and an Event it cannot publish does not fail the pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A log line naming the set.
    Log { warn: bool, message: String },
    /// Count one of the set's metric series.
    Count(Counter),
    /// Publish an Event on the set.
    Event {
        warning: bool,
        reason: &'static str,
        message: String,
    },
    /// The pass changed something (step 14 then looks again soon).
    Changed,
    /// A triaged pod's rebuild backoff still runs: step 14 looks again after at most this.
    Backoff(Duration),
    /// Step 13.1 found the spec invalid: step 14 reports it, nothing is retried.
    InvalidSpec(toolboxes::InvalidSpec),
}

/// `vec![…]` of writes and notes, as [`Effect`]s.
macro_rules! effects {
    ($($e:expr),* $(,)?) => {
        vec![$($crate::cocoonset::steps::Effect::from($e)),*]
    };
}
pub(crate) use effects;

/// A step's write or note, as a planner drafts them in one order; a [`StepPlan`] keeps them
/// apart ([`StepPlan::of`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Write(Write),
    Note(Note),
}

impl From<Write> for Effect {
    fn from(w: Write) -> Self {
        Effect::Write(w)
    }
}

impl From<Note> for Effect {
    fn from(n: Note) -> Self {
        Effect::Note(n)
    }
}

/// A metric counter to increment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counter {
    /// The set's `subagent_rebuild`.
    SubagentRebuild,
    /// The set's `subagent_dead_letter`.
    SubagentDeadLetter,
    /// `lifecycle_state_failed_observed{phase}`.
    LifecycleStateFailed { phase: String },
    /// The set's `slot_release_wake{placement}`.
    SlotReleaseWake { placement: String },
    /// The set's `slot_release_wake_unschedulable`.
    SlotReleaseWakeUnschedulable,
    /// The set's `slot_release_pods_deleted`.
    SlotReleasePodsDeleted,
    /// The set's `migrate_unschedulable`.
    MigrateUnschedulable,
    /// `idle_suspends`.
    IdleSuspend,
    /// `idle_wakes{trigger}`.
    IdleWake { trigger: &'static str },
}

/// A read a step needs before it can go on; the executor fetches it into [`Answers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// Probe `<vm>:<tag>` for each VM (at most
    /// [`crate::cocoonset::REGISTRY_CALLS_AT_ONCE`] in flight). With `fail`, a refusal fails
    /// the pass with that step as its context; without, it is fed back
    /// ([`Probed::error`]).
    Probe {
        vms: Vec<String>,
        tag: &'static str,
        fail: Option<&'static str>,
    },
    /// The `:hibernate` manifest of a VM, as the create protocol reads it (§7.1); a refusal
    /// fails the pass with `step` as its context.
    Manifest { vm: String, step: &'static str },
    /// The namespace's CocoonHibernations from the cache.
    CachedHibernations,
    /// The namespace's CocoonHibernations past the cache (one created a moment ago must not
    /// be missed).
    FreshHibernations,
    /// A pod read past the cache (`None`: it does not exist).
    Pod(String),
    /// The CocoonCheckpoint of this name in the set's namespace, from the cache
    /// (`spec.agent.fromCheckpoint`).
    CachedCheckpoint(String),
}

/// The answers to a step's reads so far, and the outcomes of its posts.
#[derive(Debug, Clone, Default)]
pub struct Answers {
    /// The last [`Read::Probe`].
    pub probed: Option<Probed>,
    /// [`Read::Manifest`] by VM.
    pub manifests: BTreeMap<String, TagRead>,
    pub cached_hibernations: Option<Vec<CocoonHibernation>>,
    pub fresh_hibernations: Option<Vec<CocoonHibernation>>,
    /// [`Read::Pod`] by name.
    pub pods: BTreeMap<String, Option<Pod>>,
    /// [`Read::CachedCheckpoint`]: `Some(None)` when the cache holds no such checkpoint.
    pub checkpoint: Option<Option<CocoonCheckpoint>>,
    /// The outcomes of the step's creates and posts so far, in order.
    pub created: Vec<Created>,
    /// `<vm>:<tag>` of every tag the step asked the registry to drop so far ([`Write::DropTag`]
    /// that reached it: deleted, or kept because it records another owner). A drop is a registry write no watch reports, so a step that waits for its
    /// effect reads it again in the same pass, and this tells it that it already dropped.
    pub dropped: BTreeSet<String>,
}

/// What a [`Read::Probe`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probed {
    /// Whether each probed tag exists (the refused ones are missing).
    pub exists: BTreeMap<String, bool>,
    /// The first refusal (in VM order), as text.
    pub error: Option<String>,
}

impl Probed {
    /// Every probed tag exists (and no probe was refused).
    pub fn all_exist(&self) -> bool {
        self.error.is_none() && self.exists.values().all(|e| *e)
    }
}

/// Outcome of a [`Write::PostPod`] (one per pod of a [`Write::PostPods`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    Yes,
    /// The pod exists already (the old one still terminating, or a racing pass).
    AlreadyExists,
}

/// What the executor observed while applying a plan, for the step to decide on.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub next: Next,
    /// The outcomes of the plan's creates, in order.
    pub created: Vec<Created>,
}

/// What the pass does after a step's writes went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Hand over to the next step.
    Continue,
    /// Fetch the plan's reads, then plan the same step again on the answers (and the
    /// outcomes of its posts).
    Replan,
    /// End the pass; run again after this long.
    RequeueAfter(Duration),
    /// End the pass; run again on the next change of the set or its pods.
    AwaitChange,
}

/// A step's decision: its writes in order, its notes, then its reads (with [`Next::Replan`]),
/// then what comes next.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    /// The API and registry writes, in order.
    pub writes: Vec<Write>,
    /// The notes, each with the number of writes planned before it: the executor applies a
    /// note once those went through.
    pub noted: Vec<(usize, Note)>,
    pub reads: Vec<Read>,
    pub next: Next,
}

impl StepPlan {
    /// No write; hand over to the next step.
    pub fn proceed() -> Self {
        StepPlan::then(Vec::new(), Next::Continue)
    }

    /// `writes`, then `next`.
    pub fn then(writes: Vec<Write>, next: Next) -> Self {
        StepPlan {
            writes,
            noted: Vec::new(),
            reads: Vec::new(),
            next,
        }
    }

    /// `writes`, then `reads`, then the step plans again.
    pub fn read(writes: Vec<Write>, reads: Vec<Read>) -> Self {
        StepPlan {
            next: Next::Replan,
            reads,
            ..StepPlan::then(writes, Next::Replan)
        }
    }

    /// The writes and notes of `effects`, kept apart in their order, then `next`.
    pub fn of(effects: Vec<Effect>, next: Next) -> Self {
        let mut plan = StepPlan::then(Vec::new(), next);
        for effect in effects {
            match effect {
                Effect::Write(w) => plan.writes.push(w),
                Effect::Note(n) => plan.noted.push((plan.writes.len(), n)),
            }
        }
        plan
    }

    /// [`StepPlan::of`] `effects`, then `reads`, then the step plans again.
    pub fn read_of(effects: Vec<Effect>, reads: Vec<Read>) -> Self {
        StepPlan {
            reads,
            ..StepPlan::of(effects, Next::Replan)
        }
    }

    /// [`StepPlan::of`] `effects`, then end the pass and run again after `d`.
    pub fn requeue_of(effects: Vec<Effect>, d: Duration) -> Self {
        StepPlan::of(effects, Next::RequeueAfter(d))
    }

    /// The notes, in order.
    pub fn notes(&self) -> impl Iterator<Item = &Note> {
        self.noted.iter().map(|(_, n)| n)
    }

    /// The writes and notes in the one order they were drafted in.
    pub fn effects(&self) -> Vec<Effect> {
        let mut out = Vec::new();
        let mut notes = self.noted.iter().peekable();
        for (i, w) in self.writes.iter().enumerate() {
            while let Some((_, n)) = notes.next_if(|(at, _)| *at <= i) {
                out.push(Effect::Note(n.clone()));
            }
            out.push(Effect::Write(w.clone()));
        }
        out.extend(notes.map(|(_, n)| Effect::Note(n.clone())));
        out
    }

    /// `writes`, then end the pass and run again after `d`.
    pub fn requeue(writes: Vec<Write>, d: Duration) -> Self {
        StepPlan::then(writes, Next::RequeueAfter(d))
    }
}

/// A log line for [`Note::Log`].
pub fn log(message: impl Into<String>) -> Note {
    Note::Log {
        warn: false,
        message: message.into(),
    }
}

/// A draft of a step's writes over several pods in a row, with the set as they leave it: the
/// annotation writes drafted so far applied to a copy, as the executor mirrors them, so a
/// decision on one pod reads the rebuild history the writes before it changed.
#[derive(Debug, Clone)]
pub struct Draft {
    pub cs: CocoonSet,
    pub effects: Vec<Effect>,
}

impl Draft {
    pub fn new(cs: &CocoonSet) -> Self {
        Draft {
            cs: cs.clone(),
            effects: Vec::new(),
        }
    }

    /// `o` with the set as the drafted writes leave it.
    pub fn observed<'a>(&'a self, o: &Observed<'a>) -> Observed<'a> {
        Observed { cs: &self.cs, ..*o }
    }

    pub fn push(&mut self, effect: impl Into<Effect>) {
        let effect = effect.into();
        let Effect::Write(w) = &effect else {
            self.effects.push(effect);
            return;
        };
        match w {
            Write::SetAnnotations(delta) => apply_delta(self.cs.annotations_mut(), delta),
            Write::ForgetVms(vms) => {
                let mut record = ReclaimRecord::from_meta(&self.cs.metadata);
                for vm in vms {
                    record.remove_vm(vm);
                }
                let delta = record.delta(self.cs.annotations());
                apply_delta(self.cs.annotations_mut(), &delta);
            }
            _ => {}
        }
        self.effects.push(effect);
    }

    pub fn extend<E: Into<Effect>>(&mut self, effects: impl IntoIterator<Item = E>) {
        for e in effects {
            self.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_keeps_its_writes_apart_from_its_notes_and_each_note_after_the_writes_before_it() {
        let drafted = effects![
            log("first"),
            Write::DeletePod("a".into()),
            Note::Changed,
            Note::Backoff(Duration::from_secs(3)),
            Write::DeletePod("b".into()),
        ];
        let plan = StepPlan::of(drafted.clone(), Next::Continue);
        assert_eq!(
            plan.writes,
            [Write::DeletePod("a".into()), Write::DeletePod("b".into())]
        );
        assert_eq!(
            plan.noted,
            [
                (0, log("first")),
                (1, Note::Changed),
                (1, Note::Backoff(Duration::from_secs(3))),
            ]
        );
        assert_eq!(
            plan.effects(),
            drafted,
            "the one order they were drafted in"
        );
        let trailing = StepPlan::of(effects![Write::ClearSuspended, log("done")], Next::Continue);
        assert_eq!(trailing.noted, [(1, log("done"))]);
        assert_eq!(trailing.notes().count(), 1);
    }
}
