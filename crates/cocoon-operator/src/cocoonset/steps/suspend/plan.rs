//! The planner of step 6 (suspend), on the rules of [`super::rules`].

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cocoon_api::contract::events::{self as ev, operator as reasons};
use cocoon_api::contract::{
    AnnotationCodec, HibernatedOnNode, ReclaimRecord, SuspendingSince, annotations as ann,
    bool_delta, tags,
};
use cocoon_api::crd::set::{CocoonSetPhase, HibernatePolicy};
use cocoon_api::naming::Role;
use kube::ResourceExt;

use super::rules::{self, Deadline, GateItem};
use crate::cocoonset::pods;
use crate::cocoonset::shared::create::{self, Protocol};
use crate::cocoonset::shared::stash::stash_names;
use crate::cocoonset::steps::{
    Answers, Counter, Created, Effect, Next, Note, Observed, Read, StepPlan, Write, effects,
};

/// The step's name in a registry error.
pub const STEP: &str = "suspend";
/// The gate's probes, in a registry error.
pub const GATE: &str = "suspend gate";

/// Step 6 on what the pass observed and the step's answers so far. `now` is fixed for the
/// pass, so the deadline decided before the record write is the one that goes out after.
pub fn plan(o: &Observed<'_>, answers: &Answers, now: DateTime<Utc>) -> StepPlan {
    if !o.cs.spec.suspend {
        return StepPlan::proceed();
    }
    let release = o.cs.spec.hibernate_policy == HibernatePolicy::Release;
    if release {
        // 6B.1: nothing live to snapshot (a set suspended before its first boot has no
        // snapshot, and needs none).
        if !rules::release_has_live_pod(o.classified) {
            return StepPlan::then(
                vec![
                    clear_suspending_since(o),
                    Write::Phase(Some(CocoonSetPhase::Suspended)),
                ],
                Next::AwaitChange,
            );
        }
    } else if o.classified.main.is_none() {
        return create_main(o, answers);
    }
    let phase = o.cs.status.as_ref().and_then(|s| s.phase);
    let deadline = rules::suspend_deadline(
        phase,
        SuspendingSince::from_meta(&o.cs.metadata),
        now,
        o.timing.suspend_deadline,
    );
    // 6A.2: the record first (durable), then the hibernate annotations, all at once. A pass
    // that asks for hibernates while (re-)entering Suspending writes `suspending-since` in
    // the same patch as the record: the deadline starts before any hibernate.
    let record = ReclaimRecord::from_meta(&o.cs.metadata);
    let next = rules::record_for_suspend(&record, o.classified);
    let mut delta = next.delta(o.cs.annotations());
    let targets = rules::hibernate_targets(o.classified);
    if !targets.is_empty() {
        if let Deadline::Restart(stamp) = deadline {
            delta.extend(stamp.desired());
        }
        let asked = bool_delta(ann::HIBERNATE, true);
        let record = Write::SetAnnotations(delta);
        if deadline == Deadline::Exceeded {
            // Past the deadline the gate still decides this pass: ask, then plan again.
            let mark = Write::MarkPods {
                names: targets,
                delta: asked,
            };
            return StepPlan::read(vec![record, mark], Vec::new());
        }
        // A pod asked now cannot pass the gate on this pass: Suspending goes out with the
        // annotations, which nothing orders against it.
        let mark = Write::MarkPodsWithPhase {
            names: targets,
            delta: asked,
            phase: CocoonSetPhase::Suspending,
        };
        return StepPlan::requeue(vec![record, mark], o.timing.suspend_poll);
    }
    let mut writes = effects![Write::SetAnnotations(delta)];
    // 6A.3: no probe while a pod is still incomplete; then all go out together.
    let mut probes = Vec::new();
    let mut incomplete = false;
    for pod in o.classified.all_by_name.values() {
        match rules::gate_item(pod, o.generation()) {
            GateItem::Skip => {}
            GateItem::Incomplete => {
                incomplete = true;
                break;
            }
            GateItem::Probe(vm) => probes.push(vm),
        }
    }
    let complete = if incomplete {
        false
    } else if probes.is_empty() {
        true
    } else {
        match &answers.probed {
            None => {
                return StepPlan::read_of(
                    writes,
                    vec![Read::Probe {
                        vms: probes,
                        tag: tags::HIBERNATE,
                        fail: None,
                    }],
                );
            }
            Some(p) => p.all_exist(),
        }
    };
    if !complete {
        let probe_error = answers.probed.as_ref().and_then(|p| p.error.clone());
        writes.extend(not_complete(o, deadline, probe_error));
        let next = Next::RequeueAfter(o.timing.suspend_poll);
        return StepPlan::of(writes, next);
    }
    writes.push(clear_suspending_since(o).into());
    if release {
        writes.extend(release_seats(o));
        return StepPlan::of(writes, Next::RequeueAfter(o.timing.suspend_poll));
    }
    writes.push(Write::Phase(Some(CocoonSetPhase::Suspended)).into());
    StepPlan::of(writes, Next::AwaitChange)
}

