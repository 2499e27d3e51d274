//! The wait rules of cli.md §4 as a pure evaluator: given one observation of the watched
//! object(s), say whether the verb succeeded, failed, or is still in progress (and what to print).

use std::time::Duration;

/// What a verb waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// The phase equals one of these.
    Phase(Vec<String>),
    /// `status.observedGeneration` caught up (unpin).
    Observed,
    /// Not `Migrating` (`Running` or `Scaling`), and the main pod is on `node` with a VM id.
    Migrated { node: String },
    /// The pod's CocoonHibernation reads `Active` (a pod without one is active) and the pod is
    /// Ready: its VM serves again.
    PodReady,
}

/// One look at the watched object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    pub exists: bool,
    pub generation: i64,
    pub observed_generation: i64,
    pub phase: String,
    /// The Ready condition's message, for progress lines.
    pub ready_message: String,
    /// For migrations: the main pod's node and whether it has a VM id.
    pub main_node: String,
    pub main_has_vm: bool,
    /// For pod targets: the pod reports Ready.
    pub pod_ready: bool,
    /// For sets: the member pods' names (their Warning Events explain a stuck set).
    pub members: Vec<String>,
    /// The (kind, uid) of the objects read: an Event of an earlier object of the same name is
    /// not theirs.
    pub uids: Vec<(&'static str, String)>,
}

/// The evaluator's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Done,
    /// Still waiting; the text describes the current state.
    Waiting(String),
    /// The failure phase has persisted past the grace.
    Failed(String),
    /// The object is gone.
    Gone,
}

/// The state a waiter keeps between observations (when the failure started).
#[derive(Debug, Clone, Default)]
pub struct WaitState {
    failing_since: Option<Duration>,
}

/// The failure phase of every verb.
pub const FAILED: &str = "Failed";
/// The CocoonHibernation phase of a woken pod.
pub const ACTIVE: &str = "Active";

impl WaitState {
    /// Evaluates `obs` at `elapsed` since the wait began, for a write that produced
    /// `generation`. Observations of an earlier generation never count.
    pub fn evaluate(
        &mut self,
        goal: &Goal,
        obs: &Observation,
        generation: i64,
        grace: Duration,
        elapsed: Duration,
    ) -> Verdict {
        if !obs.exists {
            return Verdict::Gone;
        }
        let describe = || describe(obs);
        if obs.observed_generation < generation {
            self.failing_since = None;
            return Verdict::Waiting(format!(
                "waiting for the operator to observe generation {generation} (status is at {})",
                obs.observed_generation
            ));
        }
        let done = match goal {
            Goal::Phase(phases) => phases.contains(&obs.phase),
            Goal::Observed => true,
            Goal::Migrated { node } => {
                obs.phase != "Migrating"
                    && obs.phase != FAILED
                    && !obs.phase.is_empty()
                    && obs.main_node == *node
                    && obs.main_has_vm
            }
            Goal::PodReady => obs.phase == ACTIVE && obs.pod_ready,
        };
        if done {
            return Verdict::Done;
        }
        if *goal == Goal::PodReady && obs.phase == ACTIVE {
            self.failing_since = None;
            return Verdict::Waiting(format!("{}; the pod is not Ready yet", describe()));
        }
        if obs.phase == FAILED {
            let since = *self.failing_since.get_or_insert(elapsed);
            if elapsed.saturating_sub(since) >= grace {
                return Verdict::Failed(describe());
            }
        } else {
            self.failing_since = None;
        }
        Verdict::Waiting(describe())
    }
}

fn describe(obs: &Observation) -> String {
    let phase = if obs.phase.is_empty() {
        "no phase yet"
    } else {
        obs.phase.as_str()
    };
    if obs.ready_message.is_empty() || obs.ready_message == obs.phase {
        phase.to_string()
    } else {
        format!("{phase}: {}", obs.ready_message)
    }
}

/// Progress lines: `%7.3fs <message>`, with a repeated message shortened to `...`.
#[derive(Debug, Default)]
pub struct Progress {
    last: Option<String>,
}

