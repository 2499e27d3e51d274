//! The CocoonHibernation rules of `hibernation.md` as a pure function from what a pass observed
//! to the plan the shell applies: pod patches, status, events, registry work and the requeue.

use std::collections::BTreeMap;
use std::time::Duration;

use cocoon_api::contract::events::{self, operator as reasons};
use cocoon_api::contract::{
    AnnotationCodec, HibernateFlags, Lifecycle, LifecycleState, annotations as ann,
};
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationStatus, Desire, HibernationPhase,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{NewCondition, find, set_condition};

/// The `Ready` condition type, the only one this kind uses.
pub const READY: &str = "Ready";

/// Timing knobs; defaults as the spec gives them, shrinkable for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long `Hibernating` may last before `Failed` (3 min).
    pub hibernate_timeout: Duration,
    /// How long `Waking` may last before `Failed` (5 min).
    pub wake_timeout: Duration,
    /// Re-check interval while waiting (5 s).
    pub requeue: Duration,
    /// Requeue after adding the finalizer (1 s).
    pub finalizer_requeue: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            hibernate_timeout: Duration::from_secs(180),
            wake_timeout: Duration::from_secs(300),
            requeue: Duration::from_secs(5),
            finalizer_requeue: Duration::from_secs(1),
        }
    }
}

/// What the pass knows of the target pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// `spec.podRef.name` names no pod.
    Missing,
    /// The pod exists.
    Present(PodFacts),
}

/// The facts of a pod the rules read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `vm.cocoonstack.io/name`; empty when not yet written.
    pub vm_name: String,
    /// `vm.cocoonstack.io/hibernate` is `true`.
    pub hibernate_annotated: bool,
    /// The node agent's lifecycle triple.
    pub lifecycle: Lifecycle,
    /// `cocoonset.cocoonstack.io/generation` (0 when absent).
    pub generation_stamp: i64,
    /// `VMLive`: the container is running and `vm.cocoonstack.io/id` is set (the node clears
    /// the id on hibernate and at the start of a wake, so a present id is a fresh one), **and**
    /// the lifecycle is not `hibernating`. The node writes `hibernating` before it saves and
    /// clears the id only after the push, so in between the id is the one of a VM about to be
    /// removed while the tag may already be its only copy: a wake that reverses a hibernate
    /// mid-save must not count that VM as woken and drop the tag.
    pub vm_live: bool,
    /// `vm_name` is not the VM of `(CR namespace, spec.podRef.name)`: the ownership gate
    /// ([`crate::ownership::hibernation_owns`], asked by the shell) refused it, so the pass
    /// makes no registry call and touches no pod.
    pub foreign_vm: bool,
}

impl PodFacts {
    /// Reads the facts from a pod's annotations and its container state.
    pub fn from_pod(annotations: &BTreeMap<String, String>, container_running: bool) -> Self {
        let id = annotations
            .get(ann::VM_ID)
            .map(String::as_str)
            .unwrap_or("");
        let lifecycle = Lifecycle::from_annotations(annotations);
        let hibernating = lifecycle.state == Some(LifecycleState::Hibernating);
        PodFacts {
            vm_name: annotations.get(ann::VM_NAME).cloned().unwrap_or_default(),
            hibernate_annotated: HibernateFlags::from_annotations(annotations).hibernate,
            lifecycle,
            generation_stamp: cocoon_api::contract::GenerationStamp::from_annotations(annotations)
                .0,
            vm_live: container_running && !id.is_empty() && !hibernating,
            foreign_vm: false,
        }
    }

    /// The hibernate completion gate before the registry probe: the node reported
    /// `hibernated` at or after the pod's generation stamp.
    pub fn hibernate_reported(&self) -> bool {
        self.lifecycle.is_hibernated_at(self.generation_stamp)
    }
}

/// The outcome of the registry has-manifest probe of `<vm>:hibernate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The pass did not need to ask.
    NotAsked,
    Present,
    Absent,
    /// Transport, 5xx or auth failure (the text is returned as the pass's error).
    Failed(String),
}

