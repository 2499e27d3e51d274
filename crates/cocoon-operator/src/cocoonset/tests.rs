//! Table tests of the CocoonSet rules, one group per section of `cocoonset.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::{
    AnnotationCodec, DeadLetter, DeleteVmNames, RebuildEntry, RebuildHistory, ReclaimRecord,
    annotations as ann, labels,
};
use cocoon_api::crd::set::{
    AgentMode, AgentStatus, CocoonSet, CocoonSetPhase, CocoonSetSpec, CocoonSetStatus,
    SnapshotPolicy, ToolboxMode, ToolboxSpec,
};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;

use super::plan::{self, CreateFacts, CreatePlan, FailedStep, GcItem, TagRead, Timing, Triage};
use super::pods::{self, Classified};
use super::steps::toolboxes::validate as validate_toolboxes;

const NS: &str = "ns";

fn set(spec: CocoonSetSpec) -> CocoonSet {
    let mut cs = CocoonSet::new("demo", spec);
    cs.metadata.namespace = Some(NS.into());
    cs.metadata.uid = Some("uid-1".into());
    cs.metadata.generation = Some(3);
    cs
}

fn base() -> CocoonSet {
    let mut spec = CocoonSetSpec::with_image("img:1");
    spec.agent.replicas = 2;
    set(spec)
}

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

fn resources(cpu: &str, mem: &str) -> ResourceRequirements {
    ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".into(), q(cpu)),
            ("memory".into(), q(mem)),
        ])),
        ..ResourceRequirements::default()
    }
}

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
}

fn ready(mut p: Pod) -> Pod {
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.phase = Some("Running".into());
    st.conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..PodCondition::default()
    }]);
    p
}

fn with_ann(mut p: Pod, k: &str, v: &str) -> Pod {
    p.annotations_mut().insert(k.into(), v.into());
    p
}

fn phase(mut p: Pod, ph: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).phase = Some(ph.into());
    p
}

// ----- §3 factories ------------------------------------------------------------------------

