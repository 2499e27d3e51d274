//! Real node agents in-process (feature `agents`): the production agent on the simulated
//! runtime, optionally serving its kubelet API and registering its Node.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cocoon_node::agent::{AgentParts, AgentPodBackend, run_agent};
use cocoon_node::config::NodeConfig;
use cocoon_node::kubelet::{
    ApiSecurity, KubeReviewer, KubeletAuth, KubeletServer, TlsMaterial, load_client_ca,
};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::{HostReader, LEASE_NAMESPACE, NodeRegistration, capacity};
use cocoon_node::pods::{OrphanPolicy, PodConfig, Timing as AgentTiming};
use cocoon_runtime::Runtime;
use cocoon_runtime::sim::{SimConfig, SimHandle, SimRuntime};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{BoxError, registry};

/// The `VK_UNMANAGED_IP_CIDRS` of the test agents: the static toolboxes of the e2e tests
/// pre-assign their IPs in it (`scripted::two_toolboxes`).
pub const UNMANAGED_IPS: &str = "10.9.9.0/24";

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
    /// The agent's registry client, when not the anonymous one of the test registry (a
    /// token-auth client of [`crate::registry_token`], say).
    pub registry: Option<cocoon_registry::RegistryClient>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            timing: AgentTiming::default(),
            orphan_policy: OrphanPolicy::Destroy,
            tweak: |_| {},
            kubelet: None,
            registry: None,
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
        let metrics = Arc::new(NodeMetrics::new(root.to_owned()));
        let (kubelet, registration) = match &opts.kubelet {
            Some(k) => {
                let server = start_kubelet(
                    &client,
                    node,
                    root,
                    k,
                    backend.clone(),
                    metrics.clone(),
                    &token,
                )
                .await?;
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
                // The e2e tests' static toolboxes pre-assign IPs in this range.
                tenant: cocoon_node::pods::TenantConfig {
                    unmanaged_ip_ranges: cocoon_node::pods::unmanaged_ip::parse_ranges(
                        UNMANAGED_IPS,
                    )?,
                    ..Default::default()
                },
                timing: opts.timing,
                host_reach: Default::default(),
            },
            client: client.clone(),
            runtime: runtime.clone(),
            registry: Some(
                opts.registry
                    .clone()
                    .unwrap_or_else(|| registry(registry_addr)),
            ),
            metrics,
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
/// says, answering from `backend` (and `/metrics` from the agent's `metrics`).
async fn start_kubelet(
    client: &Client,
    node: &str,
    root: &Path,
    k: &KubeletOptions,
    backend: Arc<AgentPodBackend>,
    metrics: Arc<NodeMetrics>,
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
        metrics,
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

/// The agent whose runtime holds `vm`, and the VM's id.
pub async fn host_of<'a>(agents: &'a [Agent], vm: &str) -> Result<(&'a Agent, String), BoxError> {
    for a in agents {
        if let Some((_, id)) = a.vms().await.into_iter().find(|(name, _)| name == vm) {
            return Ok((a, id));
        }
    }
    Err(format!("{vm} is not live").into())
}

/// `vm`'s guest on `agent`'s simulator: its state token and the trimmed content of the file
/// `path`, if the guest has one.
pub fn guest_of(agent: &Agent, vm: &str, path: &str) -> Result<(String, Option<String>), BoxError> {
    let marker = agent.sim.guest_file(vm, path)?.map(|m| m.trim().to_owned());
    Ok((agent.sim.guest_token(vm)?, marker))
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

/// One node of a test pool: a `TestNode` named `<prefix>-…` in `pool`, schedulable, with a real
/// agent on its own root directory (kept as long as the member lives).
pub struct PoolMember {
    pub name: String,
    pub node: cocoon_testenv::TestNode,
    pub agent: Agent,
    pub root: tempfile::TempDir,
}

impl PoolMember {
    /// Registers the node in `pool`, waits (up to `wait`) until it is schedulable and starts its
    /// agent on `registry_addr` with [`AgentOptions::fast`].
    pub async fn start(
        env: &cocoon_testenv::Shared,
        pool: &str,
        prefix: &str,
        registry_addr: &str,
        wait: Duration,
    ) -> Result<PoolMember, BoxError> {
        let client = env.client()?;
        let name = cocoon_testenv::unique_name(prefix);
        let node = cocoon_testenv::TestNode::in_pool(&client, &name, pool).await?;
        node.wait_schedulable(wait).await?;
        let root = tempfile::tempdir()?;
        let agent = Agent::start(
            client,
            &name,
            root.path(),
            registry_addr,
            AgentOptions::fast(),
        )
        .await?;
        Ok(PoolMember {
            name,
            node,
            agent,
            root,
        })
    }
}
