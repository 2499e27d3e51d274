//! What the hibernation controller's pod cache keeps of a pod, and the one status fact a pass
//! reads from it.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod, PodStatus};

/// What the pod cache keeps of a pod: its metadata (the annotations a pass reads) and whether
/// each container runs ([`container_running`]); no spec, no other status, no managedFields. A
/// cache of every pod in the watched namespaces then costs a fraction of the pods.
pub(super) fn pod_for_cache(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.spec = None;
    pod.status = pod.status.take().map(|status| PodStatus {
        container_statuses: status.container_statuses.map(|all| {
            all.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    state: c.state.map(|s| ContainerState {
                        running: s.running,
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                })
                .collect()
        }),
        ..PodStatus::default()
    });
}

pub(super) fn container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        })
}
