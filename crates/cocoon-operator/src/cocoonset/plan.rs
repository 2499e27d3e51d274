//! Pure decisions of the CocoonSet loop: triage and the rebuild budget (`cocoonset.md` §6), the
//! create protocol and snapshot image rule (§7), the failed-state step (7), status (§9), teardown GC.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{
    AnnotationCodec, ConnType, DeadLetter, DeleteVmNames, RebuildEntry, RebuildHistory,
    ReclaimRecord, VmRuntime, VmSpec, annotations as ann,
};
use cocoon_api::crd::set::{
    AgentStatus, CocoonSet, CocoonSetPhase, CocoonSetStatus, ToolboxStatus,
};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::Value;

use super::pods::{self, Classified};
use crate::conditions::{NewCondition, set_condition};

/// Extra field of a rebuild-history entry (ignored by the Go operator): the generation at
/// which the entry's pod was dead-lettered, so a pod that then vanished is not recreated
/// until the spec changes (§6 "budget exhausted for a missing pod").
pub const EXHAUSTED_FIELD: &str = "exhaustedAt";

/// The loop's intervals and budget; tests may shrink them.
#[derive(Debug, Clone)]
pub struct Timing {
    /// After a pass that changed something.
    pub requeue_after_write: Duration,
    /// Waiting for the main to exist or become Ready, and for owned pods to go at teardown.
    pub wait_for_main: Duration,
    /// Rebuild backoff by prior rebuild count (the last entry repeats).
    pub rebuild_backoff: Vec<Duration>,
    /// Rebuilds before dead-letter.
    pub rebuild_budget: u32,
    /// Sub-agent creates in flight at once.
    pub create_fanout: usize,
    /// Polling while Suspending / Suspended (step 6).
    pub suspend_poll: Duration,
    /// Polling of the migration and the release wake (steps 8 and 9).
    pub migrate_poll: Duration,
    /// How long a set may stay Suspending before it reports Failed (6C).
    pub suspend_deadline: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            requeue_after_write: Duration::from_secs(1),
            wait_for_main: Duration::from_secs(5),
            rebuild_backoff: vec![
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(30),
            ],
            rebuild_budget: 4,
            create_fanout: 8,
            suspend_poll: Duration::from_secs(5),
            migrate_poll: Duration::from_secs(5),
            suspend_deadline: Duration::from_secs(180),
        }
    }
}

impl Timing {
    /// The backoff owed after `count` prior rebuilds.
    pub fn backoff(&self, count: i64) -> Duration {
        let i = usize::try_from(count.max(0)).unwrap_or(usize::MAX);
        self.rebuild_backoff
            .get(i)
            .or(self.rebuild_backoff.last())
            .copied()
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// §6 triage
// ---------------------------------------------------------------------------------------------

/// The triage reason of a pod: `terminal (...)` when terminal and terminal counts, else
/// `spec drifted` when drifted, else none (leave it alone).
pub fn rebuild_reason(pod: &Pod, terminal_counts: bool, drifted: bool) -> Option<String> {
    if terminal_counts && pods::is_terminal(pod) {
        Some(ev::reason_terminal(
            pods::pod_phase(pod),
            pods::lifecycle_state_str(pod),
        ))
    } else if drifted {
        Some(ev::REASON_SPEC_DRIFTED.to_string())
    } else {
        None
    }
}

/// What triage does with one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Triage {
    /// Healthy, or dead-lettered at this generation: leave it.
    Leave { dead_lettered: bool },
    /// Dead-lettered at an older generation: reset its history entry and delete it.
    ResetAndDelete,
    /// Budget spent: mark dead-letter at this generation (no change counted).
    DeadLetter { reason: String },
    /// Backoff still running.
    Wait(Duration),
    /// Persist `attempt` to the history, then delete.
    Rebuild { attempt: i64, reason: String },
}

/// §6 for one existing pod.
pub fn triage(
    reason: Option<String>,
    dead_letter: DeadLetter,
    entry: Option<&RebuildEntry>,
    generation: i64,
    now: DateTime<Utc>,
    timing: &Timing,
) -> Triage {
    let Some(reason) = reason else {
        return Triage::Leave {
            dead_lettered: false,
        };
    };
    if dead_letter.is_marked() {
        return if dead_letter.is_dead_at(generation) {
            Triage::Leave {
                dead_lettered: true,
            }
        } else {
            Triage::ResetAndDelete
        };
    }
    let count = entry.map_or(0, |e| e.count);
    if count >= i64::from(timing.rebuild_budget) {
        return Triage::DeadLetter { reason };
    }
    let backoff = timing.backoff(count);
    if let Some(last) = entry.and_then(|e| e.last_deleted) {
        let elapsed = now
            .signed_duration_since(last)
            .to_std()
            .unwrap_or(Duration::ZERO);
        if backoff > elapsed {
            return Triage::Wait(backoff - elapsed);
        }
    }
    Triage::Rebuild {
        attempt: count + 1,
        reason,
    }
}

/// Whether a missing pod's budget was spent at this generation (do not recreate).
pub fn exhausted(history: &RebuildHistory, pod: &str, generation: i64) -> bool {
    history
        .get(pod)
        .and_then(|e| e.extra.get(EXHAUSTED_FIELD))
        .and_then(Value::as_i64)
        == Some(generation)
}

/// Whether a missing pod carries an exhaustion mark of an older generation: the spec has
/// changed since, so its entry is reset before it is recreated with a fresh budget.
pub fn exhausted_earlier(history: &RebuildHistory, pod: &str, generation: i64) -> bool {
    history
        .get(pod)
        .and_then(|e| e.extra.get(EXHAUSTED_FIELD))
        .and_then(Value::as_i64)
        .is_some_and(|g| g != generation)
}

/// Marks `pod`'s entry exhausted at `generation`.
pub fn mark_exhausted(history: &mut RebuildHistory, pod: &str, generation: i64) {
    history
        .0
        .entry(pod.to_string())
        .or_default()
        .extra
        .insert(EXHAUSTED_FIELD.into(), Value::from(generation));
}

/// The pod names whose history entries survive GC (§6.4).
pub fn desired_names(cs: &CocoonSet) -> std::collections::BTreeSet<String> {
    naming::desired_pod_names(
        &cs.name_any(),
        cs.spec.agent.replicas,
        cs.spec.toolboxes.iter().map(|t| t.name.as_str()),
    )
}

// ---------------------------------------------------------------------------------------------
// §7 create protocol
// ---------------------------------------------------------------------------------------------

/// The answer of the `:hibernate` manifest read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagRead {
    /// Static toolboxes have no VM and skip the registry.
    Skipped,
    Absent,
    /// Present, with the recorded base image (empty when none was recorded).
    Present {
        base_image: String,
    },
}

