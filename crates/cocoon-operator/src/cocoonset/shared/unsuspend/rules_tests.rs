//! Table tests of the rules of step 10's unsuspend bookkeeping of `cocoonset.md`.

use std::collections::BTreeSet;

use cocoon_api::contract::{ReclaimRecord, annotations as ann};
use cocoon_api::crd::hibernation::{Desire, HibernationPhase};
use k8s_openapi::api::core::v1::Pod;

use super::rules;
use crate::cocoonset::fixtures::{agent, classify, cr, vm, with};

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
