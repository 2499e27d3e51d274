//! Unit tests of `pods/resources.rs`: a pod's effective requests as the kubelet computes them,
//! and the admission verdict with the kubelet's reasons and messages.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::resources::*;

fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    })
}

fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
    Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sidecar(requests: &[(&str, &str)]) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(requests, &[])
    }
}

fn amounts(cpu_milli: u128, memory: u128, ephemeral_storage: u128) -> Amounts {
    Amounts {
        cpu_milli,
        memory,
        ephemeral_storage,
    }
}

/// Each row: the pod, and its effective requests (millicores, bytes, bytes).
#[test]
fn a_pods_requests_are_counted_as_the_kubelet_counts_them() {
    let pod = |containers: Vec<Container>, init: Vec<Container>| PodSpec {
        containers,
        init_containers: (!init.is_empty()).then_some(init),
        ..Default::default()
    };
    let cases: Vec<(&str, PodSpec, Amounts)> = vec![
        (
            "no resources",
            pod(vec![Container::default()], vec![]),
            amounts(0, 0, 0),
        ),
        (
            "requests of the containers are summed",
            pod(
                vec![
                    container(&[("cpu", "250m"), ("memory", "1Gi")], &[]),
                    container(&[("cpu", "1"), ("ephemeral-storage", "2G")], &[]),
                ],
                vec![],
            ),
            amounts(1250, 1 << 30, 2_000_000_000),
        ),
        (
            "a limit stands in for an absent request, resource by resource",
            pod(
                vec![container(
                    &[("cpu", "500m")],
                    &[("cpu", "2"), ("memory", "3Mi")],
                )],
                vec![],
            ),
            amounts(500, 3 << 20, 0),
        ),
        (
            "100000 CPUs are 100000000 millicores",
            pod(vec![container(&[("cpu", "100000")], &[])], vec![]),
            amounts(100_000_000, 0, 0),
        ),
        (
            "bytes round up, as Quantity.Value()",
            pod(vec![container(&[("memory", "1500m")], &[])], vec![]),
            amounts(0, 2, 0),
        ),
        (
            "an init container larger than the app containers sets the peak",
            pod(
                vec![container(&[("cpu", "1")], &[])],
                vec![container(&[("cpu", "3"), ("memory", "1k")], &[])],
            ),
            amounts(3000, 1000, 0),
        ),
        (
            "init containers run one at a time: their max, not their sum",
            pod(
                vec![container(&[("cpu", "1")], &[])],
                vec![
                    container(&[("cpu", "2")], &[]),
                    container(&[("cpu", "2")], &[]),
                ],
            ),
            amounts(2000, 0, 0),
        ),
        (
            "a sidecar adds to the app containers and to every later init container",
            pod(
                vec![container(&[("cpu", "1")], &[])],
                vec![sidecar(&[("cpu", "1")]), container(&[("cpu", "3")], &[])],
            ),
            amounts(4000, 0, 0),
        ),
        (
            "the pod overhead is added",
            PodSpec {
                overhead: list(&[("cpu", "100m"), ("memory", "64Mi")]),
                ..pod(vec![container(&[("cpu", "1")], &[])], vec![])
            },
            amounts(1100, 64 << 20, 0),
        ),
    ];
    for (what, spec, want) in cases {
        assert_eq!(pod_requests(&spec), Ok(want), "{what}");
    }
}

#[test]
fn an_unreadable_quantity_is_an_unexpected_admission_error_naming_the_field() {
    let spec = PodSpec {
        containers: vec![Container {
            name: "agent".into(),
            ..container(&[], &[("memory", "lots")])
        }],
        ..Default::default()
    };
    let e = pod_requests(&spec).expect_err("unreadable");
    assert_eq!(e.reason, "UnexpectedAdmissionError");
    assert!(
        e.message
            .starts_with("container \"agent\": resources.limits.memory: \"lots\""),
        "{}",
        e.message
    );
}

