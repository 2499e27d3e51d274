//! The shipped node-agent scrape (issue 36 item 3) against the real binary: a real
//! `cocoon-operator node` (simulated runtime) registers its Node on the test control plane and
//! runs a VM; the test then does what Prometheus does with the shipped ScrapeConfig
//! (manifests/components/monitoring/node-scrapeconfig.yaml): node discovery over the live Node
//! objects, the shipped `keep` relabeling, the target address from the node's InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.port`, and an HTTPS `GET /metrics` with the bearer
//! token of a ServiceAccount bound to the shipped `cocoon-node-metrics-reader` rules. The answer
//! is the agent's own registry (the VM it created is counted there); without a token it is 401,
//! with a token of an identity without those rules 403. A plain Node (no cocoon labels) is not
//! kept. TLS is not verified here (`curl -k`, as `insecureSkipVerify`): the agent runs on its
//! self-signed fallback certificate; the node crate's tests pin it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_testenv::{
    Shared, bind_cluster_role, create_namespace, delete_namespace, service_account_token,
    unique_name, wait_until,
};
use cocoon_testsupport::binaries::{LoggedChild, sim_node_command};
use cocoon_testsupport::{BoxError, vm_pod};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const BIN: &str = env!("CARGO_BIN_EXE_cocoon-operator");

fn component(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests/components/monitoring")
        .join(file)
}

/// The documents of a shipped YAML file.
fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(component(file)).expect("read the shipped manifest");
    serde_saphyr::from_multiple(&text).expect("a YAML stream")
}

fn of_kind(docs: &[Value], kind: &str) -> Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} shipped"))
}

/// Prometheus' name for a node label's meta label (`SanitizeLabelName`).
fn meta_label(label: &str) -> String {
    let clean: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("__meta_kubernetes_node_label_{clean}")
}

/// The shipped `keep` relabeling of the ScrapeConfig applied to one Node's meta labels:
/// the source labels' values joined with `;` must match the (anchored) regex. The shipped
/// regex is a literal followed by `.+`; anything else fails here loudly rather than being
/// matched wrongly.
fn kept(scrape: &Value, node: &Node) -> bool {
    let labels: BTreeMap<String, String> = node
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (meta_label(&k), v))
        .collect();
    let rules = scrape["spec"]["relabelings"]
        .as_array()
        .expect("relabelings");
    rules.iter().all(|rule| {
        assert_eq!(
            rule["action"], "keep",
            "only keep rules are shipped: {rule}"
        );
        let joined = rule["sourceLabels"]
            .as_array()
            .expect("sourceLabels")
            .iter()
            .map(|l| {
                labels
                    .get(l.as_str().expect("a label name"))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join(";");
        let regex = rule["regex"].as_str().expect("regex");
        let literal = regex.strip_suffix(".+").expect("a literal then .+");
        assert!(
            literal
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ';'),
            "{regex}: not a plain literal"
        );
        joined.len() > literal.len() && joined.starts_with(literal)
    })
}

/// The target node discovery gives a Node, as Prometheus builds it: the first InternalIP
/// (then ExternalIP, Hostname) and the kubelet endpoint port.
fn target(node: &Node) -> Option<String> {
    let status = node.status.as_ref()?;
    let addresses = status.addresses.as_ref()?;
    let addr = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| addresses.iter().find(|a| a.type_ == *t))?;
    let port = status
        .daemon_endpoints
        .as_ref()?
        .kubelet_endpoint
        .as_ref()?
        .port;
    (port > 0).then(|| format!("{}:{port}", addr.address))
}

/// `GET https://<target>/metrics` with an optional bearer token (`curl -k`): status, body.
fn scrape(target: &str, token: Option<&str>) -> Result<(u16, String), BoxError> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "20", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd.arg(format!("https://{target}/metrics")).output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').ok_or("no status from curl")?;
    Ok((code.trim().parse()?, body.to_string()))
}

