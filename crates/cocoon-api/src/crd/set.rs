//! CocoonSet: one main agent VM (slot 0), `agent.replicas` sub-agents forked from it, and named
//! toolbox VMs, each backed by a placeholder pod on a virtual node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvFromSource, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::contract::vmspec::{Backend, ConnType, Os as GuestOs, SnapshotPolicy};

fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}
fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}
fn default_node_pool() -> String {
    DEFAULT_NODE_POOL.to_string()
}

/// `spec.nodePool` when the user leaves it out.
pub const DEFAULT_NODE_POOL: &str = "default";

/// CEL rule 1 on `spec`: seats can only be released for a lone main agent.
pub const RULE_RELEASE_NEEDS_LONE_MAIN: &str = "!has(self.hibernatePolicy) || self.hibernatePolicy != 'release' || ((!has(self.agent.replicas) || self.agent.replicas == 0) && (!has(self.toolboxes) || size(self.toolboxes) == 0))";
/// Message of CEL rule 1.
pub const MSG_RELEASE_NEEDS_LONE_MAIN: &str =
    "hibernatePolicy=release requires agent.replicas=0 and no toolboxes";
/// CEL rule 2 on `spec` (a transition rule): the CPU class can be set once, never changed.
pub const RULE_CPU_CLASS_IMMUTABLE: &str = "!has(oldSelf.snapshotCompatibilityClass) || (has(self.snapshotCompatibilityClass) && self.snapshotCompatibilityClass == oldSelf.snapshotCompatibilityClass)";
/// Message of CEL rule 2.
pub const MSG_CPU_CLASS_IMMUTABLE: &str = "snapshotCompatibilityClass is immutable once set";
/// CEL rule on `spec.hibernatePolicy`: one of the two policies. The schema carries no `enum`
/// for this field, because an enum violation stops the API server before any CEL rule runs
/// and answers `Unsupported value` instead of this message.
pub const RULE_HIBERNATE_POLICY: &str = "self == 'retain' || self == 'release'";
/// Message of [`RULE_HIBERNATE_POLICY`]: cocoon-webhook's words.
pub const MSG_HIBERNATE_POLICY: &str = "must be retain or release";
/// Pattern of `spec.snapshotCompatibilityClass` (a label value).
pub const CPU_CLASS_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// Pattern of `spec.toolboxes[].name` (a DNS label).
pub const TOOLBOX_NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A set of agent VMs (main + forked sub-agents) and toolbox VMs.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1",
    kind = "CocoonSet",
    plural = "cocoonsets",
    singular = "cocoonset",
    namespaced,
    status = "CocoonSetStatus",
    scale(
        spec_replicas_path = ".spec.agent.replicas",
        status_replicas_path = ".status.replicas"
    ),
    shortname = "cset",
    shortname = "cs",
    shortname = "cocoonsets",
    category = "cocoon",
    cel,
    doc = "A set of agent microVMs: a main agent, sub-agents forked from it, and toolbox VMs.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyAgents"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredAgents"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new(RULE_RELEASE_NEEDS_LONE_MAIN).message(MSG_RELEASE_NEEDS_LONE_MAIN),
    validation = Rule::new(RULE_CPU_CLASS_IMMUTABLE).message(MSG_CPU_CLASS_IMMUTABLE),
    validation = Rule::new(RULE_IDLE_NEEDS_RETAIN).message(MSG_IDLE_NEEDS_RETAIN)
)]
#[serde(rename_all = "camelCase")]
pub struct CocoonSetSpec {
    /// `true` hibernates every managed VM of the set.
    #[serde(default, skip_serializing_if = "is_false")]
    pub suspend: bool,

    /// Which VMs get a routine `:latest` snapshot when their pod is deleted.
    #[serde(default)]
    pub snapshot_policy: SnapshotPolicy,

    /// `retain` keeps a suspended set's pods (and seats); `release` frees them once the
    /// `:hibernate` snapshot is verified in the registry.
    #[serde(default)]
    #[schemars(with = "String")]
    #[x_kube(validation = Rule::new(RULE_HIBERNATE_POLICY).message(MSG_HIBERNATE_POLICY))]
    pub hibernate_policy: HibernatePolicy,