/// Each row: the pod's requests, what the running pods use (and how many), and the verdict
/// with the kubelet's reason and message.
#[test]
fn a_pod_fits_only_within_allocatable_next_to_the_running_pods() {
    let node = Allocatable {
        cpu_milli: Some(4000),
        memory: Some(8 << 30),
        ephemeral_storage: Some(100_000),
        pods: Some(3),
    };
    let used = amounts(1200, 1 << 30, 40_000);
    let msg = |name: &str, req: u128, used: u128, cap: u128| {
        format!(
            "Node didn't have enough resource: {name}, requested: {req}, used: {used}, capacity: {cap}"
        )
    };
    /// (what, the pod's requests, pods running, the verdict: reason and message)
    type Row<'a> = (&'a str, Amounts, usize, Result<(), (&'a str, String)>);
    let cases: Vec<Row> = vec![
        ("fits", amounts(2800, 7 << 30, 60_000), 2, Ok(())),
        ("nothing requested", amounts(0, 0, 0), 2, Ok(())),
        (
            "the issue's pod: 100000 CPUs",
            amounts(100_000_000, 0, 0),
            2,
            Err(("OutOfcpu", msg("cpu", 100_000_000, 1200, 4000))),
        ),
        (
            "one millicore too many",
            amounts(2801, 0, 0),
            2,
            Err(("OutOfcpu", msg("cpu", 2801, 1200, 4000))),
        ),
        (
            "memory",
            amounts(0, (7 << 30) + 1, 0),
            2,
            Err((
                "OutOfmemory",
                msg("memory", (7 << 30) + 1, 1 << 30, 8 << 30),
            )),
        ),
        (
            "ephemeral storage",
            amounts(0, 0, 60_001),
            2,
            Err((
                "OutOfephemeral-storage",
                msg("ephemeral-storage", 60_001, 40_000, 100_000),
            )),
        ),
        (
            "cpu is reported before memory",
            amounts(5000, 9 << 30, 0),
            2,
            Err(("OutOfcpu", msg("cpu", 5000, 1200, 4000))),
        ),
        (
            "the pod count is checked first",
            amounts(5000, 0, 0),
            3,
            Err(("OutOfpods", msg("pods", 1, 3, 3))),
        ),
    ];
    for (what, pod, pods, want) in cases {
        let got = fit(&pod, &used, pods as u128, &node).map_err(|r| (r.reason, r.message));
        assert_eq!(got, want.map_err(|(r, m)| (r.to_owned(), m)), "{what}");
    }
    // Overcommitted already (the allocatable shrank): any request of that resource fails.
    let over = amounts(5000, 0, 0);
    assert_eq!(
        fit(&amounts(1, 0, 0), &over, 0, &node).map_err(|r| r.reason),
        Err("OutOfcpu".to_owned())
    );
    assert_eq!(fit(&amounts(0, 1, 0), &over, 0, &node), Ok(()));
    // A resource the node does not publish is not checked.
    assert_eq!(
        fit(
            &amounts(u128::MAX, 0, 0),
            &used,
            99,
            &Allocatable::default()
        ),
        Ok(())
    );
}

#[test]
fn allocatable_reads_the_published_quantities() {
    let q = list(&[
        ("cpu", "3200m"),
        ("memory", "6Gi"),
        ("ephemeral-storage", "80G"),
        ("pods", "16"),
        ("hugepages-2Mi", "0"),
    ])
    .expect("list");
    assert_eq!(
        Allocatable::from_quantities(&q),
        Ok(Allocatable {
            cpu_milli: Some(3200),
            memory: Some(6 << 30),
            ephemeral_storage: Some(80_000_000_000),
            pods: Some(16),
        })
    );
    let bad = list(&[("cpu", "many")]).expect("list");
    assert!(
        Allocatable::from_quantities(&bad)
            .expect_err("bad")
            .starts_with("allocatable cpu:")
    );
    let r = Rejection {
        reason: "OutOfcpu".into(),
        message: "Node didn't have enough resource: cpu, requested: 2, used: 1, capacity: 2".into(),
    };
    assert_eq!(
        r.status_message(),
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 2, used: 1, capacity: 2"
    );
}
