//! The wake of `node.md` §8.3 as a plan, and the restore-from-hibernate it shares with
//! CreatePod: `creating`, the runtime annotations cleared, the wake source resolved from
//! reads the planner asks for one at a time ([`source`]), then the source's steps (a stale
//! local copy dropped, the pull into the one-shot import), the clone, and the bring-up.
//!
//! The ordering rules the plan carries:
//! * the wake source prefers the node-local snapshot `<vm>`, trusted only once the registry's
//!   `:hibernate` names the same snapshot id (or there is no registry); a stale copy is
//!   dropped (with its fork baseline) before the pull; an unverifiable one fails the wake and
//!   stays;
//! * the pull fetches the digest whose owner was checked, and nothing else: a manifest that
//!   could not be read (a transient registry error) or was absent fails the wake rather than
//!   pulling by tag (fail closed, as the hibernate evidence check does); the next UpdatePod
//!   retries it;
//! * the one-shot import is removed after the clone, whatever its outcome (but not when the
//!   import itself could not be inspected);
//! * the runtime annotations, tracking, probe and post-restore step come before the `Woken`
//!   Event (nothing the operator waits on);
//! * the `:hibernate` tag is never deleted on wake.

use cocoon_api::contract::events::{node as ev, woken_message};
use cocoon_api::contract::{LifecycleState, tags};
use cocoon_api::naming::hibernate_import_snapshot_name;

use super::follow_up::FollowUp;
use super::{Action, CloneFrom, ClonePull, Failure, Step, Undo};
use cocoon_runtime::SnapshotRecord;

/// The manifest of `<vm>:hibernate`, through the trust gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ArtifactRead {
    /// The pod's own: its digest is what a pull fetches.
    Owned { digest: String },
    /// No such tag (or no registry).
    Absent,
    /// It records another owner.
    Refused(String),
    /// The registry could not be read (a transport, 5xx or auth error): the wake fails closed.
    Unreadable(String),
}

/// `snapshot inspect <vm>`, by exact name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LocalRead {
    Present(Box<SnapshotRecord>),
    Absent,
    Failed(String),
}

/// The local copy checked against the registry's `:hibernate` snapshot id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VerifyRead {
    /// The same snapshot (or no registry: trusted).
    Matches,
    /// No tag, or another snapshot id.
    Stale,
    /// The registry could not say.
    Failed(String),
}

/// The reads a wake source is decided on, as far as they went.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SourceFacts {
    /// A registry is configured.
    pub registry: bool,
    pub artifact: Option<ArtifactRead>,
    pub local: Option<LocalRead>,
    pub verify: Option<VerifyRead>,
}

/// The next read [`source`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceRead {
    Artifact,
    Local,
    Verify,
}

/// Where a wake or restore clones from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    /// The verified node-local snapshot `<vm>` (warm).
    Local(Box<SnapshotRecord>),
    /// A pull of `<vm>@<reference>` into `<vm>-hibernate-import` (cold), after dropping the
    /// stale local copies when `drop_stale`.
    Pull { reference: String, drop_stale: bool },
}

/// What [`source`] decided, or the read it needs first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SourceNext {
    Read(SourceRead),
    Use(Source),
    /// The wake fails with this error.
    Fail(String),
}

/// `resolveWakeSource(vm)` (§8.3) on the reads so far.
pub(crate) fn source(vm: &str, f: &SourceFacts) -> SourceNext {
    let digest = match &f.artifact {
        None => return SourceNext::Read(SourceRead::Artifact),
        Some(ArtifactRead::Refused(r)) => return SourceNext::Fail(format!("wake {vm}: {r}")),
        Some(ArtifactRead::Unreadable(e)) => return SourceNext::Fail(unreadable(vm, e)),
        Some(ArtifactRead::Owned { digest }) => Some(digest.as_str()),
        Some(ArtifactRead::Absent) => None,
    };
    let drop_stale = match &f.local {
        None => return SourceNext::Read(SourceRead::Local),
        Some(LocalRead::Failed(e)) => {
            return SourceNext::Fail(format!("inspect local snapshot {vm}: {e}"));
        }
        Some(LocalRead::Absent) => false,
        Some(LocalRead::Present(local)) => match &f.verify {
            None => return SourceNext::Read(SourceRead::Verify),
            Some(VerifyRead::Matches) => return SourceNext::Use(Source::Local(local.clone())),
            Some(VerifyRead::Failed(e)) => {
                return SourceNext::Fail(format!("verify local snapshot {vm}: {e}"));
            }
            Some(VerifyRead::Stale) => true,
        },
    };
    if !f.registry {
        return SourceNext::Fail(format!(
            "wake {vm}: no local snapshot and no puller configured"
        ));
    }
    // Only the digest whose owner was checked is pulled: a pull by tag could fetch whatever
    // the tag names by then.
    let Some(digest) = digest else {
        return SourceNext::Fail(format!(
            "wake {vm}: no usable local snapshot and no {vm}:{} in the registry",
            tags::HIBERNATE
        ));
    };
    SourceNext::Use(Source::Pull {
        reference: digest.to_owned(),
        drop_stale,
    })
}

