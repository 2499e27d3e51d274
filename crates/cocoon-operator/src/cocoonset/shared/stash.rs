//! The delete stash (`cocoonset.md` step 2.2), shared by every step that deletes a pod
//! leaving the spec: teardown (2), the seat release of a suspend (6B), a scale-down (12) and a
//! toolbox removal (13). The VM names go into the set's delete-vm-names annotation before
//! the pod's delete, so the registry GC of a later teardown still finds them.

use cocoon_api::contract::{AnnotationCodec, DeleteVmNames, ReclaimRecord};
use cocoon_api::crd::set::CocoonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::cocoonset::pods;
use crate::cocoonset::steps::{Observed, Write};

/// The delete-vm-names union (step 2.2): the previous value, status VM names, the given
/// pods' VM names and the record's VMs. Teardown stashes every owned pod so; so does every
/// other delete of a pod that leaves the spec (a scale-down in step 12, a toolbox removal
/// in step 13, the seat release of step 6B).
pub fn stash_names<'a>(cs: &CocoonSet, pods: impl IntoIterator<Item = &'a Pod>) -> DeleteVmNames {
    let mut names = DeleteVmNames::from_meta(&cs.metadata);
    if let Some(s) = &cs.status {
        names.union(s.agents.iter().map(|a| a.vm_name.as_str()));
        names.union(s.toolboxes.iter().map(|t| t.vm_name.as_str()));
    }
    names.union(pods.into_iter().map(pods::vm_name));
    names.union(ReclaimRecord::from_meta(&cs.metadata).vms.iter());
    names
}

/// Scale-down, or any removal of pods that leave the spec: stash their VM names first, then
/// delete them.
pub fn remove(o: &Observed<'_>, leaving: &[Pod]) -> Vec<Write> {
    if leaving.is_empty() {
        return Vec::new();
    }
    let stash = stash_names(o.cs, leaving);
    let mut writes = vec![Write::SetAnnotations(stash.delta(o.cs.annotations()))];
    writes.extend(leaving.iter().map(|p| Write::DeletePod(p.name_any())));
    writes
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::{AgentStatus, CocoonSetStatus};
    use cocoon_api::naming;

    use super::*;
    use crate::cocoonset::Timing;
    use crate::cocoonset::fixtures::{NS, SetFixture, observe, set};
    use crate::cocoonset::pods::Classified;

    #[test]
    fn the_delete_stash_unions_the_previous_value_the_status_the_pods_and_the_record() {
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
        let names = stash_names(&cs, [&pod]);
        let mut want = DeleteVmNames::default();
        want.union([v(0), v(1), v(5), v(7)]);
        assert_eq!(names, want);
    }

    #[test]
    fn scale_down_stashes_the_leaving_vms_first_then_deletes() {
        let t = Timing::default();
        let cs = set().with_replicas(0).at_generation(1);
        let c = Classified::default();
        let leaving = pods::build_agent_pod(&cs, NS, 3, "vm", Some("n"));
        let w = remove(&observe(&cs, &c, &t), std::slice::from_ref(&leaving));
        match &w[..] {
            [Write::SetAnnotations(stash), Write::DeletePod(name)] => {
                let value = stash.get(ann::DELETE_VM_NAMES).cloned().flatten();
                assert_eq!(value, Some(naming::vm_name_for_agent(NS, "demo", 3)));
                assert_eq!(name, "demo-3");
            }
            other => panic!("stash then delete, got {other:?}"),
        }
        assert!(remove(&observe(&cs, &c, &t), &[]).is_empty());
    }
}