/// Everything one pass observed.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub cr: &'a CocoonHibernation,
    pub pod: PodView,
    pub probe: Probe,
    /// The last phase exit announced for this CR's UID (the `observed` map).
    pub last_announced: Option<Announced>,
    pub now: Timestamp,
}

/// Which phase histogram an announcement feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseMetric {
    Hibernate,
    Wake,
}

/// An Event to emit on the CR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPlan {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Identity of an announced phase exit: the Ready `lastTransitionTime` and the phase left.
/// The API keeps that timestamp to the second, so two exits within one second (a quick
/// hibernate then wake) differ only by the phase; a repeat caused by cache lag matches both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    pub transition: Timestamp,
    pub phase: Option<HibernationPhase>,
}

/// A phase exit to announce: the Event, the histogram sample and the identity to remember.
#[derive(Debug, Clone, PartialEq)]
pub struct Announcement {
    pub event: EventPlan,
    /// `Some` when the current phase is `Hibernating` or `Waking`.
    pub metric: Option<(PhaseMetric, &'static str, f64)>,
    pub announced: Announced,
}

/// How the pass ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Nothing more to do until something changes.
    Done,
    /// Look again after this long.
    Requeue(Duration),
    /// Return this error so the controller logs it and retries with backoff.
    Error(String),
}

/// The plan of one pass, applied in field order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Add the finalizer (and stop: status is untouched on that pass).
    pub add_finalizer: bool,
    /// Emit before anything else (`RetryRequested`).
    pub retry_event: Option<EventPlan>,
    /// Set (`true`) or remove (`false`) the pod's hibernate annotation.
    pub set_hibernate: Option<bool>,
    /// Announce a phase exit before the status write.
    pub announce: Option<Announcement>,
    /// The new status, when it differs from the current one.
    pub status: Option<CocoonHibernationStatus>,
    /// Probe and delete `<vm>:hibernate` after the status write; a failure is the pass's error.
    pub drop_tag: Option<String>,
    /// `ForeignVMNameIgnored`: the pod names a VM that is not its own (emitted when the
    /// status first reports it, so once).
    pub foreign: Option<EventPlan>,
    pub finish: Finish,
}

impl Plan {
    fn new() -> Self {
        Plan {
            add_finalizer: false,
            retry_event: None,
            set_hibernate: None,
            announce: None,
            status: None,
            drop_tag: None,
            foreign: None,
            finish: Finish::Done,
        }
    }
}

/// The VM the registry must be asked about this pass, if any: only the hibernate path asks,
/// and only once the node reported `hibernated` for the current stamp.
pub fn probe_needed(cr: &CocoonHibernation, pod: &PodView) -> Option<String> {
    let PodView::Present(facts) = pod else {
        return None;
    };
    if facts.vm_name.is_empty() || facts.foreign_vm || cr.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let on_hibernate_path = match cr.spec.desire {
        Desire::Hibernate => phase(cr) != Some(HibernationPhase::Waking),
        Desire::Wake => phase(cr) == Some(HibernationPhase::Hibernating),
    };
    (on_hibernate_path && facts.hibernate_reported()).then(|| facts.vm_name.clone())
}

fn phase(cr: &CocoonHibernation) -> Option<HibernationPhase> {
    cr.status.as_ref().and_then(|s| s.phase)
}

