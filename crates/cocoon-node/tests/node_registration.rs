//! Node registration against the real control plane of cocoon-testenv: the registered node
//! turns Ready, its Lease renews, the controller-manager lifts `node.kubernetes.io/not-ready`
//! and the real scheduler binds a pool pod to it; re-registration keeps foreign labels and
//! never duplicates the provider taint; fix-up and Lease recreation repair tampering.

use std::collections::BTreeMap;
use std::time::Duration;

use cocoon_api::contract::placement;
use cocoon_node::config::{NodeConfig, Timings};
use cocoon_node::node::object::provider_taint_count;
use cocoon_node::node::{
    LEASE_NAMESPACE, NodeHeartbeat, NodeRegistration, capacity, fixup_once, register_or_update,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const WAIT: Duration = Duration::from_secs(90);

fn config(node: &str, pool: &str, root: &std::path::Path) -> NodeConfig {
    let root = root.display().to_string();
    let env: BTreeMap<&str, String> = [
        ("VK_NODE_NAME", node.to_string()),
        ("VK_NODE_POOL", pool.to_string()),
        ("VK_NODE_IP", "127.0.0.1".to_string()),
        ("OCI_REGISTRY", "http://127.0.0.1:5000".to_string()),
        ("COCOON_ROOT_DIR", root),
        ("VK_KUBELET_PORT", "10250".to_string()),
    ]
    .into();
    let mut cfg = NodeConfig::from_lookup(|k| env.get(k).cloned(), || None).expect("config");
    // Shorter than the spec's cadence so the test sees renewals quickly; the status refresh
    // still sits inside the env's 15 s node-monitor grace, as in production.
    cfg.timings = Timings {
        lease_renew: Duration::from_secs(2),
        status_refresh: Duration::from_secs(3),
        fixup_delay: Duration::from_millis(500),
        fixup_interval: Duration::from_millis(500),
        ..Timings::default()
    };
    cfg
}

fn registration(cfg: &NodeConfig) -> NodeRegistration {
    let resources = capacity::read_resources(cfg).expect("capacity");
    NodeRegistration::from_config(cfg, resources, cfg.kubelet_port)
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn cleanup(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let _ = leases.delete(name, &DeleteParams::default()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(name, &DeleteParams::default()).await;
}

async fn renew_time(leases: &Api<Lease>, name: &str) -> Option<String> {
    let lease = leases.get_opt(name).await.ok()??;
    lease.spec?.renew_time.map(|t| t.0.to_string())
}

#[tokio::test]
async fn node_becomes_ready_schedulable_and_keeps_its_lease() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let name = cocoon_testenv::unique_name("vk-reg");
        let pool = cocoon_testenv::unique_name("pool");
        let root = tempfile::tempdir()?;
        let cfg = config(&name, &pool, root.path());
        let reg = registration(&cfg);
        let nodes: Api<Node> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);

        let result: TestResult = async {
            let stored = register_or_update(&client, &reg).await?;
            let labels = stored.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("cocoonstack.io/pool"), Some(&pool));
            assert_eq!(labels.get("kubernetes.io/hostname"), Some(&name));
            assert_eq!(provider_taint_count(&stored), 1);
            let status = stored.status.clone().unwrap_or_default();
            assert_eq!(
                status
                    .daemon_endpoints
                    .and_then(|d| d.kubelet_endpoint)
                    .map(|e| e.port),
                Some(10250)
            );
            assert!(status.capacity.unwrap_or_default().contains_key("pods"));

            let shutdown = CancellationToken::new();
            let heartbeat = NodeHeartbeat::start(client.clone(), reg.clone(), &shutdown);

            // The controller-manager lifts the admission-added not-ready taint once the node
            // reports Ready and renews its Lease.
            cocoon_testenv::wait_until("node ready and untainted", WAIT, || {
                let nodes = nodes.clone();
                let name = name.clone();
                async move {
                    let n = nodes.get_opt(&name).await.ok()??;
                    (ready(&n) && !has_taint(&n, "node.kubernetes.io/not-ready")).then_some(())
                }
            })
            .await?;

            let first = cocoon_testenv::wait_until("lease exists", WAIT, || {
                let leases = leases.clone();
                let name = name.clone();
                async move { renew_time(&leases, &name).await }
            })
            .await?;
            let lease = leases.get(&name).await?;
            let owner = lease.metadata.owner_references.unwrap_or_default();
            assert_eq!(owner.first().map(|o| o.kind.as_str()), Some("Node"));
            assert_eq!(lease.spec.and_then(|s| s.lease_duration_seconds), Some(40));
            cocoon_testenv::wait_until("lease renewed", WAIT, || {
                let leases = leases.clone();
                let (name, first) = (name.clone(), first.clone());
                async move { renew_time(&leases, &name).await.filter(|t| *t != first) }
            })
            .await?;

            // The real scheduler binds a pod carrying the contract's tolerations and pool.
            let ns = cocoon_testenv::create_namespace(&client, "vk-reg").await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let pod = Pod {
                metadata: ObjectMeta {
                    name: Some("agent-0".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "agent".into(),
                        image: Some("cocoon/vm".into()),
                        ..Default::default()
                    }],
                    tolerations: Some(placement::pod_tolerations()),
                    node_selector: Some(placement::pod_node_selector(&pool, "")),
                    ..Default::default()
                }),
                status: None,
            };
            pods.create(&PostParams::default(), &pod).await?;
            let bound = cocoon_testenv::wait_until("pod bound", WAIT, || {
                let pods = pods.clone();
                async move {
                    let p = pods.get_opt("agent-0").await.ok()??;
                    p.spec.and_then(|s| s.node_name)
                }
            })
            .await?;
            assert_eq!(bound, name);
            cocoon_testenv::delete_namespace(&client, &ns).await?;

            // The Lease is recreated when it disappears.
            leases.delete(&name, &DeleteParams::default()).await?;
            cocoon_testenv::wait_until("lease recreated", WAIT, || {
                let leases = leases.clone();
                let name = name.clone();
                async move { renew_time(&leases, &name).await }
            })
            .await?;

            assert!(heartbeat.is_running());
            heartbeat.stop().await;
            Ok(())
        }
        .await;
        cleanup(&client, &name).await;
        result
    })
    .await;
}