/// Facts about the VM about to be created.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateFacts<'a> {
    pub role: Role,
    pub image: &'a str,
    pub tag: TagRead,
    /// The VM is in the record's `vms`.
    pub recorded: bool,
    /// The VM is in the record's `restore`.
    pub owed_restore: bool,
    /// A Hibernated/Waking CocoonHibernation names the pod.
    pub cr_restorable: bool,
    /// Step 6A.1 (and the migration/wake recreates): restore whenever the tag exists.
    pub unconditional_intent: bool,
}

/// What to do before and at the create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreatePlan {
    /// Delete `<vm>:hibernate` first (an error fails the pass, nothing is created).
    pub drop_tag: bool,
    /// Remove the VM from the record (`vms`, `restore`, `suspended`).
    pub forget: bool,
    /// Set `restore-from-hibernate=true` on the new pod.
    pub restore: bool,
}

/// §7 steps 2–4.
pub fn plan_create(f: &CreateFacts<'_>) -> CreatePlan {
    let base_image = match &f.tag {
        TagRead::Skipped | TagRead::Absent => return CreatePlan::default(),
        TagRead::Present { base_image } => base_image,
    };
    let fresh_after_drop = CreatePlan {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    // Snapshot image rule: the node agent refuses a pod over a tag from another image.
    if !base_image.is_empty() && base_image != f.image {
        return fresh_after_drop;
    }
    let intent = f.unconditional_intent || f.owed_restore || f.cr_restorable;
    if f.role == Role::SubAgent && !intent {
        if f.recorded {
            // Sub-agent pre-create drop: a fork-from pod is refused while the tag exists.
            return fresh_after_drop;
        }
        // Unspecified case (an unrecorded sub-agent VM with a tag): restore from it. The node
        // agent accepts a restore-marked pod, and the snapshot's state is not thrown away.
        return CreatePlan {
            restore: true,
            ..CreatePlan::default()
        };
    }
    CreatePlan {
        restore: intent,
        ..CreatePlan::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Step 7 failed state
// ---------------------------------------------------------------------------------------------

/// Step 7's verdict on the main.
#[derive(Debug, Clone, PartialEq)]
pub enum FailedStep {
    /// The main is absent, or healthy with nothing to announce.
    Continue,
    /// Terminal and drifted: the main takes the rebuild budget with this reason.
    Rebuild { reason: String },
    /// Terminal and matching the spec: report Failed.
    Fail(FailedReport),
    /// Ready again after Failed: announce and continue.
    Recovered { message: String },
}

/// How a failed main is reported.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedReport {
    pub reason: &'static str,
    pub message: String,
    /// Count `lifecycle_state_failed_observed{phase}` with this phase.
    pub lifecycle_metric_phase: Option<String>,
    /// Emit the event and count the metric: only on entering Failed, so a repeated pass over
    /// the same failure (the status patch brings one) does not announce it again.
    pub announce: bool,
}

/// Step 7.2–7.4.
pub fn failed_step(cs: &CocoonSet, ns: &str, main: Option<&Pod>, drifted: bool) -> FailedStep {
    let Some(main) = main else {
        return FailedStep::Continue;
    };
    let current = cs.status.as_ref().and_then(|s| s.phase);
    if pods::is_terminal(main) {
        if drifted {
            return FailedStep::Rebuild {
                reason: ev::reason_terminal(pods::pod_phase(main), pods::lifecycle_state_str(main)),
            };
        }
        return FailedStep::Fail(failed_report(cs, ns, main));
    }
    if current == Some(CocoonSetPhase::Failed) && pods::is_ready(main) {
        return FailedStep::Recovered {
            message: ev::recovered_message(ns, &main.name_any()),
        };
    }
    FailedStep::Continue
}

/// The report of a terminal main (7.3).
pub fn failed_report(cs: &CocoonSet, ns: &str, main: &Pod) -> FailedReport {
    let current = cs.status.as_ref().and_then(|s| s.phase);
    let lc = pods::lifecycle(main);
    let lifecycle_failed = lc.is_failed();
    let msg = if lc.message.is_empty() {
        pods::pod_phase(main).to_string()
    } else {
        lc.message.clone()
    };
    FailedReport {
        reason: if lifecycle_failed {
            reasons::POD_LIFECYCLE_FAILED
        } else {
            reasons::MAIN_AGENT_FAILED
        },
        message: ev::main_pod_failed_message(ns, &main.name_any(), &msg),
        lifecycle_metric_phase: lifecycle_failed.then(|| {
            current
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| CocoonSetPhase::Pending.as_str().to_string())
        }),
        announce: current != Some(CocoonSetPhase::Failed),
    }
}

// ---------------------------------------------------------------------------------------------
// §9 status
// ---------------------------------------------------------------------------------------------

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
        ready_toolboxes: tb_ready,
        desired_toolboxes,
        agents,
        toolboxes,
        conditions,
    }
}

