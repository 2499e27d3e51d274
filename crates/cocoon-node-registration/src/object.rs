//! The desired Node object of `node.md` §2.1/§2.2 and the merge rules that apply it onto an
//! existing Node: labels are added (others preserved), the provider taint is appended once.
//!
//! Everything here is pure so the shape of the Node is unit-testable without a cluster.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use cocoon_api::contract::{labels, placement, taints};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::capacity::Resources;

/// `status.nodeInfo.kubeletVersion`: the cocoon version.
pub const COCOON_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// Heartbeat and fix-up timings. Defaults follow `node.md` §2.4/§15; tests shorten them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// Lease `leaseDurationSeconds` (40).
    pub lease_duration: Duration,
    /// Lease renew period (10 s).
    pub lease_renew: Duration,
    /// Node status (condition heartbeat) refresh period. Unspecified by the spec: 10 s, the
    /// same as the Lease, which sits well inside the test env's 15 s node-monitor grace and
    /// the 40 s default of real clusters.
    pub status_refresh: Duration,
    /// Delay before the first fix-up attempt (5 s).
    pub fixup_delay: Duration,
    /// Fix-up attempts (10).
    pub fixup_attempts: u32,
    /// Gap between fix-up attempts (2 s).
    pub fixup_interval: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(40),
            lease_renew: Duration::from_secs(10),
            status_refresh: Duration::from_secs(10),
            fixup_delay: Duration::from_secs(5),
            fixup_attempts: 10,
            fixup_interval: Duration::from_secs(2),
        }
    }
}

/// What [`NodeRegistration::from_config`] takes of the agent's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationConfig {
    pub node_name: String,
    pub pool: String,
    pub node_ip: IpAddr,
    pub provider_id: Option<String>,
    pub snapshot_cpu_class: Option<String>,
    pub timings: Timings,
}

/// Everything needed to register and keep the Node alive. Built from the config, the computed
/// resources and the kubelet port actually bound (tests bind port 0).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRegistration {
    pub node_name: String,
    pub pool: String,
    pub node_ip: IpAddr,
    pub provider_id: Option<String>,
    pub snapshot_cpu_class: Option<String>,
    pub kubelet_port: u16,
    pub resources: Resources,
    pub timings: Timings,
    /// The API server holds this agent to its own Node as it holds a kubelet (identity
    /// `system:node:<name>`, NodeRestriction admission): it may not set `kubernetes.io` labels
    /// outside the kubelet's own set, nor change taints after create. Those are left to the
    /// administrator (see [`NodeRegistration::admin_labels`]).
    pub node_restricted: bool,
}

impl NodeRegistration {
    pub fn from_config(
        cfg: impl Into<RegistrationConfig>,
        resources: Resources,
        kubelet_port: u16,
    ) -> Self {
        let cfg = cfg.into();
        NodeRegistration {
            node_name: cfg.node_name,
            pool: cfg.pool,
            node_ip: cfg.node_ip,
            provider_id: cfg.provider_id,
            snapshot_cpu_class: cfg.snapshot_cpu_class,
            kubelet_port,
            resources,
            timings: cfg.timings,
            node_restricted: false,
        }
    }

    /// The same registration for an agent the API server holds to NodeRestriction.
    pub fn node_restricted(self, on: bool) -> Self {
        NodeRegistration {
            node_restricted: on,
            ..self
        }
    }

    /// The contract labels (§3.2) NodeRestriction refuses from a node itself (`kubernetes.io`
    /// labels outside the kubelet's set): an administrator sets them on a node-restricted agent.
    pub fn admin_labels() -> [&'static str; 2] {
        [labels::NODE_ROLE_COCOON_VM, labels::KUBERNETES_ROLE]
    }

