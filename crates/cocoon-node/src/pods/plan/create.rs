//! CreatePod (`node.md` §6) from the mode dispatch on, as plans: the unmanaged pod's
//! synthetic record, the adoption of an indexed VM, and the bring-up paths of §6.2 (restore,
//! clone-from-dir, fork, run, clone), each followed by the bring-up's tail (§6.1 steps 8–16).
//! The admission before it (claim, `creating`, tenant isolation, host reach) is planned in
//! [`super::admit`]; the restore decision is decided here ([`restore_decision`]) from the
//! evidence the caller read; a restore's wake source is read between the boot clock and its
//! steps ([`super::wake`]).
//!
//! The ordering rules the plans carry:
//! * an unmanaged pod never reaches the runtime; it is ready once tracked and probed;
//! * an adopted VM makes no runtime call: runtime annotations, tracking, probe, `ready`;
//! * every fresh bring-up first drops `fork-<vm>` (a new lineage never inherits a dead
//!   incarnation's fork baseline); a restore keeps it;
//! * the clone base is ensured (pulled if need be), its backend asserted and its base image
//!   ensured before the clone; a clone base just imported lets older unused ones be
//!   collected once the clone was attempted;
//! * the boot clock spans the whole bring-up; `ready` is published at once only without a
//!   post-restore or post-clone step.

use cocoon_api::contract::VmSpec;
use cocoon_api::contract::events::{hibernate_snapshot_exists_message, node as ev};
use cocoon_api::contract::metrics::node as m;
use cocoon_api::naming::fork_snapshot_name;

use super::ch_windows;
use super::follow_up::FollowUp;
use super::wake::{self, Reasons, Source};
use super::{Action, CloneFrom, ClonePull, Failure, Step, StepFailed, Undo};
use crate::pods::rules::{self, BringUp, Evidence, Verdict};

/// What a CreatePod is planned from, once the pod is admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// The pod's VM spec.
    pub spec: &'a VmSpec,
    /// `cocoonset.cocoonstack.io/mode` as given (the boot metric's label).
    pub mode: &'a str,
    /// `vm.cocoonstack.io/clone-from-dir` as given.
    pub clone_dir: Option<&'a str>,
    /// An unmanaged pod's pre-assigned `vm.cocoonstack.io/id` and `ip`.
    pub pre_id: &'a str,
    pub pre_ip: &'a str,
    /// A VM of the pod's VM name is in the by-name index.
    pub adoptable: bool,
}

/// The mode dispatch of §6.1 steps 4 and 5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// Unmanaged or adopted: these steps.
    Steps(Vec<Step>),
    /// Refused before any step.
    Refused(StepFailed),
    /// Decide the restore (the evidence read), then [`bring_up`].
    BringUp,
}

/// §6.1 steps 4 and 5.
pub(crate) fn route(f: &Facts<'_>) -> Route {
    let ready = |count: Step| {
        vec![
            Step::then(Action::StartProbe),
            Step::then(Action::PublishReady),
            count,
        ]
    };
    if !f.spec.managed {
        if f.pre_id.is_empty() || f.pre_ip.is_empty() {
            return Route::Refused(StepFailed::refused(
                ev::CREATE_BRING_UP_FAILED,
                format!(
                    "unmanaged vm {} missing pre-assigned IP/VMID",
                    f.spec.vm_name
                ),
            ));
        }
        let mut steps = vec![Step::then(Action::TrackSynthetic {
            id: f.pre_id.to_owned(),
            ip: f.pre_ip.to_owned(),
        })];
        steps.extend(ready(count_create("")));
        return Route::Steps(steps);
    }
    if f.adoptable {
        let mut steps = vec![Step::then(Action::Adopt)];
        steps.extend(ready(count_create(m::REASON_ADOPTED)));
        return Route::Steps(steps);
    }
    Route::BringUp
}

