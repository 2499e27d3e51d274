//! `cocoon-operator`: one binary, three modes. `run` reconciles the CRDs, `node` is the
//! per-host node agent, `crd` prints the CustomResourceDefinitions.

mod check;
mod simctl;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use cocoon_operator::admin::{self, Readiness};
use cocoon_operator::config::RawConfig;
use cocoon_operator::metrics::Metrics;
use cocoon_operator::user_agent;
use cocoon_operator::{cocoonset, hibernation};
use kube::runtime::events::{Recorder, Reporter};
use tracing::info;

/// `--version`: the workspace version and the git revision the binary was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("COCOON_GIT_REVISION"),
    ")"
);

#[derive(Parser, Debug)]
#[command(name = "cocoon-operator", version = VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Reconcile CocoonSet and CocoonHibernation resources.
    Run(Box<RunArgs>),
    /// Run the node agent for this host (virtual-kubelet style).
    #[command(
        after_help = "Every setting is an environment variable (or a --config key): --help lists them all.",
        after_long_help = cocoon_node::settings::help_text()
    )]
    Node(NodeArgs),
    /// Print the CustomResourceDefinitions as YAML (or write one file per CRD).
    Crd {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Drive the simulated runtime under a running node agent (VK_RUNTIME=sim only).
    Sim(simctl::SimArgs),
    /// Check that the metrics Service's ready endpoints answer with this version's build info
    /// (the chart's `helm test`).
    CheckMetrics(check::CheckArgs),
}

