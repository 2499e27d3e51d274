//! Step 12 — sub-agents: ensure slots `[1..Replicas]`, delete extras above the count.
//!
//! An existing sub-agent is triaged (§6: terminal or drifted pods take the rebuild budget);
//! a missing one whose budget is not spent at this generation is created, all at once (at
//! most `create_fanout` in flight), each through the create protocol (§7) and marked for
//! restore when step 10 owes it one. A sub-agent is pinned to the main's node with a hard
//! `spec.nodeName` bind and forks from the main's VM. Scale-down stashes the leaving slots'
//! VM names first (so teardown still GCs their tags), then deletes them.

use std::collections::BTreeSet;

use cocoon_api::contract::AnnotationCodec;
use cocoon_api::naming::Role;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Observed, Write, create_facts};
use crate::cocoonset::{plan, pods};

/// What step 12 finds, slot by slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Survey {
    /// Existing sub-agents in slot order, with their triage reason (none: healthy).
    pub existing: Vec<(Pod, Option<String>)>,
    /// Slots in `[1..Replicas]` without a pod.
    pub missing: Vec<i32>,
    /// Sub-agents above the requested count, in slot order.
    pub extras: Vec<Pod>,
}

/// `None` without a main: sub-agents fork from it, so they wait for it.
pub fn survey(o: &Observed<'_>) -> Option<Survey> {
    o.classified.main.as_ref()?;
    let replicas = o.cs.spec.agent.replicas.max(0);
    let mut out = Survey::default();
    for slot in 1..=replicas {
        match o.classified.sub.get(&slot) {
            Some(p) => {
                let drifted = pods::agent_drift(o.cs, o.ns, slot, p).is_some();
                out.existing
                    .push((p.clone(), plan::rebuild_reason(p, true, drifted)));
            }
            None => out.missing.push(slot),
        }
    }
    out.extras = o
        .classified
        .sub
        .iter()
        .filter(|(slot, _)| **slot > replicas)
        .map(|(_, p)| p.clone())
        .collect();
    Some(out)
}

/// The creates of `slots` (their budgets checked): bound to the main's node, forking from
/// its VM, restore-marked per the create protocol.
pub fn creates(o: &Observed<'_>, slots: &[i32], restorable: &BTreeSet<String>) -> Option<Write> {
    let main = o.classified.main.as_ref()?;
    if slots.is_empty() {
        return None;
    }
    let (main_vm, main_node) = (pods::vm_name(main), pods::bound_node(main));
    let jobs = slots
        .iter()
        .map(|slot| {
            let pod = pods::build_agent_pod(o.cs, o.ns, *slot, main_vm, Some(main_node));
            let facts = create_facts(o, &pod, Role::SubAgent, restorable, false);
            (pod, facts)
        })
        .collect();
    Some(Write::CreatePods {
        jobs,
        step: "sub-agents",
        at_once: o.timing.create_fanout.max(1),
    })
}

/// Scale-down, or any removal of pods that leave the spec: stash their VM names first, then
/// delete them.
pub fn remove(o: &Observed<'_>, leaving: &[Pod]) -> Vec<Write> {
    if leaving.is_empty() {
        return Vec::new();
    }
    let stash = plan::stash_names(o.cs, leaving);
    let mut writes = vec![Write::SetAnnotations(stash.delta(o.cs.annotations()))];
    writes.extend(leaving.iter().map(|p| Write::DeletePod(p.name_any())));
    writes
}

#[cfg(test)]
mod tests {
    use cocoon_api::contract::annotations as ann;
    use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
    use cocoon_api::naming;
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::cocoonset::plan::Timing;
    use crate::cocoonset::pods::Classified;

    const NS: &str = "ns";

    fn set(replicas: i32) -> CocoonSet {
        let mut spec = CocoonSetSpec::with_image("img:1");
        spec.agent.replicas = replicas;
        let mut cs = CocoonSet::new("demo", spec);
        cs.metadata.namespace = Some(NS.into());
        cs.metadata.uid = Some("uid".into());
        cs.metadata.generation = Some(1);
        cs
    }

    fn bound_main(cs: &CocoonSet) -> Pod {
        let mut main = pods::build_agent_pod(cs, NS, 0, "", None);
        main.spec = Some(PodSpec {
            node_name: Some("node-a".into()),
            ..main.spec.unwrap_or_default()
        });
        main
    }

    fn observe<'a>(cs: &'a CocoonSet, c: &'a Classified, t: &'a Timing) -> Observed<'a> {
        Observed {
            cs,
            ns: NS,
            owned: &[],
            classified: c,
            timing: t,
        }
    }

    #[test]
    fn ensure_slots_1_to_replicas_and_delete_extras_above_the_count() {
        let t = Timing::default();
        let cs = set(3);
        let main = bound_main(&cs);
        let main_vm = pods::vm_name(&main).to_string();
        let sub = |slot| pods::build_agent_pod(&cs, NS, slot, &main_vm, Some("node-a"));
        let c = Classified::from_owned([&main, &sub(2), &sub(4), &sub(5)]);
        let s = survey(&observe(&cs, &c, &t)).expect("a main");
        assert_eq!(
            s.existing
                .iter()
                .map(|(p, r)| (p.name_any(), r.clone()))
                .collect::<Vec<_>>(),
            [("demo-2".to_string(), None)]
        );
        assert_eq!(s.missing, [1, 3]);
        assert_eq!(
            s.extras.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["demo-4", "demo-5"]
        );
        let none = Classified::from_owned([&sub(1)]);
        assert_eq!(
            survey(&observe(&cs, &none, &t)),
            None,
            "no main, no sub-agents"
        );
    }

    #[test]
    fn a_sub_agent_is_pinned_to_the_mains_node_and_creates_fan_out_capped() {
        let t = Timing {
            create_fanout: 8,
            ..Timing::default()
        };
        let cs = set(2);
        let main = bound_main(&cs);
        let c = Classified::from_owned([&main]);
        let w = creates(&observe(&cs, &c, &t), &[1, 2], &BTreeSet::new()).expect("creates");
        let Write::CreatePods {
            jobs,
            step,
            at_once,
        } = w
        else {
            panic!("a fan-out of creates");
        };
        assert_eq!((step, at_once), ("sub-agents", 8));
        for (pod, facts) in &jobs {
            let spec = pod.spec.clone().unwrap_or_default();
            assert_eq!(spec.node_name.as_deref(), Some("node-a"), "hard bind");
            assert!(spec.affinity.is_none(), "no affinity");
            assert_eq!(
                pod.annotations().get(ann::FORK_FROM).map(String::as_str),
                Some(pods::vm_name(&main))
            );
            assert_eq!(facts.role, Role::SubAgent);
        }
        assert_eq!(creates(&observe(&cs, &c, &t), &[], &BTreeSet::new()), None);
    }

    #[test]
    fn scale_down_stashes_the_leaving_vms_first_then_deletes() {
        let t = Timing::default();
        let cs = set(0);
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
