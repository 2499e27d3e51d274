//! The CocoonCheckpoint controller's rules, pure: from what a pass observed (the CR, the
//! source pod's facts, the request the pod carries) to what it writes.
//!
//! * A CR without the finalizer gets it first, and nothing else in that pass.
//! * A CR with no phase is validated: the source must be a Running managed pod of the CR's
//!   namespace whose VM is its own (`podRef`), or the Running main agent pod of a CocoonSet of
//!   the namespace (`cocoonSetRef`). Refused: phase `Failed`, `Ready=False` reason
//!   [`REASON_INVALID_SOURCE`] with a message that names the field, a Warning Event.
//!   Accepted: phase `Pending` with the source, the VM, the node and the derived artifact
//!   recorded, a Normal Event, and the request written on the pod.
//! * `Pending`: the request stays on the pod until the node agent takes it over (it writes
//!   `Saving`). A pod that carries another checkpoint's request still in flight keeps this one
//!   waiting; the request is written once the pod is free.
//! * `Pending`, `Saving`, `Pushing` whose source pod is gone: `Failed` (the node agent
//!   cannot finish it).
//! * `Ready`, `Failed`: the request, if still this CR's, is cleared.

use cocoon_api::contract::checkpoint::{
    CheckpointArtifact, CheckpointRequest, checkpoint_artifact,
};
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CocoonCheckpoint, CocoonCheckpointStatus, Source,
};
use cocoon_api::naming::vm_name_for_pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::conditions::{NewCondition, set_condition};

/// `Ready=False` reason: the source is not a Running managed pod (or set main) of the
/// namespace.
pub const REASON_INVALID_SOURCE: &str = "InvalidSource";
/// `Ready=False` reason: accepted, waiting for the node agent (or for the pod to be free).
pub const REASON_PENDING: &str = "Pending";
/// `Ready=False` reason: the source pod went away before the checkpoint was taken.
pub const REASON_SOURCE_GONE: &str = "SourceGone";
/// Condition type.
pub const CONDITION_READY: &str = "Ready";

/// Normal Event reason (chosen here, not in the spec's table): the checkpoint was accepted
/// and handed to the node agent of the source's node.
pub const EVENT_REQUESTED: &str = "CheckpointRequested";
/// Warning Event reason (chosen here): the checkpoint was refused or could not be finished.
pub const EVENT_FAILED: &str = "CheckpointFailed";

/// What the pass saw of one pod (the source, or the set's main).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// The pod's name.
    pub name: String,
    /// `cocoonset.cocoonstack.io/managed` is `true`.
    pub managed: bool,
    /// `status.phase` is `Running`.
    pub running: bool,
    /// `vm.cocoonstack.io/name`.
    pub vm_name: String,
    /// `spec.nodeName`.
    pub node: String,
    /// The checkpoint request the pod carries (`None`: none, or one that does not parse).
    pub request: Option<CheckpointRequest>,
    /// For a set's main: whether the pod is controlled by that very set (its UID).
    pub owned_by_set: bool,
}

/// What the pass found of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceView {
    /// The spec names none or both (only possible for objects the API server did not check).
    Unnamed,
    /// The named pod does not exist.
    PodMissing,
    /// The named CocoonSet does not exist.
    SetMissing,
    /// The named CocoonSet exists, its main pod does not.
    MainMissing,
    /// The pod (the source, or the set's main).
    Pod(PodFacts),
}

/// Everything one pass decides from.
pub struct Observed<'a> {
    pub cr: &'a CocoonCheckpoint,
    pub source: SourceView,
    /// Whether the request the pod carries (when another CR's) belongs to a checkpoint still
    /// in flight in this namespace.
    pub other_request_in_flight: bool,
    pub now: Timestamp,
}

/// An Event to publish on the CR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPlan {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// A change of the source pod's request annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestChange {
    /// Write this request on the pod.
    Write {
        pod: String,
        request: CheckpointRequest,
    },
    /// Remove the request from the pod (it is this CR's).
    Clear { pod: String },
}

/// What one pass writes, in this order: finalizer, status, event, request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub add_finalizer: bool,
    pub status: Option<CocoonCheckpointStatus>,
    pub event: Option<EventPlan>,
    pub request: Option<RequestChange>,
    /// Look again after this many seconds (waiting for a busy pod).
    pub requeue: bool,
}