/// Decides one reconcile pass of a live (not deleting) CR.
pub fn plan_pass(obs: &Observed<'_>, timing: &Timing, has_finalizer: bool) -> Plan {
    let mut plan = Plan::new();
    let cr = obs.cr;
    if !has_finalizer {
        plan.add_finalizer = true;
        plan.finish = Finish::Requeue(timing.finalizer_requeue);
        return plan;
    }
    let mut st = StatusWriter::new(cr, obs.now);
    if cr.spec.pod_ref.name.is_empty() {
        st.mark_failed("spec.podRef.name is required");
        plan.status = st.finish();
        return plan;
    }
    let ns = cr.metadata.namespace.as_deref().unwrap_or("");
    let pod_name = cr.spec.pod_ref.name.as_str();
    let facts = match &obs.pod {
        PodView::Missing => {
            st.mark_pending(format!("pod {ns}/{pod_name} not yet present"));
            plan.status = st.finish();
            plan.finish = Finish::Requeue(timing.requeue);
            return plan;
        }
        PodView::Present(f) if f.vm_name.is_empty() => {
            st.mark_pending(format!(
                "pod {ns}/{pod_name} has no {} annotation yet",
                ann::VM_NAME
            ));
            plan.status = st.finish();
            plan.finish = Finish::Requeue(timing.requeue);
            return plan;
        }
        PodView::Present(f) if f.foreign_vm => {
            // A decoy: the pod names another pod's VM. Nothing is probed, dropped or
            // annotated; the CR reports it.
            let message = events::foreign_vm_name_message(
                ann::VM_NAME,
                &f.vm_name,
                &format!("pod {ns}/{pod_name}"),
            );
            st.mark_failed(message.clone());
            plan.status = st.finish();
            if plan.status.is_some() {
                plan.foreign = Some(EventPlan {
                    warning: true,
                    reason: reasons::FOREIGN_VM_NAME_IGNORED,
                    message,
                });
            }
            return plan;
        }
        PodView::Present(f) => f,
    };
    let hibernate_path = match cr.spec.desire {
        Desire::Hibernate => st.phase() != Some(HibernationPhase::Waking),
        Desire::Wake => st.phase() == Some(HibernationPhase::Hibernating),
    };
    if hibernate_path {
        hibernate(obs, timing, facts, &mut st, &mut plan);
    } else {
        wake(obs, timing, facts, ns, pod_name, &mut st, &mut plan);
    }
    plan.status = st.finish();
    plan
}

fn retry_event(cr: &CocoonHibernation, st: &StatusWriter) -> Option<EventPlan> {
    (st.phase() == Some(HibernationPhase::Failed)).then(|| EventPlan {
        warning: false,
        reason: reasons::RETRY_REQUESTED,
        message: events::retry_requested_message(cr.spec.desire.as_str()),
    })
}

fn hibernate(
    obs: &Observed<'_>,
    timing: &Timing,
    facts: &PodFacts,
    st: &mut StatusWriter,
    plan: &mut Plan,
) {
    let vm = facts.vm_name.as_str();
    plan.retry_event = retry_event(obs.cr, st);
    if !facts.hibernate_annotated {
        plan.set_hibernate = Some(true);
    }
    if facts.hibernate_reported() && obs.probe == Probe::Present {
        if st.phase() != Some(HibernationPhase::Hibernated) {
            plan.announce = st.announce(
                obs.last_announced,
                EventPlan {
                    warning: false,
                    reason: reasons::HIBERNATED,
                    message: events::hibernation_hibernated_message(vm),
                },
                "ok",
            );
        }
        st.set_phase(HibernationPhase::Hibernated, vm);
        plan.finish = Finish::Done;
        return;
    }
    // Chosen: a settled Hibernated CR whose probe errored keeps its phase and returns the
    // error, so a registry blip does not move it (hibernation.md §4 step 4).
    if let Probe::Failed(err) = &obs.probe
        && st.phase() == Some(HibernationPhase::Hibernated)
    {
        plan.finish = Finish::Error(err.clone());
        return;
    }
    st.set_phase(HibernationPhase::Hibernating, vm);
    if st.deadline_exceeded(HibernationPhase::Hibernating, timing.hibernate_timeout) {
        plan.announce = st.announce(
            obs.last_announced,
            EventPlan {
                warning: true,
                reason: reasons::HIBERNATE_TIMED_OUT,
                message: events::hibernate_timed_out_message(vm, timing.hibernate_timeout),
            },
            "timeout",
        );
        st.mark_failed(format!(
            "hibernate not confirmed within {}",
            cocoon_api::contract::go_duration(timing.hibernate_timeout)
        ));
        plan.finish = Finish::Done;
        return;
    }
    plan.finish = match &obs.probe {
        Probe::Failed(err) => Finish::Error(err.clone()),
        _ => Finish::Requeue(timing.requeue),
    };
}

