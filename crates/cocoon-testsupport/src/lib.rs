//! Test scaffolding shared by the end-to-end tests and benches of the workspace: the operator's
//! two controllers and real node agents on the simulated runtime, started in-process against the
//! real control plane and registry of `cocoon-testenv`, and stopped or killed (aborted mid-flight,
//! as a crashed process would be) on demand.
//!
//! Nothing here stands in for a real part: these are the production controllers and agents,
//! wired the way the binaries wire them, with shorter timings where a test asks for them.

mod audited;
pub mod binaries;
pub mod scripted;

pub use audited::AuditedIdentity;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::set::CocoonSet;
use cocoon_node::agent::{AgentParts, AgentPodBackend, run_agent};
use cocoon_node::config::NodeConfig;
use cocoon_node::kubelet::{
    ApiSecurity, KubeReviewer, KubeletAuth, KubeletServer, TlsMaterial, load_client_ca,
};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::{HostReader, LEASE_NAMESPACE, NodeRegistration, capacity};
use cocoon_node::pods::{OrphanPolicy, PodConfig, Timing as AgentTiming};
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
use cocoon_operator::{admin::Readiness, cocoonset, hibernation};
use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_runtime::Runtime;
use cocoon_runtime::sim::{SimConfig, SimHandle, SimRuntime};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::{Recorder, Reporter};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The error type of the helpers (test code unwraps or `?`s it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A registry client for the test registry at `addr` (plain HTTP on loopback).
pub fn registry(addr: &str) -> RegistryClient {
    RegistryClient::new(RegistryConfig::for_registry(addr).expect("registry config"))
        .expect("registry client")
}

/// How the in-process operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// CocoonSet controller timings.
    pub sets: cocoonset::Timing,
    /// CocoonHibernation controller timings.
    pub hibernation: hibernation::decide::Timing,
    /// Concurrent reconciles per controller.
    pub concurrency: u16,
}

impl Default for OperatorOptions {
    /// Production timings, concurrency 4.
    fn default() -> Self {
        OperatorOptions {
            sets: cocoonset::Timing::default(),
            hibernation: hibernation::decide::Timing::default(),
            concurrency: 4,
        }
    }
}

impl OperatorOptions {
    /// Production rules with the short requeues tests want (a write is re-read after 300 ms, a
    /// pending main re-checked every second).
    pub fn fast() -> Self {
        OperatorOptions {
            sets: cocoonset::Timing {
                requeue_after_write: Duration::from_millis(300),
                wait_for_main: Duration::from_secs(1),
                ..cocoonset::Timing::default()
            },
            ..OperatorOptions::default()
        }
    }
}

