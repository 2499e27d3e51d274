//! Table tests of the idle rules (issue 39), in the words.

use std::time::Duration;

use cocoon_api::contract::idle::{self, ActivityKind, LastActivity};
use cocoon_api::crd::set::CocoonSetPhase::{self, Running, Scaling, Suspended, Suspending};

use super::rules::{
    Act, CLOCK_RESUMED, CLOCK_STARTED, CLOCK_WOKEN, Facts, IdleCondition, Member, Refusal, Tick,
    Trigger, decide, last_activity,
};
use crate::cocoonset::fixtures::at;

const LIMIT: u64 = 20;

/// A Running set created at 0 with `suspendAfter: 20s`, its main Ready since 0.
fn running() -> Facts {
    Facts {
        suspend_after_text: Some("20s".into()),
        suspend_after: Some(Duration::from_secs(LIMIT)),
        wakes_on_exec: true,
        generation: 5,
        created: Some(at(0)),
        phase: Some(Running),
        members: vec![member("demo-0")],
        ..Facts::default()
    }
}

fn member(name: &str) -> Member {
    Member {
        name: name.into(),
        ready_since: Some(at(0)),
        suspend_after: Some("20s".into()),
        ..Member::default()
    }
}

fn active(mut f: Facts, pod: usize, s: i64, kind: ActivityKind) -> Facts {
    f.members[pod].activity = Some(LastActivity { at: at(s), kind });
    f
}

fn with_sub(mut f: Facts) -> Facts {
    f.members.push(member("demo-1"));
    f
}

/// Idle-suspended at `s` (the operator's patch went through at generation 6).
fn idle_suspended(s: i64) -> Facts {
    Facts {
        suspend: true,
        generation: 6,
        phase: Some(Suspended),
        idle_suspended: Some(Some(at(s))),
        condition: Some(IdleCondition {
            status: true,
            reason: idle::reasons::IDLE_SUSPENDED.into(),
            observed_generation: Some(6),
        }),
        ..running()
    }
}

fn wake_request(mut f: Facts, pod: usize, s: i64) -> Facts {
    f.members[pod].wake_request = Some(at(s));
    f
}

fn in_phase(mut f: Facts, phase: CocoonSetPhase) -> Facts {
    f.phase = Some(phase);
    f
}

#[test]
fn a_set_suspends_once_every_member_is_idle_for_suspend_after() {
    // (what, facts, now, act, look again in)
    let cases: Vec<(&str, Facts, i64, Act, Option<u64>)> = vec![
        (
            "idle since its start, not yet for 20s: look again when it would be",
            running(),
            15,
            Act::Nothing,
            Some(5),
        ),
        (
            "idle for exactly suspendAfter since it started: suspend",
            running(),
            20,
            Act::Suspend {
                last: Tick::new(at(0), CLOCK_STARTED),
            },
            None,
        ),
        (
            "traffic 10s ago keeps it up",
            active(running(), 0, 30, ActivityKind::Traffic),
            40,
            Act::Nothing,
            Some(10),
        ),
        (
            "an open session the node keeps publishing keeps it up",
            active(running(), 0, 55, ActivityKind::Session),
            60,
            Act::Nothing,
            Some(15),
        ),
        (
            "a busy CPU keeps it up",
            active(running(), 0, 59, ActivityKind::Cpu),
            60,
            Act::Nothing,
            Some(19),
        ),
        (
            "one active sub-agent keeps the whole set up",
            active(
                active(with_sub(running()), 0, 1, ActivityKind::Traffic),
                1,
                50,
                ActivityKind::Traffic,
            ),
            60,
            Act::Nothing,
            Some(10),
        ),
        (
            "every member idle for 20s: suspend on the latest activity",
            active(
                active(with_sub(running()), 0, 10, ActivityKind::Traffic),
                1,
                30,
                ActivityKind::Session,
            ),
            50,
            Act::Suspend {
                last: Tick::new(at(30), "session"),
            },
            None,
        ),
        (
            "a woken set counts from its wake",
            Facts {
                clock: Some(Tick::new(at(100), CLOCK_WOKEN)),
                ..running()
            },
            110,
            Act::Nothing,
            Some(10),
        ),
        (
            "a pod that came up late counts from its readiness",
            Facts {
                members: vec![Member {
                    ready_since: Some(at(90)),
                    ..member("demo-0")
                }],
                ..running()
            },
            100,
            Act::Nothing,
            Some(10),
        ),
        (
            "only while Running: Scaling waits",
            in_phase(running(), Scaling),
            100,
            Act::Nothing,
            None,
        ),
        (
            "no suspendAfter: never",
            Facts {
                suspend_after_text: None,
                suspend_after: None,
                ..running()
            },
            1000,
            Act::Nothing,
            None,
        ),
        (
            "an activity time in the future counts as now, not later",
            active(running(), 0, 10_000, ActivityKind::Traffic),
            100,
            Act::Nothing,
            Some(LIMIT),
        ),
    ];
    for (what, facts, now, act, check_in) in cases {
        let v = decide(&facts, at(now));
        assert_eq!(v.act, act, "{what}");
        assert_eq!(v.check_in, check_in.map(Duration::from_secs), "{what}");
    }
}

