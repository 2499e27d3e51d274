//! Scaffolding shared by the node agent's integration tests and its bench: an in-process agent
//! on the simulated runtime, a managed VM pod, and the waits and patches the tests repeat.
//!
//! Integration tests include it with `mod common;`, the bench with
//! `#[path = "../tests/common/mod.rs"] mod common;`. Not every includer uses every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::agent::{AgentParts, run_agent};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::NodeRegistration;
use cocoon_node::pods::host_reach::HostReach;
use cocoon_node::pods::{Handler, OrphanPolicy, PodConfig, TenantConfig, Timing};
use cocoon_registry::{PushOptions, RegistryClient, RegistryConfig};
use cocoon_runtime::sim::{SimConfig, SimHandle, SimRuntime};
use cocoon_runtime::{RunRequest, Runtime};
use cocoon_testenv::{Shared, TestNode, create_namespace, unique_name, wait_until};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod kubelet;

/// The error type of the helpers and tests.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a test body (or a helper) returns.
pub type TestResult<T = ()> = Result<T, BoxError>;

/// Default deadline of the waits.
pub const WAIT: Duration = Duration::from_secs(60);
/// The image of [`vm_pod`] (any image is pullable: the simulator runs with `permissive_pull`).
pub const IMAGE: &str = "ubuntu-test:1";

/// A registry client for the test registry at `addr` (plain HTTP on loopback).
pub fn registry(addr: &str) -> RegistryClient {
    RegistryClient::new(RegistryConfig::for_registry(addr).expect("registry config"))
        .expect("registry client")
}

/// The simulator configuration of the tests: every image pullable, short lease delay and tick.
pub fn sim_config(root: &Path) -> SimConfig {
    let mut cfg = SimConfig::new(root);
    cfg.permissive_pull = true;
    cfg.lease_delay = Duration::from_millis(50);
    cfg.tick_interval = Duration::from_millis(200);
    cfg
}

/// The agent timings of the tests: drift checks, lifecycle reconciles and start retries that
/// come round within seconds.
pub fn fast_timing() -> Timing {
    Timing {
        drift_first: Duration::from_secs(1),
        drift_every: Duration::from_secs(2),
        lifecycle_reconcile: Duration::from_secs(1),
        retry_start: Duration::from_millis(200),
        retry_max: Duration::from_secs(2),
        ..Timing::default()
    }
}

/// The `VK_UNMANAGED_IP_CIDRS` of the tests' agents ([`AgentOptions::new`]): the range the
/// tests' unmanaged pods pre-assign their IPs from.
pub const UNMANAGED_IPS: &str = "10.250.0.0/16";

/// How [`start_agent_with`] runs an agent.
pub struct AgentOptions {
    /// The simulator configuration (its root, latencies, lease delay).
    pub sim: SimConfig,
    /// The agent's timings.
    pub timing: Timing,
    /// What the startup reconcile does with VMs no pod claims.
    pub orphan_policy: OrphanPolicy,
    /// The metrics the agent writes (a fresh set on the node root if `None`).
    pub metrics: Option<Arc<NodeMetrics>>,
    /// The Node registration (none: the agent does not register a Node).
    pub registration: Option<NodeRegistration>,
    /// How long the startup reconcile may take.
    pub ready_within: Duration,
    /// The agent's cancellation token, when the test shares it with other tasks (a fresh one
    /// if `None`).
    pub token: Option<CancellationToken>,
    /// `VK_CLONE_FROM_DIR_ROOTS` (none: every `clone-from-dir` is refused).
    pub clone_from_dir_roots: Vec<PathBuf>,
    /// `VK_RUN_IMAGE_URL_ALLOW` / `VK_NETWORK_ALLOW` (default: no URL image, default network).
    pub host_reach: HostReach,
    /// `VK_ACCEPT_LEGACY_VM_NAMES`, `VK_CLONE_BASE_KEEP`, `VK_UNMANAGED_IP_CIDRS` and the
    /// allocatable pods are admitted against (defaults: off, 4, [`UNMANAGED_IPS`], the
    /// registration's if any).
    pub tenant: TenantConfig,
    /// The snapshot knobs of registry.md §5.5 as the agent applies them: `SNAPSHOT_ZSTD_LEVEL`,
    /// `SNAPSHOT_CHUNK_SIZE_MIB`, `SNAPSHOT_MEMORY_BUDGET_MIB`, `SNAPSHOT_PULL_BUDGET_MIB`
    /// (all 0: v1).
    pub snapshot_knobs: [u64; 4],
}