    /// Hard placement: every managed pod selects `cocoonstack.io/pool=<nodePool>`.
    #[serde(default = "default_node_pool")]
    pub node_pool: String,

    /// Hard placement on nodes certified for this guest-visible CPU ABI. Immutable once set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63), pattern(CPU_CLASS_PATTERN))]
    pub snapshot_compatibility_class: String,

    /// Pins the main agent to this node; a different node than the current one migrates it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,

    /// The main agent and its sub-agents.
    pub agent: AgentSpec,

    /// Named toolbox VMs. A list-map keyed by `name`, so the API server rejects duplicates and
    /// server-side apply merges entries by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub toolboxes: Vec<ToolboxSpec>,

    /// Idle suspend and wake on connect or exec. Additive: the Go controllers
    /// ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleSpec>,
}

/// CEL rule on `spec.idle.suspendAfter`: at least [`crate::contract::idle::MIN_SUSPEND_AFTER_SECS`].
pub const RULE_IDLE_SUSPEND_AFTER_MIN: &str = "duration(self) >= duration('10s')";
/// Message of [`RULE_IDLE_SUSPEND_AFTER_MIN`].
pub const MSG_IDLE_SUSPEND_AFTER_MIN: &str = "spec.idle.suspendAfter must be at least 10s";
/// Pattern of `spec.idle.suspendAfter`: a Go duration (`90s`, `15m`, `1h30m`).
pub const IDLE_DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// CEL rule 3 on `spec`: an idle suspend keeps the seats, so the wake is warm.
pub const RULE_IDLE_NEEDS_RETAIN: &str = "!has(self.idle) || !has(self.idle.suspendAfter) || !has(self.hibernatePolicy) || self.hibernatePolicy != 'release'";
/// Message of CEL rule 3.
pub const MSG_IDLE_NEEDS_RETAIN: &str = "spec.idle.suspendAfter requires hibernatePolicy=retain";
/// Most entries of `spec.idle.ports`.
pub const IDLE_MAX_PORTS: usize = 16;

/// `spec.idle`: when the set suspends by itself and what wakes it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdleSpec {
    /// Suspend the set (retain policy, so the wake is warm) once every member has been idle
    /// this long: a Go duration, at least `10s`. Unset = never suspend by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(IDLE_DURATION_PATTERN))]
    #[x_kube(validation = Rule::new(RULE_IDLE_SUSPEND_AFTER_MIN).message(MSG_IDLE_SUSPEND_AFTER_MIN))]
    pub suspend_after: Option<String>,
    /// TCP ports of the main agent that the set serves: the operator keeps a Service named
    /// after the set with these ports, and a connection to a suspended set wakes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(range(min = 1, max = 65535)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ports: Vec<i32>,
    /// What wakes an idle-suspended set: `connect`, `exec`. Empty = both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub wake_on: Vec<WakeOn>,
}

/// What may wake an idle-suspended set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum WakeOn {
    /// A TCP connection to one of `spec.idle.ports` (through the set's Service).
    Connect,
    /// `kubectl exec` or `attach` to a member pod.
    Exec,
}

impl IdleSpec {
    /// `suspendAfter` parsed; `None` when unset or not a duration (the CRD refuses those).
    pub fn suspend_after(&self) -> Option<std::time::Duration> {
        self.suspend_after
            .as_deref()
            .and_then(|text| crate::contract::idle::parse_duration(text).ok())
    }

    /// Whether `what` wakes the set (an empty `wakeOn` means both).
    pub fn wakes_on(&self, what: WakeOn) -> bool {
        self.wake_on.is_empty() || self.wake_on.contains(&what)
    }
}

/// `status.idle`: the last activity the operator saw.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdleStatus {
    /// RFC3339 time of the last activity of any member (or of the set's start or wake).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_activity: String,
    /// What it was: `traffic`, `session`, `cpu` (from the node agents), `started`, `woken`,
    /// `resumed` (from the operator).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_activity_kind: String,
}

