//! The activity rules: what one sample says ([`activity`]), what to publish and when
//! ([`Tracker`]), how often the shell samples ([`sample_every`]) and what an exec does with a
//! pod whose VM is not running ([`exec_plan`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cocoon_api::contract::idle::{ActivityKind, LastActivity, MIN_SUSPEND_AFTER_SECS};

/// One reading of a VM's cumulative counters (the runtime's `vm_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Hypervisor CPU time.
    pub cpu_ns: u64,
    /// Bytes received plus bytes sent, over every TAP of the VM.
    pub net_bytes: u64,
}

/// What the VM did between `prev` and `cur` (`elapsed` apart), with `sessions` streams open
/// now: an open session first (the most explicit use), then traffic, then CPU above
/// `cpu_threshold_millicores`. A counter that went back (the VM restarted) says nothing; no
/// previous sample, only the sessions count.
pub fn activity(
    prev: Option<Sample>,
    cur: Sample,
    elapsed: Duration,
    sessions: usize,
    cpu_threshold_millicores: u64,
) -> Option<ActivityKind> {
    if sessions > 0 {
        return Some(ActivityKind::Session);
    }
    let prev = prev?;
    if cur.net_bytes > prev.net_bytes {
        return Some(ActivityKind::Traffic);
    }
    let cpu = u128::from(cur.cpu_ns.saturating_sub(prev.cpu_ns));
    let window = elapsed.as_nanos();
    // millicores = cpu ns * 1000 / window ns; compared without dividing.
    (window > 0 && cpu * 1000 > u128::from(cpu_threshold_millicores) * window)
        .then_some(ActivityKind::Cpu)
}

/// How often the shell samples the VMs when the shortest publish interval of its pods is
/// `interval`: twice per interval (so a write is never more than half an interval late), at
/// least every half of the smallest `suspendAfter`, at most every 100 ms.
pub fn sample_every(interval: Duration) -> Duration {
    (interval / 2).clamp(
        Duration::from_millis(100),
        Duration::from_secs(MIN_SUSPEND_AFTER_SECS / 2),
    )
}

#[derive(Debug, Clone, Copy)]
struct PodActivity {
    prev: Option<(Sample, Instant)>,
    /// The latest activity not yet published.
    pending: Option<LastActivity>,
    last_write: Option<Instant>,
}

/// The previous sample, the unpublished activity and the last write of each tracked pod.
/// Holds only the pods the shell keeps ([`Tracker::retain`]): the pods of this node.
#[derive(Debug)]
pub struct Tracker {
    cpu_threshold_millicores: u64,
    pods: HashMap<String, PodActivity>,
}

impl Tracker {
    pub fn new(cpu_threshold_millicores: u64) -> Self {
        Tracker {
            cpu_threshold_millicores,
            pods: HashMap::new(),
        }
    }

    /// Records pod `key`'s sample (`None`: its VM has no stats now, only sessions count) and
    /// open `sessions` at `now` (`wall` the same moment on the wall clock); answers the
    /// activity to publish now: the latest one since the last write, once `interval` passed
    /// since that write (the first one at once). Call [`Tracker::published`] once written.
    pub fn observe(
        &mut self,
        key: &str,
        sample: Option<Sample>,
        sessions: usize,
        now: Instant,
        wall: DateTime<Utc>,
        interval: Duration,
    ) -> Option<LastActivity> {
        let threshold = self.cpu_threshold_millicores;
        let pod = self.pods.entry(key.to_owned()).or_insert(PodActivity {
            prev: None,
            pending: None,
            last_write: None,
        });
        let kind = match sample {
            Some(cur) => {
                let (prev, elapsed) = match pod.prev {
                    Some((p, at)) => (Some(p), now.saturating_duration_since(at)),
                    None => (None, Duration::ZERO),
                };
                pod.prev = Some((cur, now));
                activity(prev, cur, elapsed, sessions, threshold)
            }
            None => {
                pod.prev = None;
                (sessions > 0).then_some(ActivityKind::Session)
            }
        };
        if let Some(kind) = kind {
            pod.pending = Some(LastActivity { at: wall, kind });
        }
        let due = pod
            .last_write
            .is_none_or(|t| now.saturating_duration_since(t) >= interval);
        pod.pending.filter(|_| due)
    }

