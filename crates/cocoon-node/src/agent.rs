//! The node agent process (`node.md` §1): composes configuration, client, metrics, runtime,
//! registry, the startup reconcile, the event watcher, node registration and pod handling.
//!
//! Tests run agents in-process through [`run_agent`] with their own runtime and a cancellation
//! token; aborting the future or cancelling the token stops every task the agent started.

use std::sync::Arc;

use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_runtime::{ExecRequest, Runtime};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::NodeConfig;
use crate::kubelet::{
    ApiSecurity, BackendError, ExecError, ExecIo, KubeReviewer, KubeletAuth, KubeletServer,
    MetricsServer, PodBackend, PodStats, TlsMaterial, load_client_ca,
};
use crate::metrics::NodeMetrics;
use crate::node::HostReader;
use crate::node::{NodeHeartbeat, NodeRegistration};
use crate::pods::{self, Handler, PodConfig, Timing};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The Kubernetes client could not be built.
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The runtime backend could not be opened.
    #[error("runtime: {0}")]
    Runtime(#[from] cocoon_runtime::RuntimeError),
    /// The registry client could not be built.
    #[error("registry: {0}")]
    Registry(#[from] cocoon_registry::Error),
    /// The startup reconcile failed.
    #[error("startup reconcile failed, refusing to register node: {0}")]
    Reconcile(pods::PodError),
    /// Node registration failed.
    #[error("{0}")]
    Node(#[from] crate::node::NodeError),
    /// The simulated runtime's control socket could not be served.
    #[error("{0}")]
    Control(#[from] cocoon_runtime::sim::socket::ServeError),
}

/// Everything an in-process agent runs with.
pub struct AgentParts {
    /// Pod handling configuration.
    pub pods: PodConfig,
    /// Kubernetes client.
    pub client: Client,
    /// The VM runtime (CLI or simulator; the agent never learns which).
    pub runtime: Arc<dyn Runtime>,
    /// Registry client; `None` only in registry-less tests.
    pub registry: Option<RegistryClient>,
    /// Metrics.
    pub metrics: Arc<NodeMetrics>,
    /// Node registration (Node object, Lease, status); `None` skips it (tests that bind pods
    /// by `spec.nodeName` directly).
    pub registration: Option<NodeRegistration>,
}

/// A running agent's handle for tests: the pod handler after the startup reconcile.
pub type Ready = tokio::sync::oneshot::Sender<Arc<Handler>>;

/// Runs an agent until `shutdown` is cancelled (startup order of §1 steps 9–13).
/// `ready`, when given, receives the handler once the startup reconcile finished.
pub async fn run_agent(
    parts: AgentParts,
    shutdown: CancellationToken,
    ready: Option<Ready>,
) -> Result<(), AgentError> {
    // Every task this agent spawns hangs off `token`; dropping this future (an aborted test
    // agent) cancels them all, as a killed process would.
    let token = shutdown.child_token();
    let _guard = token.clone().drop_guard();
    let recorder = Recorder::new(
        parts.client.clone(),
        Reporter {
            controller: "vk-cocoon".into(),
            instance: Some(parts.pods.node_name.clone()),
        },
    );
    // Pods are admitted against the allocatable this agent publishes (issue 35 item 4).
    let mut pod_cfg = parts.pods;
    if pod_cfg.tenant.allocatable.is_none()
        && let Some(reg) = &parts.registration
    {
        pod_cfg.tenant.allocatable = Some(
            pods::resources::Allocatable::from_quantities(&reg.resources.allocatable)
                .map_err(AgentError::Config)?,
        );
    }
    let handler = Handler::new(
        pod_cfg,
        parts.client.clone(),
        parts.runtime,
        parts.registry,
        recorder,
        parts.metrics,
        token.clone(),
    );
    let report = handler
        .startup_reconcile()
        .await
        .map_err(AgentError::Reconcile)?;
    info!(
        adopted = report.adopted,
        orphans = report.orphans,
        "startup reconcile done"
    );
    handler.spawn(handler.clone().watch_vm_events());
    handler.spawn(handler.clone().run_vm_sampler());
    handler.spawn(handler.clone().run_activity());
    let heartbeat = match &parts.registration {
        Some(reg) => {
            // A node identity is held to NodeRestriction: register only what it allows.
            let held = crate::node::identity::detect(&parts.client, &reg.node_name)
                .await
                .map_err(crate::node::NodeError::from)?;
            let reg = reg
                .clone()
                .node_restricted(held == crate::node::identity::Held::AsNode);
            let node = crate::node::register_or_update(&parts.client, &reg).await?;
            if reg.node_restricted {
                let labels = node.metadata.labels.unwrap_or_default();
                let missing: Vec<_> = NodeRegistration::admin_labels()
                    .into_iter()
                    .filter(|k| !labels.contains_key(*k))
                    .collect();
                if !missing.is_empty() {
                    warn!(
                        node = %reg.node_name,
                        labels = ?missing,
                        "a node identity may not set these labels (NodeRestriction): an \
                         administrator sets them (kubectl label node)"
                    );
                }
            }
            let hb = NodeHeartbeat::start(parts.client.clone(), reg, &token);
            for beat in hb.heartbeats() {
                handler.liveness.register(beat);
            }
            Some(hb)
        }
        None => None,
    };
    if let Some(tx) = ready {
        let _ = tx.send(handler.clone());
    }
    tokio::select! {
        _ = token.cancelled() => {}
        _ = pods::controller::run(handler.clone()) => {}
    }
    token.cancel();
    handler.publisher.probes().close();
    if let Some(hb) = heartbeat {
        hb.stop().await;
    }
    info!("node agent stopped");
    Ok(())
}

/// Pod handling configuration from the node configuration (spec timing defaults).
pub fn pod_config(cfg: &NodeConfig) -> PodConfig {
    PodConfig {
        node_name: cfg.node_name.clone(),
        orphan_policy: cfg.orphan_policy,
        leases_path: cfg.leases_path.clone(),
        restore_mode: cfg.restore_mode.as_str().to_owned(),
        cocoon_root_dir: cfg.cocoon_root_dir.clone(),
        clone_from_dir_roots: cfg.clone_from_dir_roots.clone(),
        tenant: crate::pods::TenantConfig {
            accept_legacy_vm_names: cfg.accept_legacy_vm_names,
            clone_base_keep: cfg.clone_base_keep,
            unmanaged_ip_ranges: cfg.unmanaged_ip_ranges.clone(),
            allocatable: None,
        },
        timing: Timing {
            activity: cfg.activity,
            ..Timing::default()
        },
        host_reach: cfg.host_reach.clone(),
    }
}

/// `cocoon-operator node`: builds everything from `config` and runs until SIGINT/SIGTERM.
pub async fn run(config: NodeConfig) -> Result<(), AgentError> {
    // Every later reader takes its values from the settings (environment over `--config`).
    let settings = config.settings.clone();
    let get = |k: &str| settings.get(k);
    let kube_config = kube_config(settings.get(cocoon_api::contract::env::node::KUBECONFIG))
        .await
        .map_err(|e| AgentError::Config(format!("kubeconfig: {e}")))?;
    let client = Client::try_from(crate::user_agent::kube_config(kube_config))?;
    let notifier = crate::systemd::Notifier::from_settings(&settings).map(Arc::new);
    let watchdog = crate::systemd::watchdog_timeout(
        settings.get(crate::systemd::WATCHDOG_USEC).as_deref(),
        settings.get(crate::systemd::WATCHDOG_PID).as_deref(),
        std::process::id(),
    )
    .map_err(AgentError::Config)?;
    let metrics = Arc::new(NodeMetrics::new(config.cocoon_root_dir.clone()));
    let (runtime, sim) = config.runtime.open(get).await?;
    let shutdown = CancellationToken::new();
    // The simulator's control socket for black-box tests and demos (never on the real runtime).
    let _control = sim
        .map(|h| {
            let path = cocoon_runtime::sim::socket::socket_path(h.root());
            cocoon_runtime::sim::socket::ControlServer::start(h, &path, &shutdown)
        })
        .transpose()?;
    let registry = if config.oci_registry.trim().is_empty() {
        warn!("OCI_REGISTRY is empty; running without a registry");
        None
    } else {
        // Credentials, CA, client certificate and insecure hosts from the environment
        // (`OCI_REGISTRY_*`, `DOCKER_CONFIG`), as the README documents them.
        let mut rc = RegistryConfig::for_registry(&config.oci_registry)?.with_access_env(&get)?;
        // The snapshot knobs of registry.md §5.5 (all 0: the v1 artifact, as before).
        rc.apply_snapshot_knobs(
            config.snapshot_zstd_level,
            config.snapshot_chunk_size_mib,
            config.snapshot_memory_budget_mib,
            config.snapshot_pull_budget_mib,
        )?;
        if config.snapshot_transfer_concurrency > 0 {
            rc.transfer_concurrency =
                usize::try_from(config.snapshot_transfer_concurrency.min(256)).unwrap_or(8);
        }
        Some(RegistryClient::new(crate::user_agent::registry_config(rc))?)
    };
    let resources = crate::node::capacity::read_resources(&config)
        .map_err(|e| AgentError::Config(e.to_string()))?;
    // The kubelet API binds first: with port 0 the Node must advertise the port it got.
    let tls = TlsMaterial::load_or_generate(
        &config.tls_cert,
        &config.tls_key,
        &config.node_name,
        config.node_ip,
    )
    .map_err(|e| AgentError::Config(e.to_string()))?;
    let client_ca = match &config.client_ca_file {
        Some(path) => load_client_ca(path).map_err(|e| AgentError::Config(e.to_string()))?,
        None => {
            warn!(
                "VK_CLIENT_CA_FILE is not set: the kubelet API accepts no client certificate, \
                 so kubectl exec/logs through the API server are refused"
            );
            Vec::new()
        }
    };
    if config.anonymous_auth {
        warn!(
            "VK_ANONYMOUS_AUTH=true: kubelet API requests without credentials are authorized as system:anonymous"
        );
    }
    let security = ApiSecurity {
        client_ca,
        auth: KubeletAuth::new(
            Arc::new(KubeReviewer::new(client.clone())),
            &config.node_name,
            config.anonymous_auth,
        ),
    };
    let backend = Arc::new(AgentPodBackend::default());
    let kubelet = KubeletServer::start_with_limits(
        std::net::SocketAddr::new(config.node_ip, config.kubelet_port),
        &tls,
        security,
        backend.clone(),
        HostReader::new(config.cocoon_root_dir.clone()),
        // The same registry the VK_METRICS_ADDR listener serves, behind nodes/metrics.
        metrics.clone(),
        &config.node_name,
        &shutdown,
        config.kubelet_limits,
    )
    .await
    .map_err(|e| AgentError::Config(e.to_string()))?;
    let metrics_server = MetricsServer::start(config.metrics_addr, metrics.clone(), &shutdown)
        .await
        .map_err(|e| AgentError::Config(e.to_string()))?;
    info!(kubelet_port = kubelet.port(), metrics = %config.metrics_addr, "listeners up");
    let registration = NodeRegistration::from_config(&config, resources, kubelet.port());
    let signal = shutdown.clone();
    let stopping = notifier.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutdown signal received");
        if let Some(n) = &stopping {
            n.send("STOPPING=1");
        }
        signal.cancel();
    });
    let parts = AgentParts {
        pods: pod_config(&config),
        client,
        runtime,
        registry,
        metrics,
        registration: Some(registration),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<Arc<Handler>>();
    let late = backend.clone();
    let kubelet_beat = kubelet.heartbeat();
    let stop_watchdog = shutdown.clone();
    tokio::spawn(async move {
        let Ok(handler) = rx.await else {
            return;
        };
        // The Node is registered, its heartbeat loops run and both servers listen.
        handler.liveness.register(kubelet_beat);
        let liveness = handler.liveness.clone();
        late.set(handler);
        if let Some(n) = notifier {
            n.send("READY=1\nSTATUS=node registered, serving pods");
            if let Some(timeout) = watchdog {
                info!(
                    ?timeout,
                    "feeding the systemd watchdog while the main loops run"
                );
                crate::systemd::run_watchdog(n, liveness, timeout, stop_watchdog).await;
            }
        }
    });
    let result = run_agent(parts, shutdown, Some(tx)).await;
    // Shutdown: the HTTP servers get their grace period after pod handling stopped.
    kubelet.shutdown().await;
    metrics_server.shutdown().await;
    result
}

/// The kubelet API's view of the pods: answers once the startup reconcile handed over the
/// handler (before that, no pod has a live VM as far as the API is concerned). The kubelet
/// server starts before the agent, so the handler is set later ([`AgentPodBackend::set`]).
#[derive(Default)]
pub struct AgentPodBackend(std::sync::OnceLock<Arc<Handler>>);

impl AgentPodBackend {
    /// Hands over the agent's pod handler; later calls are ignored.
    pub fn set(&self, handler: Arc<Handler>) {
        let _ = self.0.set(handler);
    }
}

#[async_trait::async_trait]
impl PodBackend for AgentPodBackend {
    async fn logs(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        tail: u32,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, BackendError> {
        let Some(h) = self.0.get() else {
            return Ok(None);
        };
        let Some(vm) = h.tracked_vm(&format!("{namespace}/{pod}")) else {
            return Ok(None);
        };
        if vm.synthetic {
            return Ok(None);
        }
        h.artifacts
            .rt()
            .logs_capped(vm.id(), Some(u64::from(tail)), max_bytes)
            .await
            .map(Some)
            .map_err(|e| BackendError(e.to_string()))
    }

    async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        io: ExecIo,
    ) -> Result<(), ExecError> {
        let no_vm = || ExecError::NoLiveVm {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        };
        let h = self.0.get().ok_or_else(no_vm)?;
        let vm = h.exec_vm(namespace, pod).await?;
        let mut req = ExecRequest::new(vm.id(), io.command);
        req.stdin = io.stdin;
        req.stdout = io.stdout;
        req.stderr = io.stderr;
        h.artifacts
            .rt()
            .exec(req)
            .await
            .map_err(|e| match e.exit_code() {
                Some(code) => ExecError::ExitCode(code),
                None => ExecError::Failed(e.to_string()),
            })
    }

    fn stream_opened(&self, namespace: &str, pod: &str) -> Option<crate::kubelet::StreamToken> {
        let h = self.0.get()?;
        Some(Box::new(h.sessions.open(&format!("{namespace}/{pod}"))))
    }

    async fn stats(&self) -> Result<Vec<PodStats>, BackendError> {
        let Some(h) = self.0.get() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for key in h.tracked_keys() {
            let (Some(vm), Some(pod)) = (h.tracked_vm(&key), h.tracked_pod(&key)) else {
                continue;
            };
            if vm.synthetic {
                continue;
            }
            let Ok(st) = h.artifacts.rt().vm_stats(&vm.record).await else {
                continue;
            };
            out.push(PodStats {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                cpu_usage_ns: st.cpu_time_ns,
                memory_rss_bytes: st.rss_bytes,
                network_rx_bytes: st.taps.iter().map(|t| t.rx_bytes).sum(),
                network_tx_bytes: st.taps.iter().map(|t| t.tx_bytes).sum(),
            });
        }
        Ok(out)
    }
}

/// The Kubernetes client configuration: the colon-separated kubeconfig list `kubeconfig`
/// (from the settings) merged as kubectl does, else what [`kube::Config::infer`] finds
/// (`~/.kube/config`, then in-cluster).
async fn kube_config(kubeconfig: Option<String>) -> Result<kube::Config, String> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let paths: Vec<std::path::PathBuf> = kubeconfig
        .as_deref()
        .map(|v| {
            std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if paths.is_empty() {
        return kube::Config::infer().await.map_err(|e| e.to_string());
    }
    let merged = paths
        .iter()
        .try_fold(Kubeconfig::default(), |m, p| {
            Kubeconfig::read_from(p).and_then(|c| m.merge(c))
        })
        .map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    config.apply_debug_overrides();
    Ok(config)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