/// Flags of `node`: the settings themselves are environment variables (listed by `--help`).
#[derive(Args, Debug)]
struct NodeArgs {
    /// YAML file of settings, keyed by the variable names (`VK_NODE_NAME: host-1`); a variable
    /// set in the environment overrides the file; an unknown key is refused.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Flags of `run`; each falls back to its environment variable (an empty value is unset).
#[derive(Args, Debug)]
struct RunArgs {
    /// Prometheus listener (`/metrics`).
    #[arg(long, env = "METRICS_ADDR", value_name = "ADDR")]
    metrics_bind_address: Option<String>,
    /// `/metrics` answers only a bearer token whose user may `get` it (TokenReview, then
    /// SubjectAccessReview; the `cocoon-metrics-reader` ClusterRole). On unless explicitly
    /// false; `false` is for local development only.
    #[arg(long, env = "METRICS_SECURE", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    metrics_secure: Option<String>,
    /// Health probe listener (`/healthz`, `/livez`, `/readyz`).
    #[arg(long, env = "PROBE_ADDR", value_name = "ADDR")]
    health_probe_bind_address: Option<String>,
    /// Leader election (on unless explicitly false).
    #[arg(long, env = "LEADER_ELECT", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    leader_elect: Option<String>,
    /// Concurrent CocoonSet reconciles (at least 1).
    #[arg(long, env = "COCOONSET_CONCURRENCY", value_name = "N")]
    cocoonset_concurrency: Option<String>,
    /// Concurrent CocoonHibernation reconciles (at least 1).
    #[arg(long, env = "HIBERNATION_CONCURRENCY", value_name = "N")]
    hibernation_concurrency: Option<String>,
    /// Registry base (host[:port][/prefix]) holding VM snapshots.
    #[arg(long, env = "OCI_REGISTRY", value_name = "BASE")]
    oci_registry: Option<String>,
    /// How long a CocoonHibernation may stay Hibernating (Go duration, default 3m0s).
    #[arg(long, env = "COCOON_HIBERNATE_TIMEOUT", value_name = "DURATION")]
    hibernate_timeout: Option<String>,
    /// How long a CocoonHibernation may stay Waking (default 5m0s).
    #[arg(long, env = "COCOON_WAKE_TIMEOUT", value_name = "DURATION")]
    wake_timeout: Option<String>,
    /// Re-check interval while waiting on the node agent (default 5s).
    #[arg(long, env = "COCOON_REQUEUE_INTERVAL", value_name = "DURATION")]
    requeue_interval: Option<String>,
    /// How long a CocoonSet may stay Suspending before it reports Failed (default 3m0s).
    #[arg(long, env = "COCOON_SUSPEND_TIMEOUT", value_name = "DURATION")]
    suspend_timeout: Option<String>,
    /// Leader election: how long a Lease lasts without renewal before another replica may
    /// take it over, as that replica observes (default 15s).
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", value_name = "DURATION")]
    leader_elect_lease_duration: Option<String>,
    /// How long the holder keeps writing without a successful renew (default 10s).
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", value_name = "DURATION")]
    leader_elect_renew_deadline: Option<String>,
    /// How often the Lease is read and renewed (default 2s).
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", value_name = "DURATION")]
    leader_elect_retry_period: Option<String>,
    /// Let the registry GC treat the legacy unhashed VM names (`vk-<ns>-<pod>`) of a set's or
    /// CocoonHibernation's own pods as theirs (only `true`; default off). Only while legacy
    /// VMs of an earlier operator exist and no namespace name is a dash-extension of another:
    /// the legacy form is ambiguous between namespaces.
    #[arg(long, env = "OPERATOR_ACCEPT_LEGACY_VM_NAMES", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    accept_legacy_vm_names: Option<String>,
    /// Reconcile only the resources of this namespace (default: every namespace).
    #[arg(long, env = "WATCH_NAMESPACE", value_name = "NAMESPACE")]
    watch_namespace: Option<String>,
    /// Wake on connect: the address the activator listens on and advertises (default the pod
    /// IP, `POD_IP`; neither set: this replica runs no activator).
    #[arg(long, env = "ACTIVATOR_ADDR", value_name = "IP")]
    activator_addr: Option<String>,
    /// The activator port pool, `first-last` (default 40000-40999): one port per set port.
    #[arg(long, env = "ACTIVATOR_PORTS", value_name = "RANGE")]
    activator_ports: Option<String>,
    /// How long a connection to a waking set waits for its VM (Go duration, default 60s).
    #[arg(long, env = "ACTIVATOR_WAKE_WAIT", value_name = "DURATION")]
    activator_wake_wait: Option<String>,
    /// Most connections the activator holds at once (default 1000).
    #[arg(long, env = "ACTIVATOR_MAX_CONNECTIONS", value_name = "N")]
    activator_max_connections: Option<String>,
    /// Comma-separated CIDRs the activator may dial VMs in (default: any IP a main pod's
    /// `vm.cocoonstack.io/ip` names, which a tenant can write).
    #[arg(long, env = "ACTIVATOR_VM_CIDRS", value_name = "CIDRS")]
    activator_vm_cidrs: Option<String>,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "OPERATOR_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Log format.
    #[arg(long, env = "OPERATOR_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn init_logging(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .with_context(|| format!("--log-level: invalid level {level:?}"))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args.log_level, args.log_format)?;
    let config = RawConfig {
        oci_registry: args.oci_registry,
        metrics_addr: args.metrics_bind_address,
        metrics_secure: args.metrics_secure,
        probe_addr: args.health_probe_bind_address,
        leader_elect: args.leader_elect,
        cocoonset_concurrency: args.cocoonset_concurrency,
        hibernation_concurrency: args.hibernation_concurrency,
        hibernate_timeout: args.hibernate_timeout,
        wake_timeout: args.wake_timeout,
        requeue_interval: args.requeue_interval,
        suspend_timeout: args.suspend_timeout,
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
        legacy_vm_names: args.accept_legacy_vm_names,
    }
    .resolve()?;
    let registry = cocoon_operator::registry::connect(&config.oci_registry)
        .context("construct registry client")?;
    let client = kube::Config::infer()
        .await
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(kube::Client::try_from(user_agent::kube_config(c))?))
        .context("connect to the Kubernetes API (KUBECONFIG or in-cluster)")?;
    // The registry token service, when REGISTRY_TOKEN_ADDR is set (README "Registry
    // credentials"): on every replica, leader or not.
    if let Some(token_cfg) =
        cocoon_operator::registry_token::TokenConfig::from_env(&config.oci_registry, &|k| {
            std::env::var(k).ok()
        })
        .context("registry token service configuration")?
    {
        let svc = cocoon_operator::registry_token::TokenService::new(token_cfg, client.clone())
            .await
            .context("start the registry token service")?;
        let (_addr, serve) = cocoon_operator::registry_token::bind(Arc::new(svc))
            .await
            .context("bind the registry token service")?;
        tokio::spawn(serve);
    }
    let metrics = Arc::new(Metrics::new());
    metrics.set_build_info(env!("CARGO_PKG_VERSION"), env!("COCOON_GIT_REVISION"));
    let readiness = Arc::new(Readiness::default());
    let metrics_auth = config
        .metrics_secure
        .then(|| cocoon_operator::metrics_auth::MetricsAuth::kube(client.clone()));
    if metrics_auth.is_none() {
        tracing::warn!("--metrics-secure=false: /metrics answers anyone who reaches it");
    }
    let (maddr, paddr, serve) = admin::bind(
        &config.metrics_addr,
        &config.probe_addr,
        metrics.clone(),
        readiness.clone(),
        metrics_auth,
    )
    .await
    .context("bind the admin listeners")?;
    info!(metrics = %maddr, metrics_secure = config.metrics_secure, probes = %paddr, registry = %config.oci_registry, "cocoon-operator starting");
    let leadership = if config.leader_elect {
        cocoon_operator::leader::Leadership::elected()
    } else {
        cocoon_operator::leader::Leadership::always()
    };
    metrics.watch_leadership(leadership.clone());
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("cocoon-operator-{}", std::process::id()));
    let activator_config = {
        use cocoon_operator::activator::env;
        let flags = [
            (env::ADDR, args.activator_addr.clone()),
            (env::PORTS, args.activator_ports.clone()),
            (env::WAKE_WAIT, args.activator_wake_wait.clone()),
            (env::MAX_CONNECTIONS, args.activator_max_connections.clone()),
            (env::VM_CIDRS, args.activator_vm_cidrs.clone()),
        ];
        cocoon_operator::activator::Config::from_env(
            &|var| match flags.iter().find(|(k, _)| *k == var) {
                Some((_, v)) => v.clone(),
                None => std::env::var(var).ok(),
            },
            &args_lease_namespace(),
            &identity,
        )
        .context("activator configuration")?
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: cocoon_api::contract::events::COMPONENT_OPERATOR.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let hib = Arc::new(
        hibernation::Context::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            registry.clone(),
            config.hibernation_timing,
        )
        .with_leadership(leadership.clone())
        .with_legacy_vm_names(config.legacy_vm_names),
    );
    let checkpoints = Arc::new(
        cocoon_operator::checkpoint::Context::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            registry.clone(),
        )
        .with_leadership(leadership.clone()),
    );
    let services = Arc::new(
        cocoon_operator::activator::service::Context::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            &activator_config,
        )
        .with_leadership(leadership.clone()),
    );
    let activator_recorder = recorder.clone();
    let sets = Arc::new(
        cocoonset::Context::new(
            client.clone(),
            recorder,
            metrics.clone(),
            registry,
            cocoonset::Timing {
                suspend_deadline: config.suspend_timeout,
                ..cocoonset::Timing::default()
            },
        )
        .with_leadership(leadership.clone())
        .with_legacy_vm_names(config.legacy_vm_names),
    );
    // /readyz answers ok only once both controllers' caches have synced.
    let (hib_ready, set_ready) = (
        Arc::new(Readiness::default()),
        Arc::new(Readiness::default()),
    );
    {
        let (h, s, all) = (hib_ready.clone(), set_ready.clone(), readiness.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
            loop {
                tick.tick().await;
                if h.is_ready() && s.is_ready() {
                    all.set_ready();
                    break;
                }
            }
        });
    }
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let (mut stop_hib, mut stop_set, mut stop_ckpt) = (
        stop_tx.subscribe(),
        stop_tx.subscribe(),
        stop_tx.subscribe(),
    );
    if config.leader_elect {
        // Every replica keeps its caches warm; only the Lease holder reconciles.
        let namespace = args_lease_namespace();
        let identity = identity.clone();
        info!(lease = cocoon_operator::leader::LEASE_NAME, namespace = %namespace, identity = %identity, timing = ?config.election, "leader election on");
        let mut stop_lease = stop_tx.subscribe();
        let (c, l, timing) = (client.clone(), leadership.clone(), config.election);
        tokio::spawn(async move {
            cocoon_operator::leader::run(c, &namespace, identity, timing, l, async move {
                let _ = stop_lease.recv().await;
            })
            .await;
        });
    }
    let watch_namespace = args
        .watch_namespace
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty());
    // Wake on connect (README "Idle suspend and wake on connect"): the Service/EndpointSlice
    // controller writes only on the leader; the activator listens on every replica.
    {
        let mut stop = stop_tx.subscribe();
        let ns = watch_namespace.map(str::to_owned);
        tokio::spawn(async move {
            cocoon_operator::activator::service::run(services, ns.as_deref(), async move {
                let _ = stop.recv().await;
            })
            .await;
        });
    }
    match activator_config.addr {
        Some(addr) => {
            info!(%addr, ports = ?activator_config.ports, wake_wait = ?activator_config.wake_wait, max_connections = activator_config.max_connections, vm_networks = ?activator_config.vm_networks, "activator on");
            if activator_config.vm_networks.is_empty() {
                tracing::warn!(
                    "ACTIVATOR_VM_CIDRS is unset: the activator dials any main pod's status.podIP (node-written) without a network check"
                );
            }
            let activator = cocoon_operator::activator::listen::Activator::new(
                client.clone(),
                activator_recorder,
                metrics.clone(),
                activator_config.clone(),
                addr,
            );
            let (mut stop_a, mut stop_l) = (stop_tx.subscribe(), stop_tx.subscribe());
            tokio::spawn(activator.run(async move {
                let _ = stop_a.recv().await;
            }));
            tokio::spawn(cocoon_operator::activator::advertise::publish(
                client.clone(),
                activator_config.namespace.clone(),
                activator_config.identity.clone(),
                addr,
                async move {
                    let _ = stop_l.recv().await;
                },
            ));
        }
        None => info!("activator off: neither ACTIVATOR_ADDR nor POD_IP is set"),
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(());
    });
    let controllers = futures::future::join3(
        hibernation::run(
            hib.clone(),
            watch_namespace,
            config.hibernation_concurrency,
            async move {
                let _ = stop_hib.recv().await;
            },
            hib_ready,
        ),
        cocoonset::run(
            sets,
            watch_namespace,
            config.cocoonset_concurrency,
            async move {
                let _ = stop_set.recv().await;
            },
            set_ready,
        ),
        // Its cache sync is not part of /readyz: the two original controllers gate it.
        cocoon_operator::checkpoint::run(
            checkpoints,
            watch_namespace,
            config.hibernation_concurrency,
            async move {
                let _ = stop_ckpt.recv().await;
            },
            Arc::new(Readiness::default()),
        ),
    );
    tokio::select! {
        _ = controllers => info!("controllers stopped"),
        res = serve => res.context("admin server")?,
    }
    Ok(())
}

