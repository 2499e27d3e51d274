//! The kubelet HTTPS API and the `/metrics` listener, served for real on loopback: logs
//! through a test PodBackend (with and without a live VM), the not-implemented routes, the
//! stats endpoints, the spec's metric names on `/metrics`, and the same registry on the
//! kubelet port's `/metrics` behind `get nodes/metrics` (issue 36 item 3).

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use cocoon_node::kubelet::{
    ATTACH_NOT_IMPLEMENTED, BackendError, ExecError, ExecIo, KubeletServer, MetricsServer,
    NO_LIVE_VM_BODY, PORT_FORWARD_NOT_IMPLEMENTED, PodBackend, PodStats, TlsMaterial,
};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::HostReader;
use std::sync::atomic::{AtomicUsize, Ordering};

use cocoon_testenv::{
    create_namespace, delete_namespace, run_test, service_account_token, unique_name,
};
use common::kubelet::{self, Creds, TestCa};
use common::{TestResult, apiserver_kubelet_client, kubelet_security};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::api::{Api, DeleteParams, ObjectMeta};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// One pod with a VM (`ns/live`), everything else has none. Counts the calls that reached it.
#[derive(Default)]
struct FakePods {
    calls: AtomicUsize,
}

impl FakePods {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl PodBackend for FakePods {
    async fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail: u32,
        _max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, BackendError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match (namespace, pod) {
            ("ns", "live") => Ok(Some(
                format!("log of {container}, tail {tail}\n").into_bytes(),
            )),
            ("ns", "broken") => Err(BackendError("cocoon vm logs: exit 3".into())),
            _ => Ok(None),
        }
    }

    async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        _io: ExecIo,
    ) -> Result<(), ExecError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(ExecError::NoLiveVm {
            namespace: namespace.into(),
            pod: pod.into(),
        })
    }

    async fn stats(&self) -> Result<Vec<PodStats>, BackendError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![PodStats {
            namespace: "ns".into(),
            name: "live".into(),
            uid: "u-1".into(),
            cpu_usage_ns: 2_500_000_000,
            memory_rss_bytes: 4096,
            network_rx_bytes: 10,
            network_tx_bytes: 20,
        }])
    }
}

fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_string())
}

async fn start_server(
    node: &str,
    pods: Arc<FakePods>,
    security: cocoon_node::kubelet::ApiSecurity,
    root: &std::path::Path,
    cancel: &CancellationToken,
) -> KubeletServer {
    let metrics = Arc::new(NodeMetrics::new(root));
    start_server_with(node, pods, security, root, metrics, cancel).await
}

/// [`start_server`] serving `metrics` on `/metrics`.
async fn start_server_with(
    node: &str,
    pods: Arc<FakePods>,
    security: cocoon_node::kubelet::ApiSecurity,
    root: &std::path::Path,
    metrics: Arc<NodeMetrics>,
    cancel: &CancellationToken,
) -> KubeletServer {
    let tls = TlsMaterial::self_signed(node, "127.0.0.1".parse().expect("ip")).expect("tls");
    KubeletServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        &tls,
        security,
        pods,
        HostReader::new(root.to_path_buf()),
        metrics,
        node,
        cancel,
    )
    .await
    .expect("start")
}

/// One request to `server` with `creds`; a TLS failure is `Err`.
async fn call(
    server: &KubeletServer,
    method: &str,
    path: &str,
    creds: &Creds,
) -> Result<(u16, String), String> {
    kubelet::request(
        server.local_addr(),
        server.certificate_der(),
        method,
        path,
        creds,
    )
    .await
}

