//! Table tests of the shared status rules (status building, `cocoonset.md` §9, and the patch
//! rule).

use std::collections::BTreeSet;

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{AgentStatus, CocoonSetPhase, CocoonSetStatus, ToolboxSpec};
use cocoon_api::naming;
use k8s_openapi::jiff::Timestamp;

use super::status as rules;
use crate::cocoonset::fixtures::{NS, SetFixture, ready, set, with};
use crate::cocoonset::pods::{self, Classified};

#[test]
fn status_build_and_patch_rule() {
    let mut cs = set().with_replicas(2);
    cs.spec.toolboxes = vec![ToolboxSpec {
        name: "tb".into(),
        vnc_port: 0,
        ..ToolboxSpec::default()
    }];
    let main = with(
        ready(pods::build_agent_pod(&cs, NS, 0, "", None)),
        ann::VM_ID,
        "id-0",
    );
    let main_vm = pods::vm_name(&main).to_string();
    let sub = pods::build_agent_pod(&cs, NS, 1, &main_vm, Some("n"));
    let tb = ready(pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[0]));
    let c = Classified::from_owned([&main, &sub, &tb]);
    let now = Timestamp::from_second(1_800_000_000).unwrap_or_default();
    let s = rules::build_status(&cs, &c, None, now);
    assert_eq!(s.phase, Some(CocoonSetPhase::Scaling));
    assert_eq!((s.ready_agents, s.desired_agents), (1, 3));
    // The /scale subresource's status count: sub-agent pods that exist (one of two).
    assert_eq!(s.replicas, 1);
    assert_eq!((s.ready_toolboxes, s.desired_toolboxes), (1, 1));
    assert_eq!(s.observed_generation, 3);
    assert_eq!(
        s.agents[1],
        AgentStatus {
            slot: 1,
            role: "sub-agent".into(),
            pod_name: "demo-1".into(),
            vm_name: naming::vm_name_for_agent(NS, "demo", 1),
            forked_from: main_vm.clone(),
            ..AgentStatus::default()
        }
    );
    assert_eq!(s.agents[0].vm_id, "id-0");
    assert_eq!(s.toolboxes[0].conn_type, "ssh");
    let ready_c = &s.conditions[0];
    assert_eq!(
        (
            ready_c.type_.as_str(),
            ready_c.status.as_str(),
            ready_c.reason.as_str()
        ),
        ("Ready", "False", "AgentsNotReady")
    );
    assert_eq!(ready_c.message, "1/3 agents ready, 1/1 toolboxes ready");
    assert_eq!(s.conditions[1].reason, "Reconciling");
    assert_eq!(s.conditions[1].message, "Scaling");

    // Written once; the same view later produces no patch, and keeps the timestamps.
    assert!(rules::status_patch(&cs, s.clone()).is_some());
    cs.status = Some(s.clone());
    let later = Timestamp::from_second(1_800_000_100).unwrap_or_default();
    let again = rules::build_status(&cs, &c, None, later);
    assert_eq!(rules::status_patch(&cs, again), None);

    // Explicit phases win; no main derives Pending.
    let explicit = rules::build_status(&cs, &c, Some(CocoonSetPhase::Failed), later);
    assert_eq!(explicit.phase, Some(CocoonSetPhase::Failed));
    assert_eq!(explicit.conditions[1].reason, "Stable");
    let empty = rules::build_status(&cs, &Classified::default(), None, later);
    assert_eq!(empty.phase, Some(CocoonSetPhase::Pending));
    assert_eq!(empty.replicas, 0);

    // Everything ready: Running, Ready=True.
    let all = Classified::from_owned([&main, &ready(sub.clone()), &tb]);
    let mut two = cs.clone();
    two.spec.agent.replicas = 1;
    let s = rules::build_status(&two, &all, None, later);
    assert_eq!(s.phase, Some(CocoonSetPhase::Running));
    assert_eq!(s.conditions[0].reason, "AllAgentsReady");
    assert_eq!(s.conditions[0].last_transition_time.0, later);
}

#[test]
fn a_status_written_from_the_cached_version_is_not_written_again() {
    let status = |phase| CocoonSetStatus {
        phase: Some(phase),
        ..Default::default()
    };
    // The pass started from version 40, patched the record (41), then wrote the status (42).
    let last = (
        vec!["40".to_string(), "41".to_string(), "42".to_string()],
        status(CocoonSetPhase::Suspending),
    );
    let suspending = CocoonSetPhase::Suspending;
    let cases = [
        ("nothing written yet", None, "41", suspending, false),
        (
            "the cache is where the pass began",
            Some(&last),
            "40",
            suspending,
            true,
        ),
        (
            "the cache has the record only",
            Some(&last),
            "41",
            suspending,
            true,
        ),
        // (There status_patch finds nothing to write anyway.)
        (
            "the cache has the write",
            Some(&last),
            "42",
            suspending,
            true,
        ),
        (
            "someone else wrote since",
            Some(&last),
            "43",
            suspending,
            false,
        ),
        (
            "another status is due",
            Some(&last),
            "41",
            CocoonSetPhase::Suspended,
            false,
        ),
    ];
    for (what, last, version, phase, want) in cases {
        assert_eq!(
            rules::status_already_written(last, version, &status(phase)),
            want,
            "{what}"
        );
    }
}

