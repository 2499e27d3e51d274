//! Whether the node agent takes a checkpoint a pod's request names (docs/checkpoints.md §"What
//! the node agent must check"), pure: the request annotation is a hint anyone who may patch the
//! pod can write, so the verdict rests on the CocoonCheckpoint the agent read itself.
//!
//! * the request parses and is at most 1 KiB;
//! * the CR `<pod namespace>/<request.name>` exists, has the request's UID, is not being
//!   deleted, and is `Pending` (or `Saving`/`Pushing`: the agent restarted mid-way and starts
//!   over from the save); `Ready`/`Failed` are settled (the operator clears the request);
//! * its status names this node, this pod and this pod's VM, and its source resolves to this
//!   pod (`podRef` = the pod, or `cocoonSetRef` = the pod's controlling set and the pod is its
//!   slot 0);
//! * the artifact re-derived from the CR (`checkpoint_artifact(ns, name, uid)`) equals both
//!   the request's and the status' repository and tag.
//!
//! Any failed check refuses with `TenantIsolationRefused`, before any runtime or registry call.

use cocoon_api::contract::checkpoint::{
    CheckpointArtifact, CheckpointRequest, checkpoint_artifact,
};
use cocoon_api::crd::checkpoint::{CheckpointPhase, Source};
use cocoon_api::naming::{pod_name_for_agent, vm_name_for_pod};

/// The pod carrying the request, as the agent sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodFacts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `vm.cocoonstack.io/name`.
    pub vm_name: Option<&'a str>,
    /// The name of the CocoonSet that controls the pod (its controller owner reference).
    pub controller_set: Option<&'a str>,
    /// This agent's node.
    pub node: &'a str,
}

/// The CocoonCheckpoint the agent read itself (`<pod namespace>/<request.name>`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckpointFacts<'a> {
    pub uid: &'a str,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub phase: Option<CheckpointPhase>,
    /// `spec.source` (`None` when it names none or both).
    pub source: Option<Source<'a>>,
    pub node: &'a str,
    pub pod_name: &'a str,
    pub vm_name: &'a str,
    pub repository: &'a str,
    pub tag: &'a str,
}

/// What to do about a pod's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Take the checkpoint of `vm` into `artifact` (`restart`: it was `Saving`/`Pushing`).
    Take {
        vm: String,
        artifact: CheckpointArtifact,
        restart: bool,
    },
    /// The checkpoint is `Ready` or `Failed`: nothing to do until the operator clears it.
    Settled,
    /// A check failed: a Warning `TenantIsolationRefused` with this message, nothing else.
    Refuse(String),
}

/// Reads the request annotation (bounded); a bad value is a refusal message.
pub(crate) fn read_request(raw: &str) -> Result<CheckpointRequest, String> {
    CheckpointRequest::parse(raw).map_err(|e| format!("checkpoint request refused: {e}"))
}

/// The verdict for `req` on `pod`, given the CR the agent read (`None`: not found).
pub(crate) fn decide(
    pod: &PodFacts<'_>,
    req: &CheckpointRequest,
    cr: Option<&CheckpointFacts<'_>>,
) -> Verdict {
    let (ns, name) = (pod.namespace, req.name.as_str());
    let refuse = |why: String| {
        Verdict::Refuse(format!(
            "checkpoint request {name:?} on pod {ns}/{}: {why}",
            pod.name
        ))
    };
    let Some(cr) = cr else {
        return refuse(format!("no CocoonCheckpoint {name:?} in namespace {ns:?}"));
    };
    if cr.uid != req.uid {
        return refuse(format!(
            "uid {:?} is not the checkpoint's ({:?})",
            req.uid, cr.uid
        ));
    }
    if cr.deleting {
        return refuse("the checkpoint is being deleted".into());
    }
    let restart = match cr.phase {
        Some(CheckpointPhase::Pending) => false,
        Some(CheckpointPhase::Saving | CheckpointPhase::Pushing) => true,
        Some(CheckpointPhase::Ready | CheckpointPhase::Failed) => return Verdict::Settled,
        None => return refuse("the checkpoint was not handed off (no phase)".into()),
    };
    if cr.node != pod.node {
        return refuse(format!(
            "the checkpoint names node {:?}, not this node",
            cr.node
        ));
    }
    let source_is_pod = match cr.source {
        Some(Source::Pod(p)) => p == pod.name,
        Some(Source::CocoonSet(set)) => {
            pod.controller_set == Some(set) && pod.name == pod_name_for_agent(set, 0)
        }
        None => false,
    };
    if !source_is_pod || cr.pod_name != pod.name {
        return refuse("this pod is not the checkpoint's source".into());
    }
    let vm = vm_name_for_pod(ns, pod.name);
    if pod.vm_name != Some(vm.as_str()) || cr.vm_name != vm || req.vm_name != vm {
        return refuse(format!("the VM named is not this pod's ({vm})"));
    }
    let Ok(artifact) = checkpoint_artifact(ns, name, cr.uid) else {
        return refuse("no artifact can be derived".into());
    };
    if !req.matches_checkpoint(ns, name, cr.uid)
        || cr.repository != artifact.repository
        || cr.tag != artifact.tag
    {
        return refuse(format!(
            "repository {}:{} is not the derived {artifact}",
            req.repository, req.tag
        ));
    }
    Verdict::Take {
        vm,
        artifact,
        restart,
    }
}

/// Right before the manifest put: the checkpoint read again must still be the one taken
/// (same UID, not being deleted, `Pushing`); else the tag is never written.
pub(crate) fn may_put_manifest(uid: &str, cr: Option<&CheckpointFacts<'_>>) -> Result<(), String> {
    match cr {
        None => Err("the checkpoint is gone".into()),
        Some(c) if c.uid != uid => Err("the checkpoint was re-created".into()),
        Some(c) if c.deleting => Err("the checkpoint is being deleted".into()),
        Some(c) if c.phase != Some(CheckpointPhase::Pushing) => Err(format!(
            "the checkpoint is {}, not Pushing",
            c.phase.map_or("without a phase", CheckpointPhase::as_str)
        )),
        Some(_) => Ok(()),
    }
}