impl Progress {
    /// The line to print for `message` at `elapsed`, or None when nothing changed.
    pub fn line(&mut self, elapsed: Duration, message: &str) -> Option<String> {
        if self.last.as_deref() == Some(message) {
            return None;
        }
        self.last = Some(message.to_string());
        Some(format!("{:7.3}s {message}", elapsed.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(phase: &str, observed: i64) -> Observation {
        Observation {
            exists: true,
            generation: 2,
            observed_generation: observed,
            phase: phase.into(),
            ..Default::default()
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_earlier_round_never_counts() {
        let mut w = WaitState::default();
        let goal = Goal::Phase(vec!["Suspended".into()]);
        // The previous suspend cycle's Suspended at generation 1 does not satisfy generation 2.
        assert!(matches!(
            w.evaluate(&goal, &obs("Suspended", 1), 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        assert_eq!(
            w.evaluate(&goal, &obs("Suspended", 2), 2, secs(0), secs(1)),
            Verdict::Done
        );
        assert_eq!(
            w.evaluate(&goal, &obs("Suspended", 3), 2, secs(0), secs(1)),
            Verdict::Done
        );
    }

    #[test]
    fn failed_counts_only_after_the_grace() {
        let mut w = WaitState::default();
        let goal = Goal::Phase(vec!["Suspended".into()]);
        let grace = secs(10);
        assert!(matches!(
            w.evaluate(&goal, &obs("Failed", 2), 2, grace, secs(5)),
            Verdict::Waiting(_)
        ));
        // It recovers within the grace: the clock resets.
        assert!(matches!(
            w.evaluate(&goal, &obs("Suspending", 2), 2, grace, secs(8)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.evaluate(&goal, &obs("Failed", 2), 2, grace, secs(12)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.evaluate(&goal, &obs("Failed", 2), 2, grace, secs(21)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.evaluate(&goal, &obs("Failed", 2), 2, grace, secs(22)),
            Verdict::Failed(_)
        ));
        // Zero grace: the first Failed is terminal.
        let mut w = WaitState::default();
        assert!(matches!(
            w.evaluate(&goal, &obs("Failed", 2), 2, secs(0), secs(0)),
            Verdict::Failed(_)
        ));
    }

    #[test]
    fn migration_needs_the_main_on_the_target_with_a_vm() {
        let goal = Goal::Migrated { node: "b".into() };
        let mut w = WaitState::default();
        let mut o = obs("Migrating", 2);
        o.main_node = "b".into();
        o.main_has_vm = true;
        assert!(matches!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        o.phase = "Running".into();
        o.main_has_vm = false;
        assert!(matches!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        o.main_has_vm = true;
        o.main_node = "a".into();
        assert!(matches!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        o.main_node = "b".into();
        assert_eq!(w.evaluate(&goal, &o, 2, secs(0), secs(0)), Verdict::Done);
        o.phase = "Scaling".into();
        assert_eq!(w.evaluate(&goal, &o, 2, secs(0), secs(0)), Verdict::Done);
    }

    #[test]
    fn a_woken_pod_counts_only_once_ready() {
        let goal = Goal::PodReady;
        let mut w = WaitState::default();
        let mut o = obs("Waking", 2);
        o.pod_ready = true; // a stale Ready from before the hibernation does not count
        assert!(matches!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        o.phase = "Active".into();
        o.pod_ready = false;
        assert_eq!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting("Active; the pod is not Ready yet".into())
        );
        o.pod_ready = true;
        assert_eq!(w.evaluate(&goal, &o, 2, secs(0), secs(0)), Verdict::Done);
        // An earlier generation's Active never counts.
        let mut o = obs("Active", 1);
        o.pod_ready = true;
        assert!(matches!(
            w.evaluate(&goal, &o, 2, secs(0), secs(0)),
            Verdict::Waiting(_)
        ));
        // The phase goal Active (`--until Active`) keeps the old behaviour.
        let o = obs("Active", 2);
        assert_eq!(
            w.evaluate(&Goal::Phase(vec!["Active".into()]), &o, 2, secs(0), secs(0)),
            Verdict::Done
        );
    }

    #[test]
    fn a_missing_object_is_gone() {
        let mut w = WaitState::default();
        let o = Observation::default();
        assert_eq!(
            w.evaluate(&Goal::Observed, &o, 1, secs(0), secs(0)),
            Verdict::Gone
        );
    }

    #[test]
    fn progress_lines_change_only_with_the_message() {
        let mut p = Progress::default();
        assert_eq!(
            p.line(Duration::from_millis(1500), "Suspending").as_deref(),
            Some("  1.500s Suspending")
        );
        assert_eq!(p.line(Duration::from_millis(2500), "Suspending"), None);
        assert_eq!(
            p.line(Duration::from_millis(3000), "Suspended").as_deref(),
            Some("  3.000s Suspended")
        );
    }
}
