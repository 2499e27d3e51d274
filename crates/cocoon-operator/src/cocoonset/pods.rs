//! Pure pod rules of the CocoonSet loop: the pod factories (`cocoonset.md` §3), the drift rules
//! (§4), the classification of owned pods (§5) and the facts the other steps read off a pod.

use std::collections::BTreeMap;

use cocoon_api::contract::{
    AnnotationCodec, DeadLetter, GenerationStamp, HibernateFlags, Lifecycle, LifecycleState, Mode,
    VmRuntime, VmSpec, annotations as ann, labels, meta_annotations, meta_labels, placement,
};
use cocoon_api::crd::set::{AgentMode, CocoonSet, ToolboxMode, ToolboxSpec};
use cocoon_api::naming::{self, Role};
use k8s_openapi::api::core::v1::{Container, EnvFromSource, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::quantity;

/// The placeholder image: the node agent never pulls it.
pub const PLACEHOLDER_IMAGE: &str = "ghcr.io/cocoonstack/placeholder:latest";
/// Name of the single placeholder container.
pub const CONTAINER_NAME: &str = "agent";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

// ---------------------------------------------------------------------------------------------
// §3 factories
// ---------------------------------------------------------------------------------------------

fn agent_mode(m: AgentMode) -> Mode {
    match m {
        AgentMode::Clone => Mode::Clone,
        AgentMode::Run => Mode::Run,
    }
}

fn toolbox_mode(m: ToolboxMode) -> Mode {
    match m {
        ToolboxMode::Run => Mode::Run,
        ToolboxMode::Clone => Mode::Clone,
        ToolboxMode::Static => Mode::Static,
    }
}

fn storage_string(q: Option<&Quantity>) -> String {
    q.map(|q| q.0.trim().to_string()).unwrap_or_default()
}

/// "agent spec → VM spec": the VM-spec annotations of agent slot `slot`.
pub fn agent_vm_spec(cs: &CocoonSet, ns: &str, slot: i32, fork_from: &str) -> VmSpec {
    let a = &cs.spec.agent;
    VmSpec {
        vm_name: naming::vm_name_for_agent(ns, &cs.name_any(), slot),
        image: a.image.clone(),
        mode: Some(agent_mode(a.mode)),
        os: Some(a.vm.os),
        storage: storage_string(a.vm.storage.as_ref()),
        network: a.vm.network.clone(),
        snapshot_policy: Some(cs.spec.snapshot_policy),
        fork_from: fork_from.to_string(),
        conn_type: a.vm.conn_type,
        backend: Some(a.vm.backend),
        managed: true,
        force_pull: a.vm.force_pull,
        no_direct_io: a.vm.no_direct_io,
        probe_port: a.vm.probe_port,
    }
}

/// "toolbox spec → VM spec".
pub fn toolbox_vm_spec(cs: &CocoonSet, ns: &str, t: &ToolboxSpec) -> VmSpec {
    VmSpec {
        vm_name: naming::vm_name_for_toolbox(ns, &cs.name_any(), &t.name),
        image: t.image.clone(),
        mode: Some(toolbox_mode(t.mode)),
        os: Some(t.vm.os),
        storage: storage_string(t.vm.storage.as_ref()),
        network: t.vm.network.clone(),
        snapshot_policy: Some(cs.spec.snapshot_policy),
        fork_from: String::new(),
        conn_type: t.vm.conn_type,
        backend: Some(t.vm.backend),
        managed: t.mode != ToolboxMode::Static,
        force_pull: t.vm.force_pull,
        no_direct_io: t.vm.no_direct_io,
        probe_port: t.vm.probe_port,
    }
}

/// The controller owner reference every owned pod carries.
pub fn owner_reference(cs: &CocoonSet) -> Option<OwnerReference> {
    cs.controller_owner_ref(&()).map(|mut o| {
        // Foreground deletion of the set then waits for its pods.
        o.block_owner_deletion = Some(true);
        o
    })
}

/// Container resources with `storage` as ephemeral-storage request and limit.
fn container_resources(
    resources: Option<&ResourceRequirements>,
    storage: Option<&Quantity>,
) -> Option<ResourceRequirements> {
    let mut r = resources.cloned();
    if let Some(q) = storage.filter(|q| quantity::is_non_zero(&q.0)) {
        let r = r.get_or_insert_with(ResourceRequirements::default);
        r.requests
            .get_or_insert_with(BTreeMap::new)
            .insert(EPHEMERAL_STORAGE.into(), q.clone());
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert(EPHEMERAL_STORAGE.into(), q.clone());
    }
    r
}

/// The §3.1 skeleton around a VM spec.
fn skeleton(
    cs: &CocoonSet,
    ns: &str,
    pod_name: &str,
    role: Role,
    slot: &str,
    spec: &VmSpec,
    container: Container,
) -> Pod {
    let mut annotations = BTreeMap::new();
    GenerationStamp(cs.metadata.generation.unwrap_or(0)).apply_to(&mut annotations);
    spec.apply_to(&mut annotations);
    // Issue 39: the set's idle limit, so the node publishes activity often enough (not a
    // drift rule: the idle step patches it as the spec changes).
    if let Some(after) = cs
        .spec
        .idle
        .as_ref()
        .filter(|i| i.suspend_after().is_some())
        .and_then(|i| i.suspend_after.clone())
    {
        annotations.insert(cocoon_api::contract::idle::SUSPEND_AFTER.into(), after);
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(labels::pod_labels(&cs.name_any(), role, slot)),
            annotations: Some(annotations),
            owner_references: owner_reference(cs).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(1),
            tolerations: Some(placement::pod_tolerations()),
            node_selector: Some(placement::pod_node_selector(
                &cs.spec.node_pool,
                &cs.spec.snapshot_compatibility_class,
            )),
            containers: vec![container],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The agent pod of `slot` (§3.2). `bind_node` is the main's node for sub-agents.
pub fn build_agent_pod(
    cs: &CocoonSet,
    ns: &str,
    slot: i32,
    main_vm: &str,
    bind_node: Option<&str>,
) -> Pod {
    let cs_name = cs.name_any();
    let fork_from = if slot > 0 { main_vm } else { "" };
    let spec = agent_vm_spec(cs, ns, slot, fork_from);
    let a = &cs.spec.agent;
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(PLACEHOLDER_IMAGE.into()),
        resources: container_resources(a.vm.resources.as_ref(), a.vm.storage.as_ref()),
        env_from: (!a.env_from.is_empty()).then(|| a.env_from.clone()),
        ..Container::default()
    };
    let mut pod = skeleton(
        cs,
        ns,
        &naming::pod_name_for_agent(&cs_name, slot),
        naming::role_for_slot(slot),
        &slot.to_string(),
        &spec,
        container,
    );
    if let Some(ps) = pod.spec.as_mut() {
        if !a.service_account_name.is_empty() {
            ps.service_account_name = Some(a.service_account_name.clone());
        }
        match bind_node.filter(|n| !n.is_empty()) {
            Some(node) => ps.node_name = Some(node.to_string()),
            None if slot == 0 && !cs.spec.node_name.is_empty() => {
                ps.affinity = Some(placement::required_hostname_affinity(&cs.spec.node_name));
            }
            None => {}
        }
    }
    pod
}

/// The toolbox pod (§3.3); static toolboxes get their runtime identity pre-written.
pub fn build_toolbox_pod(cs: &CocoonSet, ns: &str, t: &ToolboxSpec) -> Pod {
    let spec = toolbox_vm_spec(cs, ns, t);
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(PLACEHOLDER_IMAGE.into()),
        resources: container_resources(t.vm.resources.as_ref(), t.vm.storage.as_ref()),
        ..Container::default()
    };
    let mut pod = skeleton(
        cs,
        ns,
        &naming::pod_name_for_toolbox(&cs.name_any(), &t.name),
        Role::Toolbox,
        &t.name,
        &spec,
        container,
    );
    if t.mode == ToolboxMode::Static
        && let Some(a) = pod.metadata.annotations.as_mut()
    {
        static_runtime(t).apply_to(a);
    }
    pod
}

fn static_runtime(t: &ToolboxSpec) -> VmRuntime {
    VmRuntime {
        id: t.static_vm_id.clone(),
        ip: t.static_ip.clone(),
        vnc_port: t.vnc_port,
    }
}

/// Marks a pod built by a factory for restore from its `:hibernate` snapshot.
pub fn mark_restore(pod: &mut Pod) {
    let a = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    HibernateFlags {
        restore_from_hibernate: true,
        ..HibernateFlags::default()
    }
    .desired()
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .for_each(|(k, v)| {
        a.insert(k, v);
    });
}

// ---------------------------------------------------------------------------------------------
// §0 pod facts
// ---------------------------------------------------------------------------------------------

/// The pod's `status.phase`, empty when unknown.
pub fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn condition_status<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// Ready(pod): condition `Ready` = `True`.
pub fn is_ready(pod: &Pod) -> bool {
    condition_status(pod, "Ready").is_some_and(|c| c.status == "True")
}

/// phase-failed(pod).
pub fn is_phase_failed(pod: &Pod) -> bool {
    pod_phase(pod) == "Failed"
}

/// The node agent's lifecycle triple.
pub fn lifecycle(pod: &Pod) -> Lifecycle {
    Lifecycle::from_meta(&pod.metadata)
}

/// terminal(pod): phase Failed or lifecycle-state failed.
pub fn is_terminal(pod: &Pod) -> bool {
    is_phase_failed(pod) || lifecycle(pod).is_failed()
}

/// The lifecycle state as written, for reasons and messages.
pub fn lifecycle_state_str(pod: &Pod) -> &str {
    pod.annotations()
        .get(ann::LIFECYCLE_STATE)
        .map(String::as_str)
        .unwrap_or("")
}

/// VMLive(pod): a VM id and a running container.
pub fn is_vm_live(pod: &Pod) -> bool {
    let has_id = !VmRuntime::from_meta(&pod.metadata).id.is_empty();
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        });
    has_id && running
}

