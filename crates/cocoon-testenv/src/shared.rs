//! One environment per test process (or per CI run via `TESTENV_KUBECONFIG`), shared by all
//! tests, plus the helpers tests use to isolate themselves and to show logs on failure.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::env::{Options, StartupReport, TestEnv, readyz};
use crate::error::{Error, Result};
use crate::kubeconfig::load_kubeconfig;
use crate::kubelet::{Kubelet, KubeletOptions};
use crate::paths;
use crate::rundir::log_tails_in;
use crate::wait::poll;

/// How long an external env (`TESTENV_KUBECONFIG`) gets to answer `/readyz`.
const EXTERNAL_READY: Duration = Duration::from_secs(10);

/// Label put on every namespace the harness creates.
pub const TEST_NAMESPACE_LABEL: &str = "cocoon-testenv/test";

/// The process-wide environment: either started by this process or an external one.
#[derive(Debug)]
pub struct Shared {
    kubeconfig: PathBuf,
    config: kube::Config,
    registry_addr: String,
    bin_dir: PathBuf,
    run_dir: Option<PathBuf>,
    /// Present when this process owns the processes (no `TESTENV_KUBECONFIG`).
    env: Option<TestEnv>,
}

static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();
/// The env's kubelet, started by the first [`Shared::kubelet`] call of the process.
static KUBELET: OnceLock<std::result::Result<Kubelet, String>> = OnceLock::new();
/// How long the kubelet gets to register a Ready node.
const KUBELET_READY: Duration = Duration::from_secs(90);

/// The shared environment; starts it on first use. Panics (with the reason and log tails)
/// if it cannot start, which fails the calling test.
pub async fn shared() -> &'static Shared {
    match try_shared().await {
        Ok(s) => s,
        Err(e) => panic!("cocoon-testenv: {e}"),
    }
}

/// The shared environment, or why it could not start. A failed start is remembered, so
/// the remaining tests fail fast instead of each waiting for the deadline again.
pub async fn try_shared() -> Result<&'static Shared> {
    let cell = match SHARED.get() {
        Some(c) => c,
        // Started on a blocking thread with its own runtime: the env must not depend on the
        // runtime of whichever test happened to come first (each test has its own).
        None => tokio::task::spawn_blocking(|| SHARED.get_or_init(init_blocking))
            .await
            .map_err(|e| Error::Shared(format!("start task failed: {e}")))?,
    };
    cell.as_ref().map_err(|e| Error::Shared(e.clone()))
}

fn init_blocking() -> std::result::Result<Shared, String> {
    init_tracing();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building a runtime: {e}"))?;
    let shared = rt
        .block_on(Shared::connect_or_start())
        .map_err(|e| e.to_string())?;
    if shared.env.is_some() {
        // Children already die with this process (PDEATHSIG); this also removes the run
        // dir, which nothing else would do for a value living in a static.
        // SAFETY: registering a plain extern "C" function; it catches its own panics.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    }
    Ok(shared)
}

extern "C" fn cleanup_kubelet_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(k)) = KUBELET.get() {
            k.kill_now();
        }
    });
}

extern "C" fn cleanup_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(Shared { env: Some(env), .. })) = SHARED.get() {
            env.kill_now();
        }
    });
}

/// Default log filter: our info logs, and no kube-client noise from readiness probes that
/// are expected to fail until a component is up (real failures surface as errors anyway).
pub const QUIET_FILTER: &str =
    "info,kube_client::client::builder=off,kube_client::client::tls=error";

/// Installs a `tracing` subscriber for tests (`RUST_LOG`, default `info` for this crate);
/// does nothing if one is already installed.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(QUIET_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