#[test]
fn status_idle_says_the_last_activity_and_what_it_was() {
    let f = active(running(), 0, 30, ActivityKind::Cpu);
    assert_eq!(last_activity(&f, at(40)), Some(Tick::new(at(30), "cpu")));
    assert_eq!(decide(&f, at(40)).last, Some(Tick::new(at(30), "cpu")));
    let off = Facts {
        suspend_after: None,
        suspend_after_text: None,
        ..f
    };
    assert_eq!(
        decide(&off, at(40)).last,
        None,
        "absent without suspendAfter"
    );
}

#[test]
fn a_user_always_wins() {
    let user_suspended = Facts {
        suspend: true,
        phase: Some(Suspended),
        ..running()
    };
    // (what, facts, act)
    let cases: Vec<(&str, Facts, Act)> = vec![
        (
            "a user's suspend is never woken by an exec: one refusal",
            wake_request(user_suspended.clone(), 0, 50),
            Act::RefuseWake {
                pod: "demo-0".into(),
                at: at(50),
                why: Refusal::UserSuspended,
            },
        ),
        (
            "the refusal is told once, not once per pass",
            Facts {
                wake_handled: Some(at(50)),
                ..wake_request(user_suspended.clone(), 0, 50)
            },
            Act::Nothing,
        ),
        (
            "a request that woke an earlier idle suspend is old: no refusal",
            Facts {
                wake_handled: Some(at(30)),
                ..wake_request(user_suspended.clone(), 0, 30)
            },
            Act::Nothing,
        ),
        (
            "a user's suspend is never suspended again or announced",
            user_suspended.clone(),
            Act::Nothing,
        ),
        (
            "a user's resume restarts the idle clock",
            Facts {
                suspend: false,
                generation: 7,
                ..idle_suspended(40)
            },
            Act::Resumed {
                drop_idle_suspended: true,
            },
        ),
        (
            "a user's resume of the user's own suspend restarts it too",
            Facts {
                suspend: false,
                generation: 7,
                ..user_suspended.clone()
            },
            Act::Resumed {
                drop_idle_suspended: false,
            },
        ),
        (
            "the restart is made once: the Idle condition is of this generation",
            Facts {
                suspend: false,
                generation: 7,
                condition: Some(IdleCondition {
                    status: false,
                    reason: idle::reasons::ACTIVE.into(),
                    observed_generation: Some(7),
                }),
                ..user_suspended.clone()
            },
            Act::Nothing,
        ),
        (
            "a resume by hand that left the idle mark: the mark goes",
            Facts {
                suspend: false,
                phase: Some(Running),
                ..idle_suspended(40)
            },
            Act::DropIdleSuspended,
        ),
    ];
    for (what, facts, act) in cases {
        assert_eq!(decide(&facts, at(100)).act, act, "{what}");
    }
}