/// The pod's VM name annotation.
pub fn vm_name(pod: &Pod) -> &str {
    pod.annotations()
        .get(ann::VM_NAME)
        .map(String::as_str)
        .unwrap_or("")
}

/// The pod's dead-letter mark.
pub fn dead_letter(pod: &Pod) -> DeadLetter {
    DeadLetter::from_meta(&pod.metadata)
}

/// The pod's bound node, empty when unscheduled.
pub fn bound_node(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// §4 drift
// ---------------------------------------------------------------------------------------------

/// Why a pod no longer matches its spec (the first rule that failed), or `None` when it does.
pub type Drift = Option<&'static str>;

fn vm_spec_matches(live: &VmSpec, want: &VmSpec) -> bool {
    live.image == want.image
        && live.effective_mode() == want.effective_mode()
        && live.effective_os() == want.effective_os()
        && storage_matches(&live.storage, &want.storage)
        && live.network == want.network
        && live.effective_snapshot_policy() == want.effective_snapshot_policy()
        && live.fork_from == want.fork_from
        && live.managed == want.managed
        && live.force_pull == want.force_pull
        && live.no_direct_io == want.no_direct_io
        && live.conn_type == want.conn_type
        && live.effective_backend() == want.effective_backend()
        && live.probe_port == want.probe_port
}

fn storage_matches(live: &str, want: &str) -> bool {
    match (live.is_empty(), want.is_empty()) {
        (true, true) => true,
        (false, false) => quantity::same_amount(live, want),
        _ => false,
    }
}

fn container0(pod: &Pod) -> Option<&Container> {
    pod.spec.as_ref().and_then(|s| s.containers.first())
}

fn quantity_of<'a>(m: Option<&'a BTreeMap<String, Quantity>>, key: &str) -> Option<&'a Quantity> {
    m.and_then(|m| m.get(key))
}

