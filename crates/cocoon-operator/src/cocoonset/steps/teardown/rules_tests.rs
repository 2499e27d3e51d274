//! Table tests of the rules of step 2 (teardown: the pods to delete and the registry GC) of
//! `cocoonset.md`.

use std::collections::BTreeSet;

use cocoon_api::contract::DeleteVmNames;
use cocoon_api::crd::set::SnapshotPolicy;
use cocoon_api::naming;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::rules::{self, GcItem};
use crate::cocoonset::fixtures::{NS, SetFixture, set};
use crate::cocoonset::pods;

#[test]
fn teardown_gc_items() {
    let mut cs = set().with_replicas(2);
    let v = |slot| naming::vm_name_for_agent(NS, "demo", slot);
    for (policy, kept) in [
        (SnapshotPolicy::Always, vec![true, true]),
        (SnapshotPolicy::MainOnly, vec![true, false]),
        (SnapshotPolicy::Never, vec![false, false]),
    ] {
        cs.spec.snapshot_policy = policy;
        let mut two = DeleteVmNames::default();
        two.union([v(0), v(1)]);
        let got = rules::gc_items(&cs, NS, &two);
        let want: Vec<GcItem> = [v(0), v(1)]
            .into_iter()
            .zip(kept)
            .map(|(vm, keep)| GcItem {
                vm,
                drop_latest: !keep,
            })
            .collect();
        assert_eq!(got, want, "{policy:?}");
    }
}

/// The set's pod of `slot` as the cache shows it: its UID, and whether it is terminating.
fn cached(slot: i32, uid: &str, terminating: bool) -> Pod {
    let mut p = pods::build_agent_pod(&set(), NS, slot, "", None);
    p.metadata.uid = Some(uid.into());
    if terminating {
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    }
    p
}

#[test]
fn teardown_deletes_only_the_pods_still_there_and_not_yet_going() {
    // (rule, the owned pods as the cache shows them, the UIDs this controller deleted a moment
    // ago, the pods deleted)
    type Case<'a> = (&'a str, Vec<Pod>, &'a [&'a str], &'a [&'a str]);
    let cases: Vec<Case<'_>> = vec![
        (
            "every pod the cache shows, not going, is deleted",
            vec![cached(0, "u0", false), cached(1, "u1", false)],
            &[],
            &["demo-0", "demo-1"],
        ),
        (
            "a pod absent from the cache is not deleted",
            vec![cached(1, "u1", false)],
            &[],
            &["demo-1"],
        ),
        (
            "a pod already terminating is not deleted again",
            vec![cached(0, "u0", true), cached(1, "u1", false)],
            &[],
            &["demo-1"],
        ),
        (
            "a pod deleted a moment ago that the cache still shows as it was is not deleted again",
            vec![cached(0, "u0", false), cached(1, "u1", false)],
            &["u0"],
            &["demo-1"],
        ),
        (
            "a new pod of a deleted pod's name (another UID) is deleted",
            vec![cached(0, "u0-new", false)],
            &["u0"],
            &["demo-0"],
        ),
        (
            "every pod going or gone: nothing is deleted",
            vec![cached(0, "u0", true), cached(1, "u1", false)],
            &["u1"],
            &[],
        ),
    ];
    for (rule, owned, deleted, want) in cases {
        let deleted: BTreeSet<String> = deleted.iter().map(|u| u.to_string()).collect();
        let got: Vec<String> = rules::pods_to_delete(&owned, &deleted)
            .into_iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(got, want, "{rule}");
    }
}
