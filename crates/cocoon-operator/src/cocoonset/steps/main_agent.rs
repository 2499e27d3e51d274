//! Seed step 11 — the main agent (slot 0).
//!
//! A main that drifted from the spec takes the rebuild budget (§6). A main that is not Ready
//! ends the pass with `Phase=Pending` and a requeue in 5 s — or keeps `Failed` while a set
//! coming back from Failed waits for its main, so step 7 sees Failed → Ready and announces
//! `RecoveredFromFailure` (vk-cocoon writes lifecycle `ready` before the Ready condition, and a
//! pass between the two would otherwise swallow the recovery). A missing main is created
//! through the create protocol (§7), restore-marked when a CocoonHibernation holds its
//! snapshot or step 10 owes it a restore — unless its budget is spent at this generation:
//! then the set reports Failed until the spec changes (SubAgentDeadLetter announced it).

use chrono::{DateTime, Utc};
use cocoon_api::contract::events as ev;
use cocoon_api::crd::set::CocoonSetPhase;
use cocoon_api::naming::{self, Role};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{Answers, Created, Effect, Next, Note, Observed, Read, StepPlan, Write};
use crate::cocoonset::pods;
use crate::cocoonset::shared::checkpoint::{self, Gate};
use crate::cocoonset::shared::create::{self, Protocol, rules::cr_restorable};
use crate::cocoonset::shared::status::{build_status, held};
use crate::cocoonset::shared::triage::{self, rules::Triage};
use crate::conditions::{NewCondition, set_condition};

/// The step's name in a registry error.
pub const STEP: &str = "main agent";

/// The step's plan on the pass's view and the step's answers so far (the CocoonHibernation
/// list from the cache and the manifest read of a main to create, the create's outcome).
pub fn plan(
    o: &Observed<'_>,
    answers: &Answers,
    now: DateTime<Utc>,
    status_time: Timestamp,
) -> StepPlan {
    let t = o.timing;
    let status = |phase| Write::Status(build_status(o.cs, o.classified, Some(phase), status_time));
    let Some(main) = &o.classified.main else {
        // 11.2: the create's outcome decides the requeue: a main that already exists (the
        // old one still terminating) is waited for.
        match answers.created.last() {
            Some(Created::Yes) => return StepPlan::requeue(Vec::new(), t.requeue_after_write),
            Some(Created::AlreadyExists) => return StepPlan::requeue(Vec::new(), t.wait_for_main),
            None => {}
        }
        let name = naming::pod_name_for_agent(&o.cs.name_any(), 0);
        let Some(writes) = triage::may_recreate(o, &name) else {
            return StepPlan::then(vec![status(CocoonSetPhase::Failed)], Next::AwaitChange);
        };
        // Created a moment ago and not in the cache yet: as if the post found it.
        if o.classified.pending_creates.contains_key(&name) {
            return StepPlan::requeue(writes, t.wait_for_main);
        }
        let mut writes: Vec<Effect> = writes.into_iter().map(Effect::from).collect();
        let Some(crs) = &answers.cached_hibernations else {
            return StepPlan::read(Vec::new(), vec![Read::CachedHibernations]);
        };
        let pod = pods::build_agent_pod(o.cs, o.ns, 0, "", None);
        let facts = create::facts(o, &pod, Role::Main, &cr_restorable(crs), false);
        return match create::protocol(answers, pod, facts, STEP) {
            Protocol::Read(read) => StepPlan::read(Vec::new(), vec![read]),
            Protocol::Decided {
                mut pod, writes: w, ..
            } => {
                // `spec.agent.fromCheckpoint`: a fresh main starts from the checkpoint once
                // it is Ready; a restore-marked one wakes from its own tag.
                if let Some(from) = o.cs.spec.agent.from_checkpoint.as_deref()
                    && !pods::is_restore_marked(&pod)
                {
                    let Some(found) = &answers.checkpoint else {
                        return StepPlan::read(
                            Vec::new(),
                            vec![Read::CachedCheckpoint(from.into())],
                        );
                    };
                    match checkpoint::gate(o.ns, from, found.as_ref()) {
                        Gate::Start => pods::mark_from_checkpoint(&mut pod, from),
                        Gate::Wait { reason, message } => {
                            writes.extend(checkpoint_wait(o, reason, message, status_time));
                            return StepPlan::of(writes, Next::AwaitChange);
                        }
                    }
                }
                writes.extend(w);
                writes.push(Write::PostPod(pod).into());
                StepPlan::read_of(writes, Vec::new())
            }
        };
    };
    let mut writes: Vec<Effect> = Vec::new();
    if pods::agent_drift(o.cs, o.ns, 0, main).is_some() {
        let triaged = triage::existing(o, main, Some(ev::REASON_SPEC_DRIFTED.to_string()), now);
        match triaged.decision {
            Triage::ResetAndDelete | Triage::Rebuild { .. } => {
                return StepPlan::of(triaged.writes, Next::RequeueAfter(t.requeue_after_write));
            }
            Triage::Wait(d) => return StepPlan::of(triaged.writes, Next::RequeueAfter(d)),
            Triage::Leave { .. } | Triage::DeadLetter { .. } => writes = triaged.writes,
        }
    }
    if !pods::is_ready(main) {
        let recovering = o.cs.status.as_ref().and_then(|s| s.phase) == Some(CocoonSetPhase::Failed);
        let phase = if recovering {
            CocoonSetPhase::Failed
        } else {
            CocoonSetPhase::Pending
        };
        let new = build_status(o.cs, o.classified, Some(phase), status_time);
        // While Pending, a main (or any pod) coming up moves its entry more often than the
        // counts move: that is held back as in step 14.
        if !held(o, &new) {
            writes.push(Write::Status(new).into());
        }
        return StepPlan::of(writes, Next::RequeueAfter(t.wait_for_main));
    }
    StepPlan::of(writes, Next::Continue)
}

/// The writes of a main waiting for its checkpoint: `Pending` with `Ready=False` saying why
/// (the reason of the gate, the message naming `spec.agent.fromCheckpoint`), and the Warning
/// Event of that reason when the set does not say so yet.
fn checkpoint_wait(
    o: &Observed<'_>,
    reason: &'static str,
    message: String,
    now: Timestamp,
) -> Vec<Effect> {
    let mut status = build_status(o.cs, o.classified, Some(CocoonSetPhase::Pending), now);
    set_condition(
        &mut status.conditions,
        NewCondition {
            type_: "Ready",
            status: "False",
            reason,
            message: message.clone(),
            observed_generation: o.generation(),
        },
        now,
        false,
    );
    let mut effects = Vec::new();
    if checkpoint::announce(o.cs, reason) {
        effects.push(
            Note::Event {
                warning: true,
                reason,
                message,
            }
            .into(),
        );
    }
    if o.cs.status.as_ref() != Some(&status) {
        effects.push(Write::Status(status).into());
    }
    effects
}