    /// The labels this agent owns (contract §3.2).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (labels::POOL.to_string(), self.pool.clone()),
            (labels::NODE_ROLE_COCOON_VM.to_string(), String::new()),
            (labels::HOSTNAME.to_string(), self.node_name.clone()),
            (
                labels::NODE_TYPE.to_string(),
                labels::NODE_TYPE_VIRTUAL_KUBELET.to_string(),
            ),
            (
                labels::KUBERNETES_ROLE.to_string(),
                labels::KUBERNETES_ROLE_AGENT.to_string(),
            ),
        ]);
        if let Some(class) = &self.snapshot_cpu_class {
            l.insert(labels::SNAPSHOT_CPU_CLASS.to_string(), class.clone());
        }
        if self.node_restricted {
            for k in Self::admin_labels() {
                l.remove(k);
            }
        }
        l
    }

    /// Applies the owned labels onto `existing`, keeping every other label; removes the
    /// snapshot CPU class label when unconfigured. Returns whether anything changed.
    pub fn apply_labels(&self, existing: &mut BTreeMap<String, String>) -> bool {
        let mut changed = false;
        for (k, v) in self.labels() {
            if existing.get(&k) != Some(&v) {
                existing.insert(k, v);
                changed = true;
            }
        }
        if self.snapshot_cpu_class.is_none()
            && existing.remove(labels::SNAPSHOT_CPU_CLASS).is_some()
        {
            changed = true;
        }
        changed
    }

    /// Applies labels, the provider taint (only if no taint with its key exists) and the
    /// providerID onto `node`'s metadata/spec. Returns whether anything changed. A
    /// node-restricted agent leaves an existing Node's taints alone (NodeRestriction refuses
    /// any taint change after create).
    pub fn apply_meta(&self, node: &mut Node) -> bool {
        self.apply_meta_with(node, !self.node_restricted)
    }

    fn apply_meta_with(&self, node: &mut Node, taint: bool) -> bool {
        let mut changed = self.apply_labels(node.metadata.labels.get_or_insert_default());
        let spec = node.spec.get_or_insert_default();
        let node_taints = spec.taints.get_or_insert_default();
        if taint && !placement::has_provider_taint(node_taints) {
            node_taints.push(placement::node_provider_taint());
            changed = true;
        }
        if let Some(id) = &self.provider_id
            && spec.provider_id.as_ref() != Some(id)
        {
            spec.provider_id = Some(id.clone());
            changed = true;
        }
        changed
    }

    /// A fresh Node for create: name, labels, taint, providerID (status is written separately
    /// because create ignores it).
    pub fn new_node(&self) -> Node {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: None,
        };
        self.apply_meta_with(&mut node, true);
        node
    }

    /// The full status: conditions stamped `heartbeat`, with `transition` as their transition
    /// time (the conditions never change, so it stays the registration time).
    pub fn status(&self, heartbeat: &Time, transition: &Time) -> NodeStatus {
        NodeStatus {
            conditions: Some(conditions(heartbeat, transition)),
            capacity: Some(self.resources.capacity.clone()),
            allocatable: Some(self.resources.allocatable.clone()),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: self.node_ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: self.node_name.clone(),
                },
            ]),
            daemon_endpoints: Some(self.daemon_endpoints()),
            node_info: Some(NodeSystemInfo {
                architecture: std::env::consts::ARCH.into(),
                operating_system: "linux".into(),
                os_image: "cocoon".into(),
                kernel_version: String::new(),
                kubelet_version: COCOON_VERSION.into(),
                container_runtime_version: format!("cocoon://{COCOON_VERSION}"),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn daemon_endpoints(&self) -> NodeDaemonEndpoints {
        NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(self.kubelet_port),
            }),
        }
    }

    /// True when `node` already carries the owned labels and the daemon endpoint.
    pub fn node_is_fixed_up(&self, node: &Node) -> bool {
        let mut labels = node.metadata.labels.clone().unwrap_or_default();
        let port_ok = node
            .status
            .as_ref()
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .is_some_and(|e| e.port == i32::from(self.kubelet_port));
        !self.apply_labels(&mut labels) && port_ok
    }
}

/// One fixed condition.
fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    heartbeat: &Time,
    transition: &Time,
) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(heartbeat.clone()),
        last_transition_time: Some(transition.clone()),
    }
}

/// The five fixed conditions of §2.2.
pub fn conditions(heartbeat: &Time, transition: &Time) -> Vec<NodeCondition> {
    let c = |t, s, r, m| condition(t, s, r, m, heartbeat, transition);
    vec![
        c("Ready", "True", "KubeletReady", "vk-cocoon is ready"),
        c(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "vk-cocoon has no disk pressure",
        ),
        c(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "vk-cocoon has sufficient memory",
        ),
        c(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "vk-cocoon has sufficient PID available",
        ),
        c(
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "NodeController create implicit route",
        ),
    ]
}

