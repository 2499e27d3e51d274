//! `cocoon-testenv up` runs the local control plane and registry until SIGINT/SIGTERM, and
//! `exec -- CMD` runs one command against a fresh env; `paths` shows the binaries it uses.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use cocoon_testenv::{Kubelet, KubeletOptions, Options, RegistryAuth, TestEnv, paths};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// How often `up` checks that every component is still running.
const WATCHDOG: Duration = Duration::from_secs(2);

#[derive(Debug, Parser)]
#[command(name = "cocoon-testenv", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start etcd, kube-apiserver, kube-scheduler, kube-controller-manager and a registry,
    /// install the CRDs, and stay up until SIGINT or SIGTERM (or a component dies).
    Up {
        /// Write shell `export` lines (TESTENV_KUBECONFIG, TESTENV_REGISTRY, TESTENV_BIN,
        /// TESTENV_RUN_DIR, KUBECONFIG, TESTENV_PID) here once ready; removed on teardown.
        #[arg(long)]
        env_file: Option<PathBuf>,
        /// Also start a real kubelet node (private containerd; see cocoon_testenv::kubelet).
        #[arg(long)]
        with_kubelet: bool,
        #[command(flatten)]
        env: EnvArgs,
    },
    /// Start an env, run CMD with the TESTENV_* variables and KUBECONFIG set, tear down,
    /// and exit with CMD's status: `cocoon-testenv exec -- cargo test --workspace`.
    Exec {
        #[command(flatten)]
        env: EnvArgs,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Print the binaries this harness would use and whether they exist.
    Paths,
}

#[derive(Debug, Args)]
struct EnvArgs {
    /// Keep the run dir (data, logs, PKI) after teardown.
    #[arg(long, env = "TESTENV_KEEP")]
    keep: bool,
    /// Require basic auth on the registry: USER:PASSWORD.
    #[arg(long, value_name = "USER:PASSWORD")]
    registry_auth: Option<String>,
    /// Skip installing the cocoon CRDs.
    #[arg(long)]
    no_crds: bool,
}