/// Both controllers of `cocoon-operator run`, scoped to one namespace.
pub struct Operator {
    /// The metrics both controllers write.
    pub metrics: Arc<Metrics>,
    /// The CocoonSet controller's context.
    pub sets: Arc<cocoonset::Context>,
    /// The CocoonSet controller's pass and write counters.
    pub stats: Arc<cocoonset::Stats>,
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Operator {
    /// Starts both controllers watching `ns`, with their tag registry at `registry_addr`.
    pub fn start(client: &Client, ns: &str, registry_addr: &str, opts: OperatorOptions) -> Self {
        let tags: Arc<dyn TagRegistry> = Arc::new(OciTagRegistry::new(registry(registry_addr)));
        Self::start_with_tags(client, ns, tags, opts)
    }

    /// As [`Operator::start`], with the CocoonSet controller's tag registry given (a wrapper
    /// that counts calls, say) and the CocoonHibernation controller on the same one.
    pub fn start_with_tags(
        client: &Client,
        ns: &str,
        tags: Arc<dyn TagRegistry>,
        opts: OperatorOptions,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "cocoon-operator".into(),
                instance: None,
            },
        );
        let metrics = Arc::new(Metrics::new());
        let stats = Arc::new(cocoonset::Stats::default());
        let sets = Arc::new(
            cocoonset::Context::new(
                client.clone(),
                recorder.clone(),
                metrics.clone(),
                tags.clone(),
                opts.sets,
            )
            .with_stats(stats.clone()),
        );
        let chs = Arc::new(hibernation::Context::new(
            client.clone(),
            recorder,
            metrics.clone(),
            tags,
            opts.hibernation,
        ));
        let token = CancellationToken::new();
        let readiness = Arc::new(Readiness::default());
        let mut tasks = Vec::new();
        {
            let (ns, stop, ready) = (ns.to_owned(), token.clone(), readiness.clone());
            let sets = sets.clone();
            tasks.push(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                cocoonset::run(sets, Some(&ns), opts.concurrency, until, ready).await
            }));
        }
        {
            let (ns, stop) = (ns.to_owned(), token.clone());
            tasks.push(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                hibernation::run(chs, Some(&ns), opts.concurrency, until, readiness).await
            }));
        }
        Operator {
            metrics,
            sets,
            stats,
            token,
            tasks,
        }
    }

    /// Kills both controllers where they stand (their futures are dropped mid-flight, as a
    /// crashed process's would be), and waits until they are gone.
    pub async fn kill(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }

    /// Stops both controllers gracefully and waits for them.
    pub async fn stop(mut self) {
        self.token.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.token.cancel();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How an in-process node agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Pod controller timings.
    pub timing: AgentTiming,
    /// Orphan policy at startup.
    pub orphan_policy: OrphanPolicy,
    /// Simulated-runtime latencies, sizes and failures (applied over the defaults below).
    pub tweak: fn(&mut SimConfig),
    /// Opt-in: serve the kubelet API and register the Node as the real agent does, so that
    /// `pods/log` and `pods/exec` reach the agent through the API server. `None` (the
    /// default): no kubelet API, no Node registration (the test creates its Node).
    pub kubelet: Option<KubeletOptions>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            timing: AgentTiming::default(),
            orphan_policy: OrphanPolicy::Destroy,
            tweak: |_| {},
            kubelet: None,
        }
    }
}

/// How an agent with its kubelet API exposed runs: the API on `127.0.0.1` on a free port,
/// client certificates verified against the test environment's CA (which signed the API
/// server's kubelet client certificate), tokens and access reviewed through the API server;
/// the agent registers its Node (InternalIP 127.0.0.1, `status.daemonEndpoints` the bound
/// port) in `pool` and keeps its Lease and status fresh.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// The test environment's PKI directory (`Shared::pki_dir`), holding `ca.crt`.
    pub pki_dir: PathBuf,
    /// The node pool label of the registered Node.
    pub pool: String,
}

impl KubeletOptions {
    /// The kubelet API for an agent of the shared test environment, its Node in `pool`.
    pub fn for_env(env: &cocoon_testenv::Shared, pool: &str) -> Result<Self, BoxError> {
        Ok(KubeletOptions {
            pki_dir: env
                .pki_dir()
                .ok_or("the test environment's PKI directory is unknown")?,
            pool: pool.to_owned(),
        })
    }
}

impl AgentOptions {
    /// Short reconcile and retry periods, for tests that restart agents or watch drift.
    pub fn fast() -> Self {
        AgentOptions {
            timing: AgentTiming {
                drift_first: Duration::from_secs(1),
                drift_every: Duration::from_secs(2),
                lifecycle_reconcile: Duration::from_secs(1),
                retry_start: Duration::from_millis(200),
                retry_max: Duration::from_secs(2),
                ..AgentTiming::default()
            },
            ..AgentOptions::default()
        }
    }
}