#[tokio::test]
async fn kubelet_api_over_https() {
    run_test(|env| async move {
    let cancel = CancellationToken::new();
    let root = tempfile::tempdir()?;
    let node = unique_name("vk-api");
    let server = start_server(
        &node,
        Arc::new(FakePods::default()),
        kubelet_security(env, &node, &[], false)?,
        root.path(),
        &cancel,
    )
    .await;
    // The API server's own kubelet client identity, as `kubectl logs` reaches the agent.
    let creds = Creds::cert(apiserver_kubelet_client(env)?);
    let https_get = |method: &'static str, path: &'static str| {
        let (server, creds) = (&server, &creds);
        async move { call(server, method, path, creds).await.expect("request") }
    };
    assert_ne!(server.port(), 0);

    let (code, body) = https_get("GET", "/containerLogs/ns/live/agent?tailLines=7").await;
    assert_eq!((code, body.as_str()), (200, "log of agent, tail 7\n"));
    let (code, body) = https_get("GET", "/containerLogs/ns/live/agent").await;
    assert_eq!((code, body.as_str()), (200, "log of agent, tail 200\n"));
    let (code, body) = https_get("GET", "/containerLogs/ns/gone/agent").await;
    assert_eq!((code, body.as_str()), (200, NO_LIVE_VM_BODY));
    let (code, body) = https_get("GET", "/containerLogs/ns/broken/agent").await;
    assert_eq!(code, 500);
    assert!(body.contains("exit 3"), "{body}");

    let (code, body) = https_get("POST", "/attach/ns/live/agent?stdout=1").await;
    assert_eq!((code, body.as_str()), (501, ATTACH_NOT_IMPLEMENTED));
    let (code, body) = https_get("POST", "/portForward/ns/live").await;
    assert_eq!((code, body.as_str()), (501, PORT_FORWARD_NOT_IMPLEMENTED));

    let (code, body) = https_get("GET", "/stats/summary").await;
    assert_eq!(code, 200);
    let summary: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(summary["node"]["nodeName"], node.as_str());
    assert_eq!(summary["pods"][0]["podRef"]["name"], "live");
    assert_eq!(
        summary["pods"][0]["cpu"]["usageCoreNanoSeconds"],
        2_500_000_000u64
    );
    assert_eq!(summary["pods"][0]["memory"]["workingSetBytes"], 4096);
    assert_eq!(summary["pods"][0]["network"]["rxBytes"], 10);
    assert_eq!(summary["pods"][0]["containers"][0]["name"], "agent");

    let (code, body) = https_get("GET", "/metrics/resource").await;
    assert_eq!(code, 200);
    for want in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
        "container_cpu_usage_seconds_total{container=\"agent\",namespace=\"ns\",pod=\"live\"} 2.5",
        "container_memory_working_set_bytes{container=\"agent\",namespace=\"ns\",pod=\"live\"} 4096",
        "pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"live\"} 2.5",
        "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"live\"} 4096",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }

    server.shutdown().await;
    TestResult::Ok(())
    })
    .await;
}

/// A ClusterRole granting `nodes/proxy` get+create, bound to `ns/sa`.
async fn grant_node_proxy(client: &kube::Client, name: &str, ns: &str, sa: &str) -> TestResult {
    grant(
        client,
        name,
        ns,
        sa,
        PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes/proxy".into()]),
            verbs: vec!["get".into(), "create".into()],
            ..Default::default()
        },
    )
    .await
}

/// A ClusterRole `name` with the one `rule`, bound to `ns/sa` by a ClusterRoleBinding `name`.
async fn grant(
    client: &kube::Client,
    name: &str,
    ns: &str,
    sa: &str,
    rule: PolicyRule,
) -> TestResult {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        rules: Some(vec![rule]),
        ..Default::default()
    };
    Ok(cocoon_testenv::bind_cluster_role(client, role, ns, sa).await?)
}