    /// `key`'s activity was written at `now`: nothing is pending until new activity.
    pub fn published(&mut self, key: &str, now: Instant) {
        if let Some(pod) = self.pods.get_mut(key) {
            pod.pending = None;
            pod.last_write = Some(now);
        }
    }

    /// Forgets every pod `keep` says no to.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.pods.retain(|k, _| keep(k));
    }

    /// Pods tracked.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// What an exec or attach does with its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecPlan {
    /// The VM runs: run the command.
    Run,
    /// The VM is hibernated by a suspend: ask for a wake, hold the stream until it runs.
    WakeAndHold,
    /// No VM and not hibernated (or unmanaged): refuse as before.
    NoVm,
}

/// The plan for an exec given whether the pod has a running VM and carries the hibernate
/// request.
pub fn exec_plan(vm_running: bool, hibernate_requested: bool) -> ExecPlan {
    match (vm_running, hibernate_requested) {
        (true, _) => ExecPlan::Run,
        (false, true) => ExecPlan::WakeAndHold,
        (false, false) => ExecPlan::NoVm,
    }
}

/// The error text of an exec whose pod did not wake within `wait`.
pub fn still_suspended(namespace: &str, pod: &str, wait: Duration) -> String {
    format!(
        "vk-cocoon: pod {namespace}/{pod} is still suspended after {}s (VK_EXEC_WAKE_WAIT)",
        wait.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn at(cpu_ns: u64, net_bytes: u64) -> Sample {
        Sample { cpu_ns, net_bytes }
    }

    #[test]
    fn a_vm_is_active_with_a_session_traffic_or_cpu_above_the_threshold() {
        use ActivityKind::*;
        let idle = at(1_000_000_000, 500);
        // 100m of CPU over 10 s is 1e9 ns.
        /// What, the previous and current samples, open sessions, the answer.
        type Case = (
            &'static str,
            Option<Sample>,
            Sample,
            usize,
            Option<ActivityKind>,
        );
        let cases: &[Case] = &[
            ("nothing moved", Some(idle), idle, 0, None),
            ("an open session", Some(idle), idle, 1, Some(Session)),
            (
                "a session without a previous sample",
                None,
                idle,
                2,
                Some(Session),
            ),
            ("no previous sample, no session", None, idle, 0, None),
            (
                "bytes in or out",
                Some(idle),
                at(1_000_000_000, 501),
                0,
                Some(Traffic),
            ),
            (
                "a session wins over traffic",
                Some(idle),
                at(0, 9_999),
                1,
                Some(Session),
            ),
            (
                "100m: at the threshold is idle",
                Some(idle),
                at(2_000_000_000, 500),
                0,
                None,
            ),
            (
                "101m: above it",
                Some(idle),
                at(2_010_000_000, 500),
                0,
                Some(Cpu),
            ),
            (
                "counters went back (restart)",
                Some(idle),
                at(10, 0),
                0,
                None,
            ),
        ];
        for (what, prev, cur, sessions, want) in cases {
            assert_eq!(
                activity(*prev, *cur, 10 * S, *sessions, 100),
                *want,
                "{what}"
            );
        }
        assert_eq!(
            activity(Some(idle), at(u64::MAX, 500), Duration::ZERO, 0, 100),
            None
        );
    }

    #[test]
    fn the_sample_period_is_half_the_interval_within_bounds() {
        assert_eq!(sample_every(60 * S), 5 * S);
        assert_eq!(sample_every(2 * S), S);
        assert_eq!(sample_every(Duration::ZERO), Duration::from_millis(100));
    }

    fn wall(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("time")
    }

    /// One step of a scenario: seconds since start, sample, sessions, what is published.
    type Step = (u64, Option<Sample>, usize, Option<ActivityKind>);

    fn run(steps: &[Step], interval: Duration) -> Vec<Option<(u64, ActivityKind)>> {
        let base = Instant::now();
        let mut t = Tracker::new(200);
        steps
            .iter()
            .map(|(secs, sample, sessions, _)| {
                let now = base + Duration::from_secs(*secs);
                let out = t.observe(
                    "ns/p",
                    *sample,
                    *sessions,
                    now,
                    wall(*secs as i64),
                    interval,
                );
                if out.is_some() {
                    t.published("ns/p", now);
                }
                out.map(|a| ((a.at - wall(0)).num_seconds() as u64, a.kind))
            })
            .collect()
    }

    fn check(steps: &[Step], interval: Duration, what: &str) {
        let got = run(steps, interval);
        for ((secs, _, _, want), got) in steps.iter().zip(got) {
            assert_eq!(got.map(|(_, k)| k), *want, "{what}: at {secs}s");
        }
    }

    #[test]
    fn an_idle_vm_costs_no_writes() {
        let idle = Some(at(0, 0));
        let steps: Vec<Step> = (0..20).map(|i| (i * 5, idle, 0, None)).collect();
        check(&steps, 10 * S, "idle");
    }

    #[test]
    fn an_active_vm_is_written_at_once_then_once_per_interval() {
        use ActivityKind::Session;
        let s = Some(at(0, 0));
        let steps: &[Step] = &[
            (0, s, 1, Some(Session)),
            (5, s, 1, None),
            (10, s, 1, Some(Session)),
            (15, s, 1, None),
            (20, s, 1, Some(Session)),
            // The session ended: nothing new after the last write, nothing written.
            (25, s, 0, None),
            (30, s, 0, None),
            (35, s, 0, None),
        ];
        check(steps, 10 * S, "session");
        let times = run(steps, 10 * S);
        assert_eq!(
            times[2],
            Some((10, Session)),
            "the time written is the sample's"
        );
    }

    #[test]
    fn activity_between_writes_is_published_when_the_interval_is_up_with_its_own_time() {
        use ActivityKind::{Cpu, Traffic};
        let steps: &[Step] = &[
            (0, Some(at(0, 0)), 0, None),
            (1, Some(at(0, 10)), 0, Some(Traffic)),
            (3, Some(at(0, 20)), 0, None),
            (5, Some(at(0, 20)), 0, None),
            // A burst at 3 s is still unpublished at 11 s: written then, dated 3 s.
            (11, Some(at(0, 20)), 0, Some(Traffic)),
            (12, Some(at(1_000_000_000, 20)), 0, None),
            (21, Some(at(1_000_000_000, 20)), 0, Some(Cpu)),
        ];
        check(steps, 10 * S, "burst");
        let times = run(steps, 10 * S);
        assert_eq!(times[4], Some((3, Traffic)));
        assert_eq!(times[6], Some((12, Cpu)));
    }

    #[test]
    fn an_unwritten_activity_stays_pending_and_forgotten_pods_leave() {
        let base = Instant::now();
        let mut t = Tracker::new(200);
        let a = t.observe("ns/p", None, 1, base, wall(0), 10 * S);
        assert!(a.is_some());
        // The write failed (published not called): asked again next time.
        let b = t.observe("ns/p", None, 0, base + S, wall(1), 10 * S);
        assert_eq!(b, a);
        t.observe("ns/q", None, 0, base, wall(0), 10 * S);
        assert_eq!(t.len(), 2);
        t.retain(|k| k == "ns/q");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_exec_runs_holds_for_a_wake_or_is_refused() {
        assert_eq!(exec_plan(true, false), ExecPlan::Run);
        assert_eq!(exec_plan(true, true), ExecPlan::Run);
        assert_eq!(exec_plan(false, true), ExecPlan::WakeAndHold);
        assert_eq!(exec_plan(false, false), ExecPlan::NoVm);
        assert_eq!(
            still_suspended("ns", "p", 60 * S),
            "vk-cocoon: pod ns/p is still suspended after 60s (VK_EXEC_WAKE_WAIT)"
        );
    }
}