fn quantities_match(live: Option<&Quantity>, want: Option<&Quantity>) -> bool {
    match (live, want) {
        (None, None) => true,
        (Some(a), Some(b)) => quantity::same_amount(&a.0, &b.0),
        _ => false,
    }
}

/// §4.1.2: cpu and memory of limits and requests; expected requests default to the limits.
pub fn resources_match(pod: &Pod, spec: Option<&ResourceRequirements>) -> bool {
    let live = container0(pod).and_then(|c| c.resources.as_ref());
    let want_limits = spec.and_then(|r| r.limits.as_ref());
    let want_requests = spec
        .and_then(|r| r.requests.as_ref())
        .filter(|m| !m.is_empty())
        .or(want_limits);
    let live_limits = live.and_then(|r| r.limits.as_ref());
    let live_requests = live.and_then(|r| r.requests.as_ref());
    ["cpu", "memory"].iter().all(|k| {
        quantities_match(quantity_of(live_limits, k), quantity_of(want_limits, k))
            && quantities_match(quantity_of(live_requests, k), quantity_of(want_requests, k))
    })
}

/// §4.1.5: pool, and the CPU class (a legacy pod without one is adopted unless terminal).
fn scheduling_matches(cs: &CocoonSet, pod: &Pod) -> bool {
    let want_pool = if cs.spec.node_pool.is_empty() {
        labels::DEFAULT_POOL
    } else {
        cs.spec.node_pool.as_str()
    };
    if placement::pod_node_pool_of(pod) != want_pool {
        return false;
    }
    let class = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get(labels::SNAPSHOT_CPU_CLASS));
    match class {
        Some(c) => *c == cs.spec.snapshot_compatibility_class,
        None => cs.spec.snapshot_compatibility_class.is_empty() || !is_terminal(pod),
    }
}