/// The kubelet's authentication and authorization on the real API server: no credentials
/// (401), a certificate of a foreign CA (TLS failure), an unknown token (401), identities
/// without `nodes/*` rights (403), a ServiceAccount with `nodes/proxy` (200 on proxy routes,
/// 403 on stats), the API server's kubelet client (200); refused requests never reach a VM.
/// Anonymous access is opt-in and still needs authorization.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_api_authenticates_and_authorizes_like_a_kubelet() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "kubelet-auth").await?;
        let node = unique_name("vk-auth");
        let cancel = CancellationToken::new();
        let root = tempfile::tempdir()?;
        let users_ca = TestCa::new("test-users");
        let foreign_ca = TestCa::new("foreign");
        let pods = Arc::new(FakePods::default());
        let server = start_server(
            &node,
            pods.clone(),
            kubelet_security(env, &node, &[users_ca.der()], false)?,
            root.path(),
            &cancel,
        )
        .await;
        let nobody = service_account_token(&client, &ns, "nobody").await?;
        let proxier = service_account_token(&client, &ns, "proxier").await?;
        let role = unique_name("kubelet-auth-proxy");
        grant_node_proxy(&client, &role, &ns, "proxier").await?;

        let logs = "/containerLogs/ns/live/agent";
        let exec = "/exec/ns/live/agent?command=true&stdout=1";
        let status = |r: Result<(u16, String), String>| r.map(|(code, _)| code);

        // No credentials: 401 everywhere, also on routes that do not exist.
        for (method, path) in [("GET", logs), ("POST", exec), ("GET", "/stats/summary"), ("GET", "/healthz"), ("GET", "/nope")] {
            assert_eq!(status(call(&server, method, path, &Creds::none()).await), Ok(401), "{method} {path}");
        }
        // A certificate from another CA: the handshake fails (or, at worst, 401).
        let foreign = Creds::cert(foreign_ca.client("kube-apiserver-kubelet-client", &["system:masters"]));
        match call(&server, "GET", logs, &foreign).await {
            Err(_) | Ok((401, _)) => {}
            other => panic!("a foreign certificate got {other:?}"),
        }
        // A token the API server does not know: 401.
        assert_eq!(status(call(&server, "GET", logs, &Creds::token("not-a-token")).await), Ok(401));
        // Authenticated without rights: 403, by token and by certificate of the configured CA.
        let stranger = Creds::cert(users_ca.client("stranger", &["some-team"]));
        for creds in [&Creds::token(&nobody), &stranger] {
            for (method, path) in [("GET", logs), ("POST", exec), ("GET", "/stats/summary")] {
                let r = call(&server, method, path, creds).await;
                assert_eq!(status(r.clone()), Ok(403), "{method} {path}: {r:?}");
            }
        }
        let (_, forbidden) = call(&server, "POST", exec, &Creds::token(&nobody)).await.map_err(|e| e.to_string())?;
        assert!(
            forbidden.contains(&format!("user=system:serviceaccount:{ns}:nobody, verb=create, resource=nodes, subresource(s)=[proxy]")),
            "{forbidden}"
        );
        assert_eq!(pods.calls(), 0, "a refused request reached the pod side");

        // nodes/proxy: the proxy routes (container logs) but not stats.
        let r = call(&server, "GET", logs, &Creds::token(&proxier)).await;
        assert_eq!(r, Ok((200, "log of agent, tail 200\n".to_string())));
        assert_eq!(status(call(&server, "GET", "/stats/summary", &Creds::token(&proxier)).await), Ok(403));
        assert_eq!(pods.calls(), 1);
        // The API server's kubelet client (system:kubelet-api-admin): everything.
        let apiserver = Creds::cert(apiserver_kubelet_client(env)?);
        assert_eq!(status(call(&server, "GET", logs, &apiserver).await), Ok(200));
        assert_eq!(status(call(&server, "GET", "/stats/summary", &apiserver).await), Ok(200));
        assert_eq!(pods.calls(), 3);
        server.shutdown().await;

        // Anonymous access, opted in: no longer 401, but system:anonymous has no rights.
        let open = start_server(
            &node,
            pods.clone(),
            kubelet_security(env, &node, &[], true)?,
            root.path(),
            &cancel,
        )
        .await;
        let r = call(&open, "GET", logs, &Creds::none()).await;
        assert!(matches!(&r, Ok((403, body)) if body.contains("user=system:anonymous")), "{r:?}");
        assert_eq!(pods.calls(), 3);
        open.shutdown().await;

        let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(&role, &DeleteParams::default()).await;
        let _ = Api::<ClusterRole>::all(client.clone()).delete(&role, &DeleteParams::default()).await;
        delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn metrics_listener_serves_spec_names() {
    let cancel = CancellationToken::new();
    let root = tempfile::tempdir().expect("tempdir");
    let metrics = Arc::new(NodeMetrics::new(root.path()));
    metrics.pod_lifecycle("delete", "skipped", "no_vm");
    metrics.wake("ok");
    // Labelled families appear once a series exists; unlabelled ones are always present.
    metrics.vm_boot("clone", "sim", 1.0);
    let server = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), metrics, &cancel)
        .await
        .expect("start");

    let mut tcp = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.expect("read");
    let (code, body) = parse_response(&raw);
    assert_eq!(code, 200);
    for want in [
        "cocoon_vk_pod_lifecycle_total{op=\"delete\",result=\"skipped\",reason=\"no_vm\"} 1",
        "cocoon_vk_wake_total{result=\"ok\"} 1",
        "cocoon_vk_vm_boot_duration_seconds_bucket{le=\"1.0\",mode=\"clone\",backend=\"sim\"} 1",
        "# TYPE cocoon_vk_snapshot_push_duration_seconds histogram",
        "cocoon_vk_vm_table_size 0",
        "cocoon_vk_node_storage_available_bytes ",
        "cocoon_vk_node_memory_used_bytes ",
        "cocoon_vk_node_cpu_seconds_total ",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    cancel.cancel();
    server.shutdown().await;
}

