//! Stale-create reconciliation's decisions (`node.md` §14, "Stale-create reconciliation";
//! §9.1 step 3) as pure functions over what its shell ([`crate::pods::stale`]) observed: what
//! the answer of `reconcile-stale-create` means at startup, what the inspect after
//! `not-creating` means, and each turn of the background watcher (adopt, orphan policy, ask
//! again, look again, give up). Nothing here does I/O or reads a clock.
//!
//! The rules:
//! * `collected` or `not-found` frees the name (the pod's CreatePod creates the VM again);
//!   `busy`, or a verb error, starts the watcher; `not-creating` → inspect again;
//! * inspected again: still `creating` → watch the fresh record; any other state → reconcile
//!   it like any listed VM; gone → the name is free; the inspect failed → watch the listed
//!   record;
//! * the watcher: gone → the name is free; `running` → index it by name for adoption; any
//!   other state but `creating` (dead) → the orphan policy, unless a pod already tracks the
//!   VM; still `creating` → ask the verb again (a verb error may have been transient), over
//!   only when it frees the name; an inspect error → look again; after the budget → give up;
//! * the agent never removes a `creating` record itself: no answer here is a remove.

use std::time::Duration;

use cocoon_runtime::types::STATE_CREATING;
use cocoon_runtime::{RuntimeError, StaleCreateOutcome, VmRecord};

use crate::pods::rules::{self, InspectOutcome, StaleCreateAction, StaleWatchStep};

/// What one inspect of the VM says (no retry: the watcher looks again anyway).
pub(crate) fn outcome(inspected: &Result<VmRecord, RuntimeError>) -> InspectOutcome {
    match inspected {
        Ok(r) => InspectOutcome::State(r.state.clone()),
        Err(e) if e.is_vm_not_found() => InspectOutcome::NotFound,
        Err(_) => InspectOutcome::Transient,
    }
}

/// Which record the watcher follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// The record of the startup listing.
    Listed,
    /// The record the inspect just returned.
    Fresh,
}

/// What the startup reconcile does next with a `creating` VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The name is free: the VM stays out of the indexes.
    NameFreed,
    /// Watch the VM in the background, from this record.
    Watch(Record),
    /// Inspect the VM again (then [`on_reinspect`]).
    InspectAgain,
    /// The VM left `creating`: reconcile the fresh record like any listed VM.
    ReconcileAsListed,
}

/// The verb's answer at startup; `None` when the verb failed.
pub(crate) fn on_answer(answer: Option<StaleCreateOutcome>) -> Next {
    match rules::stale_create_action(answer) {
        StaleCreateAction::NameFreed => Next::NameFreed,
        StaleCreateAction::Watch => Next::Watch(Record::Listed),
        StaleCreateAction::InspectAgain => Next::InspectAgain,
    }
}

/// The inspect after a `not-creating` answer.
pub(crate) fn on_reinspect(outcome: &InspectOutcome) -> Next {
    match outcome {
        InspectOutcome::State(s) if s == STATE_CREATING => Next::Watch(Record::Fresh),
        InspectOutcome::State(_) => Next::ReconcileAsListed,
        InspectOutcome::NotFound => Next::NameFreed,
        InspectOutcome::Transient => Next::Watch(Record::Listed),
    }
}

/// How a watch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The VM is gone, or the verb collected it: the name is free.
    NameFreed,
    /// The create finished and the VM runs: index it by name, so the pod's CreatePod adopts it.
    IndexForAdoption,
    /// The VM is dead and no pod tracks it: the orphan policy.
    OrphanPolicy,
    /// The VM is dead but a pod already tracks it: that pod owns it.
    Owned,
}

/// One turn of the watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The watch is over (pod creates waiting out a backoff are told to try again).
    Over(End),
    /// Still `creating`: ask `reconcile-stale-create` again (then [`after_ask_again`]).
    AskAgain,
    /// Back off and look again (unless [`give_up`]).
    LookAgain,
}

/// The watcher's rule over a fresh inspect; `owned`: a tracked pod references the VM's id.
pub(crate) fn watch_turn(outcome: &InspectOutcome, owned: bool) -> Turn {
    match rules::stale_watch_step(outcome) {
        StaleWatchStep::Freed => Turn::Over(End::NameFreed),
        StaleWatchStep::Adopt => Turn::Over(End::IndexForAdoption),
        StaleWatchStep::Orphan if owned => Turn::Over(End::Owned),
        StaleWatchStep::Orphan => Turn::Over(End::OrphanPolicy),
        StaleWatchStep::StillCreating => Turn::AskAgain,
        StaleWatchStep::Retry => Turn::LookAgain,
    }
}

/// The verb's answer when asked again by the watcher.
pub(crate) fn after_ask_again(answer: Option<StaleCreateOutcome>) -> Turn {
    match rules::stale_create_action(answer) {
        StaleCreateAction::NameFreed => Turn::Over(End::NameFreed),
        StaleCreateAction::Watch | StaleCreateAction::InspectAgain => Turn::LookAgain,
    }
}

/// After a turn that did not end the watch: whether the budget is used up (the `creating`
/// record is then left to the runtime).
pub(crate) fn give_up(elapsed: Duration, budget: Duration) -> bool {
    elapsed >= budget
}