fn with_pod_vm_name(mut want: VmSpec, pod: &Pod) -> VmSpec {
    want.vm_name = vm_name(pod).to_string();
    want
}

/// §4.1: does agent pod `slot` still match the spec?
pub fn agent_drift(cs: &CocoonSet, ns: &str, slot: i32, pod: &Pod) -> Drift {
    let live = VmSpec::from_meta(&pod.metadata);
    // Sub-agents keep the fork-from they were created with; the main must have none.
    let fork_from = if slot > 0 {
        live.fork_from.clone()
    } else {
        String::new()
    };
    let want = with_pod_vm_name(agent_vm_spec(cs, ns, slot, &fork_from), pod);
    if !vm_spec_matches(&live, &want) {
        return Some("vm spec");
    }
    let a = &cs.spec.agent;
    if !resources_match(pod, a.vm.resources.as_ref()) {
        return Some("resources");
    }
    let live_sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    let want_sa = if a.service_account_name.is_empty() {
        "default"
    } else {
        a.service_account_name.as_str()
    };
    if live_sa != want_sa {
        return Some("service account");
    }
    let live_env: &[EnvFromSource] = container0(pod)
        .and_then(|c| c.env_from.as_deref())
        .unwrap_or(&[]);
    if live_env != a.env_from.as_slice() {
        return Some("envFrom");
    }
    if !scheduling_matches(cs, pod) {
        return Some("scheduling");
    }
    None
}

/// §4.2: does the toolbox pod still match its spec?
pub fn toolbox_drift(cs: &CocoonSet, ns: &str, t: &ToolboxSpec, pod: &Pod) -> Drift {
    let live = VmSpec::from_meta(&pod.metadata);
    let want = with_pod_vm_name(toolbox_vm_spec(cs, ns, t), pod);
    if !vm_spec_matches(&live, &want) {
        return Some("vm spec");
    }
    if !resources_match(pod, t.vm.resources.as_ref()) {
        return Some("resources");
    }
    if !scheduling_matches(cs, pod) {
        return Some("scheduling");
    }
    if t.mode == ToolboxMode::Static && VmRuntime::from_meta(&pod.metadata) != static_runtime(t) {
        return Some("static runtime");
    }
    None
}

