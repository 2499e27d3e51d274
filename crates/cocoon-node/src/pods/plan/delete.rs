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
