//! Table tests of the rules of step 10 (unsuspend bookkeeping and reclaim) of `cocoonset.md`.

use std::collections::BTreeSet;

use cocoon_api::contract::{ReclaimRecord, annotations as ann};
use cocoon_api::crd::hibernation::{Desire, HibernationPhase};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

use super::rules;
use crate::cocoonset::fixtures::{agent, classify, cr, live, vm, with};

#[test]
fn unsuspend_skips_pods_a_hibernation_owns() {
    let crs = [
        cr(
            "demo-0",
            Desire::Hibernate,
            Some(HibernationPhase::Hibernated),
        ),
        cr("demo-1", Desire::Wake, Some(HibernationPhase::Hibernating)),
        cr("demo-2", Desire::Wake, Some(HibernationPhase::Waking)),
    ];
    let owned = rules::hibernation_owned(&crs);
    assert_eq!(
        owned,
        BTreeSet::from(["demo-0".to_string(), "demo-1".to_string()])
    );
    let c = classify(&[
        with(agent(0), ann::HIBERNATE, "true"),
        with(agent(1), ann::HIBERNATE, "true"),
        with(agent(2), ann::HIBERNATE, "true"),
        agent(3),
    ]);
    let targets = rules::unsuspend_targets(&c, &owned);
    assert_eq!(rules::names(&targets), vec!["demo-2".to_string()]);
}

#[test]
fn unsuspend_looks_again_only_for_pods_the_set_did_not_suspend() {
    let record = |suspended: &[i32]| ReclaimRecord {
        suspended: suspended.iter().map(|s| vm(*s)).collect(),
        ..ReclaimRecord::default()
    };
    let annotated = |slot| with(agent(slot), ann::HIBERNATE, "true");
    // (suspended list, pods about to be cleared, a fresh list needed)
    let table: Vec<(&[i32], Vec<Pod>, bool)> = vec![
        (&[0, 1], vec![annotated(0), annotated(1)], false),
        (&[0, 1], vec![annotated(0)], false),
        (&[0], vec![annotated(0), annotated(1)], true),
        (&[], vec![annotated(0)], true),
        (&[], vec![], false),
    ];
    for (suspended, targets, fresh) in table {
        assert_eq!(
            rules::unsuspend_needs_fresh_crs(&record(suspended), &targets),
            fresh,
            "suspended {suspended:?}, targets {:?}",
            rules::names(&targets)
        );
    }
}

#[test]
fn unsuspend_first_write_table() {
    let record = ReclaimRecord {
        generation: 1,
        vms: vec!["vk-earlier".into(), vm(0), vm(1)],
        restore: vec![],
        suspended: vec![vm(0), vm(1)],
    };
    let annotated = with(agent(0), ann::HIBERNATE, "true");
    // demo-1 was deleted while suspended: owed a restore. The earlier cycle's VM is not.
    let present = BTreeSet::from([vm(0)]);
    let r = rules::unsuspend_first_write(&record, std::slice::from_ref(&annotated), &present, 5);
    assert_eq!(r.generation, 5);
    assert_eq!(r.restore, vec![vm(1)]);
    assert!(!r.owes_restore("vk-earlier"));
    // Annotations to clear: `suspended` is cleared by the second write, not here.
    assert_eq!(r.suspended, record.suspended);
    // No annotated pod left (all cleared by an earlier pass that died before its second
    // write): the suspended list goes in this same write.
    let r = rules::unsuspend_first_write(&record, &[], &present, 5);
    assert!(r.suspended.is_empty());
    assert_eq!(r.restore, vec![vm(1)]);
    // A pod annotated without a suspended list (an earlier operator, an abandoned quiesce)
    // is recorded.
    let bare = ReclaimRecord::default();
    let r = rules::unsuspend_first_write(
        &bare,
        &[with(agent(2), ann::HIBERNATE, "true")],
        &present,
        5,
    );
    assert_eq!(r.vms, vec![vm(2)]);
    assert!(r.restore.is_empty());
}

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