impl EnvArgs {
    fn options(&self) -> anyhow::Result<Options> {
        let registry_auth = self
            .registry_auth
            .as_deref()
            .map(|s| {
                s.split_once(':')
                    .map(|(u, p)| RegistryAuth::new(u, p))
                    .context("--registry-auth must be USER:PASSWORD")
            })
            .transpose()?;
        Ok(Options {
            registry_auth,
            install_crds: !self.no_crds,
            keep_run_dir: self.keep,
            ..Options::default()
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let began = Instant::now();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(cocoon_testenv::QUIET_FILTER)
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Paths => print_paths(),
        Command::Up {
            env_file,
            with_kubelet,
            env,
        } => up(began, env_file, with_kubelet, env.options()?).await,
        Command::Exec { env, command } => {
            let code = exec(env.options()?, &command).await?;
            std::process::exit(code);
        }
    }
}

fn print_paths() -> anyhow::Result<()> {
    let bin_dir = paths::default_bin_dir();
    let registry = paths::default_registry_bin();
    println!("kubernetes version: {}", paths::k8s_version());
    println!("upstream bin dir:   {}", bin_dir.display());
    for name in paths::UPSTREAM_BINARIES {
        let p = bin_dir.join(name);
        println!(
            "  {:<26} {}",
            name,
            if p.exists() { "ok" } else { "missing" }
        );
    }
    for name in paths::KUBELET_BINARIES {
        let p = bin_dir.join(name);
        println!(
            "  {:<26} {} (only for Shared::kubelet)",
            name,
            if p.exists() { "ok" } else { "missing" }
        );
    }
    println!(
        "registry binary:    {} ({})",
        registry.display(),
        if registry.exists() { "ok" } else { "missing" }
    );
    if paths::check_bin_dir(&bin_dir).is_err() {
        println!("build the control plane with {}", paths::BUILD_SCRIPT);
    }
    if paths::check_registry_bin(&registry).is_err() {
        println!("fetch the registry with {}", paths::FETCH_REGISTRY_SCRIPT);
    }
    Ok(())
}

/// Starts the env, giving up early on SIGINT/SIGTERM.
async fn start(opts: Options, sigterm: &mut Signal) -> anyhow::Result<TestEnv> {
    tokio::select! {
        env = TestEnv::start(opts) => env.context("starting the test environment"),
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted during start"),
        _ = sigterm.recv() => anyhow::bail!("terminated during start"),
    }
}

/// Teardown waits on processes synchronously; keep it off the async workers.
async fn teardown(env: TestEnv) -> anyhow::Result<()> {
    let stop = Instant::now();
    tokio::task::spawn_blocking(move || env.shutdown())
        .await
        .context("teardown task")?;
    tracing::info!(elapsed = ?stop.elapsed(), "torn down");
    Ok(())
}

async fn up(
    began: Instant,
    env_file: Option<PathBuf>,
    with_kubelet: bool,
    opts: Options,
) -> anyhow::Result<()> {
    // Subscribe before starting, so a signal during start still tears down cleanly.
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let keep = opts.keep_run_dir;
    let env = start(opts, &mut sigterm).await?;
    let kubelet = if with_kubelet {
        let kopts = KubeletOptions {
            node_name: "testenv-kubelet".into(),
            apiserver_url: env.apiserver_url(),
            pki_dir: env.pki_dir(),
            bin_dir: env.bin_dir().to_path_buf(),
            admin_kubeconfig: env.kubeconfig_path(),
            timeout: Duration::from_secs(90),
            keep_run_dir: keep,
        };
        let client = env.client().context("admin client")?;
        match Kubelet::start(&client, kopts).await {
            Ok(k) => Some(k),
            Err(e) => {
                teardown(env).await?;
                return Err(e).context("starting the kubelet");
            }
        }
    } else {
        None
    };

    let kubeconfig = env.kubeconfig_path();
    let kubectl = env.bin_dir().join("kubectl");
    println!("cocoon-testenv is up (pid {})", std::process::id());
    println!(
        "  export KUBECONFIG={}",
        shell_quote(&kubeconfig.to_string_lossy())
    );
    println!("  kubectl:  {}", kubectl.display());
    println!(
        "  try:      {} --kubeconfig {} get nodes,crd",
        kubectl.display(),
        kubeconfig.display()
    );
    println!("  registry: {} (plain HTTP)", env.registry_addr());
    println!("  run dir:  {}", env.run_dir().display());
    if let Some(k) = &kubelet {
        println!(
            "  kubelet:  node {} (taint {}:NoSchedule), containerd {} (ctr -n k8s.io images import)",
            k.node_name(),
            cocoon_testenv::KUBELET_TAINT_KEY,
            k.containerd_socket().display()
        );
    }
    println!(
        "  process start to ready: {:.1}s",
        began.elapsed().as_secs_f64()
    );
    if let Some(report) = env.startup_report() {
        println!("  {report}");
    }
    if let Some(path) = &env_file {
        write_env_file(path, &env)?;
        println!("  env file: {} (source it)", path.display());
    }
    println!("stop with: kill -TERM {}", std::process::id());

    let mut watchdog = tokio::time::interval(WATCHDOG);
    let died = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("SIGINT: tearing down");
                break None;
            }
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM: tearing down");
                break None;
            }
            _ = watchdog.tick() => {
                if let Err(e) = env.check_alive() {
                    tracing::error!(error = %e, "a component died: tearing down");
                    break Some(e);
                }
            }
        }
    };
    if let Some(path) = &env_file {
        // The file describes an env that is going away.
        let _ = std::fs::remove_file(path);
    }
    if let Some(k) = kubelet {
        tokio::task::spawn_blocking(move || k.shutdown())
            .await
            .context("kubelet teardown task")?;
    }
    teardown(env).await?;
    match died {
        Some(e) => Err(e).context("test environment failed"),
        None => Ok(()),
    }
}

async fn exec(opts: Options, command: &[String]) -> anyhow::Result<i32> {
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let env = start(opts, &mut sigterm).await?;
    if let Some(report) = env.startup_report() {
        tracing::info!("test environment {report}");
    }
    let (program, args) = command.split_first().context("no command given")?;
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    for (k, v) in env_vars(&env) {
        child.env(k, v);
    }
    let mut child = child
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let status = tokio::select! {
        status = child.wait() => Some(status.context("waiting for the command")?),
        _ = tokio::signal::ctrl_c() => None,
        _ = sigterm.recv() => None,
    };
    if status.is_none() {
        tracing::info!("signalled: stopping the command and tearing down");
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    teardown(env).await?;
    Ok(match status {
        Some(s) => s.code().unwrap_or(1),
        None => 130,
    })
}

/// The variables tests and scripts use to find the env.
fn env_vars(env: &TestEnv) -> Vec<(&'static str, String)> {
    let kubeconfig = env.kubeconfig_path().to_string_lossy().into_owned();
    vec![
        ("TESTENV_KUBECONFIG", kubeconfig.clone()),
        ("TESTENV_REGISTRY", env.registry_addr().to_string()),
        ("TESTENV_BIN", env.bin_dir().to_string_lossy().into_owned()),
        (
            "TESTENV_RUN_DIR",
            env.run_dir().to_string_lossy().into_owned(),
        ),
        ("KUBECONFIG", kubeconfig),
        ("TESTENV_PID", std::process::id().to_string()),
    ]
}

/// Writes the env file atomically, so a script polling for it never reads half of it.
fn write_env_file(path: &Path, env: &TestEnv) -> anyhow::Result<()> {
    let text: String = env_vars(env)
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