impl Shared {
    async fn connect_or_start() -> Result<Shared> {
        if let Some(kubeconfig) = std::env::var_os("TESTENV_KUBECONFIG").filter(|v| !v.is_empty()) {
            let kubeconfig = PathBuf::from(kubeconfig);
            let registry_addr = std::env::var("TESTENV_REGISTRY").unwrap_or_default();
            if registry_addr.is_empty() {
                tracing::warn!("TESTENV_KUBECONFIG is set but TESTENV_REGISTRY is not");
            }
            let hint = |e: Error| Error::External {
                kubeconfig: kubeconfig.clone(),
                detail: e.to_string(),
            };
            let config = load_kubeconfig(&kubeconfig).await.map_err(hint)?;
            // Fail once, clearly, rather than in every test with "connection refused".
            let client = Client::try_from(config.clone()).map_err(|e| hint(e.into()))?;
            poll("external apiserver /readyz", EXTERNAL_READY, || {
                readyz(&client)
            })
            .await
            .map_err(hint)?;
            tracing::info!(kubeconfig = %kubeconfig.display(), "using external test environment");
            return Ok(Shared {
                kubeconfig,
                config,
                registry_addr,
                bin_dir: paths::default_bin_dir(),
                run_dir: std::env::var_os("TESTENV_RUN_DIR").map(PathBuf::from),
                env: None,
            });
        }
        let env = TestEnv::start(Options::default()).await?;
        let config = env.client_config().cloned().ok_or_else(|| Error::Invalid {
            what: "test environment".into(),
            detail: "started without a client configuration".into(),
        })?;
        if let Some(report) = env.startup_report() {
            tracing::info!("shared test environment {report}");
        }
        Ok(Shared {
            kubeconfig: env.kubeconfig_path(),
            config,
            registry_addr: env.registry_addr().to_string(),
            bin_dir: env.bin_dir().to_path_buf(),
            run_dir: Some(env.run_dir().to_path_buf()),
            env: Some(env),
        })
    }

    /// The API server's audit log (requests of `cocoon-system` service accounts), when this
    /// process knows the environment's run directory.
    pub fn audit_log(&self) -> Option<crate::AuditLog> {
        self.run_dir
            .as_ref()
            .map(|d| crate::AuditLog::at(d.join(crate::env::AUDIT_LOG_FILE)))
    }

