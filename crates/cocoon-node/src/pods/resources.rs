//! Resource admission (issue 35 item 4): a pod bound to this node is admitted only if its
//! requests fit the node's allocatable next to the pods the agent already runs, as a kubelet
//! admits (`pkg/kubelet/lifecycle/predicate.go`, the scheduler's `noderesources` fit).
//!
//! * A pod's requests ([`pod_requests`]), for `cpu` (millicores), `memory` and
//!   `ephemeral-storage` (bytes): the sum over its containers, each resource's request or,
//!   when the request is absent, its limit (the API server's defaulting); init containers as
//!   the kubelet counts them: `max(sum(app containers + sidecars), max over the init
//!   containers of (that init container + the sidecars started before it))`, where a sidecar
//!   is an init container with `restartPolicy: Always`; plus `spec.overhead`.
//! * The verdict ([`fit`]), in the kubelet's order: one more pod than the allocatable `pods`
//!   → `OutOfpods`; then each resource the pod requests (> 0) beyond `allocatable − used` →
//!   `OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`. The message is the kubelet's
//!   `Node didn't have enough resource: <name>, requested: <n>, used: <n>, capacity: <n>`
//!   (`capacity` is the allocatable, as in the kubelet); the first failing resource is
//!   reported. A resource the node does not publish is not checked.
//! * A quantity that does not parse (the API server validates them, so this is defensive)
//!   refuses the pod with the kubelet's `UnexpectedAdmissionError`, naming the field.
//!
//! The shell (`create`, the claim step) sums the pods it tracks that are not terminal and
//! decides and claims under one lock, so two pods cannot both take the last slice.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::node::capacity::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS, parse_quantity_milli};

/// The verdict's refusal; it lives with the admission's planner, which acts on it.
pub use super::plan::admit::Rejection;

/// The kubelet's reason for a quantity it cannot read.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// Amounts of the checked resources: millicores and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_milli: u128,
    pub memory: u128,
    pub ephemeral_storage: u128,
}

impl Amounts {
    fn add(self, o: Amounts) -> Amounts {
        Amounts {
            cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli),
            memory: self.memory.saturating_add(o.memory),
            ephemeral_storage: self.ephemeral_storage.saturating_add(o.ephemeral_storage),
        }
    }

    fn max(self, o: Amounts) -> Amounts {
        Amounts {
            cpu_milli: self.cpu_milli.max(o.cpu_milli),
            memory: self.memory.max(o.memory),
            ephemeral_storage: self.ephemeral_storage.max(o.ephemeral_storage),
        }
    }

    /// The sum of `all`.
    pub fn total<'a>(all: impl IntoIterator<Item = &'a Amounts>) -> Amounts {
        all.into_iter().fold(Amounts::default(), |a, b| a.add(*b))
    }
}

/// The node's allocatable as published on its Node (`None`: not published, not checked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_milli: Option<u128>,
    pub memory: Option<u128>,
    pub ephemeral_storage: Option<u128>,
    pub pods: Option<u128>,
}

impl Allocatable {
    /// From the Node's `status.allocatable`.
    pub fn from_quantities(q: &BTreeMap<String, Quantity>) -> Result<Allocatable, String> {
        let get = |name: &str, bytes: bool| {
            q.get(name)
                .map(|v| read(&v.0, bytes).map_err(|e| format!("allocatable {name}: {e}")))
                .transpose()
        };
        Ok(Allocatable {
            cpu_milli: get(CPU, false)?,
            memory: get(MEMORY, true)?,
            ephemeral_storage: get(EPHEMERAL_STORAGE, true)?,
            pods: get(PODS, true)?,
        })
    }
}

/// A quantity in milli-units (`bytes: false`) or whole units rounded up (`bytes: true`, as
/// Kubernetes' `Quantity.Value()`).
fn read(raw: &str, bytes: bool) -> Result<u128, String> {
    let milli = parse_quantity_milli(raw).map_err(|e| format!("{raw:?}: {e}"))?;
    Ok(if bytes { milli.div_ceil(1000) } else { milli })
}

/// One container's amounts: each resource's request, else its limit.
fn container_amounts(c: &Container, kind: &str) -> Result<Amounts, Rejection> {
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let of = |name: &str, bytes: bool| -> Result<u128, Rejection> {
        let (q, field) = match (
            requests.and_then(|m| m.get(name)),
            limits.and_then(|m| m.get(name)),
        ) {
            (Some(q), _) => (q, "requests"),
            (None, Some(q)) => (q, "limits"),
            (None, None) => return Ok(0),
        };
        read(&q.0, bytes).map_err(|e| Rejection {
            reason: UNEXPECTED_ADMISSION_ERROR.into(),
            message: format!("{kind} {:?}: resources.{field}.{name}: {e}", c.name),
        })
    };
    Ok(Amounts {
        cpu_milli: of(CPU, false)?,
        memory: of(MEMORY, true)?,
        ephemeral_storage: of(EPHEMERAL_STORAGE, true)?,
    })
}

/// The pod's effective requests (see the module documentation).
pub fn pod_requests(spec: &PodSpec) -> Result<Amounts, Rejection> {
    let mut sum = Amounts::default();
    for c in &spec.containers {
        sum = sum.add(container_amounts(c, "container")?);
    }
    let mut sidecars = Amounts::default();
    let mut init_peak = Amounts::default();
    for c in spec.init_containers.iter().flatten() {
        let own = container_amounts(c, "init container")?;
        let during = if c.restart_policy.as_deref() == Some("Always") {
            sum = sum.add(own);
            sidecars = sidecars.add(own);
            sidecars
        } else {
            own.add(sidecars)
        };
        init_peak = init_peak.max(during);
    }
    let mut total = sum.max(init_peak);
    if let Some(overhead) = &spec.overhead {
        let c = Container {
            name: "overhead".into(),
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: Some(overhead.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        total = total.add(container_amounts(&c, "pod")?);
    }
    Ok(total)
}

/// Whether a pod requesting `pod` fits next to `used` (the requests of the `used_pods` pods
/// the node already runs) within `alloc`; the kubelet's first failing check otherwise.
pub fn fit(
    pod: &Amounts,
    used: &Amounts,
    used_pods: u128,
    alloc: &Allocatable,
) -> Result<(), Rejection> {
    let out_of = |name: &str, requested: u128, used: u128, capacity: u128| Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    if let Some(cap) = alloc.pods
        && used_pods + 1 > cap
    {
        return Err(out_of(PODS, 1, used_pods, cap));
    }
    for (name, requested, used, cap) in [
        (CPU, pod.cpu_milli, used.cpu_milli, alloc.cpu_milli),
        (MEMORY, pod.memory, used.memory, alloc.memory),
        (
            EPHEMERAL_STORAGE,
            pod.ephemeral_storage,
            used.ephemeral_storage,
            alloc.ephemeral_storage,
        ),
    ] {
        if let Some(cap) = cap
            && requested > 0
            && requested > cap.saturating_sub(used)
        {
            return Err(out_of(name, requested, used, cap));
        }
    }
    Ok(())
}