impl AgentOptions {
    /// The tests' agent on `root`: [`sim_config`], [`fast_timing`], orphans destroyed, fresh
    /// metrics, no Node registration, ready within [`WAIT`], its own cancellation token,
    /// unmanaged IPs from [`UNMANAGED_IPS`].
    pub fn new(root: &Path) -> Self {
        AgentOptions {
            sim: sim_config(root),
            timing: fast_timing(),
            orphan_policy: OrphanPolicy::Destroy,
            metrics: None,
            registration: None,
            ready_within: WAIT,
            token: None,
            clone_from_dir_roots: Vec::new(),
            host_reach: HostReach::default(),
            tenant: TenantConfig {
                unmanaged_ip_ranges: cocoon_node::pods::unmanaged_ip::parse_ranges(UNMANAGED_IPS)
                    .expect("the tests' unmanaged IP ranges"),
                ..TenantConfig::default()
            },
            snapshot_knobs: [0; 4],
        }
    }
}

/// One in-process agent on its own node name and simulator root.
pub struct TestAgent {
    pub token: CancellationToken,
    pub task: JoinHandle<()>,
    pub sim: SimHandle,
    pub handler: Arc<Handler>,
    pub metrics: Arc<NodeMetrics>,
}

impl TestAgent {
    /// Kills the agent the way a crash would: every task stops mid-operation.
    pub async fn kill(self) {
        self.token.cancel();
        self.task.abort();
        let _ = self.task.await;
    }

    /// Stops the agent gracefully: cancels it and waits for it to finish.
    pub async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }

    /// The value of one rendered series (`name{labels}` exactly as rendered), 0 if absent.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

/// Starts an agent as `node` on `root` with the tests' defaults ([`AgentOptions::new`]).
pub async fn start_agent(env: &Shared, node: &str, root: &Path) -> TestResult<TestAgent> {
    start_agent_prepared(env, node, root, OrphanPolicy::Destroy, |_| Ok(())).await
}

/// [`start_agent`] with `orphan_policy`; `prepare` runs on the simulator before the agent's
/// startup reconcile.
pub async fn start_agent_prepared(
    env: &Shared,
    node: &str,
    root: &Path,
    orphan_policy: OrphanPolicy,
    prepare: impl FnOnce(&SimHandle) -> TestResult,
) -> TestResult<TestAgent> {
    let opts = AgentOptions {
        orphan_policy,
        ..AgentOptions::new(root)
    };
    start_agent_with(
        env.client()?,
        env.registry_addr(),
        node,
        root,
        opts,
        prepare,
    )
    .await
}

/// Starts an agent as `node` on `root`; `prepare` runs on the simulator before the agent's
/// startup reconcile. Returns once that reconcile (and so the orphan policy) finished.
pub async fn start_agent_with(
    client: Client,
    registry_addr: &str,
    node: &str,
    root: &Path,
    opts: AgentOptions,
    prepare: impl FnOnce(&SimHandle) -> TestResult,
) -> TestResult<TestAgent> {
    let leases = opts.sim.lease_path.clone();
    let rt = SimRuntime::open(opts.sim)?;
    let sim = rt.handle();
    prepare(&sim)?;
    let runtime: Arc<dyn Runtime> = Arc::new(rt);
    let metrics = opts
        .metrics
        .unwrap_or_else(|| Arc::new(NodeMetrics::new(root.to_owned())));
    let parts = AgentParts {
        pods: PodConfig {
            node_name: node.to_owned(),
            orphan_policy: opts.orphan_policy,
            leases_path: leases,
            restore_mode: "ondemand".into(),
            cocoon_root_dir: root.to_owned(),
            clone_from_dir_roots: opts.clone_from_dir_roots,
            tenant: opts.tenant,
            timing: opts.timing,
            host_reach: opts.host_reach,
        },
        client,
        runtime,
        registry: Some({
            let mut cfg = RegistryConfig::for_registry(registry_addr)?;
            let [zstd, chunk, budget, pull] = opts.snapshot_knobs;
            cfg.apply_snapshot_knobs(zstd, chunk, budget, pull)?;
            RegistryClient::new(cfg)?
        }),
        metrics: metrics.clone(),
        registration: opts.registration,
    };
    let token = opts.token.unwrap_or_default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = token.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run_agent(parts, t, Some(tx)).await {
            eprintln!("agent failed: {e}");
        }
    });
    // Sent only after the startup reconcile finished.
    let handler = tokio::time::timeout(opts.ready_within, rx).await??;
    Ok(TestAgent {
        token,
        task,
        sim,
        handler,
        metrics,
    })
}

