//! The pod operations as planned pipelines, in the shape of the CocoonSet controller's steps:
//! a pure planner per operation turns observed facts into an ordered list of [`Step`]s
//! (runtime calls, registry calls, API writes), each saying what its failure means
//! ([`OnFailure`]) and what undoes it if a later step fails ([`Undo`]); one executor, in the
//! shell (`pods::exec::run`), applies them in order and, on a failure, runs the compensations
//! the plan gives ([`compensations`]). No planner holds a client or a runtime handle; the
//! executor reaches the runtime, the registry and the API only through `pods::exec::Effects`,
//! which the handler implements in `pods::effects`.
//!
//! This module is the pure leaf of the pod operations: it imports nothing of the crate but
//! its own modules and the pure rules `pods::{rules, tenant, intent}` (its test code also
//! runs the plans through `pods::exec`), and no I/O handle; `tests/tests/test_layout.rs`
//! keeps it so.
//!
//! Planned: hibernate ([`hibernate`]), wake ([`wake`]), delete ([`delete`]), create from
//! the mode dispatch on ([`create`]), the create's admission before it ([`admit`]), the
//! background step after a bring-up ([`follow_up`]).
//!
//! Decided here, applied by their shells (no steps of their own): the VM event watcher's
//! reactions ([`vm_event`]), stale-create reconciliation ([`stale`]), what an update of a
//! pod means ([`update`]), what the transfers' reads mean ([`transfer`]).

pub(crate) mod admit;
pub(crate) mod checkpoint;
pub(crate) mod create;
pub(crate) mod delete;
pub(crate) mod follow_up;
pub(crate) mod hibernate;
pub(crate) mod stale;
pub(crate) mod transfer;
pub(crate) mod update;
pub(crate) mod vm_event;
pub(crate) mod wake;

use cocoon_api::contract::{Backend, LifecycleState, Os, VmSpec};

use follow_up::FollowUp;

/// CH+Windows: the hibernate drops the NIC and the wake hot-adds one.
pub(crate) fn ch_windows(spec: &VmSpec) -> bool {
    spec.backend == Some(Backend::CloudHypervisor) && spec.os == Some(Os::Windows)
}