#[test]
fn versions_seen_accumulate_without_repeats_and_stay_bounded() {
    let v = |r: std::ops::Range<usize>| r.map(|i| i.to_string()).collect::<Vec<_>>();
    assert_eq!(rules::versions_seen(None, &v(1..3)), v(1..3));
    assert_eq!(rules::versions_seen(Some(v(1..3)), &v(2..5)), v(1..5));
    let kept = rules::versions_seen(Some(v(0..rules::VERSIONS_KEPT)), &v(30..40));
    assert_eq!(
        kept,
        v(40 - rules::VERSIONS_KEPT..40),
        "the latest are kept"
    );
}

#[test]
fn while_pending_or_scaling_only_entry_changes_are_not_written() {
    use cocoon_api::crd::set::AgentStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    let cond = |status: &str, reason: &str, message: &str| Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(2),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
    };
    let entry = |vm_id: &str, ip: &str, phase: &str| AgentStatus {
        slot: 0,
        role: "main".into(),
        pod_name: "demo-0".into(),
        vm_id: vm_id.into(),
        ip: ip.into(),
        phase: phase.into(),
        ..AgentStatus::default()
    };
    let base = CocoonSetStatus {
        observed_generation: 2,
        phase: Some(CocoonSetPhase::Scaling),
        ready_agents: 0,
        desired_agents: 1,
        agents: vec![entry("", "", "Running")],
        conditions: vec![cond("False", "AgentsNotReady", "0/1 agents ready")],
        ..CocoonSetStatus::default()
    };
    let with = |f: &dyn Fn(&mut CocoonSetStatus)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    // (current, new) -> only entries moved (no write)
    type Row = (&'static str, Option<CocoonSetStatus>, CocoonSetStatus, bool);
    let table: Vec<Row> = vec![
        (
            "a VM id and IP in an entry",
            Some(base.clone()),
            with(&|s| s.agents[0] = entry("vm-1", "10.0.0.2", "Running")),
            true,
        ),
        (
            "a pod phase in an entry",
            Some(base.clone()),
            with(&|s| s.agents[0].phase = "Pending".into()),
            true,
        ),
        (
            "the same while Pending",
            Some(with(&|s| s.phase = Some(CocoonSetPhase::Pending))),
            with(&|s| {
                s.phase = Some(CocoonSetPhase::Pending);
                s.agents[0].vm_id = "vm-1".into();
            }),
            true,
        ),
        (
            "a readiness change",
            Some(base.clone()),
            with(&|s| s.ready_agents = 1),
            false,
        ),
        (
            "a Ready condition flip",
            Some(base.clone()),
            with(&|s| s.conditions = vec![cond("True", "AllAgentsReady", "1/1 agents ready")]),
            false,
        ),
        (
            "a new entry (a pod created)",
            Some(base.clone()),
            with(&|s| s.agents.push(entry("", "", "Pending"))),
            false,
        ),
        (
            "a new generation",
            Some(base.clone()),
            with(&|s| s.observed_generation = 3),
            false,
        ),
        (
            "a phase change (Running ends the wait)",
            Some(base.clone()),
            with(&|s| s.phase = Some(CocoonSetPhase::Running)),
            false,
        ),
        (
            "an entry change while Running",
            Some(with(&|s| s.phase = Some(CocoonSetPhase::Running))),
            with(&|s| {
                s.phase = Some(CocoonSetPhase::Running);
                s.agents[0].vm_id = "vm-1".into();
            }),
            false,
        ),
        (
            "an entry change while Suspended",
            Some(with(&|s| s.phase = Some(CocoonSetPhase::Suspended))),
            with(&|s| {
                s.phase = Some(CocoonSetPhase::Suspended);
                s.agents[0].vm_id = "vm-1".into();
            }),
            false,
        ),
        ("no status yet", None, base.clone(), false),
    ];
    let not_ready = BTreeSet::from(["demo-0"]);
    for (what, current, new, want) in table {
        assert_eq!(
            rules::progress_only(current.as_ref(), &new, &not_ready),
            want,
            "{what}"
        );
    }
    // The entry of a ready pod is written as it changes: a user may reach it by its IP.
    let moved = with(&|s| s.agents[0] = entry("vm-1", "10.0.0.2", "Running"));
    assert!(
        !rules::progress_only(Some(&base), &moved, &BTreeSet::new()),
        "a ready pod's new VM id and IP"
    );
    // An entry that now names another pod is no progress of the same pod.
    let renamed = with(&|s| s.agents[0].pod_name = "demo-9".into());
    assert!(
        !rules::progress_only(Some(&base), &renamed, &BTreeSet::from(["demo-0", "demo-9"])),
        "an entry of another pod"
    );
}
