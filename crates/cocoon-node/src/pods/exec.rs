//! The one executor of the pod operations' plans: applies the steps in order, each finished
//! before the next starts, and on a failure that fails the operation runs the compensations
//! the plan gives ([`super::plan::compensations`]), then returns the failure. The caller reports
//! it (failOp, §12.3); the executor only logs the failures the plan says to go on after.

use async_trait::async_trait;
use tracing::{debug, warn};

use super::plan::{
    Action, ActionError, AfterFailedRemove, OnFailure, Step, StepFailed, Undo, compensations,
};

/// What a plan's steps act on: the runtime, the registry and the API, for one pod. The
/// handler's implementation is [`super::effects::PodOp`]; the table tests use a recording
/// fake.
#[async_trait]
pub(crate) trait Effects: Send + Sync {
    /// The pod, `<namespace>/<name>`, for log lines.
    fn pod(&self) -> &str;
    /// Applies one action; a failure's text is the cause in the operation's error, a
    /// refusal fails the operation as it says.
    async fn apply(&self, action: &Action) -> Result<(), ActionError>;
    /// Inspects VM `id` after its remove failed.
    async fn inspect_after_failed_remove(&self, id: &str) -> AfterFailedRemove;
    /// Runs a compensation (its own failures are logged).
    async fn undo(&self, undo: &Undo);
    /// `cocoon_vk_hibernate_total{phase, result=failed}` += 1.
    fn count_phase_failed(&self, phase: &'static str);
}

/// Runs `steps` in order against `fx`.
pub(crate) async fn run<E: Effects + ?Sized>(fx: &E, steps: &[Step]) -> Result<(), StepFailed> {
    let mut clear_failed = false;
    for (i, step) in steps.iter().enumerate() {
        let action = match &step.action {
            Action::RetryFailedClear if !clear_failed => continue,
            Action::RetryFailedClear => &Action::ClearRuntime,
            a => a,
        };
        let started = std::time::Instant::now();
        let applied = fx.apply(action).await;
        // Where an operation's time goes (the cold fork's split: pull, clone, start, probe).
        debug!(
            pod = fx.pod(),
            ?action,
            ok = applied.is_ok(),
            ms = started.elapsed().as_millis() as u64,
            "step applied"
        );
        let error = match applied {
            Ok(()) => continue,
            Err(ActionError::Failed(error)) => error,
            Err(ActionError::Refused { reason, message }) => {
                warn!(pod = fx.pod(), reason, %message, "refused while acting");
                for undo in compensations(steps, i, None) {
                    fx.undo(&undo).await;
                }
                return Err(StepFailed::refused(reason, message));
            }
        };
        match &step.on_failure {
            OnFailure::Ignore => {}
            OnFailure::Warn(message) => {
                warn!(pod = fx.pod(), %error, "{message}");
                clear_failed |= step.action == Action::ClearRuntime;
            }
            OnFailure::Fail(f) => {
                let after = match &step.action {
                    Action::RemoveVm { id } if f.gone_is_done => {
                        Some(fx.inspect_after_failed_remove(id).await)
                    }
                    _ => None,
                };
                if after == Some(AfterFailedRemove::Gone) {
                    if let Action::RemoveVm { id } = &step.action {
                        warn!(pod = fx.pod(), %id, %error, "vm rm failed but the VM is gone; the removal stands");
                    }
                    continue;
                }
                if let Some(phase) = f.phase {
                    fx.count_phase_failed(phase);
                }
                for undo in compensations(steps, i, after) {
                    fx.undo(&undo).await;
                }
                let message = if f.context.is_empty() {
                    error
                } else {
                    format!("{}: {error}", f.context)
                };
                return Err(StepFailed {
                    reason: f.reason,
                    message,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::plan::testkit::Script;
    use super::super::plan::{Failure, Step};
    use super::*;
    use cocoon_api::contract::LifecycleState;

    fn steps() -> Vec<Step> {
        vec![
            Step::then(Action::Lifecycle(LifecycleState::Hibernating)),
            Step::then(Action::DropNic { id: "i".into() })
                .or_fail(Failure::new("NicFailed", "drop"))
                .undo(Undo::NicRollback { id: "i".into() }),
            Step::then(Action::ClearRuntime)
                .or_warn("clear failed")
                .undo(Undo::RestoreRuntime),
            Step::then(Action::Push {
                name: "v".into(),
                tag: "hibernate",
                base_image: String::new(),
            })
            .or_fail(Failure::new("PushFailed", "push v"))
            .undo(Undo::DeleteTagWhileVmAlive {
                repo: "v".into(),
                tag: "hibernate",
            }),
            Step::then(Action::RemoveVm { id: "i".into() })
                .or_fail(Failure::new("RemoveFailed", "remove vm i").unless_gone()),
            Step::then(Action::RetryFailedClear).or_warn("clear failed again"),
            Step::then(Action::PublishStatus),
        ]
    }

    async fn run_with(script: Script) -> (Vec<String>, Result<(), StepFailed>) {
        let res = run(&script, &steps()).await;
        (script.calls(), res)
    }

    #[tokio::test]
    async fn steps_run_in_order_and_a_failed_clear_is_retried_once() {
        let (calls, res) = run_with(Script::default()).await;
        assert_eq!(res, Ok(()));
        assert_eq!(
            calls,
            [
                "lifecycle hibernating",
                "drop NIC of i",
                "clear id/ip",
                "push v:hibernate",
                "remove i",
                "publish status",
            ]
        );
        let (calls, res) = run_with(Script::default().fail("clear id/ip", 1)).await;
        assert_eq!(res, Ok(()));
        assert_eq!(
            calls,
            [
                "lifecycle hibernating",
                "drop NIC of i",
                "clear id/ip ✗",
                "push v:hibernate",
                "remove i",
                "clear id/ip",
                "publish status",
            ]
        );
    }

    #[tokio::test]
    async fn a_failure_runs_the_done_steps_undos_last_first_annotations_last() {
        let (calls, res) = run_with(Script::default().fail("remove", 1)).await;
        assert_eq!(
            res,
            Err(StepFailed {
                reason: Some("RemoveFailed"),
                message: "remove vm i: boom".into(),
            })
        );
        assert_eq!(
            calls,
            [
                "lifecycle hibernating",
                "drop NIC of i",
                "clear id/ip",
                "push v:hibernate",
                "remove i ✗",
                "inspect i: still there",
                "undo: delete v:hibernate while the VM is alive",
                "undo: NIC rollback of i",
                "undo: re-apply id/ip",
            ]
        );
        // The failed step's own undo never runs; nothing after it runs.
        let (calls, res) = run_with(Script::default().fail("push", 1)).await;
        assert_eq!(res.map_err(|e| e.message), Err("push v: boom".into()));
        assert_eq!(
            calls[4..],
            ["undo: NIC rollback of i", "undo: re-apply id/ip"]
        );
    }

    #[tokio::test]
    async fn a_remove_that_took_effect_stands_and_an_unknown_one_keeps_the_tag() {
        let gone = Script::default()
            .fail("remove", 1)
            .after_remove(AfterFailedRemove::Gone);
        let (calls, res) = run_with(gone).await;
        assert_eq!(res, Ok(()));
        assert_eq!(
            calls[4..],
            ["remove i ✗", "inspect i: gone", "publish status"]
        );
        let unknown = Script::default()
            .fail("remove", 1)
            .after_remove(AfterFailedRemove::Unknown);
        let (calls, res) = run_with(unknown).await;
        assert!(res.is_err());
        assert_eq!(
            calls[5..],
            [
                "inspect i: unknown",
                "undo: keep v:hibernate",
                "undo: NIC rollback of i",
                "undo: re-apply id/ip",
            ]
        );
    }

    /// A refusal at the moment of acting (the fork source re-checked at the save) fails the
    /// operation with its own reason, even on a step whose failures are only logged, after
    /// the compensations of the steps done.
    #[tokio::test]
    async fn a_refusal_fails_with_its_reason_whatever_the_step_says() {
        for (refused, undone) in [
            ("clear id/ip", &["undo: NIC rollback of i"][..]),
            (
                "push",
                &["undo: NIC rollback of i", "undo: re-apply id/ip"][..],
            ),
        ] {
            let script = Script::default().refuse(refused, "TenantIsolationRefused");
            let (calls, res) = run_with(script).await;
            assert_eq!(
                res,
                Err(StepFailed {
                    reason: Some("TenantIsolationRefused"),
                    message: "no".into(),
                }),
                "{refused}"
            );
            assert!(
                calls.iter().all(|c| !c.starts_with("remove")),
                "{refused}: nothing after the refusal runs: {calls:?}"
            );
            let tail: Vec<String> = undone.iter().map(|u| (*u).to_owned()).collect();
            assert!(calls.ends_with(&tail), "{refused}: {calls:?}");
        }
    }
}
