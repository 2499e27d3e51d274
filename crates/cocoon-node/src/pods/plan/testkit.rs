//! Test helpers of the planners' table tests: steps as short sentences, and [`Script`], a
//! recording [`Effects`] whose actions fail as a row says.

use std::sync::Mutex;

use async_trait::async_trait;

use super::{
    Action, ActionError, AfterFailedRemove, CloneFrom, ClonePull, Failure, OnFailure, Step, Undo,
};
use crate::pods::exec::Effects;

/// An action as a short sentence.
pub(crate) fn action(a: &Action) -> String {
    match a {
        Action::Lifecycle(s) => format!("lifecycle {s}"),
        Action::ReleaseDhcp { id } => format!("release dhcp in {id}"),
        Action::DropNic { id } => format!("drop NIC of {id}"),
        Action::SaveSnapshot { name, id } => format!("save snapshot {name} from {id}"),
        Action::Push { name, tag, .. } => format!("push {name}:{tag}"),
        Action::ClearRuntime => "clear id/ip".into(),
        Action::RetryFailedClear => "clear id/ip again if that failed".into(),
        Action::RemoveVm { id } => format!("remove {id}"),
        Action::StopVm { id, grace_secs } => format!("stop {id} within {grace_secs}s"),
        Action::CountPhaseOk(p) => format!("count {p} ok"),
        Action::UntrackVm => "untrack the VM".into(),
        Action::PublishStatus => "publish status".into(),
        Action::Event {
            warning,
            reason,
            message,
        } => {
            let kind = if *warning { "warning " } else { "" };
            format!("{kind}event {reason}: {message}")
        }
        Action::DropLocalSnapshots { vm } => format!("drop local snapshots {vm} and fork-{vm}"),
        Action::PullSnapshot {
            repo,
            reference,
            into,
        } => format!("pull {repo}@{reference} into {into}"),
        Action::InspectSnapshot { name } => format!("inspect snapshot {name}"),
        Action::EnsureBaseImage => "ensure the snapshot's base image".into(),
        Action::CloneVm { from, pull, nics } => {
            let from = match from {
                CloneFrom::Snapshot(s) => s.clone(),
                CloneFrom::Dir(d) => format!("dir {}", d.display()),
            };
            let pull = match pull {
                ClonePull::IfSnapshotHasImage => " (--pull if the snapshot has an image)",
                ClonePull::Always => " --pull",
                ClonePull::Never => "",
            };
            let nics = nics.map(|n| format!(" --nics {n}")).unwrap_or_default();
            format!("clone from {from}{pull}{nics}")
        }
        Action::RemoveSnapshotDetached { name } => {
            format!("remove snapshot {name} in the background")
        }
        Action::StartBootClock => "start the boot clock".into(),
        Action::ObserveBoot { mode } => format!("observe boot {mode}"),
        Action::FinishBringUp(follow) => format!("finish bring-up, then {follow:?}"),
        Action::Warn(message) => format!("warn: {message}"),
        Action::RoutineSnapshot {
            name,
            id,
            base_image,
        } => format!(
            "routine snapshot: save {name} from {id}, push {name}:latest (base image {base_image})"
        ),
        Action::DropLocalSnapshotsBounded { vm } => {
            format!("drop local snapshots {vm} and fork-{vm} (10 s each, awaited)")
        }
        Action::Forget => "forget the pod".into(),
        Action::FinishDelete => "forget the pod, status Succeeded".into(),
        Action::CountLifecycle { op, result, reason } => {
            format!("count {op} {result} {reason:?}")
        }
        Action::TrackSynthetic { id, ip } => format!("track synthetic VM {id} at {ip}"),
        Action::Adopt => "adopt the indexed VM: runtime annotations, track".into(),
        Action::StartProbe => "start the probe".into(),
        Action::PublishReady => "publish ready (status first)".into(),
        Action::RemoveLocalSnapshot { name } => format!("remove snapshot {name}"),
        Action::EnsureForkSnapshot { src } => format!("ensure fork-{src}"),
        Action::EnsureRunImage { image, force } => {
            let force = if *force { " (forced)" } else { "" };
            format!("ensure run image {image}{force}")
        }
        Action::RunVm => "run the VM".into(),
        Action::EnsureCloneBase { repo, tag, local } => {
            format!("ensure clone base {local} (pulled from {repo}:{tag} if absent)")
        }
        Action::AssertBackend { local } => format!("assert the backend of {local}"),
        Action::CollectCloneBasesIfImported => "collect clone bases if one was imported".into(),
    }
}