/// One thing an operation does. The executor applies a plan's actions in their order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Write this lifecycle state (the intent, flushed; §5.4).
    Lifecycle(LifecycleState),
    /// `cmd /c ipconfig /release` in the guest of VM `id` (20 s, best effort), counted as
    /// `cocoon_vk_hibernate_total{phase=dhcp_release}`.
    ReleaseDhcp { id: String },
    /// `net_resize(id, 0)`: the CH+Windows NIC drop before a hibernate.
    DropNic { id: String },
    /// `snapshot save --name <name> <id>` (save counters and duration).
    SaveSnapshot { name: String, id: String },
    /// Push the local snapshot `name` to `<name>:<tag>`, recording `base_image` and the pod as
    /// its owner (push counters).
    Push {
        name: String,
        tag: &'static str,
        base_image: String,
    },
    /// Clear the runtime annotations (`id`, `ip`, `post-clone-state`) in one patch.
    ClearRuntime,
    /// [`Action::ClearRuntime`] again, only when an earlier one of the plan failed.
    RetryFailedClear,
    /// `vm rm --force <id>`; a VM the runtime no longer knows counts as removed.
    RemoveVm { id: String },
    /// `vm stop --timeout <grace_secs> <id>`, bounded by `grace_secs`: the graceful shutdown
    /// before a delete's remove. Never fails the plan; its outcome is logged and, when the
    /// guest did not stop, evented (`delete::stop_report`).
    StopVm { id: String, grace_secs: u64 },
    /// `cocoon_vk_hibernate_total{phase, result=ok}` += 1.
    CountPhaseOk(&'static str),
    /// Drop the pod's VM from the tables and stop its probe (the pod stays tracked).
    UntrackVm,
    /// Recompute and publish the pod's status.
    PublishStatus,
    /// An Event on the pod.
    Event {
        warning: bool,
        reason: &'static str,
        message: String,
    },
    /// Remove the local snapshots `<vm>` and `fork-<vm>` (errors are logged).
    DropLocalSnapshots { vm: String },
    /// Pull `<repo>@<reference>` into the local snapshot `into`, one transfer for every
    /// concurrent caller (pull counters, the `SnapshotPulled` Event).
    PullSnapshot {
        repo: String,
        reference: String,
        into: String,
    },
    /// `snapshot inspect <name>` by exact name: the snapshot the next steps clone from.
    InspectSnapshot { name: String },
    /// `ensureSnapshotBaseImage` (§6.6) of the snapshot the next clone is from.
    EnsureBaseImage,
    /// Clone the pod's VM (its network, backend, restore mode and CPU policy) from `from`.
    CloneVm {
        from: CloneFrom,
        pull: ClonePull,
        /// `--nics`.
        nics: Option<u32>,
    },
    /// Remove the local snapshot `name` in the background (errors are logged).
    RemoveSnapshotDetached { name: String },
    /// Start the clock of `cocoon_vk_vm_boot_duration_seconds`.
    StartBootClock,
    /// Observe `cocoon_vk_vm_boot_duration_seconds{mode, backend}`.
    ObserveBoot { mode: String },
    /// §6.1 steps 9–15 with the VM just brought up, then `follow`.
    FinishBringUp(FollowUp),
    /// A warning log line about the pod.
    Warn(String),
    /// The routine snapshot of §7 step 5: save `<name>` from `id`, then push it to
    /// `<name>:latest` recording `base_image`; failures are counted and logged, never fatal.
    RoutineSnapshot {
        name: String,
        id: String,
        base_image: String,
    },
    /// Remove the local snapshots `<vm>` and `fork-<vm>` concurrently, each within its own
    /// 10 s detached from the caller, and wait for both (errors are logged).
    DropLocalSnapshotsBounded { vm: String },
    /// Forget the pod: its VM, probe and lifecycle intent.
    Forget,
    /// [`Action::Forget`], then the status `Succeeded`.
    FinishDelete,
    /// `cocoon_vk_pod_lifecycle_total{op, result, reason}` += 1.
    CountLifecycle {
        op: &'static str,
        result: &'static str,
        reason: &'static str,
    },
    /// Track an unmanaged pod's synthetic record `{id, name, ip, running}` (never a runtime
    /// VM).
    TrackSynthetic { id: String, ip: String },
    /// Adopt the VM of the pod's name from the by-name index: write its runtime annotations
    /// and track it.
    Adopt,
    /// Start the readiness probe (its first probe runs now).
    StartProbe,
    /// The ready publication of §5.3 (status first, then the annotation).
    PublishReady,
    /// Remove the local snapshot `name` if it exists.
    RemoveLocalSnapshot { name: String },
    /// `ensureForkSnapshot(src)` (§6.5): one save of `fork-<src>` per lineage.
    EnsureForkSnapshot { src: String },
    /// `ensureRunImage(image, force)` (§6.6): the ref the run boots.
    EnsureRunImage { image: String, force: bool },
    /// `vm run` of the pod's VM from that ref, with the pod's resources (§6.8).
    RunVm,
    /// `ensureSnapshot(repo, tag, local)` (§6.4): the clone base, pulled if need be (pull
    /// counters, even on a local hit).
    EnsureCloneBase {
        repo: String,
        tag: String,
        local: String,
    },
    /// `assertSnapshotBackend` (§6.7) of that clone base, named `local`.
    AssertBackend { local: String },
    /// When the clone base was just imported: collect the unused older ones.
    CollectCloneBasesIfImported,
}

/// What a clone starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CloneFrom {
    /// A local snapshot.
    Snapshot(String),
    /// A `snapshot export --to-dir` directory (`cocoon_vk_clone_from_dir_total`).
    Dir(std::path::PathBuf),
}

/// The clone's `--pull`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClonePull {
    /// When the snapshot the clone is from records a base image.
    IfSnapshotHasImage,
    /// Always (a directory source).
    Always,
    /// Never.
    Never,
}

