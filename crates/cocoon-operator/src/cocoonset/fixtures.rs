//! The fixtures of the CocoonSet table tests, in one place: the set `demo` in namespace
//! [`NS`], its pods as the factories build them, the states vk-cocoon reports on them, the
//! CocoonHibernations that name them, and the view a step observes. A test starts from these
//! and writes out only what its rows vary.

use chrono::{DateTime, Utc};
use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, HibernationPhase,
    PodRef,
};
use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec, CocoonSetStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus,
};
use kube::ResourceExt;

use super::Timing;
use super::pods::{self, Classified};
use super::steps::{Effect, Note, Observed, Write};

/// The namespace of every fixture.
pub const NS: &str = "ns";

/// The set `demo` in [`NS`]: image `img:1`, UID `uid-1`, generation 3, no sub-agent and no
/// toolbox. [`SetFixture`] changes what a test varies.
pub fn set() -> CocoonSet {
    let mut cs = CocoonSet::new("demo", CocoonSetSpec::with_image("img:1"));
    cs.metadata.namespace = Some(NS.into());
    cs.metadata.uid = Some("uid-1".into());
    cs.metadata.generation = Some(3);
    cs
}

/// What the tests vary on a [`set`].
pub trait SetFixture: Sized {
    /// `spec.agent.replicas`.
    fn with_replicas(self, replicas: i32) -> Self;
    /// `metadata.generation`.
    fn at_generation(self, generation: i64) -> Self;
    /// A status reporting `phase` only (none: no status at all).
    fn in_phase(self, phase: Option<CocoonSetPhase>) -> Self;
    /// One annotation more.
    fn with_annotation(self, key: &str, value: &str) -> Self;
}

impl SetFixture for CocoonSet {
    fn with_replicas(mut self, replicas: i32) -> Self {
        self.spec.agent.replicas = replicas;
        self
    }

    fn at_generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    fn in_phase(mut self, phase: Option<CocoonSetPhase>) -> Self {
        self.status = phase.map(|p| CocoonSetStatus {
            phase: Some(p),
            ..CocoonSetStatus::default()
        });
        self
    }

    fn with_annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations_mut().insert(key.into(), value.into());
        self
    }
}

/// The agent pod of `slot` of a [`set`] with one sub-agent: the main, or a sub-agent forking
/// from the main's VM and bound to `node-a`.
pub fn agent(slot: i32) -> Pod {
    let cs = set().with_replicas(1);
    let main_vm = pods::vm_name(&pods::build_agent_pod(&cs, NS, 0, "", None)).to_string();
    pods::build_agent_pod(&cs, NS, slot, &main_vm, Some("node-a"))
}

/// The VM of [`agent`]`(slot)`.
pub fn vm(slot: i32) -> String {
    pods::vm_name(&agent(slot)).to_string()
}

/// `p` with the annotation `key=value`.
pub fn with(mut p: Pod, key: &str, value: &str) -> Pod {
    p.annotations_mut().insert(key.into(), value.into());
    p
}

/// `p` in `Pod.Phase=phase`.
pub fn phase(mut p: Pod, phase: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).phase = Some(phase.into());
    p
}

/// `p` Running and Ready.
pub fn ready(mut p: Pod) -> Pod {
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.phase = Some("Running".into());
    st.conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..PodCondition::default()
    }]);
    p
}

/// `p` running a live VM that vk-cocoon reports `ready` at `generation`.
pub fn live(p: Pod, generation: i64) -> Pod {
    let mut p = with(p, ann::VM_ID, "vm-id");
    p = with(p, ann::LIFECYCLE_STATE, "ready");
    p = with(
        p,
        ann::LIFECYCLE_OBSERVED_GENERATION,
        &generation.to_string(),
    );
    running(p)
}

/// `p` Running with its agent container running.
pub fn running(mut p: Pod) -> Pod {
    let st = p.status.get_or_insert_with(PodStatus::default);
    st.phase = Some("Running".into());
    st.container_statuses = Some(vec![ContainerStatus {
        name: "agent".into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    p
}

/// `p` as vk-cocoon reports it `hibernated` at `generation`.
pub fn hibernated(p: Pod, generation: i64) -> Pod {
    let p = with(p, ann::LIFECYCLE_STATE, "hibernated");
    with(
        p,
        ann::LIFECYCLE_OBSERVED_GENERATION,
        &generation.to_string(),
    )
}

/// `p` the scheduler could not place, saying `message`.
pub fn unschedulable(mut p: Pod, message: &str) -> Pod {
    p.status.get_or_insert_with(PodStatus::default).conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(message.into()),
        ..PodCondition::default()
    }]);
    p
}

/// `p` bound to `node`.
pub fn on(mut p: Pod, node: &str) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.node_name = Some(node.into());
    }
    p
}

/// Step 4's classification of `pods`.
pub fn classify<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Classified {
    Classified::from_owned(pods)
}

/// A CocoonHibernation of `pod` with `desire`, in `phase`.
pub fn cr(pod: &str, desire: Desire, phase: Option<HibernationPhase>) -> CocoonHibernation {
    let mut h = CocoonHibernation::new(
        pod,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
        },
    );
    h.status = Some(CocoonHibernationStatus {
        phase,
        ..CocoonHibernationStatus::default()
    });
    h
}

/// `s` seconds after a fixed instant.
pub fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
}

/// What a step observes of `cs` classified as `classified`, with no pod listed besides.
pub fn observe<'a>(
    cs: &'a CocoonSet,
    classified: &'a Classified,
    timing: &'a Timing,
) -> Observed<'a> {
    Observed {
        cs,
        ns: NS,
        owned: &[],
        classified,
        timing,
    }
}

/// The writes and notes of a plan ([`crate::cocoonset::steps::StepPlan::effects`]) as short
/// words, for the table tests of steps 12 and 13.
pub fn write_kinds(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|e| match e {
            Effect::Write(w) => match w {
                Write::SetAnnotations(d) if d.contains_key(ann::REBUILD_HISTORY) => {
                    "history".into()
                }
                Write::SetAnnotations(d) if d.contains_key(ann::DELETE_VM_NAMES) => "stash".into(),
                Write::DeletePod(n) => format!("delete {n}"),
                Write::PostPod(p) => format!("post {}", p.name_any()),
                Write::PostPods { pods, .. } => {
                    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
                    format!("post {}", names.join(","))
                }
                Write::Fail(m) => format!("fail: {m}"),
                other => panic!("unexpected write {other:?}"),
            },
            Effect::Note(n) => match n {
                Note::Event { reason, .. } => (*reason).into(),
                Note::Count(_) => "count".into(),
                Note::Log { .. } => "log".into(),
                Note::Changed => "changed".into(),
                Note::Backoff(d) => format!("backoff {}s", d.as_secs()),
                other => panic!("unexpected note {other:?}"),
            },
        })
        .collect()
}
