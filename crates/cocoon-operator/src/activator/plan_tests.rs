//! Table tests of the Service/EndpointSlice planner and the activator port pool.

use std::collections::{BTreeMap, BTreeSet};

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{
    AgentStatus, CocoonSet, CocoonSetPhase, CocoonSetSpec, CocoonSetStatus, IdleSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::plan::*;

const ACTIVATORS: &[&str] = &["10.0.0.5", "10.0.0.6"];

fn set(ports: &[i32], phase: CocoonSetPhase, suspend: bool) -> CocoonSet {
    let mut cs = CocoonSet::new("web", CocoonSetSpec::with_image("img:1"));
    cs.metadata.namespace = Some("ns".into());
    cs.metadata.uid = Some("uid-web".into());
    cs.spec.suspend = suspend;
    cs.spec.idle = Some(IdleSpec {
        ports: ports.to_vec(),
        ..IdleSpec::default()
    });
    cs.status = Some(CocoonSetStatus {
        phase: Some(phase),
        agents: vec![AgentStatus {
            slot: 0,
            role: "main".into(),
            ip: "10.1.0.9".into(),
            ..AgentStatus::default()
        }],
        ..CocoonSetStatus::default()
    });
    cs
}

/// The main pod as the node reports it: `ip` in `status.podIP`. The tenant-writable
/// annotation `vm.cocoonstack.io/ip` always names a decoy, which no row may route to.
fn main_pod(ready: bool, ip: Option<&str>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web-0".into());
    p.metadata.annotations = Some([(ann::VM_IP.to_owned(), DECOY.to_owned())].into());
    p.status = Some(PodStatus {
        pod_ip: ip.map(str::to_owned),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    p
}

/// What a tenant writes into its main pod's `vm.cocoonstack.io/ip`.
const DECOY: &str = "10.96.0.1";

fn pool() -> BTreeMap<u16, u16> {
    [(7000, 40000), (8080, 40001)].into()
}

fn addrs() -> Vec<String> {
    ACTIVATORS.iter().map(|s| s.to_string()).collect()
}

fn observe<'a>(
    cs: &'a CocoonSet,
    main: Option<&'a Pod>,
    svc: Option<&'a Service>,
    slice: Option<&'a EndpointSlice>,
    a: &'a [String],
    p: &'a BTreeMap<u16, u16>,
) -> Observed<'a> {
    Observed {
        set: cs,
        main,
        service: svc,
        slice,
        activator_addresses: a,
        activator_ports: p,
    }
}

/// A slice's endpoint addresses and its (name, port) pairs.
type Shape = (Vec<String>, Vec<(String, i32)>);

/// The endpoints and (name, port) pairs of a planned slice.
fn shape(s: &EndpointSlice) -> Shape {
    (
        s.endpoints
            .iter()
            .flat_map(|e| e.addresses.clone())
            .collect(),
        s.ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port.unwrap()))
            .collect(),
    )
}

#[test]
fn the_slice_points_at_the_vm_while_running_and_ready_else_at_the_activators() {
    use CocoonSetPhase::*;
    let vm = |ip: &str| (vec![ip.to_owned()], vec![("p7000".into(), 7000)]);
    let act = (addrs(), vec![("p7000".into(), 40000)]);
    let rows: Vec<(&str, CocoonSetPhase, bool, Pod, Shape)> = vec![
        (
            "running, main ready",
            Running,
            false,
            main_pod(true, Some("10.1.0.7")),
            vm("10.1.0.7"),
        ),
        (
            "running, ready, no podIP: the annotation and status.agents are not trusted",
            Running,
            false,
            main_pod(true, None),
            act.clone(),
        ),
        (
            "scaling keeps serving",
            Scaling,
            false,
            main_pod(true, Some("10.1.0.7")),
            vm("10.1.0.7"),
        ),
        (
            "running, main not ready",
            Running,
            false,
            main_pod(false, Some("10.1.0.7")),
            act.clone(),
        ),
        (
            "suspend asked, phase still running",
            Running,
            true,
            main_pod(true, Some("10.1.0.7")),
            act.clone(),
        ),
        (
            "suspending",
            Suspending,
            true,
            main_pod(true, Some("10.1.0.7")),
            act.clone(),
        ),
        (
            "suspended",
            Suspended,
            true,
            main_pod(false, None),
            act.clone(),
        ),
        (
            "waking",
            Waking,
            false,
            main_pod(true, Some("10.1.0.7")),
            act.clone(),
        ),
    ];
    for (what, phase, suspend, pod, want) in rows {
        let cs = set(&[7000], phase, suspend);
        let (a, p) = (addrs(), pool());
        let plan = plan(&observe(&cs, Some(&pod), None, None, &a, &p));
        let Write::Create(slice) = &plan.slice else {
            panic!("{what}: {:?}", plan.slice)
        };
        assert_eq!(shape(slice), want, "{what}");
        assert_eq!(slice.metadata.name.as_deref(), Some("web-cocoon"));
        let l = slice.metadata.labels.as_ref().unwrap();
        assert_eq!(l[SERVICE_NAME_LABEL], "web", "{what}");
        assert_eq!(l[MANAGED_BY_LABEL], "cocoon-operator.cocoonstack.io");
        assert_eq!(slice.address_type, "IPv4");
    }
}