/// A managed VM pod bound to `node` (image [`IMAGE`], mode `run`, generation 1, snapshot
/// policy `never`); `extra` adds annotations or overrides these.
pub fn vm_pod(ns: &str, name: &str, node: &str, extra: &[(&str, &str)]) -> Pod {
    let mut a: BTreeMap<String, String> = [
        (ann::VM_NAME, vm_name_for_pod(ns, name)),
        (ann::IMAGE, IMAGE.into()),
        (ann::MODE, "run".into()),
        (ann::MANAGED, "true".into()),
        (ann::GENERATION, "1".into()),
        (ann::SNAPSHOT_POLICY, "never".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        a.insert((*k).to_owned(), (*v).to_owned());
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(a),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("cocoon/vm".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The value of annotation `k` on the pod.
pub fn ann_of(p: &Pod, k: &str) -> Option<String> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k).cloned())
}

/// Whether the pod's `Ready` condition is `True`.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the pod is Running and Ready with lifecycle `ready`.
pub fn is_running_ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && is_ready(p)
        && Lifecycle::from_meta(&p.metadata).state == Some(LifecycleState::Ready)
}

/// Waits until the pod is Running+Ready with VM id, IP and lifecycle `ready`; returns it.
pub async fn wait_running(client: &Client, ns: &str, name: &str) -> TestResult<Pod> {
    wait_running_with(client, ns, name, true).await
}

/// [`wait_running`], optionally without requiring the `vm.cocoonstack.io/ip` annotation
/// (an adopted VM's record may carry no IP).
pub async fn wait_running_with(
    client: &Client,
    ns: &str,
    name: &str,
    need_ip_annotation: bool,
) -> TestResult<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let res = wait_until(&format!("{ns}/{name} running"), WAIT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            (is_running_ready(&p)
                && ann_of(&p, ann::VM_ID).is_some()
                && (!need_ip_annotation || ann_of(&p, ann::VM_IP).is_some()))
            .then_some(p)
        }
    })
    .await;
    if res.is_err()
        && let Ok(p) = api.get(name).await
    {
        // Show what the agent did publish, to make a failure readable.
        eprintln!(
            "{ns}/{name}: annotations={:?} status={:?}",
            p.metadata.annotations, p.status
        );
    }
    Ok(res?)
}

/// Waits until the pod's lifecycle is `state` at `generation` or later; returns the pod.
pub async fn wait_lifecycle(
    client: &Client,
    ns: &str,
    name: &str,
    state: LifecycleState,
    generation: i64,
) -> TestResult<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(wait_until(
        &format!("{ns}/{name} lifecycle {state}@{generation}"),
        WAIT,
        || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.ok()?;
                let lc = Lifecycle::from_meta(&p.metadata);
                (lc.state == Some(state) && lc.observed_generation >= generation).then_some(p)
            }
        },
    )
    .await?)
}

/// Merge-patches the pod's annotations with `v` (a `null` value removes one).
pub async fn patch_ann(client: &Client, ns: &str, name: &str, v: serde_json::Value) -> TestResult {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": v}})),
    )
    .await?;
    Ok(())
}

