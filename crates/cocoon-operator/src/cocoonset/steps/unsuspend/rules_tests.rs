//! Table tests of the rules of step 10's reclaim of `cocoonset.md`.

use cocoon_api::contract::{ReclaimRecord, annotations as ann};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

use super::rules;
use crate::cocoonset::fixtures::{agent, classify, live, vm, with};

#[test]
fn reclaim_waits_for_a_woken_pod() {
    let record = ReclaimRecord {
        generation: 4,
        vms: vec![vm(0), vm(1), vm(2), vm(3), vm(4)],
        ..ReclaimRecord::default()
    };
    let c = classify(&[
        live(agent(0), 4),                               // woken
        live(agent(1), 3),                               // ready at an older generation
        with(live(agent(2), 4), ann::HIBERNATE, "true"), // still annotated
        with(agent(3), ann::LIFECYCLE_STATE, "ready"),   // no live VM
                                                         // demo-4 missing: stays recorded.
    ]);
    assert_eq!(rules::reclaimable(&record, &c), vec![vm(0)]);
    assert!(rules::is_woken(&live(agent(0), 9), 4));
    // Nothing recorded: no registry call.
    assert!(rules::reclaimable(&ReclaimRecord::default(), &c).is_empty());
}

/// `p` Ready since `at` (seconds after the epoch).
fn ready_since(mut p: Pod, at: i64) -> Pod {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
        type_: "Ready".into(),
        status: "True".into(),
        last_transition_time: Some(Time(secs(at))),
        ..Default::default()
    }]);
    p
}

fn secs(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap_or_default()
}

#[test]
fn woken_vms_are_reclaimed_together_once_no_other_recorded_pod_is_coming_up_or_the_hold_passed() {
    use rules::{RECLAIM_HOLD, Reclaim};
    let hold = RECLAIM_HOLD.as_secs() as i64;
    let record = ReclaimRecord {
        generation: 4,
        vms: vec![vm(0), vm(1), vm(2)],
        ..ReclaimRecord::default()
    };
    let woken = |slot| ready_since(live(agent(slot), 4), 10);
    let coming_up = |slot| agent(slot);
    let deleting = |slot| {
        let mut p = agent(slot);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            secs(0),
        ));
        p
    };
    let table: Vec<(&str, Vec<Pod>, i64, Reclaim)> = vec![
        (
            "none woken",
            vec![coming_up(0), coming_up(1)],
            11,
            Reclaim::Nothing,
        ),
        (
            "all woken: one reclaim of them all",
            vec![woken(0), woken(1), woken(2)],
            10,
            Reclaim::Now(vec![vm(0), vm(1), vm(2)]),
        ),
        (
            "one still coming up: the woken wait, and the pass comes back when the hold ends",
            vec![woken(0), woken(1), coming_up(2)],
            11,
            Reclaim::Hold(RECLAIM_HOLD - std::time::Duration::from_secs(1)),
        ),
        (
            "the hold has passed: the woken go without the stuck one",
            vec![woken(0), woken(1), coming_up(2)],
            10 + hold,
            Reclaim::Now(vec![vm(0), vm(1)]),
        ),
        (
            "a missing pod is not coming up",
            vec![woken(0), woken(1)],
            11,
            Reclaim::Now(vec![vm(0), vm(1)]),
        ),
        (
            "nor is a terminal, a deleting or a hibernate-annotated one",
            vec![
                woken(0),
                with(coming_up(1), ann::LIFECYCLE_STATE, "failed"),
                with(coming_up(2), ann::HIBERNATE, "true"),
            ],
            11,
            Reclaim::Now(vec![vm(0)]),
        ),
        (
            "a deleting pod",
            vec![woken(0), woken(1), deleting(2)],
            11,
            Reclaim::Now(vec![vm(0), vm(1)]),
        ),
        (
            "a woken pod that does not say since when is not held",
            vec![live(agent(0), 4), coming_up(1)],
            11,
            Reclaim::Now(vec![vm(0)]),
        ),
    ];
    for (what, pods, now, want) in table {
        assert_eq!(
            rules::reclaim_decision(&record, &classify(&pods), secs(now)),
            want,
            "{what}"
        );
    }
}