#[test]
fn main_pod_skeleton() {
    let mut cs = base();
    cs.spec.node_pool = "gpu".into();
    cs.spec.snapshot_compatibility_class = "icelake".into();
    cs.spec.node_name = "node-a".into();
    cs.spec.snapshot_policy = SnapshotPolicy::MainOnly;
    cs.spec.agent.service_account_name = "sa".into();
    cs.spec.agent.vm.storage = Some(q("20Gi"));
    cs.spec.agent.vm.resources = Some(resources("2", "4Gi"));
    let pod = pods::build_agent_pod(&cs, NS, 0, "", None);
    let v = serde_json::to_value(&pod).unwrap_or_default();
    assert_eq!(v["metadata"]["name"], "demo-0");
    assert_eq!(
        v["metadata"]["labels"],
        json!({"cocoonset.cocoonstack.io/name": "demo", "cocoonset.cocoonstack.io/role": "main",
               "cocoonset.cocoonstack.io/slot": "0", "app.kubernetes.io/name": "demo"})
    );
    let a = &v["metadata"]["annotations"];
    assert_eq!(a[ann::GENERATION], "3");
    assert_eq!(a[ann::VM_NAME], naming::vm_name_for_agent(NS, "demo", 0));
    assert_eq!(a[ann::IMAGE], "img:1");
    assert_eq!(a[ann::MODE], "clone");
    assert_eq!(a[ann::OS], "linux");
    assert_eq!(a[ann::BACKEND], "cloud-hypervisor");
    assert_eq!(a[ann::MANAGED], "true");
    assert_eq!(a[ann::SNAPSHOT_POLICY], "main-only");
    assert_eq!(a[ann::STORAGE], "20Gi");
    assert!(a.get(ann::FORK_FROM).is_none());
    let o = &v["metadata"]["ownerReferences"][0];
    assert_eq!(o["kind"], "CocoonSet");
    assert_eq!(o["apiVersion"], "cocoonset.cocoonstack.io/v1");
    assert_eq!(o["controller"], true);
    assert_eq!(o["blockOwnerDeletion"], true);
    let s = &v["spec"];
    assert_eq!(s["terminationGracePeriodSeconds"], 1);
    assert_eq!(s["tolerations"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        s["nodeSelector"],
        json!({"cocoonstack.io/pool": "gpu", "cocoonstack.io/snapshot-cpu-class": "icelake"})
    );
    assert_eq!(
        s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!(["node-a"])
    );
    assert_eq!(s["serviceAccountName"], "sa");
    let c = &s["containers"][0];
    assert_eq!(c["name"], "agent");
    assert_eq!(c["image"], pods::PLACEHOLDER_IMAGE);
    assert_eq!(c["resources"]["limits"]["cpu"], "2");
    assert_eq!(c["resources"]["limits"]["ephemeral-storage"], "20Gi");
    assert_eq!(c["resources"]["requests"]["ephemeral-storage"], "20Gi");
}

#[test]
fn sub_agent_is_bound_and_forks_from_the_main() {
    let mut cs = base();
    cs.spec.node_name = "node-a".into();
    let main_vm = naming::vm_name_for_agent(NS, "demo", 0);
    let pod = pods::build_agent_pod(&cs, NS, 2, &main_vm, Some("node-b"));
    let spec = pod.spec.clone().unwrap_or_default();
    assert_eq!(spec.node_name.as_deref(), Some("node-b"));
    // The pin is the main's only: a bound sub-agent gets no affinity.
    assert!(spec.affinity.is_none());
    assert_eq!(pod.annotations()[ann::FORK_FROM], main_vm);
    assert_eq!(pod.labels()[labels::ROLE], "sub-agent");
    assert_eq!(pod.labels()[labels::SLOT], "2");
    assert_eq!(
        spec.node_selector,
        Some(BTreeMap::from([(labels::POOL.into(), "default".into())]))
    );
}

#[test]
fn toolbox_pods() {
    let mut cs = base();
    let static_tb = ToolboxSpec {
        name: "win".into(),
        mode: ToolboxMode::Static,
        static_ip: "10.0.0.9".into(),
        static_vm_id: "ext-1".into(),
        vnc_port: 5901,
        ..ToolboxSpec::default()
    };
    let run_tb = ToolboxSpec {
        name: "tb".into(),
        image: "tb:1".into(),
        ..ToolboxSpec::default()
    };
    cs.spec.toolboxes = vec![static_tb.clone(), run_tb.clone()];
    let s = pods::build_toolbox_pod(&cs, NS, &static_tb);
    let a = s.annotations();
    assert_eq!(s.name_any(), "demo-win");
    assert_eq!(a[ann::MODE], "static");
    assert!(!a.contains_key(ann::MANAGED));
    assert_eq!(a[ann::VM_ID], "ext-1");
    assert_eq!(a[ann::VM_IP], "10.0.0.9");
    assert_eq!(a[ann::VNC_PORT], "5901");
    assert_eq!(
        a[ann::VM_NAME],
        naming::vm_name_for_toolbox(NS, "demo", "win")
    );
    let r = pods::build_toolbox_pod(&cs, NS, &run_tb);
    assert_eq!(r.annotations()[ann::MODE], "run");
    assert_eq!(r.annotations()[ann::MANAGED], "true");
    assert_eq!(r.labels()[labels::ROLE], "toolbox");
    assert_eq!(r.labels()[labels::SLOT], "tb");
    assert!(r.spec.as_ref().and_then(|s| s.affinity.as_ref()).is_none());
}

// ----- §4 drift ----------------------------------------------------------------------------

#[test]
fn agent_drift_rules() {
    let cs = base();
    let main_vm = naming::vm_name_for_agent(NS, "demo", 0);
    let fresh = pods::build_agent_pod(&cs, NS, 0, "", None);
    let sub = pods::build_agent_pod(&cs, NS, 1, &main_vm, Some("n"));
    type Case = (&'static str, CocoonSet, Pod, Option<&'static str>);
    let mut edited_image = cs.clone();
    edited_image.spec.agent.image = "img:2".into();
    let mut edited_mode = cs.clone();
    edited_mode.spec.agent.mode = AgentMode::Run;
    let mut with_class = cs.clone();
    with_class.spec.snapshot_compatibility_class = "icelake".into();
    let mut pinned = cs.clone();
    pinned.spec.node_name = "elsewhere".into();
    let mut res = cs.clone();
    res.spec.agent.vm.resources = Some(resources("1", "1Gi"));
    let mut res_pod = pods::build_agent_pod(&res, NS, 0, "", None);
    // The Go operator's canonical spelling of the same amounts does not drift.
    if let Some(c) = res_pod.spec.as_mut().map(|s| &mut s.containers[0]) {
        c.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".into(), q("1000m")),
                ("memory".into(), q("1073741824")),
            ])),
            requests: Some(BTreeMap::from([
                ("cpu".into(), q("1")),
                ("memory".into(), q("1Gi")),
            ])),
            ..ResourceRequirements::default()
        });
    }
    let mut storage = cs.clone();
    storage.spec.agent.vm.storage = Some(q("1Gi"));
    let storage_pod = with_ann(
        pods::build_agent_pod(&storage, NS, 0, "", None),
        ann::STORAGE,
        "1073741824",
    );
    let cases: Vec<Case> = vec![
        ("fresh main matches", cs.clone(), fresh.clone(), None),
        (
            "sub-agent keeps its fork-from",
            cs.clone(),
            sub.clone(),
            None,
        ),
        ("image edit", edited_image, fresh.clone(), Some("vm spec")),
        ("mode edit", edited_mode, fresh.clone(), Some("vm spec")),
        (
            "fork-from on the main",
            cs.clone(),
            with_ann(fresh.clone(), ann::FORK_FROM, "x"),
            Some("vm spec"),
        ),
        ("spec.nodeName never drifts", pinned, fresh.clone(), None),
        (
            "guaranteed defaulting and canonical quantities",
            res.clone(),
            res_pod,
            None,
        ),
        (
            "resources removed",
            cs.clone(),
            pods::build_agent_pod(&res, NS, 0, "", None),
            Some("resources"),
        ),
        ("storage compared numerically", storage, storage_pod, None),
        (
            "legacy pod without class adopted",
            with_class.clone(),
            fresh.clone(),
            None,
        ),
        (
            "terminal legacy pod drifts",
            with_class,
            phase(fresh.clone(), "Failed"),
            Some("scheduling"),
        ),
    ];
    for (what, cs, pod, want) in cases {
        let slot = if pod.name_any() == "demo-1" { 1 } else { 0 };
        assert_eq!(pods::agent_drift(&cs, NS, slot, &pod), want, "{what}");
    }
}