/// Asks the agent to hibernate the pod at `generation` (the hibernate annotation and the
/// generation stamp in one patch) and waits until it reports `hibernated` there.
pub async fn hibernate_pod(
    client: &Client,
    ns: &str,
    name: &str,
    generation: i64,
) -> TestResult<Pod> {
    let stamp = generation.to_string();
    patch_ann(
        client,
        ns,
        name,
        json!({ann::HIBERNATE: "true", ann::GENERATION: stamp}),
    )
    .await?;
    wait_lifecycle(client, ns, name, LifecycleState::Hibernated, generation).await
}

/// Waits until the pod object is gone.
pub async fn wait_gone(client: &Client, ns: &str, name: &str) -> TestResult {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("{ns}/{name} deleted"), WAIT, || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await?;
    Ok(())
}

/// The kubelet API security of the tests: client certificates verified against the test
/// environment's CA (which signed the API server's kubelet client certificate) plus `extra_ca`,
/// tokens and access reviewed through the API server with the admin client.
pub fn kubelet_security(
    env: &Shared,
    node: &str,
    extra_ca: &[rustls::pki_types::CertificateDer<'static>],
    anonymous: bool,
) -> TestResult<cocoon_node::kubelet::ApiSecurity> {
    let pki = env
        .pki_dir()
        .ok_or("the test environment's PKI directory is unknown")?;
    let mut client_ca = cocoon_node::kubelet::load_client_ca(&pki.join("ca.crt"))?;
    client_ca.extend(extra_ca.iter().cloned());
    Ok(cocoon_node::kubelet::ApiSecurity {
        client_ca,
        auth: cocoon_node::kubelet::KubeletAuth::new(
            Arc::new(cocoon_node::kubelet::KubeReviewer::new(env.client()?)),
            node,
            anonymous,
        ),
    })
}

/// The API server's own kubelet client certificate (allowed every kubelet API by the test
/// environment's RBAC, as kubeadm does).
pub fn apiserver_kubelet_client(env: &Shared) -> TestResult<kubelet::ClientCert> {
    let pki = env
        .pki_dir()
        .ok_or("the test environment's PKI directory is unknown")?;
    Ok(kubelet::ClientCert::from_pem_files(
        &pki.join("apiserver-kubelet-client.crt"),
        &pki.join("apiserver-kubelet-client.key"),
    ))
}

/// The node agent configuration of a test agent on loopback: `VK_NODE_NAME`, the default pool,
/// the test registry, `root` as `COCOON_ROOT_DIR`, the kubelet `port`, plus `extra` variables.
pub fn node_config(
    env: &Shared,
    node: &str,
    root: &Path,
    port: u16,
    extra: &[(&str, String)],
) -> TestResult<cocoon_node::config::NodeConfig> {
    let mut vars: BTreeMap<&str, String> = [
        ("VK_NODE_NAME", node.to_owned()),
        ("VK_NODE_POOL", "default".to_owned()),
        ("VK_NODE_IP", "127.0.0.1".to_owned()),
        ("OCI_REGISTRY", env.registry_addr().to_owned()),
        ("COCOON_ROOT_DIR", root.display().to_string()),
        ("VK_KUBELET_PORT", port.to_string()),
    ]
    .into();
    vars.extend(extra.iter().cloned());
    Ok(cocoon_node::config::NodeConfig::from_lookup(
        |k| vars.get(k).cloned(),
        || None,
    )?)
}

/// A fresh Node `node-…` in the default pool with an agent on `root` ([`start_agent`]);
/// returns the node name, the Node (deleted when dropped) and the agent.
pub async fn node_agent(
    env: &Shared,
    client: &Client,
    root: &Path,
) -> TestResult<(String, TestNode, TestAgent)> {
    let node = unique_name("node");
    let node_obj = TestNode::in_pool(client, &node, "default").await?;
    let agent = start_agent(env, &node, root).await?;
    Ok((node, node_obj, agent))
}

/// Two tenant namespaces (created from the prefixes `a` and `b`, in that order) and a pod API
/// on each: `(ns_a, ns_b, api_a, api_b)`.
pub async fn two_tenants(
    client: &Client,
    a: &str,
    b: &str,
) -> TestResult<(String, String, Api<Pod>, Api<Pod>)> {
    let ns_a = create_namespace(client, a).await?;
    let ns_b = create_namespace(client, b).await?;
    let api_a = Api::namespaced(client.clone(), &ns_a);
    let api_b = Api::namespaced(client.clone(), &ns_b);
    Ok((ns_a, ns_b, api_a, api_b))
}

/// Creates [`vm_pod`] `ns/name` on `node` with `extra` and waits until it runs
/// ([`wait_running`]); returns the pod.
pub async fn run_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    extra: &[(&str, &str)],
) -> TestResult<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &vm_pod(ns, name, node, extra))
        .await?;
    wait_running(client, ns, name).await
}

