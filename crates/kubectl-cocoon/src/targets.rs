//! The rules of multi-target verbs as pure functions: which object and phase a verb waits for,
//! how `kind/NAME` arguments read, the worst exit code of several outcomes, the final result
//! table and the command that resumes an interrupted wait.

use std::time::Duration;

use crate::error::{CliError, EXIT_ERROR, EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT};
use crate::table::{Cell, Tone};
use crate::wait::Goal;

/// What a target names: a CocoonSet, or a pod (watched through its CocoonHibernation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    CocoonSet,
    Pod,
}

impl Kind {
    /// The word in `kind/NAME` (and in the resume command).
    pub fn word(self) -> &'static str {
        match self {
            Kind::CocoonSet => "cocoonset",
            Kind::Pod => "pod",
        }
    }
}

/// One object a verb acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl Target {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Target {
        Target {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// `cocoonset/demo`, `pod/demo-0`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.kind.word(), self.name)
    }
}

/// Reads `cocoonset/NAME`, `pod/NAME` or `cocoonhibernation/NAME` (a hibernation is named after
/// its pod, so it names the same target). A bare NAME is `bare`'s kind.
pub fn parse_target(arg: &str, bare: Kind) -> Result<(Kind, String), CliError> {
    let (kind, name) = match arg.split_once('/') {
        None => (bare, arg),
        Some((word, name)) => {
            let kind = match word {
                "cocoonset" | "cocoonsets" | "cset" | "cs" => Kind::CocoonSet,
                "pod" | "pods" | "po" => Kind::Pod,
                "cocoonhibernation" | "cocoonhibernations" | "ch" => Kind::Pod,
                _ => {
                    return Err(CliError::Usage(format!(
                        "{arg:?}: unknown kind {word:?} (use cocoonset/NAME or cset/NAME, pod/NAME or cocoonhibernation/NAME)"
                    )));
                }
            };
            (kind, name)
        }
    };
    if name.is_empty() || name.contains('/') {
        return Err(CliError::Usage(format!("{arg:?}: expected KIND/NAME")));
    }
    Ok((kind, name.to_string()))
}

/// The phases `--for`/`--until` accepts per kind. `Ready` (pods only) means: the pod's
/// CocoonHibernation (if any) is `Active` and the pod reports Ready — its VM serves.
pub fn phases(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::CocoonSet => crate::cli::SET_PHASES,
        Kind::Pod => &[
            "Pending",
            "Hibernating",
            "Hibernated",
            "Waking",
            "Active",
            "Failed",
            READY,
        ],
    }
}

/// The pod goal beyond the hibernation phase.
pub const READY: &str = "Ready";

/// The verbs that wait on a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Suspend,
    Resume,
    Hibernate,
    Wake,
    /// The read-only `wait` (its phase comes from `--for`).
    Wait,
}

/// What one target's wait is for: the evaluator's goal and the words of messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoalSpec {
    pub goal: Goal,
    /// `Suspended`, `Ready`: the `--for` that resumes the wait, and the timeout message's goal.
    pub text: String,
}

/// The goal of `verb` on a target of `kind`, `wanted` being `--until` (or `--for` of `wait`).
/// Defaults: suspend → `Suspended`, resume (and `wake cocoonset/NAME`) → `Running` (every
/// member Ready), hibernate → `Hibernated`, wake POD → `Ready` (the hibernation `Active` and
/// the pod Ready). A phase of another kind is refused, naming the flag.
pub fn goal_for(verb: Verb, kind: Kind, wanted: Option<&str>) -> Result<GoalSpec, CliError> {
    let phase = match (wanted, verb, kind) {
        (Some(p), _, _) => p.to_string(),
        (None, Verb::Suspend, _) => "Suspended".into(),
        (None, Verb::Resume | Verb::Wake, Kind::CocoonSet) => "Running".into(),
        (None, Verb::Hibernate, _) => "Hibernated".into(),
        (None, Verb::Wake, Kind::Pod) => READY.into(),
        (None, Verb::Resume, Kind::Pod) => {
            return Err(CliError::Usage("resume acts on CocoonSets only".into()));
        }
        (None, Verb::Wait, _) => {
            return Err(CliError::Usage(
                "wait needs --for=PHASE (e.g. --for=Suspended)".into(),
            ));
        }
    };
    let flag = if verb == Verb::Wait {
        "--for"
    } else {
        "--until"
    };
    let Some(known) = phases(kind).iter().find(|p| p.eq_ignore_ascii_case(&phase)) else {
        return Err(CliError::Usage(format!(
            "{flag} {phase:?}: not a phase of {} (one of: {})",
            kind.word(),
            phases(kind).join(", ")
        )));
    };
    let text = known.to_string();
    let goal = if kind == Kind::Pod && text == READY {
        Goal::PodReady
    } else {
        Goal::Phase(vec![text.clone()])
    };
    Ok(GoalSpec { goal, text })
}