/// A real node agent (`cocoon-operator node`) for one node, on the simulated runtime rooted at a
/// directory. The simulator persists its VM table there, so an agent started again on the same
/// root finds its VMs as a restarted process would.
pub struct Agent {
    /// The node it serves.
    pub node: String,
    /// The simulator's state directory.
    pub root: PathBuf,
    /// The runtime the agent drives.
    pub runtime: Arc<dyn Runtime>,
    /// The simulator's controls (state tokens, failure injection, counters).
    pub sim: SimHandle,
    client: Client,
    kubelet: Option<KubeletServer>,
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts an agent for `node` and returns once its startup reconcile is done.
    pub async fn start(
        client: Client,
        node: &str,
        root: &Path,
        registry_addr: &str,
        opts: AgentOptions,
    ) -> Result<Agent, BoxError> {
        let mut cfg = SimConfig::new(root);
        cfg.permissive_pull = true;
        cfg.lease_delay = Duration::from_millis(50);
        cfg.tick_interval = Duration::from_millis(200);
        (opts.tweak)(&mut cfg);
        let leases = cfg.lease_path.clone();
        let sim_rt = SimRuntime::open(cfg)?;
        let sim = sim_rt.handle();
        let runtime: Arc<dyn Runtime> = Arc::new(sim_rt);
        let token = CancellationToken::new();
        let backend = Arc::new(AgentPodBackend::default());
        let (kubelet, registration) = match &opts.kubelet {
            Some(k) => {
                let server = start_kubelet(&client, node, root, k, backend.clone(), &token).await?;
                let reg = registration(node, root, registry_addr, &k.pool, server.port())?;
                (Some(server), Some(reg))
            }
            None => (None, None),
        };
        let parts = AgentParts {
            pods: PodConfig {
                node_name: node.to_owned(),
                orphan_policy: opts.orphan_policy,
                leases_path: leases,
                restore_mode: "ondemand".into(),
                cocoon_root_dir: root.to_owned(),
                clone_from_dir_roots: Vec::new(),
                tenant: Default::default(),
                timing: opts.timing,
                host_reach: Default::default(),
            },
            client: client.clone(),
            runtime: runtime.clone(),
            registry: Some(registry(registry_addr)),
            metrics: Arc::new(NodeMetrics::new(root.to_owned())),
            registration,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (t, name) = (token.clone(), node.to_owned());
        let task = tokio::spawn(async move {
            if let Err(e) = run_agent(parts, t, Some(tx)).await {
                eprintln!("agent {name} failed: {e}");
            }
        });
        // The kubelet API answers for the pods once the startup reconcile handed over the
        // handler, as in `cocoon-operator node`.
        backend.set(tokio::time::timeout(Duration::from_secs(60), rx).await??);
        Ok(Agent {
            node: node.to_owned(),
            root: root.to_owned(),
            runtime,
            sim,
            client,
            kubelet,
            token,
            task: Some(task),
        })
    }

    /// The kubelet API's port, when the agent serves one ([`AgentOptions::kubelet`]).
    pub fn kubelet_port(&self) -> Option<u16> {
        self.kubelet.as_ref().map(KubeletServer::port)
    }

    /// Stops the agent (gracefully) and deletes the Node and Lease it registered; a no-op
    /// for the Node of an agent without [`AgentOptions::kubelet`] (the test owns that Node).
    pub async fn stop_and_deregister(&mut self) {
        let registered = self.kubelet.is_some();
        self.stop().await;
        if registered {
            let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
            let _ = leases.delete(&self.node, &DeleteParams::default()).await;
            let nodes: Api<Node> = Api::all(self.client.clone());
            let _ = nodes.delete(&self.node, &DeleteParams::default()).await;
        }
    }

    /// Kills the agent where it stands (every task it spawned is cancelled, as with a killed
    /// process) and waits until it is gone. The simulator's state directory stays.
    pub async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Stops the agent gracefully and waits for it (and for its kubelet API, if any).
    pub async fn stop(&mut self) {
        self.token.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        if let Some(k) = self.kubelet.take() {
            k.shutdown().await;
        }
    }

    /// Every VM this agent's runtime holds, as (VM name, VM id).
    pub async fn vms(&self) -> Vec<(String, String)> {
        self.runtime
            .list()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.config.name.clone(), r.id.clone()))
            .collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.token.cancel();
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Starts the kubelet API of `node` on loopback (a free port), secured as [`KubeletOptions`]
/// says, answering from `backend`.
async fn start_kubelet(
    client: &Client,
    node: &str,
    root: &Path,
    k: &KubeletOptions,
    backend: Arc<AgentPodBackend>,
    token: &CancellationToken,
) -> Result<KubeletServer, BoxError> {
    let loopback: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
    let tls = TlsMaterial::self_signed(node, loopback)?;
    let security = ApiSecurity {
        client_ca: load_client_ca(&k.pki_dir.join("ca.crt"))?,
        auth: KubeletAuth::new(Arc::new(KubeReviewer::new(client.clone())), node, false),
    };
    Ok(KubeletServer::start(
        std::net::SocketAddr::new(loopback, 0),
        &tls,
        security,
        backend,
        HostReader::new(root.to_owned()),
        node,
        token,
    )
    .await?)
}

/// The Node registration of a test agent: `node` in `pool` at 127.0.0.1 with its kubelet API
/// on `port`, capacity from the node root (as `cocoon-operator node` computes it).
fn registration(
    node: &str,
    root: &Path,
    registry_addr: &str,
    pool: &str,
    port: u16,
) -> Result<NodeRegistration, BoxError> {
    let vars: std::collections::BTreeMap<&str, String> = [
        ("VK_NODE_NAME", node.to_owned()),
        ("VK_NODE_POOL", pool.to_owned()),
        ("VK_NODE_IP", "127.0.0.1".to_owned()),
        ("OCI_REGISTRY", registry_addr.to_owned()),
        ("COCOON_ROOT_DIR", root.display().to_string()),
        ("VK_KUBELET_PORT", port.to_string()),
    ]
    .into();
    let config = NodeConfig::from_lookup(|k| vars.get(k).cloned(), || None)?;
    let resources = capacity::read_resources(&config)?;
    Ok(NodeRegistration::from_config(&config, resources, port))
}

/// Every VM the agents' runtimes hold, as (node, VM name, VM id).
pub async fn all_vms(agents: &[Agent]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for a in agents {
        for (name, id) in a.vms().await {
            out.push((a.node.clone(), name, id));
        }
    }
    out
}

/// Pushes a minimal snapshot artifact (config blob only, no layers) as `<vm>:<tag>`, recorded
/// against the image `ubuntu:24.10`.
pub async fn push_tag(reg: &RegistryClient, vm: &str, tag: &str) -> Result<(), BoxError> {
    scripted::push_snapshot_tag(reg, vm, tag, "ubuntu:24.10", &[]).await
}

/// Waits (up to `within`) until the CocoonSet `name` exists and satisfies `check`.
pub async fn wait_set(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name}: {what}"), within, || async {
        let cs = sets.get_opt(name).await.ok().flatten()?;
        check(&cs).then_some(cs)
    })
    .await
}