/// What undoes a step (or, as a failed step's cleanup, its own half-done part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undo {
    /// The NIC rollback of §8.2: `net_resize(id, 1)`, then `ipconfig /renew`, detached with a
    /// 30 s budget.
    NicRollback { id: String },
    /// `ipconfig /renew` in the guest only, detached with a 30 s budget.
    RenewDhcp { id: String },
    /// Delete `<repo>:<tag>` (best effort), but only while the VM provably still exists: a
    /// remove that took effect and then failed leaves the tag as the only copy of its state.
    DeleteTagWhileVmAlive { repo: String, tag: &'static str },
    /// What [`Undo::DeleteTagWhileVmAlive`] becomes when the VM's existence is unknown: the
    /// tag is kept (logged), since it may be the only copy.
    KeepTag { repo: String, tag: &'static str },
    /// Re-apply the runtime annotations (`id`, `ip`) of the tracked VM.
    RestoreRuntime,
    /// Remove the local snapshot `name` in the background (errors are logged).
    RemoveSnapshot { name: String },
    /// [`Action::CollectCloneBasesIfImported`], after a clone that failed.
    CollectCloneBasesIfImported,
}

impl Undo {
    /// Puts a pod annotation back. These run after every other compensation (see
    /// [`compensations`]).
    fn restores_annotations(&self) -> bool {
        matches!(self, Undo::RestoreRuntime)
    }
}

/// A step's failure that fails the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The failOp reason (§12.3); `None`: the operation returns the error without one.
    pub reason: Option<&'static str>,
    /// The error's context: the operation fails with `<context>: <error>` (with the error
    /// alone when empty).
    pub context: String,
    /// The `cocoon_vk_hibernate_total` phase counted `failed`.
    pub phase: Option<&'static str>,
    /// Runs first: undoes the failed step's own half-done part.
    pub cleanup: Option<Undo>,
    /// The step is a VM remove whose failure is checked with an inspect: a VM gone since
    /// (the remove took effect, then failed) counts as removed.
    pub gone_is_done: bool,
}

impl Failure {
    /// Fails the operation with `reason` and `<context>: <error>`.
    pub(crate) fn new(reason: &'static str, context: impl Into<String>) -> Self {
        Failure {
            reason: Some(reason),
            context: context.into(),
            phase: None,
            cleanup: None,
            gone_is_done: false,
        }
    }

    /// Fails the operation with `<context>: <error>` and no failOp reason.
    pub(crate) fn unreported(context: impl Into<String>) -> Self {
        Failure {
            reason: None,
            ..Failure::new("", context)
        }
    }

    /// Fails the operation with `reason` and the error as the action words it.
    pub(crate) fn bare(reason: &'static str) -> Self {
        Failure::new(reason, "")
    }

    /// Counts `cocoon_vk_hibernate_total{phase, failed}`.
    pub(crate) fn phase(mut self, phase: &'static str) -> Self {
        self.phase = Some(phase);
        self
    }

    /// Runs `undo` before the compensations.
    pub(crate) fn cleanup(mut self, undo: Undo) -> Self {
        self.cleanup = Some(undo);
        self
    }

    /// See [`Failure::gone_is_done`].
    pub(crate) fn unless_gone(mut self) -> Self {
        self.gone_is_done = true;
        self
    }
}

/// What a failure of a step means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// The action reports its own errors (it never fails the operation).
    Ignore,
    /// Logged with this message; the step counts as done and the plan goes on.
    Warn(&'static str),
    /// The operation fails.
    Fail(Failure),
}

/// One step of a plan: an action, what its failure means, what undoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub action: Action,
    pub on_failure: OnFailure,
    /// Run if a later step fails the operation.
    pub undo: Option<Undo>,
}

impl Step {
    /// `action`, whose errors never fail the operation.
    pub(crate) fn then(action: Action) -> Self {
        Step {
            action,
            on_failure: OnFailure::Ignore,
            undo: None,
        }
    }

    /// A failure of the step fails the operation.
    pub(crate) fn or_fail(mut self, failure: Failure) -> Self {
        self.on_failure = OnFailure::Fail(failure);
        self
    }

    /// A failure of the step is logged with `message`; the plan goes on.
    pub(crate) fn or_warn(mut self, message: &'static str) -> Self {
        self.on_failure = OnFailure::Warn(message);
        self
    }

    /// `undo` runs if a later step fails the operation.
    pub(crate) fn undo(mut self, undo: Undo) -> Self {
        self.undo = Some(undo);
        self
    }
}

/// Why an action failed ([`exec::Effects::apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ActionError {
    /// It failed with this text: the step's [`OnFailure`] says what that means.
    Failed(String),
    /// A rule checked at the moment of acting refused it (tenant isolation, e.g. the fork
    /// source re-checked at the save): the operation fails with `reason` and `message`,
    /// whatever the step's failure policy, after the compensations of the steps done.
    Refused {
        reason: &'static str,
        message: String,
    },
}

impl From<String> for ActionError {
    fn from(message: String) -> Self {
        ActionError::Failed(message)
    }
}

/// The operation failed (or was refused before its first step): the failOp reason and the
/// error text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct StepFailed {
    pub reason: Option<&'static str>,
    pub message: String,
}

impl StepFailed {
    /// A refusal before any step.
    pub(crate) fn refused(reason: &'static str, message: impl Into<String>) -> Self {
        StepFailed {
            reason: Some(reason),
            message: message.into(),
        }
    }
}