#[tokio::test]
async fn reregistration_preserves_labels_and_taint_and_fixup_repairs() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let name = cocoon_testenv::unique_name("vk-rereg");
        let root = tempfile::tempdir()?;
        let cfg = config(&name, "default", root.path());
        let reg = registration(&cfg);
        let nodes: Api<Node> = Api::all(client.clone());

        let result: TestResult = async {
            register_or_update(&client, &reg).await?;
            // An administrator adds a label and the snapshot class label is stale.
            let patch = serde_json::json!({"metadata": {"labels": {
                "team": "infra",
                "cocoonstack.io/snapshot-cpu-class": "old",
            }}});
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;

            let again = register_or_update(&client, &reg).await?;
            let labels = again.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("team").map(String::as_str), Some("infra"));
            assert!(!labels.contains_key("cocoonstack.io/snapshot-cpu-class"));
            assert_eq!(provider_taint_count(&again), 1);
            // Admission's not-ready taint (if still there) must survive our update too.
            let taints = again.spec.and_then(|s| s.taints).unwrap_or_default();
            assert!(taints.iter().all(|t| !t.key.is_empty()));

            // Tamper: drop an owned label and point the daemon endpoint elsewhere.
            let tamper = serde_json::json!({"metadata": {"labels": {"type": null}}});
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&tamper))
                .await?;
            let port = serde_json::json!({"status": {"daemonEndpoints": {"kubeletEndpoint": {"port": 1}}}});
            nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&port))
                .await?;
            assert!(!fixup_once(&client, &reg).await?, "tampered node needs a fix-up");
            assert!(fixup_once(&client, &reg).await?, "fixed node needs none");
            let fixed = nodes.get(&name).await?;
            assert_eq!(
                fixed.metadata.labels.unwrap_or_default().get("type").map(String::as_str),
                Some("virtual-kubelet")
            );
            Ok(())
        }
        .await;
        cleanup(&client, &name).await;
        result
    })
    .await;
}