#[test]
fn the_service_has_no_selector_named_ports_and_the_set_as_owner() {
    let cs = set(&[8080, 7000, 7000], CocoonSetPhase::Running, false);
    let (a, p) = (addrs(), pool());
    let plan = plan(&observe(&cs, None, None, None, &a, &p));
    let Write::Create(svc) = &plan.service else {
        panic!("{:?}", plan.service)
    };
    let spec = svc.spec.as_ref().unwrap();
    assert!(spec.selector.is_none());
    let ports: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.port))
        .collect();
    assert_eq!(ports, vec![("p7000".into(), 7000), ("p8080".into(), 8080)]);
    let owner = &svc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("CocoonSet", "uid-web")
    );
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        svc.metadata.labels.as_ref().unwrap()["cocoonset.cocoonstack.io/name"],
        "web"
    );
    assert!(!plan.conflict);
}

fn owned_service(cs: &CocoonSet, ports: &[u16]) -> Service {
    desired_service(cs, ports)
}

fn foreign(mut svc: Service) -> Service {
    svc.metadata.owner_references = Some(vec![OwnerReference {
        kind: "CocoonSet".into(),
        name: "web".into(),
        uid: "someone-else".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    svc
}

#[test]
fn a_foreign_service_of_the_sets_name_is_a_conflict_and_never_written() {
    let cs = set(&[7000], CocoonSetPhase::Running, false);
    let pod = main_pod(true, Some("10.1.0.7"));
    let (a, p) = (addrs(), pool());
    let mut bare = owned_service(&cs, &[7000]);
    bare.metadata.owner_references = None;
    let ours_slice = desired_slice(&cs, &[7000], &Route::Vm("10.1.0.7".into()), &a, &p);
    for (what, svc, slice, want_slice) in [
        ("no owner at all", bare.clone(), None, Write::Keep),
        (
            "another set's uid",
            foreign(bare.clone()),
            None,
            Write::Keep,
        ),
        (
            "ours slice goes",
            bare.clone(),
            Some(&ours_slice),
            Write::Delete,
        ),
    ] {
        let plan = plan(&observe(&cs, Some(&pod), Some(&svc), slice, &a, &p));
        assert!(plan.conflict, "{what}");
        assert_eq!(plan.service, Write::Keep, "{what}");
        assert_eq!(plan.slice, want_slice, "{what}");
    }
}

#[test]
fn writes_happen_only_when_something_changed() {
    let cs = set(&[7000], CocoonSetPhase::Running, false);
    let pod = main_pod(true, Some("10.1.0.7"));
    let (a, p) = (addrs(), pool());
    let svc = owned_service(&cs, &[7000]);
    let vm_slice = desired_slice(&cs, &[7000], &Route::Vm("10.1.0.7".into()), &a, &p);
    let same = plan(&observe(
        &cs,
        Some(&pod),
        Some(&svc),
        Some(&vm_slice),
        &a,
        &p,
    ));
    assert_eq!((same.service, same.slice), (Write::Keep, Write::Keep));
    // The VM moved: only the slice is patched.
    let moved = main_pod(true, Some("10.1.0.8"));
    let plan_moved = plan(&observe(
        &cs,
        Some(&moved),
        Some(&svc),
        Some(&vm_slice),
        &a,
        &p,
    ));
    assert_eq!(plan_moved.service, Write::Keep);
    let Write::Patch(patch) = &plan_moved.slice else {
        panic!("{:?}", plan_moved.slice)
    };
    assert_eq!(patch["endpoints"][0]["addresses"][0], "10.1.0.8");
    // A port added: the Service is patched.
    let more = set(&[7000, 8080], CocoonSetPhase::Running, false);
    let plan_more = plan(&observe(
        &more,
        Some(&pod),
        Some(&svc),
        Some(&vm_slice),
        &a,
        &p,
    ));
    let Write::Patch(patch) = &plan_more.service else {
        panic!("{:?}", plan_more.service)
    };
    assert_eq!(patch["spec"]["ports"][1]["name"], "p8080");
}

#[test]
fn ours_go_when_the_ports_go_and_a_foreign_one_stays() {
    let cs = set(&[7000], CocoonSetPhase::Running, false);
    let (a, p) = (addrs(), pool());
    let svc = owned_service(&cs, &[7000]);
    let slice = desired_slice(&cs, &[7000], &Route::Activator, &a, &p);
    let none = set(&[], CocoonSetPhase::Running, false);
    let gone = plan(&observe(&none, None, Some(&svc), Some(&slice), &a, &p));
    assert_eq!(
        (gone.service, gone.slice, gone.conflict),
        (Write::Delete, Write::Delete, false)
    );
    let theirs = foreign(svc.clone());
    let kept = plan(&observe(&none, None, Some(&theirs), None, &a, &p));
    assert_eq!(
        (kept.service, kept.slice, kept.conflict),
        (Write::Keep, Write::Keep, false)
    );
}

#[test]
fn an_activator_slice_without_a_pool_port_leaves_that_port_out() {
    let cs = set(&[7000, 9000], CocoonSetPhase::Suspended, true);
    let a = addrs();
    let s = desired_slice(&cs, &[7000, 9000], &Route::Activator, &a, &pool());
    assert_eq!(shape(&s).1, vec![("p7000".into(), 40000)]);
    let v6 = desired_slice(
        &cs,
        &[7000],
        &Route::Activator,
        &["fd00::5".into(), "10.0.0.5".into()],
        &pool(),
    );
    assert_eq!(
        (v6.address_type.as_str(), shape(&v6).0),
        ("IPv6", vec!["fd00::5".into()])
    );
}

fn t(set: &str, port: u16) -> Target {
    Target {
        namespace: "ns".into(),
        set: set.into(),
        port,
    }
}

#[test]
fn the_pool_keeps_assignments_frees_the_unwanted_and_is_bounded() {
    let range = PortRange::parse("40000-40002").unwrap();
    let current: BTreeMap<u16, Target> = [
        (40001, t("a", 80)),
        (40002, t("gone", 80)),
        (50000, t("b", 1)),
    ]
    .into();
    let wanted: BTreeSet<Target> = [t("a", 80), t("b", 1), t("c", 2), t("d", 3)].into();
    let got = allocate(&current, &wanted, range);
    assert_eq!(
        got.ports,
        [(40000, t("b", 1)), (40001, t("a", 80)), (40002, t("c", 2))].into()
    );
    assert_eq!(got.unallocated, vec![t("d", 3)]);
    assert_eq!(ports_of(&got.ports, "ns", "a"), [(80, 40001)].into());
    assert_eq!(decode_pool(&encode_pool(&got.ports)), got.ports);
}

#[test]
fn pool_text_that_is_not_ours_reads_as_nothing() {
    for bad in [
        "ns/web", "ns/web/0", "ns/web/x", "/web/80", "ns//80", "a/b/80/9",
    ] {
        assert_eq!(Target::decode(bad), None, "{bad}");
    }
    assert_eq!(Target::decode("ns/web/80"), Some(t("web", 80)));
    for bad in ["", "40000", "0-10", "5-4", "1-20000", "a-b"] {
        assert_eq!(PortRange::parse(bad), None, "{bad}");
    }
    assert_eq!(
        PortRange::parse("40000-40999"),
        Some(PortRange {
            first: 40000,
            last: 40999
        })
    );
}

#[test]
fn sets_of_one_name_in_two_namespaces_never_share_an_activator_port() {
    let range = PortRange::parse("40000-40009").unwrap();
    let theirs = Target {
        namespace: "team-b".into(),
        set: "web".into(),
        port: 80,
    };
    let wanted: BTreeSet<Target> = [t("web", 80), theirs.clone()].into();
    let got = allocate(&BTreeMap::new(), &wanted, range);
    let ours = ports_of(&got.ports, "ns", "web");
    let other = ports_of(&got.ports, "team-b", "web");
    assert_eq!((ours.len(), other.len()), (1, 1));
    assert_ne!(
        ours[&80], other[&80],
        "one activator port serves two namespaces"
    );
    // What a port means is read back whole: namespace, set and port.
    assert_eq!(got.ports[&other[&80]], theirs);
    assert_eq!(decode_pool(&encode_pool(&got.ports)), got.ports);
}