/// The refusal message of a source, naming the field.
pub fn refusal(source: Source<'_>, view: &SourceView, ns: &str) -> String {
    let field = source.field();
    match (source, view) {
        (Source::Pod(name), SourceView::Pod(p)) => format!(
            "{field}: pod {name:?} is not a Running managed pod of namespace {ns:?} ({})",
            pod_problem(ns, p)
        ),
        (Source::Pod(name), _) => format!(
            "{field}: pod {name:?} is not a Running managed pod of namespace {ns:?} (not found)"
        ),
        (Source::CocoonSet(name), SourceView::SetMissing) => {
            format!("{field}: CocoonSet {name:?} not found in namespace {ns:?}")
        }
        (Source::CocoonSet(name), SourceView::Pod(p)) => format!(
            "{field}: the main agent pod {:?} of CocoonSet {name:?} is not a Running managed pod of namespace {ns:?} ({})",
            p.name,
            pod_problem(ns, p)
        ),
        (Source::CocoonSet(name), _) => format!(
            "{field}: the main agent pod {:?} of CocoonSet {name:?} is not a Running managed pod of namespace {ns:?} (not found)",
            cocoon_api::naming::pod_name_for_agent(name, 0)
        ),
    }
}

/// Why a present pod is no source, or `None` when it is one.
fn problem(ns: &str, p: &PodFacts, set_main: bool) -> Option<&'static str> {
    if !p.managed {
        Some("not managed by cocoon")
    } else if set_main && !p.owned_by_set {
        Some("not controlled by the CocoonSet")
    } else if p.vm_name.is_empty() || p.vm_name != vm_name_for_pod(ns, &p.name) {
        Some("its VM name is not its own")
    } else if !p.running {
        Some("not Running")
    } else if p.node.is_empty() {
        Some("not bound to a node")
    } else {
        None
    }
}

fn pod_problem(ns: &str, p: &PodFacts) -> &'static str {
    problem(ns, p, false)
        .or_else(|| problem(ns, p, true))
        .unwrap_or("refused")
}

/// The source pod, when the view is a valid source for `source`.
pub fn valid_source<'v>(
    source: Source<'_>,
    view: &'v SourceView,
    ns: &str,
) -> Option<&'v PodFacts> {
    match view {
        SourceView::Pod(p) => {
            let set_main = matches!(source, Source::CocoonSet(_));
            problem(ns, p, set_main).is_none().then_some(p)
        }
        _ => None,
    }
}

fn ready_false(
    status: &mut CocoonCheckpointStatus,
    reason: &str,
    message: String,
    generation: i64,
    now: Timestamp,
) {
    set_condition(
        &mut status.conditions,
        NewCondition {
            type_: CONDITION_READY,
            status: "False",
            reason,
            message,
            observed_generation: generation,
        },
        now,
        false,
    );
}

/// The plan of one pass over a CR that is not being deleted.
pub fn plan_pass(o: &Observed<'_>, has_finalizer: bool) -> Plan {
    if !has_finalizer {
        return Plan {
            add_finalizer: true,
            ..Plan::default()
        };
    }
    let cr = o.cr;
    let ns = cr.namespace().unwrap_or_default();
    let generation = cr.metadata.generation.unwrap_or(0);
    let current = cr.status.clone().unwrap_or_default();
    let ours = |p: &PodFacts| {
        p.request
            .as_ref()
            .is_some_and(|r| Some(r.uid.as_str()) == cr.metadata.uid.as_deref())
    };
    match current.phase {
        None => validate(o, &ns, generation, current),
        Some(CheckpointPhase::Pending) => {
            let SourceView::Pod(p) = &o.source else {
                return gone(o, generation, current);
            };
            if ours(p) {
                return Plan::default();
            }
            if p.request.is_some() && o.other_request_in_flight {
                return Plan {
                    requeue: true,
                    ..Plan::default()
                };
            }
            match request_for(cr, &ns, &current.vm_name) {
                Some(request) => Plan {
                    request: Some(RequestChange::Write {
                        pod: p.name.clone(),
                        request,
                    }),
                    ..Plan::default()
                },
                None => Plan::default(),
            }
        }
        Some(CheckpointPhase::Saving | CheckpointPhase::Pushing) => match &o.source {
            SourceView::Pod(_) => Plan::default(),
            _ => gone(o, generation, current),
        },
        Some(CheckpointPhase::Ready | CheckpointPhase::Failed) => match &o.source {
            SourceView::Pod(p) if ours(p) => Plan {
                request: Some(RequestChange::Clear {
                    pod: p.name.clone(),
                }),
                ..Plan::default()
            },
            _ => Plan::default(),
        },
    }
}

