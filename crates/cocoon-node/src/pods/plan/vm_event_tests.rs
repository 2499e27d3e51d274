//! Table tests of the VM event watcher's decisions, row by row as `node.md` §10 states them
//! ("Dispatch", "handleVMGone", "Restart with cooldown", "Deferred recheck").

use std::time::{Duration, Instant};

use cocoon_runtime::{EventKind, VmEvent, VmRecord};

use super::vm_event::{
    AfterRemove, Cooldown, Eviction, Leave, OnGone, Recheck, Tracked, after_remove, after_start,
    leave_alone, means_gone, on_inspect, recheck,
};
use crate::pods::rules::InspectOutcome;

fn event(kind: EventKind, id: &str, name: &str, state: &str) -> VmEvent {
    let mut vm = VmRecord {
        id: id.into(),
        state: state.into(),
        ..VmRecord::default()
    };
    vm.config.name = name.into();
    VmEvent { kind, vm }
}

fn state(s: &str) -> InspectOutcome {
    InspectOutcome::State(s.into())
}

fn evict(reason: &'static str, message: &str) -> Eviction {
    Eviction::new(reason, message)
}

#[test]
fn dispatch_table() {
    use EventKind::*;
    let rows = [
        (
            "DELETED → handleVMGone",
            event(Deleted, "i", "vm", "running"),
            true,
        ),
        (
            "MODIFIED to stopped → handleVMGone",
            event(Modified, "i", "vm", "stopped"),
            true,
        ),
        (
            "MODIFIED to error → handleVMGone",
            event(Modified, "i", "", "error"),
            true,
        ),
        (
            "MODIFIED, by name only",
            event(Modified, "", "vm", "stopped (stale)"),
            true,
        ),
        (
            "MODIFIED to running → ignored",
            event(Modified, "i", "vm", "running"),
            false,
        ),
        (
            "ADDED → ignored, whatever its state",
            event(Added, "i", "vm", "stopped"),
            false,
        ),
        (
            "neither id nor name → dropped",
            event(Deleted, "", "", "stopped"),
            false,
        ),
    ];
    for (rule, ev, want) in rows {
        assert_eq!(means_gone(&ev), want, "{rule}");
    }
}

#[test]
fn which_pods_an_event_leaves_alone() {
    let live = Tracked::default();
    let rows = [
        (
            "no tracked pod matches the VM → ignore",
            None,
            Some(Leave::NoMatch),
        ),
        ("a tracked pod with its VM → inspect", Some(live), None),
        (
            "the hibernate annotation: its own Remove made the event → ignore",
            Some(Tracked {
                hibernate: true,
                ..live
            }),
            Some(Leave::Hibernate),
        ),
        (
            "a DeletePod in progress → ignore",
            Some(Tracked {
                deleting: true,
                ..live
            }),
            Some(Leave::Deleting),
        ),
        (
            "a resumed operation holds the claim → ignore",
            Some(Tracked {
                resumed: true,
                ..live
            }),
            Some(Leave::Resumed),
        ),
        (
            "an unmanaged pod's synthetic record is never a runtime VM → ignore",
            Some(Tracked {
                synthetic: true,
                hibernate: true,
                ..live
            }),
            Some(Leave::Synthetic),
        ),
    ];
    for (rule, tracked, want) in rows {
        assert_eq!(leave_alone(tracked.as_ref()), want, "{rule}");
    }
}

#[test]
fn inspect_outcome_table() {
    let now = Instant::now();
    let period = Duration::from_secs(30);
    let ago = |s: u64| Some(now - Duration::from_secs(s));
    let cd = |last: Option<Instant>| Cooldown { last, now, period };
    let cooldown =
        OnGone::RemoveThenEvict(evict("RestartCooldown", "restart cooldown not elapsed"));
    let rows = [
        (
            "not found → evict VMGone",
            InspectOutcome::NotFound,
            cd(None),
            OnGone::Evict(evict("VMGone", "vm no longer exists")),
        ),
        (
            "still transient → count and recheck later",
            InspectOutcome::Transient,
            cd(None),
            OnGone::Recheck,
        ),
        (
            "running → a false alarm",
            state("running"),
            cd(ago(1)),
            OnGone::Ignore,
        ),
        (
            "stopped, never restarted → restart",
            state("stopped"),
            cd(None),
            OnGone::Restart,
        ),
        (
            "error, restarted 31 s ago → restart",
            state("error"),
            cd(ago(31)),
            OnGone::Restart,
        ),
        (
            "stopped, restarted exactly 30 s ago → restart",
            state("stopped"),
            cd(ago(30)),
            OnGone::Restart,
        ),
        (
            "stopped (stale), restarted 5 s ago → remove, then evict RestartCooldown",
            state("stopped (stale)"),
            cd(ago(5)),
            cooldown.clone(),
        ),
        (
            "created, restarted just now → remove, then evict",
            state("created"),
            cd(Some(now)),
            cooldown,
        ),
        (
            "not found within the cooldown still evicts VMGone",
            InspectOutcome::NotFound,
            cd(Some(now)),
            OnGone::Evict(evict("VMGone", "vm no longer exists")),
        ),
    ];
    for (rule, outcome, cooldown, want) in rows {
        assert_eq!(on_inspect(&outcome, cooldown), want, "{rule}");
    }
}

#[test]
fn restart_and_remove_outcomes() {
    assert_eq!(after_start(Ok(())), None, "started: refresh the record");
    assert_eq!(
        after_start(Err("vm x: start: exit status 1".into())),
        Some(evict("RestartFailed", "vm x: start: exit status 1")),
        "a failed start: remove, then evict RestartFailed with the start error"
    );
    let e = evict("RestartFailed", "boom");
    let rows = [
        (
            "removed (or already gone) → evict",
            Ok(()),
            AfterRemove::Evict(e.clone()),
        ),
        (
            "the remove failed → keep the pod and its VM tracked",
            Err("busy".to_owned()),
            AfterRemove::Keep("busy".into()),
        ),
    ];
    for (rule, removed, want) in rows {
        assert_eq!(after_remove(removed, e.clone()), want, "{rule}");
    }
}

#[test]
fn deferred_recheck_table() {
    let budget = Duration::from_secs(30 * 60);
    let early = Duration::from_secs(3);
    let rows = [
        (
            "not found → evict VMGone",
            InspectOutcome::NotFound,
            early,
            Recheck::Evict(evict("VMGone", "vm no longer exists")),
        ),
        (
            "transient within the budget → back off",
            InspectOutcome::Transient,
            early,
            Recheck::BackOff,
        ),
        (
            "transient with the 30 min budget used up → evict VMInspectTimeout",
            InspectOutcome::Transient,
            budget,
            Recheck::Evict(evict(
                "VMInspectTimeout",
                "vm inspect did not resolve within budget",
            )),
        ),
        ("running → stop", state("running"), budget, Recheck::Stop),
        (
            "not running → replay through handleVMGone",
            state("stopped"),
            early,
            Recheck::Replay("stopped".into()),
        ),
    ];
    for (rule, outcome, elapsed, want) in rows {
        assert_eq!(recheck(outcome, elapsed, budget), want, "{rule}");
    }
}
