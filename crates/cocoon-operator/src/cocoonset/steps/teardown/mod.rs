//! Seed step 2 — teardown: `deletionTimestamp` is set.
//!
//! Stash the VM names of every owned pod (with the status's and the reclaim record's) onto
//! `delete-vm-names`, delete the pods that are still there and not yet going
//! ([`rules::pods_to_delete`]: each pod is deleted once), and once they are all gone GC the
//! registry tags of every stashed VM: `:hibernate` always, `:latest` where vk-cocoon never
//! pushed one. A failed `:hibernate` delete keeps the finalizer (the pass fails and retries);
//! then the finalizer goes.

use std::collections::BTreeSet;

use cocoon_api::contract::{AnnotationCodec, finalizers};
use kube::ResourceExt;

use super::{Next, Observed, StepPlan, Write};
use crate::cocoonset::shared::stash::stash_names;

pub mod rules;
#[cfg(test)]
mod rules_tests;

/// The teardown of `o.cs`; `deleted`: the UIDs of its pods this controller deleted a moment
/// ago that the cache still shows as they were ([`crate::cocoonset::memory::deleted`]).
pub fn plan(o: &Observed<'_>, deleted: &BTreeSet<String>) -> StepPlan {
    if !o.cs.finalizers().iter().any(|f| f == finalizers::COCOONSET) {
        return StepPlan::then(Vec::new(), Next::AwaitChange);
    }
    let names = stash_names(o.cs, o.owned);
    let mut writes = vec![Write::SetAnnotations(names.delta(o.cs.annotations()))];
    if !o.owned.is_empty() {
        // Tag GC waits for the pods: the node agent may push :latest while they go.
        let delete = rules::pods_to_delete(o.owned, deleted);
        writes.extend(delete.into_iter().map(|p| Write::DeletePod(p.name_any())));
        return StepPlan::then(writes, Next::RequeueAfter(o.timing.wait_for_main));
    }
    writes.push(Write::GcTags(rules::gc_items(o.cs, o.ns, &names)));
    writes.push(Write::Finalizers {
        patch: crate::controller::remove_finalizer_patch(o.cs, finalizers::COCOONSET),
        gone_ok: true,
    });
    StepPlan::then(writes, Next::AwaitChange)
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::{DeleteVmNames, annotations as ann};
    use cocoon_api::crd::set::{CocoonSet, SnapshotPolicy};
    use cocoon_api::naming;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::rules::GcItem;
    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, observe, set};
    use crate::cocoonset::pods::{self, Classified};

    /// The set being deleted, with these finalizers.
    fn deleting(finalizers: &[&str], policy: SnapshotPolicy) -> CocoonSet {
        let mut cs = set();
        cs.spec.snapshot_policy = policy;
        cs.metadata.resource_version = Some("42".into());
        cs.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        cs
    }

    fn run(cs: &CocoonSet, owned: &[Pod]) -> StepPlan {
        let (classified, timing) = (Classified::default(), Timing::default());
        let o = Observed {
            owned,
            ..observe(cs, &classified, &timing)
        };
        plan(&o, &BTreeSet::new())
    }

    fn stash_of(plan: &StepPlan) -> String {
        match &plan.writes[0] {
            Write::SetAnnotations(d) => d
                .get(ann::DELETE_VM_NAMES)
                .cloned()
                .flatten()
                .unwrap_or_default(),
            other => panic!("first write is the stash, got {other:?}"),
        }
    }

    #[test]
    fn a_set_without_our_finalizer_is_left_alone() {
        let cs = deleting(&["other.io/keep"], SnapshotPolicy::Always);
        let pod = pods::build_agent_pod(&cs, NS, 0, "", None);
        assert_eq!(
            run(&cs, &[pod]),
            StepPlan::then(Vec::new(), Next::AwaitChange)
        );
    }

    #[test]
    fn vm_names_are_stashed_before_pod_deletion_then_the_pods_go() {
        let cs = deleting(&[finalizers::COCOONSET], SnapshotPolicy::Always);
        let main = pods::build_agent_pod(&cs, NS, 0, "", None);
        let sub = pods::build_agent_pod(&cs, NS, 1, "vm-main", Some("n1"));
        let p = run(&cs, &[main.clone(), sub.clone()]);
        let stash = stash_of(&p);
        assert!(stash.contains(pods::vm_name(&main)) && stash.contains(pods::vm_name(&sub)));
        assert_eq!(
            p.writes[1..],
            [
                Write::DeletePod("demo-0".into()),
                Write::DeletePod("demo-1".into())
            ]
        );
        assert_eq!(p.next, Next::RequeueAfter(Timing::default().wait_for_main));
    }

    #[test]
    fn pods_still_going_are_not_deleted_again_and_hold_the_gc_and_the_finalizer_back() {
        let cs = deleting(&[finalizers::COCOONSET], SnapshotPolicy::Always);
        let mut main = pods::build_agent_pod(&cs, NS, 0, "", None);
        main.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let mut sub = pods::build_agent_pod(&cs, NS, 1, "vm-main", Some("n1"));
        sub.metadata.uid = Some("sub-uid".into());
        let (classified, timing) = (Classified::default(), Timing::default());
        let owned = [main, sub];
        let o = Observed {
            owned: &owned,
            ..observe(&cs, &classified, &timing)
        };
        // The main is terminating; the sub-agent was deleted a moment ago and the cache still
        // shows it as it was.
        let p = plan(&o, &BTreeSet::from(["sub-uid".to_string()]));
        assert!(
            p.writes[1..].is_empty(),
            "no delete, no GC, no finalizer: {:?}",
            p.writes
        );
        assert_eq!(p.next, Next::RequeueAfter(Timing::default().wait_for_main));
    }

    #[test]
    fn the_stash_also_takes_the_vms_of_the_reclaim_record() {
        let mut cs = deleting(&[finalizers::COCOONSET], SnapshotPolicy::Always);
        cs.annotations_mut().insert(
            ann::HIBERNATE_RECLAIM.into(),
            r#"{"generation":1,"vms":["vm-gone"]}"#.into(),
        );
        assert!(stash_of(&run(&cs, &[])).contains("vm-gone"));
    }

    #[test]
    fn once_the_pods_are_gone_tags_are_gcd_then_the_finalizer_dropped() {
        let mut cs = deleting(&["a.io/x", finalizers::COCOONSET], SnapshotPolicy::MainOnly);
        let main_vm = naming::vm_name_for_agent(NS, "demo", 0);
        let sub_vm = naming::vm_name_for_agent(NS, "demo", 1);
        let mut names = DeleteVmNames::default();
        names.union([main_vm.as_str(), sub_vm.as_str()]);
        cs.annotations_mut()
            .insert(ann::DELETE_VM_NAMES.into(), names.encode());
        let p = run(&cs, &[]);
        assert_eq!(
            p.writes[1..],
            [
                Write::GcTags(vec![
                    // main-only keeps slot 0's :latest, drops the sub-agent's.
                    GcItem {
                        vm: main_vm.clone(),
                        drop_latest: false
                    },
                    GcItem {
                        vm: sub_vm.clone(),
                        drop_latest: true
                    },
                ]),
                Write::Finalizers {
                    patch: serde_json::json!({"metadata": {
                        "finalizers": ["a.io/x"],
                        "resourceVersion": "42",
                    }}),
                    gone_ok: true,
                },
            ]
        );
        assert_eq!(p.next, Next::AwaitChange);
    }
}
