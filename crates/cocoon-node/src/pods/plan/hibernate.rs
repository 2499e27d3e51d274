//! The hibernate of `node.md` §8.2 as a plan: save → push → clear the runtime annotations →
//! remove, each failure with its failOp reason and the compensations of what was done.
//!
//! The ordering rules the plan carries:
//! * the lifecycle goes `hibernating` first (a new attempt);
//! * the CH+Windows NIC drop comes before the save, and every later failure rolls it back;
//! * the VM id is cleared before the remove, so the operator's view of "manifest present,
//!   VM id still there" lasts one patch round trip; a failed clear is retried after it;
//! * a failed remove deletes the `:hibernate` tag only while the VM provably still exists, and
//!   the VM id comes back after the tag is gone and the NIC rollback started;
//! * the status (not Ready, no IP) goes out before `hibernated`, so the operator's pass woken
//!   by `hibernated` sees the final status.

use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::{LifecycleState, Os, VmSpec, tags};

use super::{Action, Failure, Step, StepFailed, Undo, ch_windows};

/// What the hibernate of a pod is planned from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// The pod's VM spec.
    pub spec: &'a VmSpec,
    /// The tracked VM's id.
    pub vm_id: &'a str,
    /// The tracked VM is an unmanaged pod's synthetic record.
    pub synthetic: bool,
    /// A registry is configured (the snapshot is pushed to `:hibernate`).
    pub registry: bool,
}

/// The hibernate's steps, or its refusal before any of them.
pub(crate) fn plan(f: &Facts<'_>) -> Result<Vec<Step>, StepFailed> {
    let name = f.spec.vm_name.as_str();
    if f.synthetic {
        // An unmanaged pod's record is synthetic: no runtime verb ever runs against it.
        return Err(StepFailed::refused(
            ev::TENANT_ISOLATION_REFUSED,
            format!("vm {name} is unmanaged; it cannot be hibernated"),
        ));
    }
    if f.spec.effective_os() == Os::Macos {
        return Err(StepFailed::refused(
            ev::HIBERNATE_UNSUPPORTED,
            format!("macOS guest {name} does not support hibernate"),
        ));
    }
    let id = f.vm_id.to_owned();
    let mut steps = vec![Step::then(Action::Lifecycle(LifecycleState::Hibernating))];
    if ch_windows(f.spec) {
        steps.push(Step::then(Action::ReleaseDhcp { id: id.clone() }));
        steps.push(
            Step::then(Action::DropNic { id: id.clone() })
                .or_fail(
                    Failure::new(
                        ev::HIBERNATE_NET_RESIZE_FAILED,
                        format!("drop NIC pre-hibernate {name}"),
                    )
                    .phase("netresize")
                    .cleanup(Undo::RenewDhcp { id: id.clone() }),
                )
                .undo(Undo::NicRollback { id: id.clone() }),
        );
    }
    steps.push(
        Step::then(Action::SaveSnapshot {
            name: name.to_owned(),
            id: id.clone(),
        })
        .or_fail(
            Failure::new(
                ev::HIBERNATE_SNAPSHOT_FAILED,
                format!("snapshot save {name}"),
            )
            .phase("snapshot"),
        ),
    );
    if f.registry {
        steps.push(
            Step::then(Action::Push {
                name: name.to_owned(),
                tag: tags::HIBERNATE,
                base_image: f.spec.image.clone(),
            })
            .or_fail(
                Failure::new(
                    ev::HIBERNATE_PUSH_FAILED,
                    format!("push hibernation snapshot {name}"),
                )
                .phase("push"),
            )
            .undo(Undo::DeleteTagWhileVmAlive {
                repo: name.to_owned(),
                tag: tags::HIBERNATE,
            }),
        );
    }
    steps.extend([
        Step::then(Action::ClearRuntime)
            .or_warn("clearing runtime annotations before remove failed; retrying after remove")
            .undo(Undo::RestoreRuntime),
        Step::then(Action::RemoveVm { id: id.clone() }).or_fail(
            Failure::new(ev::HIBERNATE_REMOVE_FAILED, format!("remove vm {id}"))
                .phase("remove")
                .unless_gone(),
        ),
        Step::then(Action::CountPhaseOk("remove")),
        Step::then(Action::RetryFailedClear)
            .or_warn("clearing runtime annotations after remove failed"),
        Step::then(Action::UntrackVm),
        Step::then(Action::PublishStatus),
        Step::then(Action::Lifecycle(LifecycleState::Hibernated)),
        Step::then(Action::Event {
            warning: false,
            reason: ev::HIBERNATED,
            message: if f.registry {
                ev::MSG_HIBERNATED_PUSHED
            } else {
                ev::MSG_HIBERNATED_LOCAL
            }
            .to_owned(),
        }),
    ]);
    Ok(steps)
}
