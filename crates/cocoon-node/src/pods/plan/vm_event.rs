//! The VM event watcher's decisions (`node.md` §10) as pure functions over what its shell
//! ([`crate::pods::events`]) observed: which events mean a VM is gone, which tracked pods
//! such an event leaves alone, what the inspect outcome then means (nothing, evict, recheck,
//! restart, or remove-then-evict once the cooldown forbids a restart), what a failed start
//! or remove leads to, and each turn of the deferred recheck. The shell gathers the facts,
//! asks these, and applies the answer; nothing here does I/O or reads a clock.
//!
//! The rules, as §10 states them:
//! * `DELETED`, and `MODIFIED` to any state but `running`, go to handleVMGone; the rest
//!   (`ADDED` included) is ignored, and so is an event whose VM has neither id nor name;
//! * a pod carrying the hibernate annotation is left alone (the hibernate's own Remove made
//!   the event), and so are a pod being deleted, a pod claimed by a resumed operation and an
//!   unmanaged pod's synthetic record;
//! * not found → evict `VMGone`; transient → count and recheck later; `running` → a false
//!   alarm; any other state → restart in place, unless the last restart of that VM id is
//!   less than the cooldown ago: then remove the VM and evict `RestartCooldown`;
//! * a failed start → remove the VM and evict `RestartFailed` with the start error;
//! * a remove before an eviction that fails (other than "not found") keeps the pod: evicting
//!   would orphan a live VM and collide on its name at the recreate.

use std::time::{Duration, Instant};

use cocoon_api::contract::events::eviction as ev;
use cocoon_runtime::types::STATE_RUNNING;
use cocoon_runtime::{EventKind, VmEvent};

use crate::pods::rules::{self, GoneAction, InspectOutcome};

/// An eviction: the terminated container's reason and message (`contract.md` §10.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Eviction {
    pub reason: &'static str,
    pub message: String,
}

impl Eviction {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Eviction {
            reason,
            message: message.into(),
        }
    }
}

/// The dispatch of §10: whether `event` goes to handleVMGone.
pub(crate) fn means_gone(event: &VmEvent) -> bool {
    if event.vm.id.is_empty() && event.vm.name().is_empty() {
        return false;
    }
    match event.kind {
        EventKind::Deleted => true,
        EventKind::Modified => event.vm.state != STATE_RUNNING,
        EventKind::Added => false,
    }
}

/// What the shell knows of the tracked pod (with a tracked VM) an event's VM belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tracked {
    /// The tracked VM record is an unmanaged pod's synthetic one (never a runtime VM).
    pub synthetic: bool,
    /// The pod carries the hibernate annotation.
    pub hibernate: bool,
    /// The pod has a `deletionTimestamp` (DeletePod removes the VM itself).
    pub deleting: bool,
    /// A resumed startup operation holds the pod's claim.
    pub resumed: bool,
}

/// Why handleVMGone leaves a pod alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// No tracked pod (with a VM) matches the event's VM id or name.
    NoMatch,
    /// The VM record is synthetic.
    Synthetic,
    /// The hibernate's own Remove produced the event.
    Hibernate,
    /// A DeletePod in progress produced the event.
    Deleting,
    /// A resumed operation owns the pod for now.
    Resumed,
}

/// Steps 1 and 2 of handleVMGone: `Some` = leave the pod alone, `None` = inspect the VM.
pub(crate) fn leave_alone(tracked: Option<&Tracked>) -> Option<Leave> {
    let Some(t) = tracked else {
        return Some(Leave::NoMatch);
    };
    if t.synthetic {
        Some(Leave::Synthetic)
    } else if t.hibernate {
        Some(Leave::Hibernate)
    } else if t.deleting {
        Some(Leave::Deleting)
    } else if t.resumed {
        Some(Leave::Resumed)
    } else {
        None
    }
}

/// The cooldown's inputs: the last in-place restart of the VM id (if one is remembered),
/// now, and the cooldown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cooldown {
    pub last: Option<Instant>,
    pub now: Instant,
    pub period: Duration,
}

/// What handleVMGone does once the VM was inspected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnGone {
    /// A false alarm (the VM runs).
    Ignore,
    /// Evict the pod.
    Evict(Eviction),
    /// Count `cocoon_vk_vm_inspect_transient_fail_total` and schedule a deferred recheck.
    Recheck,
    /// Record now as the last restart and `vm start` the VM in place (see [`after_start`]).
    Restart,
    /// Remove the VM, then evict (see [`after_remove`]).
    RemoveThenEvict(Eviction),
}

/// Steps 3–4 of handleVMGone and the cooldown rule.
pub(crate) fn on_inspect(outcome: &InspectOutcome, cooldown: Cooldown) -> OnGone {
    match rules::gone_action(outcome) {
        GoneAction::Ignore => OnGone::Ignore,
        GoneAction::Evict(reason, message) => OnGone::Evict(Eviction::new(reason, message)),
        GoneAction::Recheck => OnGone::Recheck,
        GoneAction::Restart
            if rules::cooldown_allows_restart(cooldown.last, cooldown.now, cooldown.period) =>
        {
            OnGone::Restart
        }
        GoneAction::Restart => OnGone::RemoveThenEvict(Eviction::new(
            ev::RESTART_COOLDOWN,
            ev::RESTART_COOLDOWN_MESSAGE,
        )),
    }
}

/// After the in-place `vm start`: `Some` = remove the VM, then evict with this; `None` = the
/// VM runs again (refresh the tracked record's PID and NICs).
pub(crate) fn after_start(started: Result<(), String>) -> Option<Eviction> {
    started.err().map(|e| Eviction::new(ev::RESTART_FAILED, e))
}

/// What the remove before an eviction leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterRemove {
    /// The VM is gone: evict.
    Evict(Eviction),
    /// The remove failed (this error): keep the pod and the VM tracked.
    Keep(String),
}

/// After the remove of a remove-then-evict; `removed` is [`super::removed`] of its outcome
/// (a VM the runtime no longer knows counts as removed).
pub(crate) fn after_remove(removed: Result<(), String>, eviction: Eviction) -> AfterRemove {
    match removed {
        Ok(()) => AfterRemove::Evict(eviction),
        Err(e) => AfterRemove::Keep(e),
    }
}

/// One turn of the deferred recheck, after its inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// Evict the pod and stop.
    Evict(Eviction),
    /// Still transient within the budget: back off and inspect again.
    BackOff,
    /// The VM runs: stop.
    Stop,
    /// The VM is in this other state: replay it through handleVMGone (which keeps the
    /// cooldown logic in one place) and stop.
    Replay(String),
}

/// The deferred recheck's rule; `elapsed` is the time since the loop started.
pub(crate) fn recheck(outcome: InspectOutcome, elapsed: Duration, budget: Duration) -> Recheck {
    match outcome {
        InspectOutcome::NotFound => Recheck::Evict(Eviction::new(ev::VM_GONE, ev::VM_GONE_MESSAGE)),
        InspectOutcome::Transient if elapsed >= budget => Recheck::Evict(Eviction::new(
            ev::VM_INSPECT_TIMEOUT,
            ev::VM_INSPECT_TIMEOUT_MESSAGE,
        )),
        InspectOutcome::Transient => Recheck::BackOff,
        InspectOutcome::State(s) if s == STATE_RUNNING => Recheck::Stop,
        InspectOutcome::State(s) => Recheck::Replay(s),
    }
}
