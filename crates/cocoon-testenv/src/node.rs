//! Schedulable fake Nodes for tests of the ground: a Node with status, a renewing Lease and a
//! Ready heartbeat, so the node-lifecycle controller lifts the not-ready taint.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::wait::{Probe, poll};

/// Label carrying the node pool, as the operator's nodeSelector uses it.
pub const POOL_LABEL: &str = "cocoonstack.io/pool";
/// The provider taint every cocoon node carries.
pub const PROVIDER_TAINT: &str = "virtual-kubelet.io/provider";
/// Taints the node-lifecycle controller manages.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// Namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Lease duration, like a kubelet's.
const LEASE_SECONDS: i32 = 40;
/// Heartbeat period: well inside the env's 15 s node-monitor grace period.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// A fake node with a background heartbeat. Delete it with [`TestNode::delete`]; dropping it
/// stops the heartbeat and deletes it best-effort.
pub struct TestNode {
    name: String,
    client: Client,
    heartbeat: Option<JoinHandle<()>>,
    deleted: bool,
}

impl std::fmt::Debug for TestNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNode")
            .field("name", &self.name)
            .field("heartbeat", &self.heartbeat.is_some())
            .field("deleted", &self.deleted)
            .finish()
    }
}

impl TestNode {
    /// Creates node `name` in `pool` with the standard cocoon labels and taint.
    pub async fn in_pool(client: &Client, name: &str, pool: &str) -> Result<TestNode> {
        Self::create(client, name, [(POOL_LABEL, pool)]).await
    }

    /// Creates node `name` with `labels` on top of the standard ones (hostname, pool
    /// `default` unless given, cocoon-vm role), reports it Ready, starts its Lease and
    /// heartbeat. Must run inside the Tokio runtime that will drive the heartbeat.
    pub async fn create<K, V>(
        client: &Client,
        name: &str,
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Result<TestNode>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let mut all = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), name.to_string()),
            (POOL_LABEL.to_string(), "default".to_string()),
            (
                "node-role.kubernetes.io/cocoon-vm".to_string(),
                String::new(),
            ),
            ("type".to_string(), "virtual-kubelet".to_string()),
            ("kubernetes.io/role".to_string(), "agent".to_string()),
        ]);
        all.extend(labels.into_iter().map(|(k, v)| (k.into(), v.into())));

        let nodes: Api<Node> = Api::all(client.clone());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(all),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: PROVIDER_TAINT.into(),
                    value: Some("cocoon".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                }]),
                ..Default::default()
            }),
            status: None,
        };
        let created = nodes.create(&PostParams::default(), &node).await?;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let mut test_node = TestNode {
            name: name.to_string(),
            client: client.clone(),
            heartbeat: None,
            deleted: false,
        };
        patch_status(&nodes, name).await?;
        renew_lease(client, name, &uid).await?;
        tracing::info!(node = name, "test node created");

        let (client, name_owned) = (client.clone(), name.to_string());
        test_node.heartbeat = Some(tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client.clone());
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate; we just reported
            loop {
                tick.tick().await;
                if let Err(e) = renew_lease(&client, &name_owned, &uid).await {
                    tracing::warn!(node = %name_owned, error = %e, "lease renew failed");
                }
                if let Err(e) = patch_status(&nodes, &name_owned).await {
                    tracing::warn!(node = %name_owned, error = %e, "node heartbeat failed");
                }
            }
        }));
        Ok(test_node)
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops renewing the Lease and heartbeat (to simulate a lost node).
    pub fn stop_heartbeat(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }

    /// Waits until the node is Ready and carries no not-ready/unreachable taint.
    pub async fn wait_schedulable(&self, timeout: Duration) -> Result<Node> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let name = self.name.as_str();
        poll(&format!("node {name} schedulable"), timeout, || {
            let nodes = nodes.clone();
            async move {
                match nodes.get_opt(name).await {
                    Ok(Some(n)) => match blocking_taints(&n) {
                        blocking if blocking.is_empty() && is_ready(&n) => Probe::Ready(n),
                        blocking => {
                            Probe::NotYet(format!("ready={} taints={blocking:?}", is_ready(&n)))
                        }
                    },
                    Ok(None) => Probe::Fail(Error::Invalid {
                        what: "test node".into(),
                        detail: format!("{name} disappeared"),
                    }),
                    Err(e) => Probe::NotYet(e.to_string()),
                }
            }
        })
        .await
    }

    /// Stops the heartbeat and deletes the Lease and the Node.
    pub async fn delete(mut self) -> Result<()> {
        self.stop_heartbeat();
        self.deleted = true;
        delete_node(&self.client, &self.name).await
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if self.deleted {
            return;
        }
        // Drop cannot await; spawn the delete on the current runtime. If the runtime is
        // shutting down it may not finish: names are unique, so a leftover only costs memory.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (client, name) = (self.client.clone(), self.name.clone());
            handle.spawn(async move {
                if let Err(e) = delete_node(&client, &name).await {
                    tracing::warn!(node = %name, error = %e, "best-effort node delete failed");
                }
            });
        }
    }
}

async fn delete_node(client: &Client, name: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    ignore_not_found(
        leases
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    ignore_not_found(
        nodes
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    tracing::info!(node = name, "test node deleted");
    Ok(())
}

fn ignore_not_found(r: std::result::Result<(), kube::Error>) -> Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => Ok(other?),
    }
}

/// Taints that keep ordinary pods off the node and are owned by the node-lifecycle
/// controller.
pub fn blocking_taints(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .filter(|t| t.key == NOT_READY_TAINT || t.key == UNREACHABLE_TAINT)
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default()
}

/// True when the node's `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// Reports the node Ready with fresh heartbeat times, capacity and a loopback address.
async fn patch_status(nodes: &Api<Node>, name: &str) -> Result<()> {
    let now = Time(Timestamp::now());
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", "8"),
        ("memory", "32Gi"),
        ("pods", "110"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    let status = NodeStatus {
        conditions: Some(vec![
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "testenv node is ready",
                &now,
            ),
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "testenv node has sufficient memory",
                &now,
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "testenv node has no disk pressure",
                &now,
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "testenv node has sufficient PID available",
                &now,
            ),
        ]),
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.into(),
            operating_system: "linux".into(),
            os_image: "cocoon-testenv".into(),
            kernel_version: "testenv".into(),
            kubelet_version: format!("{}-testenv", crate::paths::k8s_version()),
            container_runtime_version: "testenv://0".into(),
            boot_id: String::new(),
            machine_id: String::new(),
            system_uuid: String::new(),
            kube_proxy_version: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    };
    // A merge patch replaces the whole conditions list, which is what a heartbeat wants.
    let patch = serde_json::json!({ "status": status });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Creates the node's Lease (owned by the Node) or bumps its renew time.
async fn renew_lease(client: &Client, name: &str, node_uid: &str) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(Timestamp::now());
    let renew = serde_json::json!({
        "spec": { "holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now }
    });
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: Node::api_version(&()).into_owned(),
                kind: Node::kind(&()).into_owned(),
                name: name.to_string(),
                uid: node_uid.to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(now.clone()),
            acquire_time: Some(now),
            ..Default::default()
        }),
    };
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        // Raced with another renewer (a previous heartbeat); the patch path wins next time.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
