//! DeletePod (`node.md` §7) as a plan: the routine snapshot by role and policy, the VM's
//! removal, the local snapshot cleanup unless `keep-snapshot-on-delete`, and forgetting the
//! pod.
//!
//! The ordering rules the plan carries:
//! * an unmanaged VM (or an unmanaged pod's synthetic record) is never touched: the pod is
//!   only forgotten and reported `Succeeded`;
//! * a pod without a VM (hibernated, never created, evicted) only loses its local snapshots,
//!   unless `keep` (the warm-wake cache of a seat release) or the VM name is not provably
//!   its own (tenant isolation);
//! * the routine snapshot goes before the remove and never blocks it;
//! * then the graceful stop (issue 40): `vm stop --timeout <grace>`, bounded by the pod's
//!   grace period ([`stop_grace`]), never blocks the remove either; what each of its outcomes
//!   leads to is [`stop_report`]'s table;
//! * a failed remove fails the delete with the VM still tracked (the controller retries);
//! * the local snapshots go after the remove, awaited, so an immediate recreate cannot race
//!   them; then the pod is forgotten and reported `Succeeded`.

use cocoon_api::contract::SnapshotPolicy;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::metrics::node as m;
use cocoon_api::naming::{Role, should_snapshot_vm};

use super::{Action, Failure, Step};

/// The gate before a delete is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// An eviction is deleting the pod: it forgets the pod and writes its `Failed` status
    /// (§10), so the delete succeeds with nothing to do (never `Succeeded` over `Failed`).
    Evicting,
    /// A resumed operation holds the pod (§9.3): fail with `resumed operation still in
    /// flight for <key>`.
    InFlight,
    /// Plan it.
    Pass,
}

/// The gate: an eviction in progress first, then a resumed operation's claim.
pub(crate) fn gate(evicting: bool, resumed: bool) -> Gate {
    if evicting {
        Gate::Evicting
    } else if resumed {
        Gate::InFlight
    } else {
        Gate::Pass
    }
}

/// The pod's tracked VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vm<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// An unmanaged pod's synthetic record.
    pub synthetic: bool,
}

/// What a delete is planned from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// `managed` as the pod was admitted.
    pub managed: bool,
    /// The tracked VM.
    pub vm: Option<Vm<'a>>,
    /// `vm.cocoonstack.io/keep-snapshot-on-delete`.
    pub keep: bool,
    /// Without a tracked VM: the VM name whose local snapshots are the pod's, and whether
    /// tenant isolation lets the pod drop them (`tenant::delete_may_drop_snapshots`).
    pub vm_name: &'a str,
    pub may_drop: bool,
    /// The routine snapshot's policy and the pod's role (`contract.md` §2.3).
    pub policy: SnapshotPolicy,
    pub role: Role,
    /// A registry is configured.
    pub registry: bool,
    /// The pod's image (recorded as the routine snapshot's base image).
    pub image: &'a str,
    /// The graceful-stop budget in seconds ([`stop_grace`]); 0 = no stop.
    pub grace_secs: u64,
}

/// The kubelet's default grace period, for a pod that gives none.
pub(crate) const DEFAULT_GRACE_SECS: u64 = 30;
/// The longest graceful stop a delete waits for, whatever the pod asks: the delete holds the
/// pod's operations while it waits.
pub(crate) const MAX_STOP_GRACE_SECS: u64 = 600;

/// The graceful-stop budget of a deleted pod, as a kubelet reads it:
/// `metadata.deletionGracePeriodSeconds` when set (what the delete request asked), else
/// `spec.terminationGracePeriodSeconds`, else 30; a negative value reads as 0 (no stop), and
/// the result is capped at [`MAX_STOP_GRACE_SECS`].
pub(crate) fn stop_grace(deletion: Option<i64>, termination: Option<i64>) -> u64 {
    deletion
        .or(termination)
        .map_or(DEFAULT_GRACE_SECS, |s| u64::try_from(s).unwrap_or(0))
        .min(MAX_STOP_GRACE_SECS)
}

/// How the graceful stop before the remove went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopResult {
    /// The guest shut down within the grace period.
    Stopped,
    /// The runtime no longer knows the VM.
    Gone,
    /// The grace period ran out first (the stop call was dropped, killing `cocoon vm stop`).
    TimedOut,
    /// The installed runtime has no `vm stop`.
    Unsupported(String),
    /// `vm stop` failed (its error text).
    Failed(String),
}

