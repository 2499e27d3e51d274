//! Table tests of the rules of step 2 (teardown: the delete stash and the registry GC) of
//! `cocoonset.md`.

use cocoon_api::contract::{AnnotationCodec, DeleteVmNames, ReclaimRecord, annotations as ann};
use cocoon_api::crd::set::{AgentStatus, CocoonSetStatus, SnapshotPolicy};
use cocoon_api::naming;
use kube::ResourceExt;

use super::rules::{self, GcItem};
use crate::cocoonset::fixtures::{NS, SetFixture, set};
use crate::cocoonset::pods;

#[test]
fn teardown_stash_and_gc_items() {
    let mut cs = set().with_replicas(2);
    let v = |slot| naming::vm_name_for_agent(NS, "demo", slot);
    cs.annotations_mut()
        .insert(ann::DELETE_VM_NAMES.into(), v(5));
    let record = ReclaimRecord {
        vms: vec![v(7)],
        ..ReclaimRecord::default()
    };
    record.apply_to(cs.annotations_mut());
    cs.status = Some(CocoonSetStatus {
        agents: vec![AgentStatus {
            vm_name: v(0),
            ..AgentStatus::default()
        }],
        ..CocoonSetStatus::default()
    });
    let pod = pods::build_agent_pod(&cs, NS, 1, &v(0), Some("n"));
    let names = rules::stash_names(&cs, [&pod]);
    let mut want = DeleteVmNames::default();
    want.union([v(0), v(1), v(5), v(7)]);
    assert_eq!(names, want);

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
