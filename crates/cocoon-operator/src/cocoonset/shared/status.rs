//! The status rules of `cocoonset.md` §9, shared by the steps that write a status (7, 9, 11,
//! 14), the executor's status writes and the controller's memory: the status built from the
//! classification, the patch rule (an unchanged status is no write; a status this controller
//! just wrote is not written again while the cache has not caught up), and the entry changes
//! held back while the set waits (issue #20, [`held`]).

use std::collections::BTreeSet;

use cocoon_api::contract::{AnnotationCodec, ConnType, VmRuntime, VmSpec, annotations as ann};
use cocoon_api::crd::set::{
    AgentStatus, CocoonSet, CocoonSetPhase, CocoonSetStatus, ToolboxStatus,
};
use cocoon_api::naming::Role;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::cocoonset::pods::{self, Classified};
use crate::cocoonset::steps::Observed;
use crate::conditions::{NewCondition, set_condition};

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// §9: the status from the step-4 classification. `phase` is the explicit phase of a step,
/// if any; conditions are merged into the previous ones (timestamps kept unless they flip).
pub fn build_status(
    cs: &CocoonSet,
    c: &Classified,
    phase: Option<CocoonSetPhase>,
    now: Timestamp,
) -> CocoonSetStatus {
    let generation = cs.metadata.generation.unwrap_or(0);
    let desired_agents = cs.spec.desired_agents();
    let desired_toolboxes = count(cs.spec.toolboxes.len());
    let main_vm = c.main.as_ref().map(|p| pods::vm_name(p).to_string());
    let mut agents = Vec::new();
    let mut ready = 0;
    let entry = |slot: i32, role: Role, p: &Pod, forked: &str| {
        let rt = VmRuntime::from_meta(&p.metadata);
        AgentStatus {
            slot,
            role: role.as_str().to_string(),
            pod_name: p.name_any(),
            vm_name: pods::vm_name(p).to_string(),
            vm_id: rt.id,
            ip: rt.ip,
            phase: pods::pod_phase(p).to_string(),
            forked_from: forked.to_string(),
        }
    };
    if let Some(m) = &c.main {
        ready += i32::from(pods::is_ready(m));
        agents.push(entry(0, Role::Main, m, ""));
    }
    for (slot, p) in &c.sub {
        ready += i32::from(pods::is_ready(p));
        agents.push(entry(
            *slot,
            Role::SubAgent,
            p,
            main_vm.as_deref().unwrap_or(""),
        ));
    }
    let mut toolboxes = Vec::new();
    let mut tb_ready = 0;
    for (name, p) in &c.toolbox {
        tb_ready += i32::from(pods::is_ready(p));
        let rt = VmRuntime::from_meta(&p.metadata);
        let spec = VmSpec::from_meta(&p.metadata);
        let explicit = p
            .annotations()
            .get(ann::CONN_TYPE)
            .and_then(|v| ConnType::from_wire(v));
        toolboxes.push(ToolboxStatus {
            name: name.clone(),
            pod_name: p.name_any(),
            vm_name: pods::vm_name(p).to_string(),
            vm_id: rt.id,
            ip: rt.ip,
            phase: pods::pod_phase(p).to_string(),
            conn_type: ConnType::infer(explicit, rt.vnc_port, spec.effective_os())
                .as_str()
                .to_string(),
            vnc_port: rt.vnc_port,
        });
    }
    let phase = phase.unwrap_or(if c.main.is_none() {
        CocoonSetPhase::Pending
    } else if ready < desired_agents || tb_ready < desired_toolboxes {
        CocoonSetPhase::Scaling
    } else {
        CocoonSetPhase::Running
    });
    let all_ready = ready == desired_agents && desired_agents > 0 && tb_ready == desired_toolboxes;
    let message = format!(
        "{ready}/{desired_agents} agents ready, {tb_ready}/{desired_toolboxes} toolboxes ready"
    );
    let progressing = matches!(phase, CocoonSetPhase::Pending | CocoonSetPhase::Scaling);
    let mut conditions = cs
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    set_condition(
        &mut conditions,
        NewCondition {
            type_: "Ready",
            status: if all_ready { "True" } else { "False" },
            reason: if all_ready {
                "AllAgentsReady"
            } else {
                "AgentsNotReady"
            },
            message,
            observed_generation: generation,
        },
        now,
        false,
    );
    set_condition(
        &mut conditions,
        NewCondition {
            type_: "Progressing",
            status: if progressing { "True" } else { "False" },
            reason: if progressing { "Reconciling" } else { "Stable" },
            message: phase.as_str().to_string(),
            observed_generation: generation,
        },
        now,
        false,
    );
    CocoonSetStatus {
        observed_generation: generation,
        phase: Some(phase),
        ready_agents: ready,
        desired_agents,
        replicas: count(c.sub.len()),
        ready_toolboxes: tb_ready,
        desired_toolboxes,
        agents,
        toolboxes,
        // Carried over: the idle step (issue 39) computes it.
        idle: cs.status.as_ref().and_then(|s| s.idle.clone()),
        conditions,
    }
}

