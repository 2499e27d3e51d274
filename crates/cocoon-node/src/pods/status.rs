//! Pod status computation (`node.md` §12.1): what this agent reports for a tracked pod, as a
//! pure function of the tracked VM, the probe result and the lifecycle state.
//!
//! Choice for the unspecified hibernated container state: `waiting` with reason `Hibernated`
//! (phase `Running`, Ready `False`), so nothing mistakes it for a live VM; a pod tracked at
//! create with no VM yet reports phase `Pending` with a `waiting` container, reason
//! `Creating`.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The one container every VM pod reports.
pub const CONTAINER: &str = "agent";

/// Inputs of the status computation.
#[derive(Debug, Clone)]
pub struct StatusInput<'a> {
    /// The tracked VM's IP (§11.2), when a VM is tracked.
    pub vm_ip: Option<&'a str>,
    /// The probe says ready.
    pub probe_ready: bool,
    /// `lifecycle-state == ready` (or the §5.3 bypass).
    pub lifecycle_ready: bool,
    /// The pod carries the hibernate annotation.
    pub hibernated: bool,
    /// Kept start time.
    pub start_time: Option<Time>,
    /// When the VM started (container `startedAt`).
    pub vm_started: Option<Time>,
    /// The previous status (for `lastTransitionTime`).
    pub previous: Option<&'a PodStatus>,
    /// Now.
    pub now: Time,
}

fn condition(kind: &str, status: bool, previous: Option<&PodStatus>, now: &Time) -> PodCondition {
    let status = if status { "True" } else { "False" };
    // Keep the transition time while the status is unchanged, as kubelets do.
    let last = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        last_transition_time: Some(last),
        ..Default::default()
    }
}

fn container(ready: bool, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: CONTAINER.to_owned(),
        ready,
        started: Some(state.running.is_some()),
        state: Some(state),
        image: String::new(),
        image_id: String::new(),
        restart_count: 0,
        ..Default::default()
    }
}

fn waiting(reason: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message: None,
        }),
        ..Default::default()
    }
}

/// §12.1 for a tracked pod.
pub fn compute(input: &StatusInput<'_>) -> PodStatus {
    let now = &input.now;
    match input.vm_ip {
        None => {
            let (phase, reason) = if input.hibernated {
                ("Running", "Hibernated")
            } else {
                ("Pending", "Creating")
            };
            PodStatus {
                phase: Some(phase.to_owned()),
                start_time: input.start_time.clone(),
                conditions: Some(vec![
                    condition("Ready", false, input.previous, now),
                    condition("Initialized", true, input.previous, now),
                ]),
                container_statuses: Some(vec![container(false, waiting(reason))]),
                ..Default::default()
            }
        }
        Some(ip) => {
            let ready = input.probe_ready && input.lifecycle_ready;
            PodStatus {
                phase: Some("Running".to_owned()),
                pod_ip: (!ip.is_empty()).then(|| ip.to_owned()),
                pod_ips: (!ip.is_empty())
                    .then(|| vec![k8s_openapi::api::core::v1::PodIP { ip: ip.to_owned() }]),
                start_time: input.start_time.clone(),
                conditions: Some(vec![
                    condition("Ready", ready, input.previous, now),
                    condition("Initialized", true, input.previous, now),
                ]),
                container_statuses: Some(vec![container(
                    ready,
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: input
                                .vm_started
                                .clone()
                                .or_else(|| input.start_time.clone()),
                        }),
                        ..Default::default()
                    },
                )]),
                ..Default::default()
            }
        }
    }
}

/// The status of DeletePod (§12.1): phase `Succeeded`.
pub fn succeeded(previous: Option<&PodStatus>) -> PodStatus {
    PodStatus {
        phase: Some("Succeeded".to_owned()),
        start_time: previous.and_then(|p| p.start_time.clone()),
        ..Default::default()
    }
}