fn wake(
    obs: &Observed<'_>,
    timing: &Timing,
    facts: &PodFacts,
    ns: &str,
    pod_name: &str,
    st: &mut StatusWriter,
    plan: &mut Plan,
) {
    let vm = facts.vm_name.as_str();
    let settled = st.phase() == Some(HibernationPhase::Active)
        && st.observed_generation() == obs.cr.metadata.generation.unwrap_or(0);
    if settled && facts.hibernate_annotated {
        // Someone else (a CocoonSet suspend) owns the annotation now.
        plan.finish = Finish::Done;
        return;
    }
    if !settled {
        plan.retry_event = retry_event(obs.cr, st);
        if facts.hibernate_annotated {
            plan.set_hibernate = Some(false);
        }
    }
    if facts.vm_live {
        if !settled {
            plan.announce = st.announce(
                obs.last_announced,
                EventPlan {
                    warning: false,
                    reason: reasons::WOKEN_ACTIVE,
                    message: events::woken_active_message(ns, pod_name),
                },
                "ok",
            );
            st.set_phase(HibernationPhase::Active, vm);
        }
        plan.drop_tag = Some(vm.to_string());
        plan.finish = Finish::Done;
        return;
    }
    if settled {
        plan.finish = Finish::Done;
        return;
    }
    if st.deadline_exceeded(HibernationPhase::Waking, timing.wake_timeout) {
        plan.announce = st.announce(
            obs.last_announced,
            EventPlan {
                warning: true,
                reason: reasons::WAKE_TIMED_OUT,
                message: events::wake_timed_out_message(timing.wake_timeout),
            },
            "timeout",
        );
        st.mark_failed(format!(
            "wake timed out after {}; vk-cocoon never reported the container running",
            cocoon_api::contract::go_duration(timing.wake_timeout)
        ));
        plan.finish = Finish::Done;
        return;
    }
    st.set_phase(HibernationPhase::Waking, vm);
    plan.finish = Finish::Requeue(timing.requeue);
}

/// Status edits of one pass with the helpers of `hibernation.md` §2, on a working copy.
struct StatusWriter {
    original: CocoonHibernationStatus,
    status: CocoonHibernationStatus,
    generation: i64,
    now: Timestamp,
}

impl StatusWriter {
    fn new(cr: &CocoonHibernation, now: Timestamp) -> Self {
        let original = cr.status.clone().unwrap_or_default();
        // Condition timestamps are stored to the second; deciding with the same precision
        // keeps what this pass writes equal to what later passes read back.
        let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
        StatusWriter {
            status: original.clone(),
            original,
            generation: cr.metadata.generation.unwrap_or(0),
            now,
        }
    }

    fn phase(&self) -> Option<HibernationPhase> {
        self.status.phase
    }

    fn observed_generation(&self) -> i64 {
        self.status.observed_generation
    }

    fn ready(&self) -> Option<&Condition> {
        find(&self.status.conditions, READY)
    }

    fn set_ready(&mut self, status: &str, reason: &str, message: String, force: bool) {
        let new = NewCondition {
            type_: READY,
            status,
            reason,
            message,
            observed_generation: self.generation,
        };
        set_condition(&mut self.status.conditions, new, self.now, force);
    }