/// How one target ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The write was only sent (`--no-wait`) or was a server dry run.
    Written,
    TimedOut,
    Failed,
    /// API error, RBAC, not found, deleted while waiting.
    Error,
}

impl Outcome {
    pub fn of(result: &Result<(), CliError>) -> Outcome {
        match result {
            Ok(()) => Outcome::Done,
            Err(CliError::Timeout { .. }) => Outcome::TimedOut,
            Err(CliError::Failed { .. }) => Outcome::Failed,
            Err(_) => Outcome::Error,
        }
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Done | Outcome::Written => EXIT_OK,
            Outcome::TimedOut => EXIT_TIMEOUT,
            Outcome::Failed => EXIT_FAILED,
            Outcome::Error => EXIT_ERROR,
        }
    }

    fn word(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Written => "written",
            Outcome::TimedOut => "timed out",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
        }
    }

    fn tone(&self) -> Tone {
        match self {
            Outcome::Done | Outcome::Written => Tone::Good,
            Outcome::TimedOut => Tone::Warn,
            Outcome::Failed | Outcome::Error => Tone::Bad,
        }
    }
}

/// The exit code of several outcomes: the worst, Failed (4) over timed out (3) over error (1)
/// over success (0).
pub fn worst_exit(outcomes: &[Outcome]) -> i32 {
    let rank = |code: i32| match code {
        EXIT_FAILED => 3,
        EXIT_TIMEOUT => 2,
        EXIT_ERROR => 1,
        _ => 0,
    };
    outcomes
        .iter()
        .map(Outcome::exit_code)
        .max_by_key(|c| rank(*c))
        .unwrap_or(EXIT_OK)
}

/// One line of the final result table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRow {
    pub target: Target,
    pub outcome: Outcome,
    pub elapsed: Duration,
    /// The reached phase, or the error.
    pub message: String,
}

/// The result table's cells, in target order; the namespace column only when targets span
/// namespaces.
pub fn result_cells(rows: &[ResultRow]) -> (Vec<&'static str>, Vec<Vec<Cell>>) {
    let spans = rows.iter().any(|r| {
        rows.first()
            .is_some_and(|f| f.target.namespace != r.target.namespace)
    });
    let mut headers = vec!["target", "outcome", "elapsed", "message"];
    if spans {
        headers.insert(0, "namespace");
    }
    let cells = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                Cell::plain(r.target.display()),
                Cell::toned(r.outcome.word(), r.outcome.tone()),
                Cell::plain(format!("{:.1}s", r.elapsed.as_secs_f64())),
                Cell::plain(if r.message.is_empty() {
                    "-".to_string()
                } else {
                    r.message.clone()
                }),
            ];
            if spans {
                c.insert(0, Cell::plain(&r.target.namespace));
            }
            c
        })
        .collect();
    (headers, cells)
}

/// The one-line summary of several outcomes, the error text when not all succeeded.
pub fn summary(rows: &[ResultRow]) -> Option<String> {
    let bad = rows
        .iter()
        .filter(|r| r.outcome.exit_code() != EXIT_OK)
        .count();
    if bad == 0 {
        return None;
    }
    let count = |o: Outcome| rows.iter().filter(|r| r.outcome == o).count();
    let mut parts = Vec::new();
    for (o, word) in [
        (Outcome::Failed, "failed"),
        (Outcome::TimedOut, "timed out"),
        (Outcome::Error, "error"),
    ] {
        let n = count(o);
        if n > 0 {
            parts.push(format!("{n} {word}"));
        }
    }
    Some(format!(
        "{bad} of {} targets did not succeed ({})",
        rows.len(),
        parts.join(", ")
    ))
}

