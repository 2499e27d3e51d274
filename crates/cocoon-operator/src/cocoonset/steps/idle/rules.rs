//! Pure rules of the idle step (issue 39): given what the set and its members say, when the
//! set suspends by itself, what an exec's wake request does, and how a wake or a user's
//! resume restarts the idle clock. The step's planner ([`super::plan`]) gathers the
//! [`Facts`] and turns the [`Verdict`] into writes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::idle::{self, LastActivity};
use cocoon_api::crd::set::CocoonSetPhase;

/// The idle clock's entries the operator writes itself (`status.idle.lastActivityKind`).
pub const CLOCK_STARTED: &str = "started";
pub const CLOCK_WOKEN: &str = "woken";
pub const CLOCK_RESUMED: &str = "resumed";

/// What woke a set (the value of [`idle::WOKEN_BY`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Connection,
    Exec,
}

impl Trigger {
    /// The annotation value read back; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            idle::WOKEN_BY_CONNECTION => Some(Self::Connection),
            idle::WOKEN_BY_EXEC => Some(Self::Exec),
            _ => None,
        }
    }

    /// The metric label (`trigger`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => idle::WOKEN_BY_CONNECTION,
            Self::Exec => idle::WOKEN_BY_EXEC,
        }
    }

    /// The condition and Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Connection => idle::reasons::WOKEN_BY_CONNECTION,
            Self::Exec => idle::reasons::WOKEN_BY_EXEC,
        }
    }
}

/// One point of the idle clock: when, and what it was (`traffic`, `session`, `cpu`, or one of
/// the operator's `started`, `woken`, `resumed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    pub at: DateTime<Utc>,
    pub kind: String,
}

impl Tick {
    pub fn new(at: DateTime<Utc>, kind: &str) -> Self {
        Tick {
            at,
            kind: kind.to_owned(),
        }
    }
}

impl From<LastActivity> for Tick {
    fn from(a: LastActivity) -> Self {
        Tick::new(a.at, a.kind.as_str())
    }
}

/// The `Idle` condition as the set carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleCondition {
    pub status: bool,
    pub reason: String,
    pub observed_generation: Option<i64>,
}

/// One member pod, as the idle rules see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// [`idle::LAST_ACTIVITY`] / [`idle::LAST_ACTIVITY_KIND`], when the node published them.
    pub activity: Option<LastActivity>,
    /// When its `Ready` condition last turned `True` (the VM came up), while it is Ready.
    pub ready_since: Option<DateTime<Utc>>,
    /// [`idle::WAKE_REQUEST`], when parsable.
    pub wake_request: Option<DateTime<Utc>>,
    /// [`idle::SUSPEND_AFTER`] as the pod carries it.
    pub suspend_after: Option<String>,
}

/// Everything the idle rules read, gathered from the set and its member pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// `spec.idle.suspendAfter` as written, and parsed.
    pub suspend_after_text: Option<String>,
    pub suspend_after: Option<Duration>,
    /// `exec` is in `spec.idle.wakeOn` (or the list is empty).
    pub wakes_on_exec: bool,
    /// `spec.suspend`.
    pub suspend: bool,
    pub generation: i64,
    pub created: Option<DateTime<Utc>>,
    pub phase: Option<CocoonSetPhase>,
    /// [`idle::IDLE_SUSPENDED`]: `Some(None)` when present but not a time.
    pub idle_suspended: Option<Option<DateTime<Utc>>>,
    /// [`idle::WOKEN_BY`], as written.
    pub woken_by: Option<String>,
    /// [`idle::WAKE_HANDLED`]: the newest wake request already acted on or refused.
    pub wake_handled: Option<DateTime<Utc>>,
    /// `status.idle`, when it parses.
    pub clock: Option<Tick>,
    pub condition: Option<IdleCondition>,
    pub members: Vec<Member>,
}

/// Why a wake request was not acted on (the Event's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The user suspended the set (`spec.suspend` without [`idle::IDLE_SUSPENDED`]).
    UserSuspended,
    /// `spec.idle.wakeOn` does not name `exec`.
    NotInWakeOn,
}

impl Refusal {
    pub fn message(self, pod: &str) -> String {
        match self {
            Refusal::UserSuspended => format!(
                "exec to {pod} asked for a wake; ignored: the set was suspended by a user (spec.suspend), only a user's resume wakes it"
            ),
            Refusal::NotInWakeOn => format!(
                "exec to {pod} asked for a wake; ignored: spec.idle.wakeOn does not include exec"
            ),
        }
    }
}

/// What the set does this pass (at most one of these; the writes that end the pass are
/// [`Act::Suspend`] and [`Act::WakeByExec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Nothing,
    /// [`idle::WOKEN_BY`] is present: say so (condition, Event, metric), restart the clock
    /// (`woken`), remove the annotation.
    AnnounceWake(Trigger),
    /// Announce a garbled [`idle::WOKEN_BY`] nothing can read: just remove it.
    DropWokenBy,
    /// The set's own idle suspend went through: condition `Idle=True`, Event, metric.
    AnnounceSuspend,
    /// A member's exec asked (at `at`) to wake the idle-suspended set: write the wake.
    WakeByExec {
        pod: String,
        at: DateTime<Utc>,
    },
    /// A wake request that is not acted on: one Event, and remember it.
    RefuseWake {
        pod: String,
        at: DateTime<Utc>,
        why: Refusal,
    },
    /// A user resumed the set: restart the clock (`resumed`), drop a stale
    /// [`idle::IDLE_SUSPENDED`].
    Resumed {
        drop_idle_suspended: bool,
    },
    /// A user resumed the set by hand without the plugin: only drop the stale annotation.
    DropIdleSuspended,
    /// Every member has been idle for `suspendAfter`: suspend.
    Suspend {
        last: Tick,
    },
}

