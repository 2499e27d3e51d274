//! Table tests of what an update of a pod means, row by row as `node.md` §8.1 ("Dispatch",
//! "Lifting a failed hibernate") states it.

use cocoon_api::contract::{Lifecycle, LifecycleState};

use super::update::{Dispatch, Facts, Gate, Republish, dispatch, gate, report_refusal};
use crate::pods::intent::Intent;

fn intent(state: LifecycleState, generation: i64, message: &str, by_hibernate: bool) -> Intent {
    Intent {
        uid: "u1".into(),
        lifecycle: Lifecycle::new(state, generation, message),
        flushed: String::new(),
        failed_by_hibernate: by_hibernate,
    }
}

const REFUSAL: &str = "pod ns/a may not rename its VM";

#[test]
fn gate_table() {
    let reported = intent(LifecycleState::Failed, 1, REFUSAL, false);
    let other = intent(LifecycleState::Failed, 1, "snapshot save vk-a: boom", false);
    let ready = intent(LifecycleState::Ready, 1, "", false);
    let rows = [
        (
            "a resumed operation holds the pod → in flight",
            true,
            None,
            None,
            Gate::InFlight,
        ),
        (
            "checked before anything else, a refusal included",
            true,
            Some(REFUSAL),
            None,
            Gate::InFlight,
        ),
        (
            "nothing refused → dispatch",
            false,
            None,
            Some(&ready),
            Gate::Pass,
        ),
        (
            "a refusal → reported",
            false,
            Some(REFUSAL),
            Some(&ready),
            Gate::Refused { report: true },
        ),
        (
            "a refusal of a pod without an intent → reported",
            false,
            Some(REFUSAL),
            None,
            Gate::Refused { report: true },
        ),
        (
            "a refusal while another failure stands → reported",
            false,
            Some(REFUSAL),
            Some(&other),
            Gate::Refused { report: true },
        ),
        (
            "the same refusal already stands as the failure → not again",
            false,
            Some(REFUSAL),
            Some(&reported),
            Gate::Refused { report: false },
        ),
    ];
    for (rule, resumed, refusal, current, want) in rows {
        assert_eq!(gate(resumed, refusal, current), want, "{rule}");
    }
    let hibernating = intent(LifecycleState::Hibernating, 1, REFUSAL, false);
    assert!(
        report_refusal(REFUSAL, Some(&hibernating)),
        "only a failed intent stands"
    );
}

#[test]
fn dispatch_table() {
    use LifecycleState::*;
    let ready = intent(Ready, 3, "", false);
    let hib_failed = intent(Failed, 3, "snapshot save vk-a: boom", true);
    let clone_failed = intent(Failed, 3, "post-clone fixup exhausted", false);
    let no_state = Intent {
        lifecycle: Lifecycle::default(),
        ..intent(Ready, 3, "", false)
    };
    let f = |managed, hibernate, has_vm, intent, generation| Facts {
        managed,
        hibernate,
        has_vm,
        intent,
        generation,
    };
    let again = |state, message: &str, keep| {
        Dispatch::Noop(Some(Republish {
            state,
            message: message.into(),
            keep_hibernate_origin: keep,
        }))
    };
    let rows = [
        (
            "unmanaged pods ignore the hibernate annotation",
            f(false, true, true, Some(&ready), 3),
            Dispatch::Unmanaged,
        ),
        (
            "unmanaged, at a risen generation: still nothing",
            f(false, false, false, Some(&ready), 4),
            Dispatch::Unmanaged,
        ),
        (
            "want and have → hibernate",
            f(true, true, true, Some(&ready), 3),
            Dispatch::Hibernate,
        ),
        (
            "a retried hibernate after a failed one → hibernate",
            f(true, true, true, Some(&hib_failed), 3),
            Dispatch::Hibernate,
        ),
        (
            "not want and not have → wake",
            f(true, false, false, Some(&ready), 3),
            Dispatch::Wake,
        ),
        (
            "a wake without an intent → wake",
            f(true, false, false, None, 0),
            Dispatch::Wake,
        ),
        (
            "want, no VM (already hibernated) → no-op",
            f(true, true, false, Some(&ready), 3),
            Dispatch::Noop(None),
        ),
        (
            "not want, a live VM → no-op",
            f(true, false, true, Some(&ready), 3),
            Dispatch::Noop(None),
        ),
        (
            "not want, a live VM failed by a hibernate → lift the failure",
            f(true, false, true, Some(&hib_failed), 3),
            Dispatch::LiftHibernateFailure,
        ),
        (
            "a failure of another operation stays sticky",
            f(true, false, true, Some(&clone_failed), 3),
            Dispatch::Noop(None),
        ),
        (
            "still wanted after a failed hibernate, the VM gone: not lifted",
            f(true, true, false, Some(&hib_failed), 3),
            Dispatch::Noop(None),
        ),
        (
            "the generation rose → re-publish state and message with it",
            f(true, false, true, Some(&ready), 4),
            again(Ready, "", false),
        ),
        (
            "a sticky failure re-published keeps its message",
            f(true, false, true, Some(&clone_failed), 4),
            again(Failed, "post-clone fixup exhausted", false),
        ),
        (
            "a hibernate failure re-published stays liftable",
            f(true, true, false, Some(&hib_failed), 5),
            again(Failed, "snapshot save vk-a: boom", true),
        ),
        (
            "the generation went down → nothing",
            f(true, false, true, Some(&ready), 2),
            Dispatch::Noop(None),
        ),
        (
            "an intent without a state → nothing to re-publish",
            f(true, false, true, Some(&no_state), 9),
            Dispatch::Noop(None),
        ),
        (
            "no intent → nothing to re-publish",
            f(true, true, false, None, 9),
            Dispatch::Noop(None),
        ),
    ];
    for (rule, facts, want) in rows {
        assert_eq!(dispatch(&facts), want, "{rule}");
    }
}

#[test]
fn what_each_dispatch_counts() {
    let rows = [
        (Dispatch::Unmanaged, ("update", "skipped", "noop")),
        (Dispatch::Noop(None), ("update", "skipped", "noop")),
        (Dispatch::Hibernate, ("update", "ok", "")),
        (Dispatch::Wake, ("update", "ok", "")),
        (Dispatch::LiftHibernateFailure, ("update", "ok", "")),
    ];
    for (d, want) in rows {
        assert_eq!(d.counted(), want, "{d:?}");
    }
}