/// What suspend does with the scheduling seats.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum HibernatePolicy {
    #[default]
    Retain,
    Release,
}

impl HibernatePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retain => "retain",
            Self::Release => "release",
        }
    }
}

/// How an agent VM comes to life.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum AgentMode {
    /// Clone from a snapshot artifact.
    #[default]
    Clone,
    /// Boot a fresh VM from an image.
    Run,
}

impl AgentMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Clone => "clone",
            Self::Run => "run",
        }
    }
}

/// How a toolbox VM comes to life.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ToolboxMode {
    #[default]
    Run,
    Clone,
    /// Managed outside cocoon: the node agent never touches the runtime for it.
    Static,
}

impl ToolboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Clone => "clone",
            Self::Static => "static",
        }
    }
}

/// VM options shared by agents and toolboxes; their fields sit inline in both.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VmOptions {
    #[serde(default)]
    pub os: GuestOs,
    #[serde(default)]
    pub backend: Backend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn_type: Option<ConnType>,
    /// CNI conflist name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// Bypass the node's image cache.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_pull: bool,
    /// `true` passes `--no-direct-io` to the runtime: the VM's disks go through the host page
    /// cache instead of direct I/O.
    #[serde(default, skip_serializing_if = "is_false", rename = "noDirectIO")]
    pub no_direct_io: bool,
    /// TCP readiness probe port instead of ICMP; 0 = unset.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    #[schemars(range(min = 0, max = 65535))]
    pub probe_port: i32,
    /// Disk size; also the container's ephemeral-storage request and limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Quantity>,
    /// Goes onto the placeholder container, not into an annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// The main agent and its sub-agents.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Number of sub-agents; the main always exists in addition.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Image or snapshot reference the VMs boot from.
    #[schemars(length(min = 1))]
    pub image: String,
    #[serde(default)]
    pub mode: AgentMode,
    #[serde(flatten)]
    pub vm: VmOptions,
    /// Copied onto the agent pods' placeholder container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Service account of the agent pods; set on the pod only when non-empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,
    /// Start the main agent from this CocoonCheckpoint of the set's namespace (it must be
    /// `Ready`) instead of `image`. Additive: the Go controllers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(crate::crd::checkpoint::OBJECT_NAME_PATTERN)
    )]
    pub from_checkpoint: Option<String>,
}

/// A named toolbox VM.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolboxSpec {
    /// Toolbox identity; the pod is `<cs>-<name>`.
    #[schemars(length(min = 1, max = 63), pattern(TOOLBOX_NAME_PATTERN))]
    pub name: String,
    /// Image or snapshot reference the toolbox VM boots from.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default)]
    pub mode: ToolboxMode,
    /// `static` only: pre-written as `vm.cocoonstack.io/ip`.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "staticIP")]
    pub static_ip: String,
    /// `static` only: pre-written as `vm.cocoonstack.io/id`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "staticVMID"
    )]
    pub static_vm_id: String,
    /// `static` only: pre-written as `vm.cocoonstack.io/vnc-port` when > 0.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    #[schemars(range(min = 0, max = 65535))]
    pub vnc_port: i32,
    #[serde(flatten)]
    pub vm: VmOptions,
}

/// CocoonSet phase.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CocoonSetPhase {
    Pending,
    Scaling,
    Running,
    Suspending,
    Suspended,
    Waking,
    Migrating,
    Failed,
}