/// What a delete reports about its graceful stop; the remove follows in every case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StopReport {
    /// Log at warn (else info).
    pub warn: bool,
    /// The log line.
    pub log: String,
    /// A Warning Event on the pod: reason and message.
    pub event: Option<(&'static str, String)>,
}

/// The graceful-stop table (README "Deleting a pod: graceful stop"):
///
/// | stop result | log | Warning Event |
/// |---|---|---|
/// | stopped | info `vm <id> stopped within its grace period of <n>s` | — |
/// | gone | info `vm <id> already gone before its stop` | — |
/// | timed out | warn `vm <id> did not stop within <n>s; removing it by force` | `VMStopTimeout`, same text |
/// | failed | warn `stop vm <id>: <err>; removing it by force` | `VMStopFailed`, same text |
/// | unsupported | warn `<err>; removing vm <id> by force` | — (a node-wide condition, logged) |
pub(crate) fn stop_report(id: &str, grace_secs: u64, result: &StopResult) -> StopReport {
    let quiet = |log: String| StopReport {
        warn: false,
        log,
        event: None,
    };
    let loud = |reason: &'static str, log: String| StopReport {
        warn: true,
        event: Some((reason, log.clone())),
        log,
    };
    match result {
        StopResult::Stopped => quiet(format!(
            "vm {id} stopped within its grace period of {grace_secs}s"
        )),
        StopResult::Gone => quiet(format!("vm {id} already gone before its stop")),
        StopResult::TimedOut => loud(
            ev::VM_STOP_TIMEOUT,
            format!("vm {id} did not stop within {grace_secs}s; removing it by force"),
        ),
        StopResult::Failed(e) => loud(
            ev::VM_STOP_FAILED,
            format!("stop vm {id}: {e}; removing it by force"),
        ),
        StopResult::Unsupported(e) => StopReport {
            warn: true,
            log: format!("{e}; removing vm {id} by force"),
            event: None,
        },
    }
}

/// The delete's steps.
pub(crate) fn plan(f: &Facts<'_>) -> Vec<Step> {
    if !f.managed || f.vm.is_some_and(|v| v.synthetic) {
        return vec![Step::then(Action::FinishDelete)];
    }
    let Some(vm) = f.vm else {
        let mut steps = Vec::new();
        if !f.keep && !f.vm_name.is_empty() {
            steps.push(Step::then(if f.may_drop {
                Action::DropLocalSnapshots {
                    vm: f.vm_name.to_owned(),
                }
            } else {
                Action::Warn(format!(
                    "not dropping the local snapshots of VM {}, which is not this pod's",
                    f.vm_name
                ))
            }));
        }
        let reason = if f.keep {
            m::REASON_SEAT_RELEASE
        } else {
            m::REASON_NO_VM
        };
        steps.extend([
            Step::then(Action::Forget),
            Step::then(Action::CountLifecycle {
                op: ev::OP_DELETE,
                result: m::RESULT_SKIPPED,
                reason,
            }),
        ]);
        return steps;
    };
    let mut steps = Vec::new();
    if should_snapshot_vm(f.policy, f.role) && f.registry && !vm.name.is_empty() {
        steps.push(Step::then(Action::RoutineSnapshot {
            name: vm.name.to_owned(),
            id: vm.id.to_owned(),
            base_image: f.image.to_owned(),
        }));
    }
    if f.grace_secs > 0 {
        steps.push(Step::then(Action::StopVm {
            id: vm.id.to_owned(),
            grace_secs: f.grace_secs,
        }));
    }
    steps.push(
        Step::then(Action::RemoveVm {
            id: vm.id.to_owned(),
        })
        .or_fail(Failure::unreported(format!("remove vm {}", vm.id))),
    );
    if !f.keep {
        steps.push(Step::then(Action::DropLocalSnapshotsBounded {
            vm: vm.name.to_owned(),
        }));
    }
    steps.extend([
        Step::then(Action::FinishDelete),
        Step::then(Action::CountLifecycle {
            op: ev::OP_DELETE,
            result: m::RESULT_OK,
            reason: "",
        }),
    ]);
    steps
}