/// Wakes a hibernated pod at `generation` (drops the hibernate annotation and stamps the
/// generation in one patch) and waits until it runs again; returns the pod.
pub async fn wake_pod(client: &Client, ns: &str, name: &str, generation: i64) -> TestResult<Pod> {
    let stamp = generation.to_string();
    patch_ann(
        client,
        ns,
        name,
        json!({ann::HIBERNATE: null, ann::GENERATION: stamp}),
    )
    .await?;
    wait_running(client, ns, name).await
}

/// Waits for lifecycle `failed` (at `generation` or later) and a `TenantIsolationRefused`
/// Warning Event on this pod incarnation whose note is `<op>: <lifecycle message>` (`op` is
/// `create` or `update`); returns the message.
pub async fn wait_refused_at(
    client: &Client,
    ns: &str,
    name: &str,
    op: &str,
    generation: i64,
) -> TestResult<String> {
    let p = wait_lifecycle(client, ns, name, LifecycleState::Failed, generation).await?;
    let msg = Lifecycle::from_meta(&p.metadata).message;
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let want = format!("{op}: {msg}");
    wait_until(&format!("{ns}/{name}: refusal event"), WAIT, || {
        let events = events.clone();
        let (uid, want) = (uid.clone(), want.clone());
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(ev::TENANT_ISOLATION_REFUSED)
                    && e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref() == Some(want.as_str())
                    && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })
        }
    })
    .await?;
    Ok(msg)
}

/// [`wait_refused_at`] generation 1 (a refused create, or an update of a pod at generation 1).
pub async fn wait_refused(client: &Client, ns: &str, name: &str, op: &str) -> TestResult<String> {
    wait_refused_at(client, ns, name, op, 1).await
}

/// The lifecycle message once the pod failed at generation 1 or later (any reason).
pub async fn wait_failed(client: &Client, ns: &str, name: &str) -> TestResult<String> {
    let p = wait_lifecycle(client, ns, name, LifecycleState::Failed, 1).await?;
    Ok(Lifecycle::from_meta(&p.metadata).message)
}

/// A "golden" VM on a standalone simulated host, saved as snapshot `golden`: the host
/// (runtime, its directory) and the guest's state token.
pub struct Golden {
    pub _dir: tempfile::TempDir,
    pub rt: Arc<dyn Runtime>,
    pub token: String,
}

/// Brings up the [`Golden`] host: image [`IMAGE`], VM `golden-vm`, snapshot `golden`.
pub async fn golden_host() -> TestResult<Golden> {
    let dir = tempfile::tempdir()?;
    let rt = SimRuntime::open(sim_config(dir.path()))?;
    let sim = rt.handle();
    let rt: Arc<dyn Runtime> = Arc::new(rt);
    rt.ensure_image(IMAGE, false).await?;
    let vm = rt
        .run(RunRequest {
            image: IMAGE.into(),
            name: "golden-vm".into(),
            network: "cocoon-dhcp".into(),
            ..RunRequest::default()
        })
        .await?;
    rt.snapshot_save("golden", &vm.id).await?;
    let token = sim.guest_token("golden-vm")?;
    Ok(Golden {
        _dir: dir,
        rt,
        token,
    })
}