/// Whether `status` differs from the set's only in what [`progress_only`] holds back,
/// on the pass's classification: such a status is not written (steps 11 and 14).
pub fn held(o: &Observed<'_>, status: &CocoonSetStatus) -> bool {
    let not_ready: BTreeSet<&str> = o
        .classified
        .all_by_name
        .iter()
        .filter(|(_, pod)| !pods::is_ready(pod))
        .map(|(name, _)| name.as_str())
        .collect();
    o.cs.status.as_ref() != Some(status) && progress_only(o.cs.status.as_ref(), status, &not_ready)
}

/// The status to write, or `None` when it equals the current one (no API call).
pub fn status_patch(cs: &CocoonSet, new: CocoonSetStatus) -> Option<CocoonSetStatus> {
    let current = cs.status.clone().unwrap_or_default();
    (current != new).then_some(new)
}

/// A departure from §9's patch rule (issue #20): while the set is `Pending` or `Scaling`
/// at this generation, a new status that keeps the phase, the generation, every ready and
/// desired count and the conditions' statuses and reasons is not written for what else
/// moved in the entries of pods that are not ready (`not_ready`, by pod name): their VM id,
/// IP or pod phase (and the Ready condition's message, which only repeats the counts). The
/// entry of a ready pod is always written as it changes; a not-ready pod's entry goes out
/// with its readiness change, or with the phase that ends the wait (`Running`): a resume of
/// a set of four pods made a write for each pod's VM id and another for its readiness.
pub fn progress_only(
    current: Option<&CocoonSetStatus>,
    new: &CocoonSetStatus,
    not_ready: &BTreeSet<&str>,
) -> bool {
    use cocoon_api::crd::set::CocoonSetPhase::{Pending, Scaling};
    let Some(cur) = current else {
        return false;
    };
    let waiting = matches!(cur.phase, Some(Pending | Scaling));
    let conditions = |s: &CocoonSetStatus| {
        s.conditions
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.observed_generation,
                )
            })
            .collect::<Vec<_>>()
    };
    waiting
        && cur.phase == new.phase
        && cur.observed_generation == new.observed_generation
        && (
            cur.ready_agents,
            cur.desired_agents,
            cur.replicas,
            cur.ready_toolboxes,
            cur.desired_toolboxes,
        ) == (
            new.ready_agents,
            new.desired_agents,
            new.replicas,
            new.ready_toolboxes,
            new.desired_toolboxes,
        )
        && cur.agents.len() == new.agents.len()
        && cur.toolboxes.len() == new.toolboxes.len()
        && conditions(cur) == conditions(new)
        && cur.agents.iter().zip(&new.agents).all(|(a, b)| {
            a == b || (a.pod_name == b.pod_name && not_ready.contains(b.pod_name.as_str()))
        })
        && cur.toolboxes.iter().zip(&new.toolboxes).all(|(a, b)| {
            a == b || (a.pod_name == b.pod_name && not_ready.contains(b.pod_name.as_str()))
        })
}

/// Step 14's patch is skipped when `status` is exactly what this controller last wrote and
/// the cache still shows a version of the set from up to that write (`last`: the versions
/// the controller saw or produced until then, and the status): the cache has not caught up
/// with the write yet. A change by anyone else moves the version past them, and the status
/// is then compared afresh.
pub fn status_already_written(
    last: Option<&(Vec<String>, CocoonSetStatus)>,
    cached: &str,
    status: &CocoonSetStatus,
) -> bool {
    last.is_some_and(|(seen, written)| seen.iter().any(|v| v == cached) && written == status)
}

/// How many versions [`versions_seen`] keeps: a cache is never that many of this
/// controller's own writes behind.
pub const VERSIONS_KEPT: usize = 32;

/// The versions known after a status write: those known before it, then this pass's (the
/// one it started from, those its patches produced, the write's own), at most
/// [`VERSIONS_KEPT`] of the latest.
pub fn versions_seen(before: Option<Vec<String>>, pass: &[String]) -> Vec<String> {
    let mut seen = before.unwrap_or_default();
    for v in pass {
        if !seen.contains(v) {
            seen.push(v.clone());
        }
    }
    let extra = seen.len().saturating_sub(VERSIONS_KEPT);
    seen.drain(..extra);
    seen
}