/// A compensation as a short sentence.
pub(crate) fn undo(u: &Undo) -> String {
    match u {
        Undo::NicRollback { id } => format!("NIC rollback of {id}"),
        Undo::RenewDhcp { id } => format!("renew dhcp in {id}"),
        Undo::DeleteTagWhileVmAlive { repo, tag } => {
            format!("delete {repo}:{tag} while the VM is alive")
        }
        Undo::KeepTag { repo, tag } => format!("keep {repo}:{tag}"),
        Undo::RestoreRuntime => "re-apply id/ip".into(),
        Undo::RemoveSnapshot { name } => format!("remove snapshot {name} in the background"),
        Undo::CollectCloneBasesIfImported => "collect clone bases if one was imported".into(),
    }
}

fn failure(f: &Failure) -> String {
    let mut s = format!("fail {}", f.reason.unwrap_or("-"));
    if !f.context.is_empty() {
        s.push_str(&format!(": {}", f.context));
    }
    if let Some(p) = f.phase {
        s.push_str(&format!(" [count {p} failed]"));
    }
    if let Some(c) = &f.cleanup {
        s.push_str(&format!(" then {}", undo(c)));
    }
    if f.gone_is_done {
        s.push_str(" unless the VM is gone");
    }
    s
}

/// A step as `action | on failure | undo: compensation`.
pub(crate) fn step(s: &Step) -> String {
    let mut out = action(&s.action);
    match &s.on_failure {
        OnFailure::Ignore => {}
        OnFailure::Warn(_) => out.push_str(" | warn"),
        OnFailure::Fail(f) => {
            out.push_str(" | ");
            out.push_str(&failure(f));
        }
    }
    if let Some(u) = &s.undo {
        out.push_str(" | undo: ");
        out.push_str(&undo(u));
    }
    out
}

/// Every step of a plan as [`step`].
pub(crate) fn steps(plan: &[Step]) -> Vec<String> {
    plan.iter().map(step).collect()
}

/// A recording [`Effects`]: every call as a sentence ([`action`], `✗` when it failed,
/// `undo: …`, `count <phase> failed`, `inspect <id>: …`); actions whose sentence starts with
/// a scripted prefix fail (with `boom`) as often as scripted.
#[derive(Default)]
pub(crate) struct Script {
    fails: Mutex<Vec<(String, u32)>>,
    refuses: Vec<(String, &'static str)>,
    after_remove: Option<AfterFailedRemove>,
    calls: Mutex<Vec<String>>,
}

impl Script {
    /// Actions starting with `prefix` fail `times` times.
    pub(crate) fn fail(self, prefix: &str, times: u32) -> Self {
        self.fails
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((prefix.to_owned(), times));
        self
    }

    /// Actions starting with `prefix` are refused with `reason` (and the message `no`).
    pub(crate) fn refuse(mut self, prefix: &str, reason: &'static str) -> Self {
        self.refuses.push((prefix.to_owned(), reason));
        self
    }

    /// What the inspect after a failed remove says (default: still there).
    pub(crate) fn after_remove(mut self, a: AfterFailedRemove) -> Self {
        self.after_remove = Some(a);
        self
    }

    /// The calls so far.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, call: String) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
    }
}

#[async_trait]
impl Effects for Script {
    fn pod(&self) -> &str {
        "ns/pod"
    }

    async fn apply(&self, a: &Action) -> Result<(), ActionError> {
        let text = action(a);
        if let Some((_, reason)) = self.refuses.iter().find(|(p, _)| text.starts_with(p)) {
            self.record(format!("{text} ⊘"));
            return Err(ActionError::Refused {
                reason,
                message: "no".into(),
            });
        }
        let fails = {
            let mut fails = self.fails.lock().unwrap_or_else(|p| p.into_inner());
            match fails
                .iter_mut()
                .find(|(prefix, n)| *n > 0 && text.starts_with(prefix.as_str()))
            {
                Some((_, n)) => {
                    *n -= 1;
                    true
                }
                None => false,
            }
        };
        if fails {
            self.record(format!("{text} ✗"));
            return Err(ActionError::Failed("boom".into()));
        }
        self.record(text);
        Ok(())
    }

    async fn inspect_after_failed_remove(&self, id: &str) -> AfterFailedRemove {
        let a = self.after_remove.unwrap_or(AfterFailedRemove::StillThere);
        let what = match a {
            AfterFailedRemove::StillThere => "still there",
            AfterFailedRemove::Gone => "gone",
            AfterFailedRemove::Unknown => "unknown",
        };
        self.record(format!("inspect {id}: {what}"));
        a
    }

    async fn undo(&self, u: &Undo) {
        self.record(format!("undo: {}", undo(u)));
    }

    fn count_phase_failed(&self, phase: &'static str) {
        self.record(format!("count {phase} failed"));
    }
}