/// The status to write, or `None` when it equals the current one (no API call).
pub fn status_patch(cs: &CocoonSet, new: CocoonSetStatus) -> Option<CocoonSetStatus> {
    let current = cs.status.clone().unwrap_or_default();
    (current != new).then_some(new)
}

// ---------------------------------------------------------------------------------------------
// Step 2 teardown, and the stash of scale-down / toolbox removal
// ---------------------------------------------------------------------------------------------

/// The delete-vm-names union (step 2.2): the previous value, status VM names, the given
/// pods' VM names and the record's VMs.
pub fn stash_names<'a>(cs: &CocoonSet, pods: impl IntoIterator<Item = &'a Pod>) -> DeleteVmNames {
    let mut names = DeleteVmNames::from_meta(&cs.metadata);
    if let Some(s) = &cs.status {
        names.union(s.agents.iter().map(|a| a.vm_name.as_str()));
        names.union(s.toolboxes.iter().map(|t| t.vm_name.as_str()));
    }
    names.union(pods.into_iter().map(pods::vm_name));
    names.union(ReclaimRecord::from_meta(&cs.metadata).vms.iter());
    names
}

/// One VM of the registry GC: always drop `:hibernate`; drop `:latest` unless kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcItem {
    pub vm: String,
    pub drop_latest: bool,
}

/// Step 2.4 over the stash, in the annotation's order.
pub fn gc_plan(cs: &CocoonSet, ns: &str, names: &DeleteVmNames) -> Vec<GcItem> {
    let cs_name = cs.name_any();
    names
        .names()
        .map(|vm| GcItem {
            vm: vm.to_string(),
            drop_latest: !naming::should_keep_latest_tag(cs.spec.snapshot_policy, ns, &cs_name, vm),
        })
        .collect()
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

/// 8.6.2 and 9.1.2–9.1.3: a recreate has no snapshot to restore (no tag, or the image rule dropped it);
/// the hint is cleared and the normal flow boots the main fresh.
pub fn wake_boots_fresh(tag: &TagRead, plan: &CreatePlan) -> bool {
    !matches!(tag, TagRead::Present { .. }) || plan.drop_tag
}