/// What the inspect after a failed `vm rm` says about the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailedRemove {
    /// The VM still exists: its disk and memory are intact, so a `:hibernate` just pushed is
    /// the stale duplicate the compensation deletes.
    StillThere,
    /// The VM is gone (the remove took effect before failing): `:hibernate` is now the only
    /// copy of its state, so the remove counts as done.
    Gone,
    /// Unknown (the inspect failed otherwise): keep `:hibernate` and fail.
    Unknown,
}

/// Decides what a failed `vm rm` left from an inspect of the VM.
pub(crate) fn after_failed_remove<T>(
    inspect: &std::result::Result<T, cocoon_runtime::RuntimeError>,
) -> AfterFailedRemove {
    match inspect {
        Ok(_) => AfterFailedRemove::StillThere,
        Err(e) if e.is_vm_not_found() => AfterFailedRemove::Gone,
        Err(_) => AfterFailedRemove::Unknown,
    }
}

/// The outcome of `vm rm`: a VM the runtime no longer knows counts as removed (a VM gone
/// already, say by a remove that took effect before an agent restart).
pub(crate) fn removed(
    res: std::result::Result<(), cocoon_runtime::RuntimeError>,
) -> Result<(), String> {
    match res {
        Err(e) if !e.is_vm_not_found() => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// The compensations after step `failed` of `steps` failed the operation, in the order they
/// run: the failed step's own cleanup, then the undo of every step done before it, the last
/// done first, except that the pod's annotations are put back after everything else (§8.2
/// step 6: the `:hibernate` tag goes and the NIC comes back before the VM id reappears, so
/// the VM id is never seen next to a tag about to go). `after_remove` is what an inspect
/// said after a failed remove (`None`: no remove failed, the VM is alive): a tag delete
/// waits on a VM that provably still exists.
pub(crate) fn compensations(
    steps: &[Step],
    failed: usize,
    after_remove: Option<AfterFailedRemove>,
) -> Vec<Undo> {
    let vm_alive = after_remove.is_none_or(|a| a == AfterFailedRemove::StillThere);
    let cleanup = steps.get(failed).and_then(|s| match &s.on_failure {
        OnFailure::Fail(f) => f.cleanup.clone(),
        _ => None,
    });
    let mut undos: Vec<Undo> = steps[..failed.min(steps.len())]
        .iter()
        .rev()
        .filter_map(|s| s.undo.clone())
        .map(|u| match u {
            Undo::DeleteTagWhileVmAlive { repo, tag } if !vm_alive => Undo::KeepTag { repo, tag },
            u => u,
        })
        .collect();
    // Stable: the order among the others, and among the annotation restores, stays.
    undos.sort_by_key(Undo::restores_annotations);
    cleanup.into_iter().chain(undos).collect()
}

#[cfg(test)]
pub(crate) mod testkit;

#[cfg(test)]
mod admit_tests;
#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod create_tests;
#[cfg(test)]
mod delete_tests;
#[cfg(test)]
mod follow_up_tests;
#[cfg(test)]
mod hibernate_tests;
#[cfg(test)]
mod stale_tests;
#[cfg(test)]
mod transfer_tests;
#[cfg(test)]
mod update_tests;
#[cfg(test)]
mod vm_event_tests;
#[cfg(test)]
mod wake_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_runtime::RuntimeError;

    #[test]
    fn a_failed_remove_deletes_the_tag_only_while_the_vm_exists() {
        let rows: [(std::result::Result<(), RuntimeError>, AfterFailedRemove); 3] = [
            (Ok(()), AfterFailedRemove::StillThere),
            (
                Err(RuntimeError::VmNotFound("vm x: VM not found".into())),
                AfterFailedRemove::Gone,
            ),
            (
                Err(RuntimeError::Other("connection reset".into())),
                AfterFailedRemove::Unknown,
            ),
        ];
        for (inspect, want) in rows {
            assert_eq!(after_failed_remove(&inspect), want, "{inspect:?}");
        }
    }

    #[test]
    fn a_vm_already_gone_counts_as_removed() {
        type Row = (
            &'static str,
            std::result::Result<(), RuntimeError>,
            Result<(), String>,
        );
        let rows: [Row; 3] = [
            ("removed", Ok(()), Ok(())),
            (
                "already gone",
                Err(RuntimeError::VmNotFound("vm x: VM not found".into())),
                Ok(()),
            ),
            (
                "refused",
                Err(RuntimeError::Other("busy".into())),
                Err("busy".into()),
            ),
        ];
        for (situation, res, want) in rows {
            assert_eq!(removed(res), want, "{situation}");
        }
    }
}