/// The source pod went away while the checkpoint was in flight.
fn gone(o: &Observed<'_>, generation: i64, mut status: CocoonCheckpointStatus) -> Plan {
    let message = format!(
        "the source pod {:?} is gone: the checkpoint was not taken",
        status.pod_name
    );
    status.phase = Some(CheckpointPhase::Failed);
    status.observed_generation = generation;
    ready_false(
        &mut status,
        REASON_SOURCE_GONE,
        message.clone(),
        generation,
        o.now,
    );
    Plan {
        status: Some(status),
        event: Some(EventPlan {
            warning: true,
            reason: EVENT_FAILED,
            message,
        }),
        ..Plan::default()
    }
}

fn request_for(cr: &CocoonCheckpoint, ns: &str, vm: &str) -> Option<CheckpointRequest> {
    let uid = cr.metadata.uid.as_deref()?;
    let CheckpointArtifact { repository, tag } =
        checkpoint_artifact(ns, &cr.name_any(), uid).ok()?;
    Some(CheckpointRequest {
        name: cr.name_any(),
        uid: uid.to_owned(),
        vm_name: vm.to_owned(),
        repository,
        tag,
    })
}

fn validate(
    o: &Observed<'_>,
    ns: &str,
    generation: i64,
    mut status: CocoonCheckpointStatus,
) -> Plan {
    let cr = o.cr;
    status.observed_generation = generation;
    let Some(source) = cr.spec.source.one() else {
        let message = cocoon_api::crd::checkpoint::MSG_ONE_SOURCE.to_owned();
        return failed(o, generation, status, message);
    };
    status.source = source.display();
    let Some(pod) = valid_source(source, &o.source, ns) else {
        return failed(o, generation, status, refusal(source, &o.source, ns));
    };
    let Some(request) = request_for(cr, ns, &pod.vm_name) else {
        return failed(o, generation, status, "metadata.uid: missing".to_owned());
    };
    status.phase = Some(CheckpointPhase::Pending);
    status.pod_name = pod.name.clone();
    status.vm_name = pod.vm_name.clone();
    status.node = pod.node.clone();
    status.repository = request.repository.clone();
    status.tag = request.tag.clone();
    let busy = pod.request.is_some() && o.other_request_in_flight;
    let message = if busy {
        format!(
            "waiting: pod {:?} is busy with checkpoint {:?}",
            pod.name,
            pod.request.as_ref().map(|r| r.name.as_str()).unwrap_or("")
        )
    } else {
        format!(
            "handed to the node agent of node {:?} (VM {})",
            pod.node, pod.vm_name
        )
    };
    ready_false(&mut status, REASON_PENDING, message, generation, o.now);
    Plan {
        event: Some(EventPlan {
            warning: false,
            reason: EVENT_REQUESTED,
            message: format!(
                "checkpoint of {} (VM {} on node {}) into {}:{}",
                source.display(),
                pod.vm_name,
                pod.node,
                request.repository,
                request.tag
            ),
        }),
        requeue: busy,
        request: (!busy).then(|| RequestChange::Write {
            pod: pod.name.clone(),
            request,
        }),
        status: Some(status),
        ..Plan::default()
    }
}

fn failed(
    o: &Observed<'_>,
    generation: i64,
    mut status: CocoonCheckpointStatus,
    message: String,
) -> Plan {
    status.phase = Some(CheckpointPhase::Failed);
    ready_false(
        &mut status,
        REASON_INVALID_SOURCE,
        message.clone(),
        generation,
        o.now,
    );
    Plan {
        status: Some(status),
        event: Some(EventPlan {
            warning: true,
            reason: EVENT_FAILED,
            message,
        }),
        ..Plan::default()
    }
}

/// What deletion does with the artifact: the name derived from the CR itself (never its
/// status), or nothing when no name can be derived.
pub fn artifact_to_delete(cr: &CocoonCheckpoint) -> Option<CheckpointArtifact> {
    let ns = cr.namespace()?;
    let uid = cr.metadata.uid.as_deref()?;
    checkpoint_artifact(&ns, &cr.name_any(), uid).ok()
}