#[test]
fn a_resumed_set_is_not_suspended_again_at_once() {
    // The resume restarted the clock at 100; the set is Running again at 105.
    let f = Facts {
        clock: Some(Tick::new(at(100), CLOCK_RESUMED)),
        ..running()
    };
    let v = decide(&f, at(105));
    assert_eq!(v.act, Act::Nothing);
    assert_eq!(v.check_in, Some(Duration::from_secs(15)));
    assert_eq!(
        decide(&f, at(120)).act,
        Act::Suspend {
            last: Tick::new(at(100), CLOCK_RESUMED)
        },
        "then suspendAfter later it is idle again"
    );
}

#[test]
fn an_exec_wakes_an_idle_suspended_set() {
    // (what, facts, act)
    let cases: Vec<(&str, Facts, Act)> = vec![
        (
            "the idle suspend is announced first",
            Facts {
                condition: None,
                ..wake_request(idle_suspended(40), 0, 50)
            },
            Act::AnnounceSuspend,
        ),
        (
            "a request newer than the idle suspend wakes it",
            wake_request(idle_suspended(40), 0, 50),
            Act::WakeByExec {
                pod: "demo-0".into(),
                at: at(50),
            },
        ),
        (
            "a request in the second of the suspend wakes it",
            wake_request(idle_suspended(40), 0, 40),
            Act::WakeByExec {
                pod: "demo-0".into(),
                at: at(40),
            },
        ),
        (
            "a request from before the idle suspend is an old one",
            wake_request(idle_suspended(40), 0, 30),
            Act::Nothing,
        ),
        (
            "a request to a sub-agent wakes the set too",
            wake_request(with_sub(idle_suspended(40)), 1, 41),
            Act::WakeByExec {
                pod: "demo-1".into(),
                at: at(41),
            },
        ),
        (
            "wakeOn without exec: refused once",
            Facts {
                wakes_on_exec: false,
                ..wake_request(idle_suspended(40), 0, 50)
            },
            Act::RefuseWake {
                pod: "demo-0".into(),
                at: at(50),
                why: Refusal::NotInWakeOn,
            },
        ),
        (
            "while it is still Suspending the wake goes through",
            in_phase(wake_request(idle_suspended(40), 0, 50), Suspending),
            Act::WakeByExec {
                pod: "demo-0".into(),
                at: at(50),
            },
        ),
    ];
    for (what, facts, act) in cases {
        assert_eq!(decide(&facts, at(100)).act, act, "{what}");
    }
}

#[test]
fn a_wake_is_announced_and_restarts_the_clock() {
    let woken = |by: &str| Facts {
        suspend: false,
        idle_suspended: None,
        woken_by: Some(by.into()),
        generation: 7,
        ..idle_suspended(40)
    };
    assert_eq!(
        decide(&woken("exec"), at(100)).act,
        Act::AnnounceWake(Trigger::Exec)
    );
    assert_eq!(
        decide(&woken("connection"), at(100)).act,
        Act::AnnounceWake(Trigger::Connection)
    );
    assert_eq!(decide(&woken("magic"), at(100)).act, Act::DropWokenBy);
    assert_eq!(Trigger::Exec.reason(), "WokenByExec");
    assert_eq!(Trigger::Connection.reason(), "WokenByConnection");
    // Announced (the condition at the wake's generation): not a user's resume.
    let after = Facts {
        woken_by: None,
        condition: Some(IdleCondition {
            status: false,
            reason: "WokenByExec".into(),
            observed_generation: Some(7),
        }),
        clock: Some(Tick::new(at(100), CLOCK_WOKEN)),
        ..woken("exec")
    };
    assert_eq!(decide(&after, at(101)).act, Act::Nothing);
}

#[test]
fn member_pods_carry_the_sets_suspend_after() {
    let mut f = with_sub(running());
    f.members[1].suspend_after = None;
    assert_eq!(
        decide(&f, at(1)).marks,
        [("demo-1".to_owned(), Some("20s".to_owned()))]
    );
    let off = Facts {
        suspend_after: None,
        suspend_after_text: None,
        ..f
    };
    assert_eq!(
        decide(&off, at(1)).marks,
        [("demo-0".to_owned(), None)],
        "removed once suspendAfter is unset"
    );
}