fn clear_suspending_since(o: &Observed<'_>) -> Write {
    Write::SetAnnotations(SuspendingSince(None).delta(o.cs.annotations()))
}

/// 6A.1: a missing main is created with unconditional restore intent, so a main deleted
/// while suspended comes back from its snapshot (and hibernates again on the next pass).
fn create_main(o: &Observed<'_>, answers: &Answers) -> StepPlan {
    match answers.created.last() {
        Some(Created::Yes) => return StepPlan::requeue(Vec::new(), o.timing.requeue_after_write),
        Some(Created::AlreadyExists) => {
            return StepPlan::requeue(Vec::new(), o.timing.wait_for_main);
        }
        None => {}
    }
    let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
    // Created a moment ago and not in the cache yet: as if the post found it.
    if o.classified.pending_creates.contains_key(&pod.name_any()) {
        return StepPlan::requeue(Vec::new(), o.timing.wait_for_main);
    }
    let facts = create::facts(o, &pod, Role::Main, &BTreeSet::new(), true);
    match create::protocol(answers, pod, facts, STEP) {
        Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
        Protocol::Decided {
            pod, mut writes, ..
        } => {
            writes.push(Write::PostPod(pod).into());
            StepPlan::read_of(writes, Vec::new())
        }
    }
}

/// 6C on a pass whose gate is not complete, with the deadline decided before the record
/// write (a restart's stamp may have gone out with it; writing it again is then no call).
/// A probe error fails the pass after the status, so the registry gets backoff; the
/// deadline still counts it.
fn not_complete(o: &Observed<'_>, deadline: Deadline, probe_error: Option<String>) -> Vec<Effect> {
    let mut writes: Vec<Effect> = Vec::new();
    match deadline {
        Deadline::Restart(stamp) => writes.push(Write::SetAnnotations(stamp.desired()).into()),
        Deadline::Running => {}
        Deadline::Exceeded => {
            let msg =
                ev::suspend_timed_out_message(o.timing.suspend_deadline, probe_error.as_deref());
            writes.push(
                Note::Log {
                    warn: true,
                    message: format!("suspend timed out: {msg}"),
                }
                .into(),
            );
            writes.push(
                Note::Event {
                    warning: true,
                    reason: reasons::SUSPEND_TIMED_OUT,
                    message: msg,
                }
                .into(),
            );
            writes.push(Write::Phase(Some(CocoonSetPhase::Failed)).into());
            return writes;
        }
    }
    let desired = (
        o.cs.spec.desired_agents(),
        i32::try_from(o.cs.spec.toolboxes.len()).unwrap_or(i32::MAX),
    );
    if !rules::suspending_reported(o.cs.status.as_ref(), o.generation(), desired) {
        writes.push(Write::Phase(Some(CocoonSetPhase::Suspending)).into());
    }
    if probe_error.is_some() {
        writes.push(Write::FailProbe { step: GATE }.into());
    }
    writes
}

/// 6B.3: free the seats once every snapshot is in the registry: the VM names and the main's
/// node first, then each pod flagged keep-snapshot-on-delete (best effort: a missing flag
/// costs the wake a registry pull, while blocking the delete would keep the seat the policy
/// exists to free) and deleted, then Suspended.
fn release_seats(o: &Observed<'_>) -> Vec<Effect> {
    let mut writes = effects![Write::SetAnnotations(
        stash_names(o.cs, o.classified.all_by_name.values()).delta(o.cs.annotations()),
    )];
    if let Some(node) = o
        .classified
        .main
        .as_ref()
        .map(|m| pods::bound_node(m).to_string())
        .filter(|n| !n.is_empty())
    {
        writes.push(Write::SetAnnotations(HibernatedOnNode(node).delta(o.cs.annotations())).into());
    }
    for name in rules::release_victims(o.classified) {
        writes.push(
            Write::FlagPod {
                name: name.clone(),
                delta: bool_delta(ann::KEEP_SNAPSHOT_ON_DELETE, true),
            }
            .into(),
        );
        writes.push(Write::DeletePod(name.clone()).into());
        writes.push(Note::Count(Counter::SlotReleasePodsDeleted).into());
        writes.push(
            crate::cocoonset::steps::log(format!("released the seat of hibernated pod {name}"))
                .into(),
        );
    }
    writes.push(Write::Phase(Some(CocoonSetPhase::Suspended)).into());
    writes
}
