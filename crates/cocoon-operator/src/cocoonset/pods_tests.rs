//! Table tests of pod construction (`cocoonset.md` §3), the drift rules (§4) and the pod
//! facts the steps read.

use std::collections::BTreeMap;

use cocoon_api::contract::{annotations as ann, labels};
use cocoon_api::crd::set::{AgentMode, CocoonSet, SnapshotPolicy, ToolboxMode, ToolboxSpec};
use cocoon_api::naming;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use serde_json::json;

use super::fixtures::{NS, SetFixture, phase, set, with};
use super::pods;

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

// ----- §3 factories ------------------------------------------------------------------------

#[test]
fn main_pod_skeleton() {
    let mut cs = set().with_replicas(2);
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
    let mut cs = set().with_replicas(2);
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
    let mut cs = set().with_replicas(2);
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
    let cs = set().with_replicas(2);
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
    let storage_pod = with(
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
            with(fresh.clone(), ann::FORK_FROM, "x"),
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
    let cs = set().with_replicas(2);
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

// ----- pod facts ---------------------------------------------------------------------------

#[test]
fn pod_facts() {
    let cs = set().with_replicas(2);
    let mut p = pods::build_agent_pod(&cs, NS, 0, "", None);
    assert!(!pods::is_vm_live(&p));
    p = with(p, ann::VM_ID, "id");
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
    assert!(pods::is_terminal(&with(p, ann::LIFECYCLE_STATE, "failed")));
}

#[test]
fn members_carry_the_idle_limit_and_it_is_no_drift() {
    use cocoon_api::contract::idle::SUSPEND_AFTER;
    use cocoon_api::crd::set::IdleSpec;
    let plain = set();
    let main = pods::build_agent_pod(&plain, NS, 0, "", None);
    assert!(
        !main.annotations().contains_key(SUSPEND_AFTER),
        "no spec.idle"
    );
    let mut idle = set();
    idle.spec.idle = Some(IdleSpec {
        suspend_after: Some("90s".into()),
        ..IdleSpec::default()
    });
    let main = pods::build_agent_pod(&idle, NS, 0, "", None);
    assert_eq!(
        main.annotations().get(SUSPEND_AFTER).map(String::as_str),
        Some("90s")
    );
    // The idle step patches it as the spec changes; the pod is not rebuilt for it.
    assert_eq!(pods::agent_drift(&plain, NS, 0, &main), None);
    assert_eq!(pods::agent_drift(&idle, NS, 0, &main), None);
}
