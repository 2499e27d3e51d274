//! The seed's reconcile steps as pure planners, one module per step.
//!
//! Each step reads what the pass has observed so far ([`Observed`]) and returns a
//! [`StepPlan`]: the writes to make, in order, and what the pass does next. The executor
//! (`super::executor`) applies the writes one after another, each durable before the next,
//! stops at the first error, and mirrors what they changed into the pass's view before the
//! next step plans. No planner talks to the API server or the registry.

pub mod classify;
pub mod failed_main;
pub mod finalizer;
pub mod main;
pub mod release_wake;
pub mod stamp;
pub mod status;
pub mod sub_agents;
pub mod teardown;
pub mod toolboxes;
pub mod triage;

use std::collections::BTreeSet;
use std::time::Duration;

use cocoon_api::contract::{AnnotationCodec, AnnotationDelta, ReclaimRecord};
use cocoon_api::crd::set::{CocoonSet, CocoonSetStatus};
use cocoon_api::naming::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::plan::{CreateFacts, GcItem, TagRead, Timing};
use super::pods::{self, Classified};

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
    /// Replace the set's finalizer list, under a resourceVersion precondition. `gone_ok`:
    /// a set already gone counts as done (the last finalizer's removal).
    Finalizers {
        list: Vec<String>,
        resource_version: Option<String>,
        gone_ok: bool,
    },
    /// Delete a pod (NotFound is success).
    DeletePod(String),
    /// Merge-patch a pod's annotations; its pending step-5 stamp rides along.
    PatchPod {
        name: String,
        delta: AnnotationDelta,
    },
    /// Create a pod through the create protocol (§7): read its VM's `:hibernate` manifest,
    /// drop the tag under the image rule, forget the VM from the reclaim record, mark for
    /// restore, post. `step` names the step in a registry error. Its outcome is fed back to
    /// the step ([`Applied::created`]).
    CreatePod {
        pod: Box<Pod>,
        facts: CreateFacts<'static>,
        step: &'static str,
    },
    /// [`Write::CreatePod`] of several pods at once, at most `at_once` in flight; the VMs to
    /// forget go out together once all are done, then the first error, if any, fails the
    /// pass.
    CreatePods {
        jobs: Vec<(Pod, CreateFacts<'static>)>,
        step: &'static str,
        at_once: usize,
    },
    /// Delete `<vm>:<tag>` from the registry (absent is success); a refusal fails the pass
    /// with `step` as its context.
    DropTag {
        vm: String,
        tag: &'static str,
        step: &'static str,
    },
    /// Count one of the set's metric series.
    Count(Counter),
    /// Step 2.4's registry GC: every VM's `:hibernate` tag is tried and the failures are
    /// returned together; `:latest` (where listed) is best-effort.
    GcTags(Vec<GcItem>),
    /// Merge-patch the set's status (nothing when it already carries it).
    Status(CocoonSetStatus),
    /// Publish an Event on the set.
    Event {
        warning: bool,
        reason: &'static str,
        message: String,
    },
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
}

/// Outcome of a [`Write::CreatePod`].
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
    /// End the pass; run again after this long.
    RequeueAfter(Duration),
    /// End the pass; run again on the next change of the set or its pods.
    AwaitChange,
}

/// A step's decision: its writes in order, then what comes next.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    pub writes: Vec<Write>,
    pub next: Next,
}

impl StepPlan {
    /// No write; hand over to the next step.
    pub fn proceed() -> Self {
        StepPlan {
            writes: Vec::new(),
            next: Next::Continue,
        }
    }

    /// `writes`, then `next`.
    pub fn then(writes: Vec<Write>, next: Next) -> Self {
        StepPlan { writes, next }
    }
}

/// The create facts of `pod` (its role, its VM's standing in the reclaim record, restore
/// intent); the executor fills in the image and the tag read.
pub fn create_facts(
    o: &Observed<'_>,
    pod: &Pod,
    role: Role,
    restorable: &BTreeSet<String>,
    unconditional: bool,
) -> CreateFacts<'static> {
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let vm = pods::vm_name(pod);
    CreateFacts {
        role,
        image: "",
        tag: TagRead::Skipped,
        recorded: record.contains_vm(vm),
        owed_restore: record.owes_restore(vm),
        cr_restorable: restorable.contains(&pod.name_any()),
        unconditional_intent: unconditional,
    }
}
