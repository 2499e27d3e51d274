//! Table tests of the rules of step 9 (the release-policy wake) of `cocoonset.md`.

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
};
use kube::ResourceExt;

use super::rules::{self as suspend, WakeStep};
use crate::cocoonset::plan::{self, CreatePlan, TagRead};
use crate::cocoonset::pods::{self};

const NS: &str = "ns";

fn set() -> CocoonSet {
    let mut spec = CocoonSetSpec::with_image("img:1");
    spec.agent.replicas = 1;
    let mut cs = CocoonSet::new("demo", spec);
    cs.metadata.namespace = Some(NS.into());
    cs.metadata.uid = Some("uid-1".into());
    cs.metadata.generation = Some(3);
    cs
}

fn agent(slot: i32) -> Pod {
    let cs = set();
    let main_vm = pods::vm_name(&pods::build_agent_pod(&cs, NS, 0, "", None)).to_string();
    pods::build_agent_pod(&cs, NS, slot, &main_vm, Some("node-a"))
}

fn with(mut p: Pod, k: &str, v: &str) -> Pod {
    p.annotations_mut().insert(k.into(), v.into());
    p
}

fn live(mut p: Pod, generation: i64) -> Pod {
    p = with(p, ann::VM_ID, "vm-id");
    p = with(p, ann::LIFECYCLE_STATE, "ready");
    p = with(
        p,
        ann::LIFECYCLE_OBSERVED_GENERATION,
        &generation.to_string(),
    );
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.phase = Some("Running".into());
    st.container_statuses = Some(vec![ContainerStatus {
        name: "agent".into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    p
}

fn phase(mut p: Pod, ph: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).phase = Some(ph.into());
    p
}

// ----- step 9 -------------------------------------------------------------------------------

fn restored(p: Pod) -> Pod {
    with(p, ann::RESTORE_FROM_HIBERNATE, "true")
}

fn unschedulable(mut p: Pod, msg: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(msg.into()),
        ..PodCondition::default()
    }]);
    p
}

fn on(mut p: Pod, node: &str) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.node_name = Some(node.into());
    }
    p
}

/// (what, status phase, hint, main, expected step).
type WakeCase = (
    &'static str,
    Option<CocoonSetPhase>,
    &'static str,
    Option<Pod>,
    WakeStep,
);

#[test]
fn wake_step_table() {
    use CocoonSetPhase::*;
    let main = on(agent(0), "node-a");
    let cases: Vec<WakeCase> = vec![
        (
            "running, no hint: no registry call",
            Some(Running),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "pending, no hint",
            Some(Pending),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
        (
            "suspending, no hint",
            Some(Suspending),
            "",
            None,
            WakeStep::HandOver,
        ),
        (
            "suspended, main gone",
            Some(Suspended),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "suspended retain set with no pods",
            Some(Suspended),
            "",
            None,
            WakeStep::Start,
        ),
        (
            "suspending with hint, gone",
            Some(Suspending),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, gone",
            Some(Waking),
            "node-a",
            None,
            WakeStep::Start,
        ),
        (
            "waking, not live",
            Some(Waking),
            "node-a",
            Some(restored(agent(0))),
            WakeStep::WaitLive {
                unschedulable: None,
            },
        ),
        (
            "waking, unschedulable",
            Some(Waking),
            "node-a",
            Some(unschedulable(restored(agent(0)), "0/3 nodes are available")),
            WakeStep::WaitLive {
                unschedulable: Some("0/3 nodes are available".into()),
            },
        ),
        (
            "waking, live on the hint",
            Some(Waking),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "waking, live elsewhere",
            Some(Waking),
            "node-a",
            Some(live(restored(on(agent(0), "node-b")), 3)),
            WakeStep::Complete {
                placement: Some("pool"),
            },
        ),
        (
            "stale Waking without a hint does not score again",
            Some(Waking),
            "",
            Some(live(main.clone(), 3)),
            WakeStep::Complete { placement: None },
        ),
        (
            "cleanup pending after a stale pass overwrote Waking",
            Some(Running),
            "node-a",
            Some(live(restored(main.clone()), 3)),
            WakeStep::Complete {
                placement: Some("hint-node"),
            },
        ),
        (
            "restore-marked but still hibernating: not cleanup",
            Some(Running),
            "node-a",
            Some(with(restored(main.clone()), ann::HIBERNATE, "true")),
            WakeStep::HandOver,
        ),
        (
            "suspended, cache still shows the released main",
            Some(Suspended),
            "node-a",
            Some(main.clone()),
            WakeStep::ConfirmGone,
        ),
        (
            "suspended, kept terminal pod",
            Some(Suspended),
            "node-a",
            Some(phase(main.clone(), "Failed")),
            WakeStep::HandOver,
        ),
        (
            "retain placeholder",
            Some(Suspended),
            "",
            Some(main.clone()),
            WakeStep::HandOver,
        ),
    ];
    for (what, ph, hint, main, want) in cases {
        assert_eq!(suspend::wake_step(ph, hint, main.as_ref()), want, "{what}");
    }
    let present = TagRead::Present {
        base_image: "img:1".into(),
    };
    assert!(plan::wake_boots_fresh(
        &TagRead::Absent,
        &CreatePlan::default()
    ));
    assert!(!plan::wake_boots_fresh(&present, &CreatePlan::default()));
    let dropped = CreatePlan {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    assert!(plan::wake_boots_fresh(&present, &dropped));
}

// ----- step 10 ------------------------------------------------------------------------------

#[test]
fn unschedulable_reads_the_scheduler_message() {
    assert_eq!(
        pods::unschedulable_message(&unschedulable(agent(0), "0/2 nodes")),
        Some("0/2 nodes".into())
    );
    assert_eq!(pods::unschedulable_message(&agent(0)), None);
}