    /// `setPhase(phase, vm)`: no-op when phase, VM and generation already match.
    fn set_phase(&mut self, phase: HibernationPhase, vm: &str) {
        if self.status.phase == Some(phase)
            && self.status.vm_name == vm
            && self.status.observed_generation == self.generation
        {
            return;
        }
        let entering_deadline_phase = matches!(
            phase,
            HibernationPhase::Hibernating | HibernationPhase::Waking
        ) && self.status.phase != Some(phase);
        let (status, reason) = match phase {
            HibernationPhase::Hibernated | HibernationPhase::Active => ("True", "Done"),
            HibernationPhase::Failed => ("False", "Failed"),
            _ => ("False", "Pending"),
        };
        self.status.observed_generation = self.generation;
        self.status.phase = Some(phase);
        self.status.vm_name = vm.to_string();
        self.set_ready(
            status,
            reason,
            phase.as_str().to_string(),
            entering_deadline_phase,
        );
    }

    /// `markPending(msg)`: never demotes `Hibernated` or `Waking`.
    fn mark_pending(&mut self, msg: String) {
        if matches!(
            self.status.phase,
            Some(HibernationPhase::Hibernated | HibernationPhase::Waking)
        ) {
            return;
        }
        if self.status.phase == Some(HibernationPhase::Pending)
            && self.status.observed_generation == self.generation
            && self.ready().is_some_and(|c| c.message == msg)
        {
            return;
        }
        self.status.observed_generation = self.generation;
        self.status.phase = Some(HibernationPhase::Pending);
        self.set_ready("False", "Pending", msg, false);
    }

    /// `markFailed(msg)`.
    fn mark_failed(&mut self, msg: impl Into<String>) {
        self.status.observed_generation = self.generation;
        self.status.phase = Some(HibernationPhase::Failed);
        self.set_ready("False", "Failed", msg.into(), false);
    }

    /// `phaseDeadlineExceeded(phase, timeout)`.
    fn deadline_exceeded(&self, phase: HibernationPhase, timeout: Duration) -> bool {
        if self.status.phase != Some(phase) {
            return false;
        }
        let Some(ltt) = self.ready().map(|c| c.last_transition_time.0) else {
            return false;
        };
        if ltt.as_second() == 0 {
            return false;
        }
        self.now
            .duration_since(ltt)
            .as_secs_f64()
            .gt(&timeout.as_secs_f64())
    }

    /// `announcePhaseExit`: only for a Ready transition not announced before.
    fn announce(
        &self,
        last: Option<Announced>,
        event: EventPlan,
        result: &'static str,
    ) -> Option<Announcement> {
        let transition = self.ready().map(|c| c.last_transition_time.0)?;
        let this = Announced {
            transition,
            phase: self.status.phase,
        };
        if last.is_some_and(|l| transition < l.transition || l == this) {
            return None;
        }
        let seconds = self.now.duration_since(transition).as_secs_f64().max(0.0);
        let metric = match self.status.phase {
            Some(HibernationPhase::Hibernating) => Some((PhaseMetric::Hibernate, result, seconds)),
            Some(HibernationPhase::Waking) => Some((PhaseMetric::Wake, result, seconds)),
            _ => None,
        };
        Some(Announcement {
            event,
            metric,
            announced: this,
        })
    }

    fn finish(self) -> Option<CocoonHibernationStatus> {
        (self.status != self.original).then_some(self.status)
    }
}

/// Deletion guard (`hibernation.md` §6): keep the tag when another live CR tracks the same VM
/// (by `status.vmName`) or the same pod (by `spec.podRef.name`, which also catches a duplicate
/// that never reconciled).
pub fn another_holder(me: &CocoonHibernation, others: &[CocoonHibernation]) -> bool {
    let my_vm = me.status.as_ref().map(|s| s.vm_name.as_str()).unwrap_or("");
    others.iter().any(|o| {
        o.metadata.uid != me.metadata.uid
            && o.metadata.deletion_timestamp.is_none()
            && o.metadata.namespace == me.metadata.namespace
            && ((!my_vm.is_empty() && o.status.as_ref().is_some_and(|s| s.vm_name == my_vm))
                || o.spec.pod_ref.name == me.spec.pod_ref.name)
    })
}