/// The shipped reader ClusterRole's rules under a unique `name`, bound to `ns/sa`.
async fn bind_shipped_reader(
    client: &kube::Client,
    name: &str,
    ns: &str,
    sa: &str,
) -> Result<(), BoxError> {
    let mut role: ClusterRole =
        serde_json::from_value(of_kind(&documents("node-metrics-rbac.yaml"), "ClusterRole"))?;
    role.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    Ok(bind_cluster_role(client, role, ns, sa).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_scrape_config_reaches_a_real_node_agent() {
    cocoon_testenv::run_test(|env| async move {
        let admin = env.client()?;
        let ns = create_namespace(&admin, "node-scrape").await?;
        let node = unique_name("scraped-node");
        let plain = unique_name("plain-kubelet");
        let role = unique_name("node-metrics-reader");
        let tmp = tempfile::tempdir()?;
        let agent = spawn_agent(env, &node, &tmp.path().join("root"))?;
        let result = scenario(&admin, &ns, &node, &plain, &role).await;
        let _ = agent_stop(agent).await;
        let _ = Api::<ClusterRoleBinding>::all(admin.clone())
            .delete(&role, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(admin.clone())
            .delete(&role, &DeleteParams::default())
            .await;
        let nodes: Api<Node> = Api::all(admin.clone());
        for n in [&node, &plain] {
            let _ = nodes.delete(n, &DeleteParams::default()).await;
        }
        delete_namespace(&admin, &ns).await?;
        result
    })
    .await;
}

fn spawn_agent(env: &Shared, node: &str, root: &Path) -> Result<LoggedChild, BoxError> {
    std::fs::create_dir_all(root)?;
    let mut cmd = sim_node_command(
        BIN,
        env.kubeconfig_path(),
        env.registry_addr(),
        node,
        &unique_name("pool"),
        root,
    );
    cmd.env("VK_SIM_PERMISSIVE_PULL", "true");
    Ok(LoggedChild::spawn(cmd)?)
}

async fn agent_stop(mut agent: LoggedChild) -> std::io::Result<()> {
    agent.child.start_kill()?;
    let _ = tokio::time::timeout(WAIT, agent.child.wait()).await;
    Ok(())
}

async fn scenario(
    admin: &kube::Client,
    ns: &str,
    node: &str,
    plain: &str,
    role: &str,
) -> Result<(), BoxError> {
    let scrape_config = of_kind(&documents("node-scrapeconfig.yaml"), "ScrapeConfig");
    assert_eq!(scrape_config["spec"]["jobName"], "cocoon-node");
    assert_eq!(scrape_config["spec"]["scheme"], "HTTPS");
    assert_eq!(scrape_config["spec"]["metricsPath"], "/metrics");
    assert_eq!(
        scrape_config["spec"]["kubernetesSDConfigs"],
        serde_json::json!([{"role": "Node"}])
    );

    // A Node of a plain kubelet: discovered, not kept.
    let nodes: Api<Node> = Api::all(admin.clone());
    let plain_node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": plain, "labels": {"kubernetes.io/hostname": plain}},
    }))?;
    nodes.create(&PostParams::default(), &plain_node).await?;

    // Node discovery: the agent's Node, once registered with its kubelet endpoint.
    let registered = wait_until(
        "the agent's Node with its kubelet endpoint",
        WAIT,
        || async {
            let n = nodes.get_opt(node).await.ok().flatten()?;
            target(&n).is_some().then_some(n)
        },
    )
    .await?;
    let discovered = nodes.list(&Default::default()).await?;
    let kept: Vec<String> = discovered
        .items
        .iter()
        .filter(|n| kept(&scrape_config, n))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert!(kept.iter().any(|n| n == node), "{node} not kept: {kept:?}");
    assert!(
        !kept.iter().any(|n| n == plain),
        "a plain kubelet was kept: {kept:?}"
    );
    let address = target(&registered).ok_or("no target")?;
    assert!(
        address.starts_with("127.0.0.1:"),
        "InternalIP first: {address}"
    );

    // Some work counted in the agent's registry: a pod's VM.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    pods.create(&PostParams::default(), &vm_pod(ns, "vm-0", node, &[]))
        .await?;
    wait_until("the pod's VM running", WAIT, || async {
        let p = pods.get_opt("vm-0").await.ok().flatten()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (running && p.metadata.annotations.as_ref()?.contains_key(ann::VM_ID)).then_some(())
    })
    .await?;

    // Refused: no token 401, a token of an identity without the reader rules 403.
    assert_eq!(scrape(&address, None)?.0, 401);
    let stranger = service_account_token(admin, ns, "stranger").await?;
    let (code, body) = scrape(&address, Some(&stranger))?;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource(s)=[metrics]"), "{body}");

    // The scrape identity: the shipped rules, its ServiceAccount's token.
    let scraper = service_account_token(admin, ns, "scraper").await?;
    bind_shipped_reader(admin, role, ns, "scraper").await?;
    let body = wait_until(
        "the agent's own metrics on the kubelet port",
        WAIT,
        || async {
            let (code, body) = scrape(&address, Some(&scraper)).ok()?;
            (code == 200
                && body.contains("\ncocoon_vk_vm_table_size 1\n")
                && body.contains("cocoon_vk_pod_lifecycle_total{"))
            .then_some(body)
        },
    )
    .await?;
    for name in [
        "cocoon_vk_node_memory_used_bytes ",
        "cocoon_vk_node_storage_available_bytes ",
        "cocoon_vk_node_cpu_seconds_total ",
        "process_start_time_seconds ",
    ] {
        assert!(body.contains(name), "missing {name:?} in\n{body}");
    }
    Ok(())
}