// ---------------------------------------------------------------------------------------------
// §0 ownership and §5 classification
// ---------------------------------------------------------------------------------------------

/// An owned pod: our name label and a controller owner reference with our UID.
pub fn is_owned(cs: &CocoonSet, pod: &Pod) -> bool {
    let Some(uid) = cs.metadata.uid.as_deref() else {
        return false;
    };
    let labelled = meta_labels(&pod.metadata).get(labels::COCOONSET_NAME) == Some(&cs.name_any())
        && pod.metadata.namespace == cs.metadata.namespace;
    labelled
        && pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether the pod is managed (every agent, every non-static toolbox).
pub fn is_managed(pod: &Pod) -> bool {
    meta_annotations(&pod.metadata)
        .get(ann::MANAGED)
        .is_some_and(|v| v == "true")
}

/// The owned pods of one pass, by role; every map iterates in pod-name order.
#[derive(Debug, Clone, Default)]
pub struct Classified {
    pub all_by_name: BTreeMap<String, Pod>,
    pub main: Option<Pod>,
    pub sub: BTreeMap<i32, Pod>,
    pub toolbox: BTreeMap<String, Pod>,
    /// Pods this controller created a moment ago that the cache does not show yet
    /// ([`super::memory::expected`]), with the time their expectation has left: they exist,
    /// pending.
    pub pending_creates: BTreeMap<String, std::time::Duration>,
}

impl Classified {
    /// §5 over owned pods; terminating pods are left out.
    pub fn from_owned<'a>(owned: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut pods: Vec<&Pod> = owned
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        pods.sort_by_key(|p| p.name_any());
        let mut c = Classified::default();
        for p in pods {
            let l = meta_labels(&p.metadata);
            let slot = l.get(labels::SLOT).map(String::as_str).unwrap_or("");
            match l.get(labels::ROLE).and_then(|r| Role::from_wire(r)) {
                Some(Role::Main) => c.main = Some(p.clone()),
                Some(Role::SubAgent) => {
                    if let Ok(n) = slot.parse::<i32>() {
                        c.sub.insert(n, p.clone());
                    }
                }
                Some(Role::Toolbox) => {
                    c.toolbox.insert(slot.to_string(), p.clone());
                }
                None => {}
            }
            c.all_by_name.insert(p.name_any(), p.clone());
        }
        c
    }
}

/// A pod's current lifecycle state as an enum, when recognised.
pub fn lifecycle_state(pod: &Pod) -> Option<LifecycleState> {
    lifecycle(pod).state
}

/// `vm.cocoonstack.io/hibernate=true` on the pod.
pub fn is_hibernate_annotated(pod: &Pod) -> bool {
    <cocoon_api::contract::HibernateFlags as cocoon_api::contract::AnnotationCodec>::from_meta(
        &pod.metadata,
    )
    .hibernate
}

/// Marks a main agent pod to start from CocoonCheckpoint `name` of its namespace
/// (`spec.agent.fromCheckpoint`); the node agent resolves the artifact from the checkpoint.
pub fn mark_from_checkpoint(pod: &mut Pod, name: &str) {
    pod.annotations_mut().insert(
        cocoon_api::contract::checkpoint::FROM_CHECKPOINT_ANNOTATION.into(),
        name.into(),
    );
}

/// `vm.cocoonstack.io/restore-from-hibernate=true` on the pod.
pub fn is_restore_marked(pod: &Pod) -> bool {
    <cocoon_api::contract::HibernateFlags as cocoon_api::contract::AnnotationCodec>::from_meta(
        &pod.metadata,
    )
    .restore_from_hibernate
}

/// Unschedulable(pod): `PodScheduled=False` with reason `Unschedulable`; the scheduler's
/// message when so.
pub fn unschedulable_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.message.clone().unwrap_or_default())
}