/// The operator's own namespace for its Lease: `POD_NAMESPACE` (the Downward API), else
/// `cocoon-system`.
fn args_lease_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "cocoon-system".to_string())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { out_dir: None } => {
            print!("{}", cocoon_api::crd::render_all_yaml()?);
            Ok(())
        }
        Command::Crd { out_dir: Some(dir) } => {
            for (file, yaml) in cocoon_api::crd::render_files()? {
                let path = dir.join(&file);
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Run(args) => tokio::runtime::Runtime::new()
            .context("start the async runtime")?
            .block_on(run(*args)),
        Command::Node(args) => node(args),
        Command::Sim(args) => simctl::main(args),
        Command::CheckMetrics(args) => check::main(args),
    }
}

/// `node`: the per-host node agent. Its settings come from the environment over the optional
/// `--config` file (`cocoon_node::settings`); logging from `VK_LOG_LEVEL` and `VK_LOG_FORMAT`.
/// A bad setting exits with status 1 and a message naming the variable (and the file, when
/// the value came from there).
fn node(args: NodeArgs) -> anyhow::Result<()> {
    use cocoon_api::contract::env::node as env;
    use cocoon_node::config::{self, NodeConfig};
    use cocoon_node::settings::{FileSettings, Settings};
    let fail = |msg: String| -> ! {
        eprintln!("cocoon-operator node: {msg}");
        std::process::exit(1);
    };
    let file = args
        .config
        .as_deref()
        .map(|path| FileSettings::load(path).unwrap_or_else(|e| fail(e.to_string())));
    let settings = Settings::merge(file.as_ref(), |k| std::env::var(k).ok());
    // A value's error, with the file it came from (the environment needs no mention).
    let located = |e: config::ConfigError| match settings.file_of(e.var()) {
        Some(path) => format!("{e} (set in {})", path.display()),
        None => e.to_string(),
    };
    let raw = settings
        .get(env::LOG_LEVEL)
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| env::DEFAULT_LOG_LEVEL.to_owned());
    let level = config::parse_log_level(&raw).unwrap_or_else(|e| fail(located(e)));
    let raw_format = settings.get(env::LOG_FORMAT).unwrap_or_default();
    let format = config::parse_log_format(&raw_format).unwrap_or_else(|e| fail(located(e)));
    let builder =
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(level));
    match format {
        config::LogFormat::Text => builder.init(),
        config::LogFormat::Json => builder.json().init(),
    }
    if let Some(path) = &args.config {
        info!(config = %path.display(), "settings from the environment over the config file");
    }
    let config = NodeConfig::from_settings(&settings, config::first_non_loopback_ipv4)
        .map_err(|e| anyhow::anyhow!(located(e)))
        .context("node agent configuration")?;
    tokio::runtime::Runtime::new()
        .context("start the async runtime")?
        .block_on(cocoon_node::agent::run(config))
        .context("node agent")
}
