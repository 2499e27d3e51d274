//! Table tests of the rules of step 9 (the release-policy wake) of `cocoonset.md`.

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::CocoonSetPhase;
use k8s_openapi::api::core::v1::Pod;

use super::rules::{self, WakeStep};
use crate::cocoonset::fixtures::{agent, live, on, phase, unschedulable, with};
use crate::cocoonset::pods;

fn restored(p: Pod) -> Pod {
    with(p, ann::RESTORE_FROM_HIBERNATE, "true")
}

/// (what, status phase, hint, main, expected step).
type WakeCase = (
    &'static str,
    Option<CocoonSetPhase>,
    &'static str,
    Option<Pod>,
    WakeStep,
);

#[test]
fn wake_step_table() {
    use CocoonSetPhase::*;
    let main = on(agent(0), "node-a");
    let cases: Vec<WakeCase> = vec![
        (
            "running, no hint: no registry call",
            Some(Running),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "pending, no hint",
            Some(Pending),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
        (
            "suspending, no hint",
            Some(Suspending),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "suspended, main gone",
            Some(Suspended),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "suspended retain set with no pods",
            Some(Suspended),
            "",
            None,
            WakeStep::Start,
        ),
        (
            "suspending with hint, gone",
            Some(Suspending),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, gone",
            Some(Waking),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, not live",
            Some(Waking),
            "node-a",
            Some(restored(agent(0))),
            WakeStep::WaitLive {
                unschedulable: None,
            },
        ),
        (
            "waking, unschedulable",
            Some(Waking),
            "node-a",
            Some(unschedulable(restored(agent(0)), "0/3 nodes are available")),
            WakeStep::WaitLive {
                unschedulable: Some("0/3 nodes are available".into()),
            },
        ),
        (
            "waking, live on the hint",
            Some(Waking),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "waking, live elsewhere",
            Some(Waking),
            "node-a",
            Some(live(restored(on(agent(0), "node-b")), 3)),
            WakeStep::Complete {
                placement: Some("pool"),
            },
        ),
        (
            "stale Waking without a hint does not score again",
            Some(Waking),
            "",
            Some(live(main.clone(), 3)),
            WakeStep::Complete { placement: None },
        ),
        (
            "cleanup pending after a stale pass overwrote Waking",
            Some(Running),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "restore-marked but still hibernating: not cleanup",
            Some(Running),
            "node-a",
            Some(with(restored(main.clone()), ann::HIBERNATE, "true")),
            WakeStep::HandOver,
        ),
        (
            "suspended, cache still shows the released main",
            Some(Suspended),
            "node-a",
            Some(main.clone()),
            WakeStep::ConfirmGone,
        ),
        (
            "suspended, kept terminal pod",
            Some(Suspended),
            "node-a",
            Some(phase(main.clone(), "Failed")),
            WakeStep::HandOver,
        ),
        (
            "retain placeholder",
            Some(Suspended),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
    ];
    for (what, ph, hint, main, want) in cases {
        assert_eq!(rules::wake_step(ph, hint, main.as_ref()), want, "{what}");
    }
}

#[test]
fn unschedulable_reads_the_scheduler_message() {
    assert_eq!(
        pods::unschedulable_message(&unschedulable(agent(0), "0/2 nodes")),
        Some("0/2 nodes".into())
    );
    assert_eq!(pods::unschedulable_message(&agent(0)), None);
}