/// The failure of a wake whose `:hibernate` manifest could not be read.
fn unreadable(vm: &str, err: &str) -> String {
    format!(
        "wake {vm}: {err} (refusing to pull {vm}:{} unchecked; the next update retries)",
        tags::HIBERNATE
    )
}

/// The failOp reasons of a restore's two halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reasons {
    /// Resolving and pulling the source.
    pub source: &'static str,
    /// The base image and the clone.
    pub clone: &'static str,
}

/// The wake's reasons (§8.3 steps 4 and 5).
pub(crate) const WAKE: Reasons = Reasons {
    source: ev::WAKE_PULL_FAILED,
    clone: ev::WAKE_CLONE_FAILED,
};

/// The local snapshot a source clones from: `<vm>`, or the one-shot import.
pub(crate) fn source_name(vm: &str, source: &Source) -> String {
    match source {
        Source::Local(_) => vm.to_owned(),
        Source::Pull { .. } => hibernate_import_snapshot_name(vm),
    }
}

/// The steps that make `source` a local snapshot: nothing for the local copy; for a pull,
/// the stale copies dropped, the pull, and the import inspected (the import is removed if a
/// later step fails).
pub(crate) fn source_steps(vm: &str, source: &Source, reason: &'static str) -> Vec<Step> {
    let Source::Pull {
        reference,
        drop_stale,
    } = source
    else {
        return Vec::new();
    };
    let import = hibernate_import_snapshot_name(vm);
    let mut steps = Vec::new();
    if *drop_stale {
        steps.push(Step::then(Action::DropLocalSnapshots { vm: vm.to_owned() }));
    }
    steps.extend([
        Step::then(Action::PullSnapshot {
            repo: vm.to_owned(),
            reference: reference.clone(),
            into: import.clone(),
        })
        .or_fail(Failure::new(
            reason,
            format!("pull hibernation snapshot {vm}"),
        )),
        Step::then(Action::InspectSnapshot {
            name: import.clone(),
        })
        .or_fail(Failure::new(
            reason,
            format!("inspect imported snapshot {import}"),
        ))
        .undo(Undo::RemoveSnapshot { name: import }),
    ]);
    steps
}

/// `cloneFromHibernate` (§8.3): the base image, the clone (one fresh NIC for CH+Windows,
/// whose hibernate dropped it), and the one-shot import removed.
pub(crate) fn clone_steps(
    vm: &str,
    source: &Source,
    ch_windows: bool,
    reason: &'static str,
) -> Vec<Step> {
    let from = source_name(vm, source);
    let mut steps = vec![
        Step::then(Action::EnsureBaseImage).or_fail(Failure::bare(reason)),
        Step::then(Action::CloneVm {
            from: CloneFrom::Snapshot(from.clone()),
            pull: ClonePull::IfSnapshotHasImage,
            nics: ch_windows.then_some(1),
        })
        .or_fail(Failure::new(reason, format!("clone vm {vm} from {from}"))),
    ];
    if matches!(source, Source::Pull { .. }) {
        steps.push(Step::then(Action::RemoveSnapshotDetached { name: from }));
    }
    steps
}

/// The wake's first steps, before the source is read (§8.3 steps 2 and 3).
pub(crate) fn begin() -> Vec<Step> {
    vec![
        Step::then(Action::Lifecycle(LifecycleState::Creating)),
        Step::then(Action::ClearRuntime).or_warn("clearing runtime annotations at wake failed"),
    ]
}

/// The wake's steps from its decided source (§8.3 steps 4–6).
pub(crate) fn plan(vm: &str, source: &Source, ch_windows: bool) -> Vec<Step> {
    let mut steps = source_steps(vm, source, WAKE.source);
    steps.push(Step::then(Action::StartBootClock));
    steps.extend(clone_steps(vm, source, ch_windows, WAKE.clone));
    steps.extend([
        Step::then(Action::ObserveBoot {
            mode: "clone".into(),
        }),
        Step::then(Action::FinishBringUp(FollowUp::Restore)),
        Step::then(Action::Event {
            warning: false,
            reason: ev::WOKEN,
            message: woken_message(&source_name(vm, source)),
        }),
    ]);
    steps
}