fn count_create(reason: &'static str) -> Step {
    Step::then(Action::CountLifecycle {
        op: ev::OP_CREATE,
        result: m::RESULT_OK,
        reason,
    })
}

/// The restore decision (§6.1 step 6 with the guards of §6.3), applied in its fields' order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestoreDecision {
    /// `cocoon_vk_hibernate_evidence_total{verdict}` to count, if any.
    pub count: Option<&'static str>,
    /// Keep the derived restore marker (in memory only, never patched onto the pod).
    pub derive: bool,
    /// A Warning Event (reason, message).
    pub warning: Option<(&'static str, String)>,
    /// Whether the pod restores; `Err`: the failCreate (not restoring) that ends the create.
    pub restoring: Result<bool, StepFailed>,
}

/// The restore decision from the evidence read (`Artifacts::hibernate_evidence`):
/// `explicit` is the operator's `restore-from-hibernate` marker. A failed read fails closed
/// (`HibernateEvidenceUnavailable`, then `HibernateEvidenceFailed`); a verdict is counted
/// unless it is the restore an explicit marker asked for; a derived restore is announced
/// with `HibernateSnapshotExists`.
pub(crate) fn restore_decision(
    spec: &VmSpec,
    explicit: bool,
    clone_dir: Option<&str>,
    evidence: Result<Evidence, String>,
) -> RestoreDecision {
    let evidence = match evidence {
        Ok(e) => e,
        Err(e) => {
            return RestoreDecision {
                count: Some("unavailable"),
                derive: false,
                warning: Some((ev::HIBERNATE_EVIDENCE_UNAVAILABLE, e.clone())),
                restoring: Err(StepFailed::refused(ev::HIBERNATE_EVIDENCE_FAILED, e)),
            };
        }
    };
    let verdict = rules::restore_verdict(spec, explicit, clone_dir, &evidence);
    let count = verdict
        .label()
        .filter(|_| !explicit || verdict != Verdict::Restore);
    let decided = |derive, warning, restoring| RestoreDecision {
        count,
        derive,
        warning,
        restoring,
    };
    match verdict {
        Verdict::FreshBoot => decided(false, None, Ok(false)),
        Verdict::SourceConflict(e) | Verdict::ImageConflict(e) => decided(
            false,
            None,
            Err(StepFailed::refused(ev::HIBERNATE_EVIDENCE_FAILED, e)),
        ),
        Verdict::Restore if explicit => decided(false, None, Ok(true)),
        Verdict::Restore => decided(
            true,
            Some((
                ev::HIBERNATE_SNAPSHOT_EXISTS,
                hibernate_snapshot_exists_message(&spec.vm_name),
            )),
            Ok(true),
        ),
    }
}

/// What a bring-up runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BringUpPlan {
    /// A fresh bring-up: these steps.
    Fresh(Vec<Step>),
    /// A restore: the boot clock, the wake source read, then [`restore`].
    Restore,
}

/// The bring-up failures' reason (both halves of a restore too).
const BRING_UP: &str = ev::CREATE_BRING_UP_FAILED;