/// The status of an eviction (§10): phase `Failed` with a terminated `agent` container.
pub fn evicted(previous: Option<&PodStatus>, reason: &str, message: &str) -> PodStatus {
    PodStatus {
        phase: Some("Failed".to_owned()),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        start_time: previous.and_then(|p| p.start_time.clone()),
        container_statuses: Some(vec![container(
            false,
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    reason: Some(reason.to_owned()),
                    message: Some(message.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )]),
        ..Default::default()
    }
}

/// The fields the drift reconciler compares (§12.2).
pub fn drift_key(
    s: &PodStatus,
) -> (
    Option<String>,
    Option<String>,
    String,
    String,
    bool,
    &'static str,
) {
    let cond = |t: &str| {
        s.conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
            .map(|c| c.status.clone())
            .unwrap_or_default()
    };
    let agent = s
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER));
    let kind = match agent.and_then(|c| c.state.as_ref()) {
        Some(st) if st.running.is_some() => "running",
        Some(st) if st.terminated.is_some() => "terminated",
        Some(st) if st.waiting.is_some() => "waiting",
        _ => "",
    };
    (
        s.phase.clone(),
        s.pod_ip.clone(),
        cond("Ready"),
        cond("Initialized"),
        agent.is_some_and(|c| c.ready),
        kind,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(ip: Option<&'a str>, probe: bool, lc: bool, hib: bool) -> StatusInput<'a> {
        StatusInput {
            vm_ip: ip,
            probe_ready: probe,
            lifecycle_ready: lc,
            hibernated: hib,
            start_time: None,
            vm_started: None,
            previous: None,
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }

    fn ready(s: &PodStatus) -> String {
        drift_key(s).2
    }

    #[test]
    fn status_rows_of_12_1() {
        // VM tracked: Running; Ready = probe AND lifecycle ready.
        for (probe, lc, want) in [
            (true, true, "True"),
            (true, false, "False"),
            (false, true, "False"),
        ] {
            let s = compute(&input(Some("10.0.0.2"), probe, lc, false));
            assert_eq!(s.phase.as_deref(), Some("Running"));
            assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.2"));
            assert_eq!(ready(&s), want);
            assert_eq!(drift_key(&s).5, "running");
            assert_eq!(drift_key(&s).4, want == "True");
        }
        // Hibernated: Running, not ready, waiting container, no IP.
        let s = compute(&input(None, true, true, true));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!((ready(&s).as_str(), drift_key(&s).5), ("False", "waiting"));
        assert_eq!(s.pod_ip, None);
        // Tracked at create, no VM yet: Pending.
        let s = compute(&input(None, false, false, false));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        // Eviction and delete.
        let e = evicted(None, "VMGone", "vm no longer exists");
        assert_eq!(e.phase.as_deref(), Some("Failed"));
        let t = e
            .container_statuses
            .as_ref()
            .and_then(|c| c[0].state.as_ref())
            .and_then(|s| s.terminated.as_ref());
        assert_eq!(
            t.map(|t| (t.exit_code, t.reason.clone())),
            Some((1, Some("VMGone".into())))
        );
        assert_eq!(succeeded(None).phase.as_deref(), Some("Succeeded"));
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let old = Time(
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
        );
        let mut first = compute(&input(Some("1.1.1.1"), true, true, false));
        if let Some(cs) = first.conditions.as_mut() {
            for c in cs.iter_mut() {
                c.last_transition_time = Some(old.clone());
            }
        }
        let mut i = input(Some("1.1.1.1"), true, true, false);
        i.previous = Some(&first);
        let same = compute(&i);
        let lt = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .map(|c| c[0].last_transition_time.clone())
        };
        assert_eq!(lt(&same), Some(Some(old.clone())));
        let mut j = input(Some("1.1.1.1"), false, true, false);
        j.previous = Some(&first);
        assert_ne!(lt(&compute(&j)), Some(Some(old)));
    }
}
