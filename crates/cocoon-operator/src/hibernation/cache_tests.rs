//! The pod cache keeps what a pass reads: the same facts from a cached pod as from the pod.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodSpec, PodStatus,
};
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::cache::{container_running, pod_for_cache};
use super::decide::PodFacts;

fn pod(state: ContainerState) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("demo-0".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            resource_version: Some("42".into()),
            annotations: Some(
                [
                    ("vm.cocoonstack.io/name", "vk-ns-demo-0"),
                    ("vm.cocoonstack.io/id", "abc123"),
                    ("cocoonset.cocoonstack.io/hibernate", "true"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            labels: Some([("app".to_string(), "demo".to_string())].into()),
            managed_fields: Some(vec![Default::default(); 4]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("ubuntu:24.04".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "agent".into(),
                image: "ubuntu:24.04".into(),
                image_id: "sha256:feed".into(),
                ready: true,
                restart_count: 3,
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..ContainerState::default()
    }
}

fn waiting() -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("ContainerCreating".into()),
            ..ContainerStateWaiting::default()
        }),
        ..ContainerState::default()
    }
}

fn facts(p: &Pod) -> PodFacts {
    PodFacts::from_pod(p.annotations(), container_running(p))
}

#[test]
fn a_cached_pod_gives_a_pass_the_same_facts_as_the_pod() {
    for state in [running(), waiting()] {
        let full = pod(state);
        let mut cached = full.clone();
        pod_for_cache(&mut cached);
        assert_eq!(facts(&cached), facts(&full));
        assert_eq!(cached.metadata.annotations, full.metadata.annotations);
        assert_eq!(cached.name_any(), "demo-0");
        assert_eq!(cached.uid().as_deref(), Some("u1"));
        assert_eq!(cached.resource_version().as_deref(), Some("42"));
    }
    let mut running_pod = pod(running());
    pod_for_cache(&mut running_pod);
    assert!(
        container_running(&running_pod),
        "a running container stays running"
    );
    let mut waiting_pod = pod(waiting());
    pod_for_cache(&mut waiting_pod);
    assert!(
        !container_running(&waiting_pod),
        "a waiting container does not become running"
    );
}

#[test]
fn a_cached_pod_keeps_no_spec_no_other_status_and_no_managed_fields() {
    let mut cached = pod(running());
    pod_for_cache(&mut cached);
    assert_eq!(cached.metadata.managed_fields, None);
    assert_eq!(cached.spec, None);
    let status = cached.status.expect("the container states stay");
    assert_eq!(status.phase, None);
    assert_eq!(status.conditions, None);
    let c = &status.container_statuses.expect("container statuses")[0];
    assert_eq!(
        (c.name.as_str(), c.image.as_str(), c.restart_count),
        ("agent", "", 0)
    );
}