/// Pushes the golden snapshot to `<repo>:<tag>` in the real registry, with `extra` manifest
/// annotations.
pub async fn push_golden(
    env: &Shared,
    golden: &Golden,
    repo: &str,
    tag: &str,
    extra: &[(&str, &str)],
) -> TestResult {
    let export = golden.rt.snapshot_export("golden").await?;
    let mut opts = PushOptions::new(tag, IMAGE);
    opts.annotations.extra = extra
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    registry(env.registry_addr())
        .push_snapshot_tar(repo, export.stream, &opts)
        .await?;
    export.done.await?;
    Ok(())
}

/// Starts an agent as `node` on `root` that registers its Node (the test node configuration,
/// [`node_config`], with the kubelet API on `kubelet_port`) and serves the kubelet API through
/// `backend`; `opts` carries the caller's timings and metrics, and the agent runs under `token`.
pub async fn start_registered_agent(
    env: &Shared,
    node: &str,
    root: &Path,
    kubelet_port: u16,
    backend: &cocoon_node::agent::AgentPodBackend,
    token: CancellationToken,
    mut opts: AgentOptions,
) -> TestResult<TestAgent> {
    let config = node_config(env, node, root, kubelet_port, &[])?;
    let resources = cocoon_node::node::capacity::read_resources(&config)?;
    let registration = NodeRegistration::from_config(&config, resources, kubelet_port);
    opts.registration = Some(registration);
    opts.token = Some(token);
    let agent = start_agent_with(env.client()?, env.registry_addr(), node, root, opts, |_| {
        Ok(())
    })
    .await?;
    backend.set(agent.handler.clone());
    Ok(agent)
}

/// Deletes the Node `node` a registered agent created, and its heartbeat Lease (either may be
/// gone already).
pub async fn cleanup_node(env: &Shared, node: &str) -> TestResult {
    let client = env.client()?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), cocoon_node::node::LEASE_NAMESPACE);
    let _ = leases.delete(node, &DeleteParams::default()).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let _ = nodes.delete(node, &DeleteParams::default()).await;
    Ok(())
}

/// Waits until the pod has a VM id and lifecycle `ready`.
pub async fn wait_vm_ready(api: &Api<Pod>, name: &str) -> TestResult {
    wait_until(&format!("{name} ready with a VM"), WAIT, || async {
        let p = api.get(name).await.ok()?;
        let has_id = p
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ann::VM_ID));
        (has_id && Lifecycle::from_meta(&p.metadata).state == Some(LifecycleState::Ready))
            .then_some(())
    })
    .await?;
    Ok(())
}

/// A kubelet API server for `node` on loopback under `limits` (a self-signed certificate, the
/// tests' [`kubelet_security`], host reads below `root`, which is created), serving through a
/// fresh pod backend: `(token, backend, kubelet)`; the server stops with `token`.
pub async fn start_kubelet(
    env: &Shared,
    node: &str,
    root: &Path,
    limits: cocoon_node::kubelet::KubeletLimits,
) -> TestResult<(
    CancellationToken,
    Arc<cocoon_node::agent::AgentPodBackend>,
    cocoon_node::kubelet::KubeletServer,
)> {
    std::fs::create_dir_all(root)?;
    let token = CancellationToken::new();
    let backend = Arc::new(cocoon_node::agent::AgentPodBackend::default());
    let tls = cocoon_node::kubelet::TlsMaterial::self_signed(node, "127.0.0.1".parse()?)?;
    let kubelet = cocoon_node::kubelet::KubeletServer::start_with_limits(
        "127.0.0.1:0".parse()?,
        &tls,
        kubelet_security(env, node, &[], false)?,
        backend.clone(),
        cocoon_node::node::HostReader::new(root.to_owned()),
        Arc::new(cocoon_node::metrics::NodeMetrics::new(root)),
        node,
        &token,
        limits,
    )
    .await?;
    Ok((token, backend, kubelet))
}

/// Kills the agent, then deletes the test's namespaces.
pub async fn kill_and_delete(client: &Client, agent: TestAgent, namespaces: &[&str]) -> TestResult {
    agent.kill().await;
    for ns in namespaces {
        cocoon_testenv::delete_namespace(client, ns).await?;
    }
    Ok(())
}