/// The node a pod is bound to ("" when unscheduled).
pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// A managed VM pod bound to `node` as the CocoonSet controller would create it (mode `run`,
/// image `ubuntu-test:1`, generation 1), with `extra` annotations added or overriding.
pub fn vm_pod(ns: &str, name: &str, node: &str, extra: &[(&str, &str)]) -> Pod {
    use cocoon_api::contract::annotations as ann;
    let mut annotations: std::collections::BTreeMap<String, String> = [
        (ann::VM_NAME, cocoon_api::naming::vm_name_for_pod(ns, name)),
        (ann::IMAGE, "ubuntu-test:1".to_owned()),
        (ann::MODE, "run".to_owned()),
        (ann::MANAGED, "true".to_owned()),
        (ann::GENERATION, "1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        annotations.insert((*k).to_owned(), (*v).to_owned());
    }
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(node.into()),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "agent".into(),
                image: Some("cocoon/vm".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Starts a test environment of its own for a bench and says how long it took.
pub async fn bench_env() -> Result<cocoon_testenv::TestEnv, BoxError> {
    let started = std::time::Instant::now();
    let env = cocoon_testenv::TestEnv::start(cocoon_testenv::Options::default()).await?;
    println!(
        "test environment up in {:.1} s (registry {})",
        started.elapsed().as_secs_f64(),
        env.registry_addr()
    );
    Ok(env)
}

/// Ends a bench's environment: the components' log tails when the bench failed, then shutdown.
pub fn end_bench_env<T, E>(env: cocoon_testenv::TestEnv, outcome: Result<T, E>) -> Result<T, E> {
    if outcome.is_err() {
        eprintln!("---- component logs ----\n{}", env.log_tails(30));
    }
    env.shutdown();
    outcome
}