    /// A new admin client for the calling runtime. Never cache it across tests: a client
    /// is bound to the runtime it was made on, and each `#[tokio::test]` has its own.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config.clone())?)
    }

    /// The admin client configuration.
    pub fn client_config(&self) -> &kube::Config {
        &self.config
    }

    /// Absolute path of the admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `127.0.0.1:PORT` of the anonymous plain-HTTP registry.
    pub fn registry_addr(&self) -> &str {
        &self.registry_addr
    }

    /// Upstream bin dir (for `kubectl`).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The run dir, when known (always for an owned env; via `TESTENV_RUN_DIR` otherwise).
    pub fn run_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref()
    }

    /// Directory with the environment's certificates and keys (`ca.crt`, `ca.key`, one
    /// client pair per identity), when the run dir is known.
    pub fn pki_dir(&self) -> Option<PathBuf> {
        self.run_dir.as_ref().map(|d| d.join("pki"))
    }

    /// The env this process started, if it started one.
    pub fn env(&self) -> Option<&TestEnv> {
        self.env.as_ref()
    }

    /// Start time and memory, for an env this process started.
    pub fn startup_report(&self) -> Option<&StartupReport> {
        self.env.as_ref().and_then(|e| e.startup_report())
    }

    /// Tails of the component logs (if the run dir is known).
    pub fn log_tails(&self, lines: usize) -> String {
        match &self.run_dir {
            Some(dir) => log_tails_in(dir, lines),
            None => "(run dir unknown: set TESTENV_RUN_DIR to see component logs)".into(),
        }
    }

    /// A kubeconfig `<node>.kubeconfig` in `dir` for this cluster that authenticates as the
    /// kubelet identity of `node`: user `system:node:<node>` in group `system:nodes`, a
    /// client certificate issued from the env's CA (so the Node authorizer and NodeRestriction
    /// hold it to that node). Needs the PKI (`TESTENV_RUN_DIR` for an external env).
    pub fn node_kubeconfig(&self, node: &str, dir: &Path) -> Result<PathBuf> {
        let pki = self.pki_dir().ok_or_else(|| Error::Invalid {
            what: "node kubeconfig".into(),
            detail: "the env's PKI is unknown (set TESTENV_RUN_DIR)".into(),
        })?;
        let (cert, key) = crate::pki::issue_node_client(&pki, node, dir, node)?;
        let path = dir.join(format!("{node}.kubeconfig"));
        let server = self.config.cluster_url.to_string();
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: node
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: node
  context: {{cluster: testenv, user: node}}
current-context: node
",
            server = server.trim_end_matches('/'),
            ca = crate::kubeconfig::quote(&pki.join("ca.crt"))?,
            cert = crate::kubeconfig::quote(&cert)?,
            key = crate::kubeconfig::quote(&key)?,
        );
        std::fs::write(&path, yaml)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(path)
    }

    /// A copy of the admin kubeconfig in `dir` that authenticates as ServiceAccount
    /// `namespace/sa` with a fresh token valid for `duration` (kubectl's syntax, e.g. `2h`).
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        sa: &str,
        duration: &str,
        dir: &Path,
    ) -> Result<PathBuf> {
        let run = |args: &[&str]| -> Result<String> {
            let out = self
                .kubectl()
                .args(args)
                .output()
                .map_err(|e| Error::io(format!("running kubectl {}", args.join(" ")), e))?;
            if !out.status.success() {
                return Err(Error::Kubectl(format!(
                    "kubectl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let token = run(&[
            "-n",
            namespace,
            "create",
            "token",
            sa,
            "--duration",
            duration,
        ])?;
        let path = dir.join(format!("{sa}.kubeconfig"));
        std::fs::copy(&self.kubeconfig, &path)
            .map_err(|e| Error::io(format!("copying the kubeconfig to {}", path.display()), e))?;
        let path_s = path.to_string_lossy().into_owned();
        run(&[
            "--kubeconfig",
            &path_s,
            "config",
            "set-credentials",
            sa,
            "--token",
            token.trim(),
        ])?;
        run(&[
            "--kubeconfig",
            &path_s,
            "config",
            "set-context",
            "--current",
            "--user",
            sa,
        ])?;
        Ok(path)
    }

    /// A real kubelet (with its own containerd) registered as one Node of this env, started
    /// on the first call in the process and torn down at exit; later calls return the same
    /// one. Only tests that run pods for real call this, so the others never pay for it.
    /// The Node is tainted [`crate::KUBELET_TAINT_KEY`]; see [`crate::kubelet`] for what
    /// its pods can and cannot do. Needs the env's PKI (`TESTENV_RUN_DIR` for an external
    /// env) and the tools `scripts/setup.sh` installs.
    pub async fn kubelet(&'static self) -> Result<&'static Kubelet> {
        let cell = match KUBELET.get() {
            Some(c) => c,
            None => tokio::task::spawn_blocking(move || {
                KUBELET.get_or_init(|| self.start_kubelet_blocking())
            })
            .await
            .map_err(|e| Error::Shared(format!("kubelet start task failed: {e}")))?,
        };
        cell.as_ref().map_err(|e| Error::Shared(e.clone()))
    }

    fn start_kubelet_blocking(&self) -> std::result::Result<Kubelet, String> {
        let pki_dir = self.pki_dir().ok_or_else(|| {
            "the kubelet needs the env's PKI: set TESTENV_RUN_DIR to the env's run dir".to_string()
        })?;
        let opts = KubeletOptions {
            node_name: unique_name("kubelet"),
            apiserver_url: self
                .config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_string(),
            pki_dir,
            bin_dir: self.bin_dir.clone(),
            admin_kubeconfig: self.kubeconfig.clone(),
            timeout: KUBELET_READY,
            keep_run_dir: std::env::var_os("TESTENV_KEEP").is_some(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("building a runtime: {e}"))?;
        let kubelet = rt
            .block_on(async {
                let client = self.client()?;
                Kubelet::start(&client, opts).await
            })
            .map_err(|e| e.to_string())?;
        // SAFETY: registering a plain extern "C" function; it catches its own panics. It runs
        // before the env's own handler (registered earlier), while the API server is up.
        unsafe {
            libc::atexit(cleanup_kubelet_at_exit);
        }
        Ok(kubelet)
    }

    /// The upstream `kubectl` binary (see [`Shared::kubectl`] for a command aimed at this env).
    pub fn kubectl_bin(&self) -> std::path::PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// The upstream `kubectl` with `--kubeconfig` pointing at this env.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.bin_dir.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }
}

/// A DNS-1123 label unique across calls and processes: `<prefix>-<pid>-<n><salt>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut clean: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    clean.truncate(40);
    let clean = clean.trim_matches('-');
    let clean = if clean.is_empty() { "t" } else { clean };
    // A little clock salt keeps names distinct across runs against one long-lived env.
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() & 0xfff)
        .unwrap_or(0);
    format!("{clean}-{:x}-{n}{salt:03x}", std::process::id())
}

/// Creates a uniquely named namespace (labelled as a test namespace) and returns its name.
pub async fn create_namespace(client: &Client, prefix: &str) -> Result<String> {
    let name = unique_name(prefix);
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &ns).await?;
    Ok(name)
}

/// Makes sure the namespace `name` exists (created if missing; one that exists, or is created
/// concurrently by another test, is fine). For fixed namespaces such as `cocoon-system`, which
/// a test must not assume an earlier test created.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Force-deletes the namespace's pods (no kubelet will ever confirm a graceful delete of a
/// pod bound to a fake node) and then the namespace; does not wait for it to vanish.
pub async fn delete_namespace(client: &Client, name: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let force = DeleteParams::background().grace_period(0);
    match pods.delete_collection(&force, &ListParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let api: Api<Namespace> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What a test body may return: `()` or any `Result<(), E: Debug>`.
pub trait TestOutcome {
    fn into_failure(self) -> Option<String>;
}

impl TestOutcome for () {
    fn into_failure(self) -> Option<String> {
        None
    }
}

impl<E: std::fmt::Debug> TestOutcome for std::result::Result<(), E> {
    fn into_failure(self) -> Option<String> {
        self.err().map(|e| format!("{e:?}"))
    }
}

/// Prints the component log tails to stderr if dropped while panicking.
#[derive(Debug)]
pub struct LogsOnFailure {
    shared: &'static Shared,
    armed: bool,
}

impl LogsOnFailure {
    pub fn new(shared: &'static Shared) -> Self {
        LogsOnFailure {
            shared,
            armed: true,
        }
    }

    /// Prints the tails now and disarms the guard.
    pub fn dump(&mut self) {
        self.armed = false;
        eprintln!(
            "---- cocoon-testenv component logs ----\n{}",
            self.shared.log_tails(LOG_TAIL_LINES)
        );
    }
}

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            self.dump();
        }
    }
}

/// Lines of each component log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 30;

/// Runs a test body against the shared env. On panic or `Err`, prints the component log
/// tails and the run dir, then fails the test.
///
/// ```no_run
/// // #[tokio::test]
/// async fn works() {
///     cocoon_testenv::run_test(|env| async move {
///         let client = env.client()?;
///         let ns = cocoon_testenv::create_namespace(&client, "works").await?;
///         // ... the test ...
///         cocoon_testenv::delete_namespace(&client, &ns).await?;
///         Ok::<_, cocoon_testenv::Error>(())
///     })
///     .await;
/// }
/// ```
pub async fn run_test<F, Fut, R>(body: F)
where
    F: FnOnce(&'static Shared) -> Fut,
    Fut: Future<Output = R>,
    R: TestOutcome,
{
    let env = shared().await;
    let mut guard = LogsOnFailure::new(env);
    if let Some(failure) = body(env).await.into_failure() {
        guard.dump();
        panic!("test failed: {failure}");
    }
}

/// Default deadline for test waits against the shared env.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