/// §6.2 for a pod `restoring` (the explicit or derived marker) or not.
pub(crate) fn bring_up(f: &Facts<'_>, restoring: bool) -> Result<BringUpPlan, StepFailed> {
    let path = rules::bring_up_path(f.spec, restoring, f.clone_dir)
        .map_err(|e| StepFailed::refused(BRING_UP, e))?;
    if path == BringUp::Restore {
        return Ok(BringUpPlan::Restore);
    }
    let vm = f.spec.vm_name.as_str();
    let mut steps = vec![
        Step::then(Action::StartBootClock),
        Step::then(Action::RemoveLocalSnapshot {
            name: fork_snapshot_name(vm),
        })
        .or_warn("dropping the fork baseline failed"),
    ];
    match path {
        BringUp::Restore => return Ok(BringUpPlan::Restore),
        BringUp::CloneFromDir(dir) => {
            let context = format!("clone vm {vm} from dir {}", dir.display());
            steps.push(
                Step::then(Action::CloneVm {
                    from: CloneFrom::Dir(dir),
                    pull: ClonePull::Always,
                    nics: None,
                })
                .or_fail(Failure::new(BRING_UP, context)),
            );
        }
        BringUp::Fork(src) => {
            let snap = fork_snapshot_name(&src);
            steps.extend([
                Step::then(Action::EnsureForkSnapshot { src }).or_fail(Failure::bare(BRING_UP)),
                Step::then(Action::CloneVm {
                    from: CloneFrom::Snapshot(snap.clone()),
                    pull: ClonePull::Never,
                    nics: None,
                })
                .or_fail(Failure::new(BRING_UP, format!("clone vm {vm} from {snap}"))),
            ]);
        }
        BringUp::Run => {
            let image = f.spec.image.clone();
            steps.extend([
                Step::then(Action::EnsureRunImage {
                    image: image.clone(),
                    force: f.spec.force_pull,
                })
                .or_fail(Failure::new(BRING_UP, format!("ensure image {image}"))),
                Step::then(Action::RunVm).or_fail(Failure::new(BRING_UP, format!("run vm {vm}"))),
            ]);
        }
        BringUp::Clone => {
            let (repo, tag) = rules::parse_ref(&f.spec.image);
            let local = rules::local_snapshot_name(&repo, &tag);
            let clone_context = format!("clone vm {vm} from {local}");
            steps.extend([
                Step::then(Action::EnsureCloneBase {
                    repo,
                    tag,
                    local: local.clone(),
                })
                .or_fail(Failure::new(BRING_UP, format!("ensure snapshot {local}"))),
                Step::then(Action::AssertBackend {
                    local: local.clone(),
                })
                .or_fail(Failure::new(BRING_UP, clone_context.clone())),
                Step::then(Action::EnsureBaseImage).or_fail(Failure::bare(BRING_UP)),
                Step::then(Action::CloneVm {
                    from: CloneFrom::Snapshot(local),
                    pull: ClonePull::IfSnapshotHasImage,
                    nics: None,
                })
                .or_fail(
                    Failure::new(BRING_UP, clone_context)
                        .cleanup(Undo::CollectCloneBasesIfImported),
                ),
                Step::then(Action::CollectCloneBasesIfImported),
            ]);
        }
    }
    let follow = if rules::is_cloned(f.spec, f.clone_dir) {
        FollowUp::Clone
    } else {
        FollowUp::None
    };
    steps.extend(tail(f.mode, follow));
    Ok(BringUpPlan::Fresh(steps))
}

/// A restore's first step, before its wake source is read: the boot clock.
pub(crate) fn restore_begin() -> Vec<Step> {
    vec![Step::then(Action::StartBootClock)]
}

/// A restore's steps from its decided source (§6.2 step 1: the wake's source and clone,
/// without touching the fork baseline), then the tail.
pub(crate) fn restore(f: &Facts<'_>, source: &Source) -> Vec<Step> {
    const REASONS: Reasons = Reasons {
        source: BRING_UP,
        clone: BRING_UP,
    };
    let vm = f.spec.vm_name.as_str();
    let mut steps = wake::source_steps(vm, source, REASONS.source);
    steps.extend(wake::clone_steps(
        vm,
        source,
        ch_windows(f.spec),
        REASONS.clone,
    ));
    steps.extend(tail("clone", FollowUp::Restore));
    steps
}

/// §6.1 steps 8–16: the boot duration, the bring-up's finish, the count.
fn tail(mode: &str, follow: FollowUp) -> [Step; 3] {
    [
        Step::then(Action::ObserveBoot {
            mode: mode.to_owned(),
        }),
        Step::then(Action::FinishBringUp(follow)),
        count_create(""),
    ]
}