#[test]
fn toolbox_drift_rules() {
    let tb = ToolboxSpec {
        name: "win".into(),
        mode: ToolboxMode::Static,
        static_ip: "10.0.0.9".into(),
        ..ToolboxSpec::default()
    };
    let cs = base();
    let pod = pods::build_toolbox_pod(&cs, NS, &tb);
    assert_eq!(pods::toolbox_drift(&cs, NS, &tb, &pod), None);
    let moved = ToolboxSpec {
        static_ip: "10.0.0.10".into(),
        ..tb.clone()
    };
    assert_eq!(
        pods::toolbox_drift(&cs, NS, &moved, &pod),
        Some("static runtime")
    );
    let run = ToolboxSpec {
        mode: ToolboxMode::Run,
        ..tb.clone()
    };
    assert_eq!(pods::toolbox_drift(&cs, NS, &run, &pod), Some("vm spec"));
}

// ----- §0/§5 ownership and classification ---------------------------------------------------

#[test]
fn ownership_and_classification() {
    let cs = base();
    let main = pods::build_agent_pod(&cs, NS, 0, "", None);
    let sub = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
    let tb = pods::build_toolbox_pod(
        &cs,
        NS,
        &ToolboxSpec {
            name: "tb".into(),
            ..ToolboxSpec::default()
        },
    );
    let mut stranger = sub.clone();
    stranger.metadata.name = Some("demo-7".into());
    stranger.metadata.owner_references = None;
    let mut bad_slot = sub.clone();
    bad_slot.metadata.name = Some("demo-x".into());
    bad_slot
        .labels_mut()
        .insert(labels::SLOT.into(), "x".into());
    let mut terminating = sub.clone();
    terminating.metadata.name = Some("demo-2".into());
    terminating
        .labels_mut()
        .insert(labels::SLOT.into(), "2".into());
    terminating.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let all = [main, sub, tb, stranger.clone(), bad_slot, terminating];
    assert!(!pods::is_owned(&cs, &stranger));
    let owned: Vec<&Pod> = all.iter().filter(|p| pods::is_owned(&cs, p)).collect();
    assert_eq!(owned.len(), 5);
    let c = Classified::from_owned(owned);
    assert_eq!(
        c.main.as_ref().map(|p| p.name_any()).as_deref(),
        Some("demo-0")
    );
    assert_eq!(c.sub.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(
        c.toolbox.keys().cloned().collect::<Vec<_>>(),
        vec!["tb".to_string()]
    );
    assert_eq!(
        c.all_by_name.keys().cloned().collect::<Vec<_>>(),
        vec!["demo-0", "demo-1", "demo-tb", "demo-x"]
    );
}

// ----- §6 triage ---------------------------------------------------------------------------

#[test]
fn triage_table() {
    let t = Timing::default();
    let entry = |count: i64, last: i64| RebuildEntry {
        count,
        last_deleted: Some(at(last)),
        generation: Some(3),
        ..RebuildEntry::default()
    };
    let r = || Some("spec drifted".to_string());
    type Row = (
        &'static str,
        Option<String>,
        DeadLetter,
        Option<RebuildEntry>,
        Triage,
    );
    let cases: Vec<Row> = vec![
        (
            "healthy",
            None,
            DeadLetter(None),
            None,
            Triage::Leave {
                dead_lettered: false,
            },
        ),
        (
            "first rebuild is immediate",
            r(),
            DeadLetter(None),
            None,
            Triage::Rebuild {
                attempt: 1,
                reason: "spec drifted".into(),
            },
        ),
        (
            "1 s after the first",
            r(),
            DeadLetter(None),
            Some(entry(1, 100)),
            Triage::Wait(Duration::from_secs(1)),
        ),
        (
            "second after 1 s",
            r(),
            DeadLetter(None),
            Some(entry(1, 99)),
            Triage::Rebuild {
                attempt: 2,
                reason: "spec drifted".into(),
            },
        ),
        (
            "5 s after the second",
            r(),
            DeadLetter(None),
            Some(entry(2, 98)),
            Triage::Wait(Duration::from_secs(3)),
        ),
        (
            "30 s after the third",
            r(),
            DeadLetter(None),
            Some(entry(3, 90)),
            Triage::Wait(Duration::from_secs(20)),
        ),
        (
            "fourth after 30 s",
            r(),
            DeadLetter(None),
            Some(entry(3, 70)),
            Triage::Rebuild {
                attempt: 4,
                reason: "spec drifted".into(),
            },
        ),
        (
            "budget spent",
            r(),
            DeadLetter(None),
            Some(entry(4, 0)),
            Triage::DeadLetter {
                reason: "spec drifted".into(),
            },
        ),
        (
            "dead-lettered at this generation",
            r(),
            DeadLetter(Some(3)),
            Some(entry(4, 0)),
            Triage::Leave {
                dead_lettered: true,
            },
        ),
        (
            "spec edited since the dead-letter",
            r(),
            DeadLetter(Some(2)),
            Some(entry(4, 0)),
            Triage::ResetAndDelete,
        ),
    ];
    for (what, reason, dl, e, want) in cases {
        assert_eq!(
            plan::triage(reason, dl, e.as_ref(), 3, at(100), &t),
            want,
            "{what}"
        );
    }
}

#[test]
fn triage_reasons() {
    let cs = base();
    let pod = pods::build_agent_pod(&cs, NS, 1, "vm", Some("n"));
    assert_eq!(plan::rebuild_reason(&pod, true, false), None);
    assert_eq!(
        plan::rebuild_reason(&pod, true, true).as_deref(),
        Some("spec drifted")
    );
    let failed = with_ann(
        phase(pod.clone(), "Running"),
        ann::LIFECYCLE_STATE,
        "failed",
    );
    assert_eq!(
        plan::rebuild_reason(&failed, true, true).as_deref(),
        Some("terminal (phase=Running lifecycle=failed)")
    );
    // The main's drift triage in step 11 does not count terminal (step 7 owns that).
    assert_eq!(plan::rebuild_reason(&failed, false, false), None);
}

#[test]
fn exhaustion_is_per_generation() {
    let mut h = RebuildHistory::default();
    h.record_delete("demo-1", at(0), 3);
    assert!(!plan::exhausted(&h, "demo-1", 3));
    plan::mark_exhausted(&mut h, "demo-1", 3);
    assert!(plan::exhausted(&h, "demo-1", 3));
    assert!(!plan::exhausted(&h, "demo-1", 4));
    assert!(plan::exhausted_earlier(&h, "demo-1", 4));
    // The mark survives the history codec (an extra field the Go operator ignores).
    let round = RebuildHistory::decode(&h.encode().unwrap_or_default());
    assert!(plan::exhausted(&round, "demo-1", 3));
}

// ----- §7 create protocol ------------------------------------------------------------------

#[test]
fn create_protocol_table() {
    let present = |img: &str| TagRead::Present {
        base_image: img.into(),
    };
    let f = |role: Role, tag: TagRead, recorded: bool, owed: bool, cr: bool, uncond: bool| {
        CreateFacts {
            role,
            image: "img:1",
            tag,
            recorded,
            owed_restore: owed,
            cr_restorable: cr,
            unconditional_intent: uncond,
        }
    };
    let fresh = CreatePlan::default();
    let drop = CreatePlan {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    let restore = CreatePlan {
        restore: true,
        ..CreatePlan::default()
    };
    let cases = [
        (
            "no tag: nothing to do",
            f(Role::Main, TagRead::Absent, false, false, false, false),
            fresh,
        ),
        (
            "static toolbox skips the registry",
            f(Role::Toolbox, TagRead::Skipped, true, true, true, true),
            fresh,
        ),
        (
            "image rule: other image",
            f(Role::Main, present("img:0"), true, true, false, false),
            drop,
        ),
        (
            "image rule wins over unconditional intent",
            f(Role::Main, present("img:0"), false, false, false, true),
            drop,
        ),
        (
            "same image, owed restore",
            f(Role::Main, present("img:1"), true, true, false, false),
            restore,
        ),
        (
            "unrecorded base image, CR-restorable",
            f(Role::Toolbox, present(""), false, false, true, false),
            restore,
        ),
        (
            "main with a tag but no intent",
            f(Role::Main, present("img:1"), false, false, false, false),
            fresh,
        ),
        (
            "unconditional intent (6A.1)",
            f(Role::Main, present(""), false, false, false, true),
            restore,
        ),
        (
            "sub-agent pre-create drop",
            f(Role::SubAgent, present("img:1"), true, false, false, false),
            drop,
        ),
        (
            "sub-agent owed a restore",
            f(Role::SubAgent, present("img:1"), true, true, false, false),
            restore,
        ),
        (
            "sub-agent restorable by a CR",
            f(Role::SubAgent, present("img:1"), true, false, true, false),
            restore,
        ),
        (
            "unrecorded sub-agent tag (choice: restore)",
            f(Role::SubAgent, present("img:1"), false, false, false, false),
            restore,
        ),
    ];
    for (what, facts, want) in cases {
        assert_eq!(plan::plan_create(&facts), want, "{what}");
    }
}

// ----- step 7 ------------------------------------------------------------------------------

#[test]
fn failed_state_table() {
    let mut cs = base();
    let main = ready(pods::build_agent_pod(&cs, NS, 0, "", None));
    assert_eq!(
        plan::failed_step(&cs, NS, None, false),
        FailedStep::Continue
    );
    assert_eq!(
        plan::failed_step(&cs, NS, Some(&main), false),
        FailedStep::Continue
    );

    let lc_failed = with_ann(
        with_ann(main.clone(), ann::LIFECYCLE_STATE, "failed"),
        ann::LIFECYCLE_STATE_MESSAGE,
        "boom",
    );
    match plan::failed_step(&cs, NS, Some(&lc_failed), false) {
        FailedStep::Fail(r) => {
            assert_eq!(r.reason, "PodLifecycleFailed");
            assert_eq!(r.message, "main pod ns/demo-0: boom");
            assert_eq!(r.lifecycle_metric_phase.as_deref(), Some("Pending"));
            assert!(r.announce);
        }
        other => panic!("{other:?}"),
    }
    let phase_failed = phase(main.clone(), "Failed");
    match plan::failed_step(&cs, NS, Some(&phase_failed), false) {
        FailedStep::Fail(r) => {
            assert_eq!(r.reason, "MainAgentFailed");
            assert_eq!(r.message, "main pod ns/demo-0: Failed");
            assert_eq!(r.lifecycle_metric_phase, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        plan::failed_step(&cs, NS, Some(&phase_failed), true),
        FailedStep::Rebuild {
            reason: "terminal (phase=Failed lifecycle=)".into()
        }
    );
    cs.status = Some(CocoonSetStatus {
        phase: Some(CocoonSetPhase::Failed),
        ..CocoonSetStatus::default()
    });
    // Already Failed: reported again without a second announcement.
    match plan::failed_step(&cs, NS, Some(&phase_failed), false) {
        FailedStep::Fail(r) => assert!(!r.announce),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        plan::failed_step(&cs, NS, Some(&main), false),
        FailedStep::Recovered {
            message: "main pod ns/demo-0 is Ready again".into()
        }
    );
}

// ----- §9 status ---------------------------------------------------------------------------

#[test]
fn status_build_and_patch_rule() {
    let mut cs = base();
    cs.spec.toolboxes = vec![ToolboxSpec {
        name: "tb".into(),
        vnc_port: 0,
        ..ToolboxSpec::default()
    }];
    let main = with_ann(
        ready(pods::build_agent_pod(&cs, NS, 0, "", None)),
        ann::VM_ID,
        "id-0",
    );
    let main_vm = pods::vm_name(&main).to_string();
    let sub = pods::build_agent_pod(&cs, NS, 1, &main_vm, Some("n"));
    let tb = ready(pods::build_toolbox_pod(&cs, NS, &cs.spec.toolboxes[0]));
    let c = Classified::from_owned([&main, &sub, &tb]);
    let now = Timestamp::from_second(1_800_000_000).unwrap_or_default();
    let s = plan::build_status(&cs, &c, None, now);
    assert_eq!(s.phase, Some(CocoonSetPhase::Scaling));
    assert_eq!((s.ready_agents, s.desired_agents), (1, 3));
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
    assert!(plan::status_patch(&cs, s.clone()).is_some());
    cs.status = Some(s.clone());
    let later = Timestamp::from_second(1_800_000_100).unwrap_or_default();
    let again = plan::build_status(&cs, &c, None, later);
    assert_eq!(plan::status_patch(&cs, again), None);

    // Explicit phases win; no main derives Pending.
    let explicit = plan::build_status(&cs, &c, Some(CocoonSetPhase::Failed), later);
    assert_eq!(explicit.phase, Some(CocoonSetPhase::Failed));
    assert_eq!(explicit.conditions[1].reason, "Stable");
    let empty = plan::build_status(&cs, &Classified::default(), None, later);
    assert_eq!(empty.phase, Some(CocoonSetPhase::Pending));

    // Everything ready: Running, Ready=True.
    let all = Classified::from_owned([&main, &ready(sub.clone()), &tb]);
    let mut two = cs.clone();
    two.spec.agent.replicas = 1;
    let s = plan::build_status(&two, &all, None, later);
    assert_eq!(s.phase, Some(CocoonSetPhase::Running));
    assert_eq!(s.conditions[0].reason, "AllAgentsReady");
    assert_eq!(s.conditions[0].last_transition_time.0, later);
}

// ----- step 2 teardown ---------------------------------------------------------------------

#[test]
fn teardown_stash_and_gc_plan() {
    let mut cs = base();
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
    let names = plan::stash_names(&cs, [&pod]);
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
        let got = plan::gc_plan(&cs, NS, &two);
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

#[test]
fn toolbox_validation() {
    let tb = |n: &str| ToolboxSpec {
        name: n.into(),
        ..ToolboxSpec::default()
    };
    assert!(validate_toolboxes(&[tb("a"), tb("b")]).is_ok());
    assert_eq!(
        validate_toolboxes(&[tb("a"), tb("a")]).map_err(|e| e.to_string()),
        Err("duplicate toolbox name \"a\" in spec".to_string())
    );
    assert_eq!(
        validate_toolboxes(&[tb("7")]).map_err(|e| e.to_string()),
        Err(
            "toolbox name \"7\" must not be an integer: collides with agent slot pod naming"
                .to_string()
        )
    );
}

#[test]
fn pod_facts() {
    let cs = base();
    let mut p = pods::build_agent_pod(&cs, NS, 0, "", None);
    assert!(!pods::is_vm_live(&p));
    p = with_ann(p, ann::VM_ID, "id");
    p.status
        .get_or_insert_with(PodStatus::default)
        .container_statuses = Some(vec![ContainerStatus {
        name: "agent".into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    assert!(pods::is_vm_live(&p));
    assert!(!pods::is_terminal(&p));
    assert!(pods::is_terminal(&phase(p.clone(), "Failed")));
    assert!(pods::is_terminal(&with_ann(
        p,
        ann::LIFECYCLE_STATE,
        "failed"
    )));
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
            plan::status_already_written(last, version, &status(phase)),
            want,
            "{what}"
        );
    }
}

#[test]
fn versions_seen_accumulate_without_repeats_and_stay_bounded() {
    let v = |r: std::ops::Range<usize>| r.map(|i| i.to_string()).collect::<Vec<_>>();
    assert_eq!(plan::versions_seen(None, &v(1..3)), v(1..3));
    assert_eq!(plan::versions_seen(Some(v(1..3)), &v(2..5)), v(1..5));
    let kept = plan::versions_seen(Some(v(0..plan::VERSIONS_KEPT)), &v(30..40));
    assert_eq!(kept, v(40 - plan::VERSIONS_KEPT..40), "the latest are kept");
}