/// The idle step's decision over [`Facts`] at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Member pods whose [`idle::SUSPEND_AFTER`] must change to this (`None`: remove).
    pub marks: Vec<(String, Option<String>)>,
    /// The set's last activity (what `status.idle` says); `None` without `suspendAfter`.
    pub last: Option<Tick>,
    pub act: Act,
    /// Look again after this long (the idle limit is still ahead).
    pub check_in: Option<Duration>,
}

/// Member activity, start and wake times, and the clock kept in `status.idle`: the latest
/// one (a time in the future counts as now, so a skewed clock cannot keep a set awake
/// longer than its activity does).
pub fn last_activity(f: &Facts, now: DateTime<Utc>) -> Option<Tick> {
    let mut ticks: Vec<Tick> = Vec::new();
    ticks.extend(f.clock.clone());
    ticks.extend(f.created.map(|at| Tick::new(at, CLOCK_STARTED)));
    for m in &f.members {
        ticks.extend(m.ready_since.map(|at| Tick::new(at, CLOCK_STARTED)));
        ticks.extend(m.activity.map(Tick::from));
    }
    // The first of equal times wins: the clock as written stays.
    ticks
        .into_iter()
        .map(|t| Tick::new(t.at.min(now), &t.kind))
        .reduce(|best, t| if t.at > best.at { t } else { best })
}

/// The newest wake request of any member that is not older than `since` (times are whole
/// seconds: a request in the second of the suspend counts) and newer than the last one
/// handled.
fn newest_request(f: &Facts, since: Option<DateTime<Utc>>) -> Option<(String, DateTime<Utc>)> {
    f.members
        .iter()
        .filter_map(|m| Some((m.name.clone(), m.wake_request?)))
        .filter(|(_, at)| since.is_none_or(|s| *at >= s))
        .filter(|(_, at)| f.wake_handled.is_none_or(|h| *at > h))
        .max_by_key(|(_, at)| *at)
}

/// The rule of the idle step:
/// * a member pod carries the set's `suspendAfter` (removed when it is unset);
/// * a wake someone wrote ([`idle::WOKEN_BY`]) is announced first;
/// * while suspended: an idle suspend is announced once; an exec's wake request newer than the
///   idle suspend wakes it when `wakeOn` has `exec`; a request for a user's suspend, or with
///   `exec` not in `wakeOn`, is refused with one Event;
/// * while not suspended: a user's resume (the status still `Suspended`/`Suspending`, the
///   `Idle` condition from an older generation) restarts the clock; a Running set whose every
///   member has been idle for `suspendAfter` suspends; otherwise look again when it would.
pub fn decide(f: &Facts, now: DateTime<Utc>) -> Verdict {
    let marks = f
        .members
        .iter()
        .filter(|m| m.suspend_after != f.suspend_after_text)
        .map(|m| (m.name.clone(), f.suspend_after_text.clone()))
        .collect();
    let last = f.suspend_after.and(last_activity(f, now));
    let mut verdict = Verdict {
        marks,
        last: last.clone(),
        act: Act::Nothing,
        check_in: None,
    };
    if let Some(text) = &f.woken_by {
        verdict.act = Trigger::parse(text).map_or(Act::DropWokenBy, Act::AnnounceWake);
        return verdict;
    }
    if f.suspend {
        verdict.act = suspended(f);
        return verdict;
    }
    let waking = matches!(
        f.phase,
        Some(CocoonSetPhase::Suspended | CocoonSetPhase::Suspending)
    );
    let stale = f.idle_suspended.is_some();
    let seen = f
        .condition
        .as_ref()
        .is_some_and(|c| c.observed_generation == Some(f.generation));
    if f.suspend_after.is_some() && waking && !seen {
        verdict.act = Act::Resumed {
            drop_idle_suspended: stale,
        };
        return verdict;
    }
    if stale {
        verdict.act = Act::DropIdleSuspended;
        return verdict;
    }
    let (Some(limit), Some(last)) = (f.suspend_after, last) else {
        return verdict;
    };
    if f.phase != Some(CocoonSetPhase::Running) {
        return verdict;
    }
    let idle_for = (now - last.at).to_std().unwrap_or_default();
    match limit.checked_sub(idle_for) {
        Some(left) if !left.is_zero() => {
            verdict.check_in = Some(left.max(Duration::from_secs(1)));
        }
        _ => verdict.act = Act::Suspend { last },
    }
    verdict
}

/// [`decide`] for a set with `spec.suspend: true`.
fn suspended(f: &Facts) -> Act {
    let announced = f
        .condition
        .as_ref()
        .is_some_and(|c| c.status && c.reason == idle::reasons::IDLE_SUSPENDED);
    match f.idle_suspended {
        Some(_) if !announced => Act::AnnounceSuspend,
        Some(since) => {
            // A request from before this idle suspend is an old one.
            match newest_request(f, since) {
                Some((pod, at)) if f.wakes_on_exec => Act::WakeByExec { pod, at },
                Some((pod, at)) => Act::RefuseWake {
                    pod,
                    at,
                    why: Refusal::NotInWakeOn,
                },
                None => Act::Nothing,
            }
        }
        None => match newest_request(f, None) {
            Some((pod, at)) => Act::RefuseWake {
                pod,
                at,
                why: Refusal::UserSuspended,
            },
            None => Act::Nothing,
        },
    }
}