impl CocoonSetPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Scaling => "Scaling",
            Self::Running => "Running",
            Self::Suspending => "Suspending",
            Self::Suspended => "Suspended",
            Self::Waking => "Waking",
            Self::Migrating => "Migrating",
            Self::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for CocoonSetPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of a CocoonSet.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CocoonSetStatus {
    /// The `metadata.generation` this status was built from.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CocoonSetPhase>,
    /// Ready agent pods (main + sub-agents). Always written, also 0.
    #[serde(default)]
    pub ready_agents: i32,
    /// `1 + spec.agent.replicas`.
    #[serde(default)]
    pub desired_agents: i32,
    /// Sub-agent pods that exist (the entries of `agents` other than the main): what
    /// `spec.agent.replicas` counts, and the `/scale` subresource's `status.replicas`.
    /// Always written, also 0.
    #[serde(default)]
    pub replicas: i32,
    /// Ready toolbox pods. Always written, also 0.
    #[serde(default)]
    pub ready_toolboxes: i32,
    /// Number of entries in `spec.toolboxes`.
    #[serde(default)]
    pub desired_toolboxes: i32,
    /// One entry per existing agent pod, keyed by `slot`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["slot".into()]))]
    pub agents: Vec<AgentStatus>,
    /// One entry per existing toolbox pod, keyed by `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub toolboxes: Vec<ToolboxStatus>,
    /// Idle tracking (`spec.idle`); absent when the set has no `suspendAfter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleStatus>,
    /// `Ready` (every desired agent and toolbox pod is Ready) and `Progressing` (the phase is
    /// `Pending` or `Scaling`); `Idle` says why the set suspended by itself or woke.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// One existing agent pod.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// 0 = main.
    pub slot: i32,
    /// `main` or `sub-agent`.
    pub role: String,
    /// The agent pod, `<cocoonset>-<slot>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    /// The VM name, from the pod annotation `vm.cocoonstack.io/name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vm_name: String,
    /// The runtime's VM id, from the pod annotation `vm.cocoonstack.io/id`.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "vmID")]
    pub vm_id: String,
    /// The VM's IP address, from the pod annotation `vm.cocoonstack.io/ip`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    /// The pod's `status.phase`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// Sub-agents: the main's VM name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub forked_from: String,
}

/// One existing toolbox pod.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolboxStatus {
    /// The toolbox's name in `spec.toolboxes`.
    pub name: String,
    /// The toolbox pod, `<cocoonset>-<name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    /// The VM name, from the pod annotation `vm.cocoonstack.io/name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vm_name: String,
    /// The runtime's VM id, from the pod annotation `vm.cocoonstack.io/id`.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "vmID")]
    pub vm_id: String,
    /// The VM's IP address, from the pod annotation `vm.cocoonstack.io/ip`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    /// The pod's `status.phase`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// How to connect: the pod's `vm.cocoonstack.io/conn-type`; else `vnc` when a VNC port is
    /// set, `adb` for android, `rdp` for windows, otherwise `ssh`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conn_type: String,
    /// The VNC port, from the pod annotation `vm.cocoonstack.io/vnc-port`; 0 = none.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub vnc_port: i32,
}

impl CocoonSetSpec {
    /// A spec with every schema default applied and the given image, for code-built objects.
    pub fn with_image(image: impl Into<String>) -> Self {
        Self {
            suspend: false,
            snapshot_policy: SnapshotPolicy::default(),
            hibernate_policy: HibernatePolicy::default(),
            node_pool: default_node_pool(),
            snapshot_compatibility_class: String::new(),
            node_name: String::new(),
            agent: AgentSpec {
                image: image.into(),
                ..AgentSpec::default()
            },
            toolboxes: Vec::new(),
            idle: None,
        }
    }

    /// Apply the schema defaults to fields a code-built object may have left empty
    /// (enums default through their types; the pool is a free string).
    pub fn apply_defaults(&mut self) {
        if self.node_pool.is_empty() {
            self.node_pool = default_node_pool();
        }
    }

    /// `1 + agent.replicas` (negative replicas count as 0).
    pub fn desired_agents(&self) -> i32 {
        1 + self.agent.replicas.max(0)
    }

    /// Toolbox names that appear more than once, sorted.
    pub fn duplicate_toolbox_names(&self) -> Vec<String> {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.toolboxes {
            *seen.entry(t.name.as_str()).or_default() += 1;
        }
        seen.into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(name, _)| name.to_string())
            .collect()
    }
}