/// The commands that resume waiting for `pending` (one per namespace), for the Ctrl-C note.
pub fn resume_commands(
    program: &str,
    pending: &[(Target, String)],
    timeout: Duration,
    grace: Duration,
) -> Vec<String> {
    let mut by_ns: Vec<(&str, &str, Vec<String>)> = Vec::new();
    for (t, goal) in pending {
        match by_ns
            .iter_mut()
            .find(|(ns, g, _)| *ns == t.namespace && *g == goal)
        {
            Some((_, _, names)) => names.push(t.display()),
            None => by_ns.push((&t.namespace, goal, vec![t.display()])),
        }
    }
    by_ns
        .into_iter()
        .map(|(ns, goal, names)| {
            let mut cmd = format!("{program} wait -n {ns} {} --for={goal}", names.join(" "));
            cmd.push_str(&format!(" --timeout={}", crate::duration::human(timeout)));
            if grace != DEFAULT_GRACE {
                cmd.push_str(&format!(
                    " --failure-grace={}",
                    crate::duration::human(grace)
                ));
            }
            cmd
        })
        .collect()
}

/// `--failure-grace`'s default (kept in step with the flag's).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    /// argument, bare kind, what it reads as (None: a usage error).
    type Case<'a> = (&'a str, Kind, Option<(Kind, &'a str)>);

    #[test]
    fn target_words() {
        let cases: &[Case] = &[
            ("demo", Kind::CocoonSet, Some((Kind::CocoonSet, "demo"))),
            ("demo-0", Kind::Pod, Some((Kind::Pod, "demo-0"))),
            ("cocoonset/demo", Kind::Pod, Some((Kind::CocoonSet, "demo"))),
            ("cs/demo", Kind::Pod, Some((Kind::CocoonSet, "demo"))),
            ("cset/demo", Kind::Pod, Some((Kind::CocoonSet, "demo"))),
            ("pod/demo-0", Kind::CocoonSet, Some((Kind::Pod, "demo-0"))),
            ("po/demo-0", Kind::CocoonSet, Some((Kind::Pod, "demo-0"))),
            (
                "cocoonhibernation/demo-0",
                Kind::CocoonSet,
                Some((Kind::Pod, "demo-0")),
            ),
            ("ch/demo-0", Kind::CocoonSet, Some((Kind::Pod, "demo-0"))),
            ("deployment/x", Kind::Pod, None),
            ("pod/", Kind::Pod, None),
            ("pod/a/b", Kind::Pod, None),
            ("", Kind::Pod, None),
        ];
        for (arg, bare, want) in cases {
            let got = parse_target(arg, *bare);
            match want {
                Some((k, n)) => assert_eq!(got.expect(arg), (*k, n.to_string()), "{arg}"),
                None => assert!(matches!(got, Err(CliError::Usage(_))), "{arg}: {got:?}"),
            }
        }
    }

    #[test]
    fn which_phase_each_verb_waits_for() {
        let phase = |p: &str| Goal::Phase(vec![p.to_string()]);
        let cases: &[(Verb, Kind, Option<&str>, Goal, &str)] = &[
            (
                Verb::Suspend,
                Kind::CocoonSet,
                None,
                phase("Suspended"),
                "Suspended",
            ),
            (
                Verb::Resume,
                Kind::CocoonSet,
                None,
                phase("Running"),
                "Running",
            ),
            (
                Verb::Wake,
                Kind::CocoonSet,
                None,
                phase("Running"),
                "Running",
            ),
            (
                Verb::Hibernate,
                Kind::Pod,
                None,
                phase("Hibernated"),
                "Hibernated",
            ),
            // wake POD returns when the VM serves again, not when the CR reads Active.
            (Verb::Wake, Kind::Pod, None, Goal::PodReady, "Ready"),
            (
                Verb::Wake,
                Kind::Pod,
                Some("Active"),
                phase("Active"),
                "Active",
            ),
            (
                Verb::Wake,
                Kind::Pod,
                Some("active"),
                phase("Active"),
                "Active",
            ),
            (
                Verb::Suspend,
                Kind::CocoonSet,
                Some("Suspending"),
                phase("Suspending"),
                "Suspending",
            ),
            (
                Verb::Wait,
                Kind::CocoonSet,
                Some("Suspended"),
                phase("Suspended"),
                "Suspended",
            ),
            (
                Verb::Wait,
                Kind::Pod,
                Some("Hibernated"),
                phase("Hibernated"),
                "Hibernated",
            ),
            (
                Verb::Wait,
                Kind::Pod,
                Some("Ready"),
                Goal::PodReady,
                "Ready",
            ),
        ];
        for (verb, kind, wanted, goal, text) in cases {
            let got = goal_for(*verb, *kind, *wanted).expect("valid");
            assert_eq!(
                (&got.goal, got.text.as_str()),
                (goal, *text),
                "{verb:?} {kind:?} {wanted:?}"
            );
        }
        for (verb, kind, wanted, flag) in [
            (Verb::Wait, Kind::CocoonSet, Some("Hibernated"), "--for"),
            (Verb::Wait, Kind::Pod, Some("Suspended"), "--for"),
            (Verb::Suspend, Kind::CocoonSet, Some("Ready"), "--until"),
            (Verb::Wait, Kind::Pod, None, "--for"),
        ] {
            let err = goal_for(verb, kind, wanted).expect_err("refused");
            assert!(
                matches!(&err, CliError::Usage(m) if m.contains(flag)),
                "{verb:?} {wanted:?}: {err}"
            );
        }
    }

    #[test]
    fn the_worst_outcome_decides_the_exit_code() {
        use Outcome::*;
        let cases: &[(&[Outcome], i32)] = &[
            (&[], 0),
            (&[Done, Done], 0),
            (&[Done, Written], 0),
            (&[Done, Error], 1),
            (&[Error, TimedOut], 3),
            (&[TimedOut, Done, Error], 3),
            (&[TimedOut, Failed, Error], 4),
            (&[Failed, Done], 4),
        ];
        for (outcomes, code) in cases {
            assert_eq!(worst_exit(outcomes), *code, "{outcomes:?}");
        }
    }

    #[test]
    fn result_table_says_what_each_target_did() {
        let row = |ns: &str, name: &str, o: Outcome, ms: u64, m: &str| ResultRow {
            target: Target::new(Kind::CocoonSet, ns, name),
            outcome: o,
            elapsed: Duration::from_millis(ms),
            message: m.into(),
        };
        let rows = vec![
            row("a", "one", Outcome::Done, 12_340, "Suspended"),
            row("a", "two", Outcome::TimedOut, 60_000, "Suspending: 1/2 VMs"),
        ];
        let (h, c) = result_cells(&rows);
        assert_eq!(
            crate::table::render(&h, &c, false),
            "TARGET          OUTCOME     ELAPSED   MESSAGE\n\
             cocoonset/one   done        12.3s     Suspended\n\
             cocoonset/two   timed out   60.0s     Suspending: 1/2 VMs\n"
        );
        assert_eq!(
            summary(&rows).as_deref(),
            Some("1 of 2 targets did not succeed (1 timed out)")
        );
        let spread = vec![
            row("a", "one", Outcome::Done, 0, ""),
            row("b", "one", Outcome::Error, 0, "x"),
        ];
        let (h, c) = result_cells(&spread);
        assert_eq!(h[0], "namespace");
        assert_eq!(c[0][4].text, "-");
        assert_eq!(summary(&spread[..1]), None);
    }

    #[test]
    fn resume_commands_group_by_namespace_and_goal() {
        let t = |ns: &str, k: Kind, n: &str| Target::new(k, ns, n);
        let pending = vec![
            (t("a", Kind::CocoonSet, "one"), "Suspended".to_string()),
            (t("a", Kind::CocoonSet, "two"), "Suspended".to_string()),
            (t("b", Kind::Pod, "p-0"), "Ready".to_string()),
        ];
        assert_eq!(
            resume_commands(
                "kubectl cocoon",
                &pending,
                Duration::from_secs(600),
                DEFAULT_GRACE
            ),
            [
                "kubectl cocoon wait -n a cocoonset/one cocoonset/two --for=Suspended --timeout=10m0s",
                "kubectl cocoon wait -n b pod/p-0 --for=Ready --timeout=10m0s",
            ]
        );
        assert_eq!(
            resume_commands(
                "kubectl-cocoon",
                &pending[..1],
                Duration::from_secs(60),
                Duration::ZERO
            ),
            [
                "kubectl-cocoon wait -n a cocoonset/one --for=Suspended --timeout=1m0s --failure-grace=0s"
            ]
        );
    }
}