/// Keys of taints on `node` with the provider key (used by tests and diagnostics).
pub fn provider_taint_count(node: &Node) -> usize {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map_or(0, |ts| {
            ts.iter().filter(|t| t.key == taints::PROVIDER_KEY).count()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;
    use k8s_openapi::jiff::Timestamp;

    fn reg() -> NodeRegistration {
        NodeRegistration {
            node_name: "vk1".into(),
            pool: "gpu".into(),
            node_ip: "10.0.0.9".parse().expect("ip"),
            provider_id: Some("cocoon://vk1".into()),
            snapshot_cpu_class: None,
            kubelet_port: 10250,
            resources: Resources::default(),
            timings: Timings::default(),
            node_restricted: false,
        }
    }

    #[test]
    fn node_restricted_leaves_admin_labels_and_existing_taints_alone() {
        let r = reg().node_restricted(true);
        // Create: the taint goes on (NodeRestriction allows taints at create), the labels
        // NodeRestriction refuses from a node do not.
        let n = r.new_node();
        let l = n.metadata.labels.clone().expect("labels");
        assert!(!l.contains_key("node-role.kubernetes.io/cocoon-vm"));
        assert!(!l.contains_key("kubernetes.io/role"));
        assert_eq!(l["kubernetes.io/hostname"], "vk1");
        assert_eq!(l["cocoonstack.io/pool"], "gpu");
        assert_eq!(provider_taint_count(&n), 1);
        // Update: admin-set labels stay; a removed taint is not put back (no change at all).
        let mut n = n;
        n.metadata
            .labels
            .get_or_insert_default()
            .insert("node-role.kubernetes.io/cocoon-vm".into(), String::new());
        n.spec.as_mut().expect("spec").taints = None;
        assert!(!r.apply_meta(&mut n));
        assert_eq!(provider_taint_count(&n), 0);
        assert!(
            n.metadata
                .labels
                .expect("labels")
                .contains_key("node-role.kubernetes.io/cocoon-vm")
        );
        // An unrestricted agent puts the taint back.
        let mut m = reg().new_node();
        m.spec.as_mut().expect("spec").taints = None;
        assert!(reg().apply_meta(&mut m));
        assert_eq!(provider_taint_count(&m), 1);
    }

    #[test]
    fn new_node_shape() {
        let n = reg().new_node();
        let l = n.metadata.labels.clone().expect("labels");
        assert_eq!(l["cocoonstack.io/pool"], "gpu");
        assert_eq!(l["node-role.kubernetes.io/cocoon-vm"], "");
        assert_eq!(l["kubernetes.io/hostname"], "vk1");
        assert_eq!(l["type"], "virtual-kubelet");
        assert_eq!(l["kubernetes.io/role"], "agent");
        let spec = n.spec.expect("spec");
        assert_eq!(spec.provider_id.as_deref(), Some("cocoon://vk1"));
        let t = spec.taints.expect("taints");
        assert_eq!(t.len(), 1);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("virtual-kubelet.io/provider", Some("cocoon"), "NoSchedule")
        );
    }

    #[test]
    fn merge_preserves_labels_and_does_not_duplicate_taint() {
        let r = NodeRegistration {
            snapshot_cpu_class: Some("icelake".into()),
            ..reg()
        };
        let mut n = r.new_node();
        n.metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "a".into());
        // An admin-edited provider taint (other value) must be left alone, not duplicated.
        n.spec.as_mut().expect("spec").taints = Some(vec![Taint {
            key: "virtual-kubelet.io/provider".into(),
            value: Some("other".into()),
            effect: "NoExecute".into(),
            time_added: None,
        }]);
        assert!(!r.apply_meta(&mut n));
        assert_eq!(provider_taint_count(&n), 1);
        let l = n.metadata.labels.clone().expect("labels");
        assert_eq!(l["team"], "a");
        assert_eq!(l["cocoonstack.io/snapshot-cpu-class"], "icelake");
        // Unconfigured class → the label is removed.
        assert!(reg().apply_meta(&mut n));
        assert!(
            !n.metadata
                .labels
                .expect("labels")
                .contains_key("cocoonstack.io/snapshot-cpu-class")
        );
    }

    #[test]
    fn status_conditions_and_endpoints() {
        let now = Time(Timestamp::now());
        let s = reg().status(&now, &now);
        let conds = s.conditions.expect("conditions");
        let got: Vec<_> = conds
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("Ready", "True", Some("KubeletReady")),
                ("DiskPressure", "False", Some("KubeletHasNoDiskPressure")),
                (
                    "MemoryPressure",
                    "False",
                    Some("KubeletHasSufficientMemory")
                ),
                ("PIDPressure", "False", Some("KubeletHasSufficientPID")),
                ("NetworkUnavailable", "False", Some("RouteCreated")),
            ]
        );
        assert_eq!(conds[0].message.as_deref(), Some("vk-cocoon is ready"));
        let addrs = s.addresses.expect("addresses");
        assert_eq!(addrs[0].address, "10.0.0.9");
        assert_eq!(addrs[1].type_, "Hostname");
        assert_eq!(s.node_info.expect("info").kubelet_version, COCOON_VERSION);
        assert_eq!(
            s.daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|e| e.port),
            Some(10250)
        );
    }
}