/// `get nodes/metrics` on the named node only (what a Prometheus identity needs, narrowed to
/// one node so the test can tell nodes apart).
fn node_metrics_on(node: &str) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["nodes/metrics".into()]),
        resource_names: Some(vec![node.to_owned()]),
        verbs: vec!["get".into()],
        ..Default::default()
    }
}

/// The lines of an exposition that do not change between two scrapes of an idle agent: all
/// but the values of the node and process collectors (read from `/proc` and statfs at scrape
/// time, so they move); their HELP and TYPE lines stay.
fn stable_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with("cocoon_vk_node_") && !l.starts_with("process_"))
        .collect()
}

/// Issue 36 item 3: the kubelet port serves the agent's own registry on `/metrics`, authorized
/// as a kubelet authorizes it (`get nodes/metrics` on this node): a ServiceAccount allowed that
/// scrapes the spec's `cocoon_vk_*` names, the very text the `VK_METRICS_ADDR` listener serves
/// (and live: a counter bumped after start shows); no credentials is 401; an identity with
/// only `nodes/proxy`, with nothing, or with `nodes/metrics` on another node is 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_port_serves_node_metrics_to_nodes_metrics_readers_only() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "kubelet-metrics").await?;
        let node = unique_name("vk-metrics");
        let other_node = unique_name("vk-metrics-other");
        let cancel = CancellationToken::new();
        let root = tempfile::tempdir()?;
        let metrics = Arc::new(NodeMetrics::new(root.path()));
        metrics.wake("ok");
        metrics.vm_boot("clone", "sim", 1.0);
        let pods = Arc::new(FakePods::default());
        let server = start_server_with(
            &node,
            pods.clone(),
            kubelet_security(env, &node, &[], false)?,
            root.path(),
            metrics.clone(),
            &cancel,
        )
        .await;
        let local = MetricsServer::start("127.0.0.1:0".parse()?, metrics.clone(), &cancel).await?;

        let scraper = service_account_token(&client, &ns, "scraper").await?;
        let elsewhere = service_account_token(&client, &ns, "elsewhere").await?;
        let proxier = service_account_token(&client, &ns, "proxier").await?;
        let nobody = service_account_token(&client, &ns, "nobody").await?;
        let roles = [
            unique_name("node-metrics-here"),
            unique_name("node-metrics-there"),
            unique_name("node-metrics-proxy"),
        ];
        grant(&client, &roles[0], &ns, "scraper", node_metrics_on(&node)).await?;
        grant(&client, &roles[1], &ns, "elsewhere", node_metrics_on(&other_node)).await?;
        grant_node_proxy(&client, &roles[2], &ns, "proxier").await?;

        // Refused: no credentials (401); nothing, only nodes/proxy, nodes/metrics elsewhere (403).
        let r = call(&server, "GET", "/metrics", &Creds::none()).await;
        assert_eq!(r.map(|(code, _)| code), Ok(401));
        for (who, token) in [("nobody", &nobody), ("proxier", &proxier), ("elsewhere", &elsewhere)] {
            let r = call(&server, "GET", "/metrics", &Creds::token(token)).await;
            assert!(
                matches!(&r, Ok((403, body)) if body.contains(&format!(
                    "user=system:serviceaccount:{ns}:{who}, verb=get, resource=nodes, subresource(s)=[metrics]"
                ))),
                "{who}: {r:?}"
            );
        }

        // Allowed: the spec's node-agent names, in the OpenMetrics text of the local listener.
        let (code, body) = call(&server, "GET", "/metrics", &Creds::token(&scraper)).await?;
        assert_eq!(code, 200, "{body}");
        for want in [
            "cocoon_vk_wake_total{result=\"ok\"} 1",
            "cocoon_vk_vm_boot_duration_seconds_bucket{le=\"1.0\",mode=\"clone\",backend=\"sim\"} 1",
            "cocoon_vk_pod_evict_failure_total 0",
            "# TYPE cocoon_vk_snapshot_push_duration_seconds histogram",
            "cocoon_vk_vm_table_size 0",
            "cocoon_vk_node_cpu_seconds_total ",
            "cocoon_vk_node_memory_used_bytes ",
            "cocoon_vk_node_storage_available_bytes ",
            "cocoon_vk_node_storage_total_bytes ",
        ] {
            assert!(body.contains(want), "missing {want:?} in\n{body}");
        }
        assert!(body.trim_end().ends_with("# EOF"), "not OpenMetrics:\n{body}");
        let (code, plain) = parse_response(&get_plain(local.local_addr(), "/metrics").await?);
        assert_eq!(code, 200);
        assert_eq!(stable_lines(&body), stable_lines(&plain), "the two listeners differ");
        // The live registry, not a copy: a counter bumped now shows on the next scrape.
        metrics.wake("failed");
        let (_, again) = call(&server, "GET", "/metrics", &Creds::token(&scraper)).await?;
        assert!(again.contains("cocoon_vk_wake_total{result=\"failed\"} 1"), "{again}");
        // nodes/metrics covers /metrics/resource too (the kubelet's mapping), not stats.
        let r = call(&server, "GET", "/metrics/resource", &Creds::token(&scraper)).await;
        assert_eq!(r.map(|(code, _)| code), Ok(200));
        let r = call(&server, "GET", "/stats/summary", &Creds::token(&scraper)).await;
        assert_eq!(r.map(|(code, _)| code), Ok(403));

        server.shutdown().await;
        local.shutdown().await;
        for role in &roles {
            let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(role, &DeleteParams::default()).await;
            let _ = Api::<ClusterRole>::all(client.clone()).delete(role, &DeleteParams::default()).await;
        }
        delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}

/// One plain-HTTP `GET path` to `addr` with `Connection: close`: the raw response.
async fn get_plain(addr: std::net::SocketAddr, path: &str) -> TestResult<Vec<u8>> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await?;
    Ok(raw)
}
