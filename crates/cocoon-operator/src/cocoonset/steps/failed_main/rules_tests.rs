//! Table tests of the rules of step 7 (the main's failed state) of `cocoonset.md`.

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{CocoonSetPhase, CocoonSetStatus};

use super::rules::{self, Verdict};
use crate::cocoonset::fixtures::{NS, SetFixture, phase, ready, set, with};
use crate::cocoonset::pods;

#[test]
fn failed_state_table() {
    let mut cs = set().with_replicas(2);
    let main = ready(pods::build_agent_pod(&cs, NS, 0, "", None));
    assert_eq!(rules::verdict(&cs, NS, None, false), Verdict::Continue);
    assert_eq!(
        rules::verdict(&cs, NS, Some(&main), false),
        Verdict::Continue
    );

    let lc_failed = with(
        with(main.clone(), ann::LIFECYCLE_STATE, "failed"),
        ann::LIFECYCLE_STATE_MESSAGE,
        "boom",
    );
    match rules::verdict(&cs, NS, Some(&lc_failed), false) {
        Verdict::Fail(r) => {
            assert_eq!(r.reason, "PodLifecycleFailed");
            assert_eq!(r.message, "main pod ns/demo-0: boom");
            assert_eq!(r.lifecycle_metric_phase.as_deref(), Some("Pending"));
            assert!(r.announce);
        }
        other => panic!("{other:?}"),
    }
    let phase_failed = phase(main.clone(), "Failed");
    match rules::verdict(&cs, NS, Some(&phase_failed), false) {
        Verdict::Fail(r) => {
            assert_eq!(r.reason, "MainAgentFailed");
            assert_eq!(r.message, "main pod ns/demo-0: Failed");
            assert_eq!(r.lifecycle_metric_phase, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rules::verdict(&cs, NS, Some(&phase_failed), true),
        Verdict::Rebuild {
            reason: "terminal (phase=Failed lifecycle=)".into()
        }
    );
    cs.status = Some(CocoonSetStatus {
        phase: Some(CocoonSetPhase::Failed),
        ..CocoonSetStatus::default()
    });
    // Already Failed: reported again without a second announcement.
    match rules::verdict(&cs, NS, Some(&phase_failed), false) {
        Verdict::Fail(r) => assert!(!r.announce),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rules::verdict(&cs, NS, Some(&main), false),
        Verdict::Recovered {
            message: "main pod ns/demo-0 is Ready again".into()
        }
    );
}
