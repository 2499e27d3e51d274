//! `TestEnv`: one real control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager) plus a registry, started with deadlines and torn down in order.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::Api;

use crate::error::{Error, Result};
use crate::kubeconfig::{load_kubeconfig, quote, write_kubeconfigs};
use crate::paths;
use crate::pki::Pki;
use crate::process::{ChildProc, STOP_GRACE, free_ports, rss_kib};
use crate::registry::{Registry, RegistryAuth};
use crate::rundir::{log_tails_in, make_run_dir, mark_keep, remove_run_dir};
use crate::wait::{Probe, poll};

/// Starting on a port another process grabbed is retried this many times.
const PORT_ATTEMPTS: usize = 3;
/// The API server's audit policy and log, in the run directory.
const AUDIT_POLICY_FILE: &str = "audit-policy.yaml";
/// See [`AUDIT_POLICY_FILE`]; read it with [`crate::AuditLog`].
pub const AUDIT_LOG_FILE: &str = "audit.log";
/// Metadata-level records of every request made by a service account of `cocoon-system`
/// (where the shipped manifests put the operator) or of `cocoon-nodes` (node agents in
/// ServiceAccount mode), and by node identities (`system:nodes`: node agents and kubelets);
/// nothing else is recorded.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [\"system:serviceaccounts:cocoon-system\", \"system:serviceaccounts:cocoon-nodes\", \"system:nodes\"]
- level: None
";
/// The API server's kubelet client identity (`--kubelet-client-certificate`).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// As kubeadm does: the API server's kubelet client may use every kubelet API (exec, logs,
/// stats), through the bootstrap ClusterRole `system:kubelet-api-admin`. Node agents that
/// authorize their clients (SubjectAccessReview) need this for `kubectl exec`/`logs`.
async fn bind_kubelet_client(client: &Client) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("testenv:{KUBELET_CLIENT_USER}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "system:kubelet-api-admin".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: KUBELET_CLIENT_USER.into(),
            namespace: None,
        }]),
    };
    match api
        .create(&kube::api::PostParams::default(), &binding)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Per-request bound for readiness probes, so a wedged connection cannot eat the deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a [`TestEnv`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Upstream bin dir; default `$TESTENV_BIN` or the build script's cache dir.
    pub bin_dir: Option<PathBuf>,
    /// Registry binary; default `$TESTENV_REGISTRY_BIN`, the fetch script's cache path,
    /// or `/usr/bin/docker-registry`.
    pub registry_bin: Option<PathBuf>,
    /// Require basic auth (htpasswd) on the env's registry.
    pub registry_auth: Option<RegistryAuth>,
    /// Install cocoon's CRDs and wait until they are Established.
    pub install_crds: bool,
    /// Keep the run dir after teardown (default: `TESTENV_KEEP` is set).
    pub keep_run_dir: bool,
    /// Budget for the apiserver's `/readyz` (10–30 s is typical on two cores).
    pub apiserver_timeout: Duration,
    /// Budget for each of the other readiness checks.
    pub component_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bin_dir: None,
            registry_bin: None,
            registry_auth: None,
            install_crds: true,
            keep_run_dir: std::env::var_os("TESTENV_KEEP").is_some(),
            apiserver_timeout: Duration::from_secs(90),
            component_timeout: Duration::from_secs(60),
        }
    }
}

/// Resident memory of one component after start.
#[derive(Debug, Clone)]
pub struct ComponentMemory {
    pub component: String,
    pub pid: u32,
    /// `VmRSS` in KiB; `None` if the process is gone.
    pub rss_kib: Option<u64>,
}

/// Start time and memory, for the `up` binary and the report.
#[derive(Debug, Clone)]
pub struct StartupReport {
    /// From `TestEnv::start` being called to CRDs Established.
    pub elapsed: Duration,
    pub memory: Vec<ComponentMemory>,
}

impl std::fmt::Display for StartupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "started in {:.1}s", self.elapsed.as_secs_f64())?;
        let mut total = 0;
        for m in &self.memory {
            let rss = m.rss_kib.unwrap_or(0);
            total += rss;
            writeln!(
                f,
                "  {:<24} pid {:<8} RSS {:>7.1} MiB",
                m.component,
                m.pid,
                mib(rss)
            )?;
        }
        write!(
            f,
            "  {:<24} {:<12} RSS {:>7.1} MiB",
            "total",
            "",
            mib(total)
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A running local control plane and registry. Torn down by [`TestEnv::shutdown`] or drop.
#[derive(Debug)]
pub struct TestEnv {
    run_dir: PathBuf,
    bin_dir: PathBuf,
    api_port: u16,
    admin_config: Option<kube::Config>,
    /// Control-plane processes in start order; stopped in reverse.
    children: Mutex<Vec<ChildProc>>,
    /// Stopped last, after etcd.
    registry: Mutex<Option<Registry>>,
    registry_addr: String,
    keep: bool,
    report: Option<StartupReport>,
    torn_down: bool,
}

impl TestEnv {
    /// Starts everything and waits until it is ready (see the module docs for the order).
    pub async fn start(opts: Options) -> Result<TestEnv> {
        let began = Instant::now();
        let bin_dir = opts.bin_dir.clone().unwrap_or_else(paths::default_bin_dir);
        paths::check_bin_dir(&bin_dir)?;
        let registry_bin = opts
            .registry_bin
            .clone()
            .unwrap_or_else(paths::default_registry_bin);
        paths::check_registry_bin(&registry_bin)?;

        let run_dir = make_run_dir("cocoon-testenv")?;
        if opts.keep_run_dir {
            mark_keep(&run_dir);
        }
        // From here on, dropping `env` (also on the error path) stops whatever was started.
        let mut env = TestEnv {
            run_dir: run_dir.clone(),
            bin_dir,
            api_port: 0,
            admin_config: None,
            children: Mutex::new(Vec::new()),
            registry: Mutex::new(None),
            registry_addr: String::new(),
            keep: opts.keep_run_dir,
            report: None,
            torn_down: false,
        };
        tracing::info!(run_dir = %run_dir.display(), "starting test environment");
        match env.boot(&opts, &registry_bin, began).await {
            Ok(()) => Ok(env),
            Err(e) => {
                tracing::error!(error = %e, "test environment failed to start");
                // Keep the evidence if asked to; otherwise the error carries the log tail.
                Err(match e {
                    Error::Timeout { what, after, last } => Error::Timeout {
                        what,
                        after,
                        last: format!("{last}\n{}", env.log_tails(15)),
                    },
                    other => other,
                })
            }
        }
    }

    async fn boot(&mut self, opts: &Options, registry_bin: &Path, began: Instant) -> Result<()> {
        let logs = self.run_dir.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
        let pki = Pki::generate(&self.run_dir.join("pki"))?;

        // etcd and the registry are independent, so they start side by side.
        let registry_dir = self.run_dir.join("registry");
        let (etcd_port, registry) = tokio::try_join!(
            self.start_etcd(opts.component_timeout),
            Registry::start_in(
                registry_bin,
                &registry_dir,
                &logs,
                opts.registry_auth.clone(),
                true,
            ),
        )?;
        self.registry_addr = registry.addr().to_string();
        *lock(&self.registry) = Some(registry);

        self.api_port = self
            .start_apiserver(&pki, etcd_port, opts.apiserver_timeout)
            .await?;
        let config = load_kubeconfig(&self.kubeconfig_path()).await?;
        self.admin_config = Some(config);

        tokio::try_join!(
            self.start_scheduler(opts.component_timeout),
            self.start_controller_manager(&pki, opts.component_timeout),
        )?;

        let client = self.client()?;
        // Full mode's functional check: the serviceaccount controller has run. The CRDs
        // need only the apiserver, so they go in while the controller-manager warms up.
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let sa_ready = poll(
            "sa/default in namespace default",
            opts.component_timeout,
            || {
                let sa = sa.clone();
                async move {
                    match sa.get_opt("default").await {
                        Ok(Some(_)) => Probe::Ready(()),
                        Ok(None) => Probe::NotYet("not created yet".into()),
                        Err(e) => Probe::NotYet(e.to_string()),
                    }
                }
            },
        );
        let crds = async {
            if opts.install_crds {
                crate::crds::install(&client, opts.component_timeout).await?;
            }
            Ok::<_, Error>(())
        };
        tokio::try_join!(sa_ready, crds, bind_kubelet_client(&client))?;
        let report = StartupReport {
            elapsed: began.elapsed(),
            memory: self.memory(),
        };
        tracing::info!(elapsed = ?report.elapsed, "test environment ready");
        self.report = Some(report);
        Ok(())
    }

    async fn start_etcd(&self, timeout: Duration) -> Result<u16> {
        let data = crate::rundir::etcd_data_dir(&self.run_dir);
        let ports = self
            .start_component(
                "etcd",
                2,
                timeout,
                |p| {
                    let client = format!("http://127.0.0.1:{}", p[0]);
                    let peer = format!("http://127.0.0.1:{}", p[1]);
                    args([
                        "--name=testenv".to_string(),
                        format!("--data-dir={}", data.display()),
                        format!("--listen-client-urls={client}"),
                        format!("--advertise-client-urls={client}"),
                        format!("--listen-peer-urls={peer}"),
                        format!("--initial-advertise-peer-urls={peer}"),
                        format!("--initial-cluster=testenv={peer}"),
                        "--unsafe-no-fsync".into(),
                        "--logger=zap".into(),
                        "--log-level=warn".into(),
                    ])
                },
                |p| {
                    let url = format!("http://127.0.0.1:{}/health", p[0]);
                    async move {
                        let http = match reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() {
                            Ok(h) => h,
                            Err(e) => return Probe::Fail(e.into()),
                        };
                        match http.get(&url).send().await {
                            Ok(r) if r.status().is_success() => match r.text().await {
                                Ok(body) if body.contains(r#""health":"true""#) => Probe::Ready(()),
                                Ok(body) => Probe::NotYet(body),
                                Err(e) => Probe::NotYet(e.to_string()),
                            },
                            Ok(r) => Probe::NotYet(format!("status {}", r.status())),
                            Err(e) => Probe::NotYet(e.to_string()),
                        }
                    }
                },
            )
            .await?;
        Ok(ports[0])
    }

    async fn start_apiserver(&self, pki: &Pki, etcd_port: u16, timeout: Duration) -> Result<u16> {
        let kubeconfig = self.kubeconfig_path();
        let run_dir = self.run_dir.clone();
        let audit_policy = self.run_dir.join(AUDIT_POLICY_FILE);
        std::fs::write(&audit_policy, AUDIT_POLICY)
            .map_err(|e| Error::io(format!("writing {}", audit_policy.display()), e))?;
        let audit_log = self.run_dir.join(AUDIT_LOG_FILE);
        let ports = self
            .start_component(
                "kube-apiserver",
                1,
                timeout,
                |p| {
                    // The kubeconfigs embed the port, so they are (re)written per attempt.
                    write_kubeconfigs(&run_dir, pki, p[0])?;
                    args([
                        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                        "--bind-address=127.0.0.1".into(),
                        "--advertise-address=127.0.0.1".into(),
                        format!("--secure-port={}", p[0]),
                        format!("--tls-cert-file={}", pki.cert("apiserver").display()),
                        format!("--tls-private-key-file={}", pki.key("apiserver").display()),
                        format!("--client-ca-file={}", pki.ca_cert().display()),
                        "--service-account-issuer=https://kubernetes.default.svc".into(),
                        format!("--service-account-key-file={}", pki.sa_pub().display()),
                        format!(
                            "--service-account-signing-key-file={}",
                            pki.sa_key().display()
                        ),
                        "--service-cluster-ip-range=10.0.0.0/24".into(),
                        "--authorization-mode=Node,RBAC".into(),
                        "--allow-privileged=true".into(),
                        // Pods in brand-new namespaces would otherwise wait for sa/default.
                        "--disable-admission-plugins=ServiceAccount".into(),
                        // As hardened clusters run: setting blockOwnerDeletion on an owner
                        // reference needs `update` on the owner's finalizers subresource; and,
                        // as kubeadm clusters run, a node identity (system:node:<name>) may
                        // write only its own Node, Lease and pods (NodeRestriction).
                        "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement".into(),
                        // Requests of service accounts in cocoon-system (the shipped RBAC under
                        // test) are audited, so a test can compare what they call with what
                        // their roles grant.
                        format!("--audit-policy-file={}", audit_policy.display()),
                        format!("--audit-log-path={}", audit_log.display()),
                        "--audit-log-format=json".into(),
                        "--audit-log-mode=blocking".into(),
                        "--audit-log-maxbackup=1".into(),
                        // With a loopback advertise address the endpoint reconciler only fails.
                        "--endpoint-reconciler-type=none".into(),
                        format!(
                            "--kubelet-client-certificate={}",
                            pki.cert("apiserver-kubelet-client").display()
                        ),
                        format!(
                            "--kubelet-client-key={}",
                            pki.key("apiserver-kubelet-client").display()
                        ),
                        // Reach node agents' kubelet APIs (exec, logs) at their InternalIP:
                        // the default prefers the Hostname address, and test node names do
                        // not resolve.
                        "--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP".into(),
                        "--default-not-ready-toleration-seconds=30".into(),
                        "--default-unreachable-toleration-seconds=30".into(),
                        "--profiling=false".into(),
                        "--v=1".into(),
                    ])
                },
                |_| {
                    let kubeconfig = kubeconfig.clone();
                    async move {
                        let client = match load_kubeconfig(&kubeconfig).await {
                            Ok(mut c) => {
                                c.connect_timeout = Some(PROBE_TIMEOUT);
                                c.read_timeout = Some(PROBE_TIMEOUT);
                                Client::try_from(c)
                            }
                            Err(e) => return Probe::Fail(e),
                        };
                        let client = match client {
                            Ok(c) => c,
                            Err(e) => return Probe::Fail(e.into()),
                        };
                        get_text(&client, "/readyz").await
                    }
                },
            )
            .await?;
        Ok(ports[0])
    }

    async fn start_scheduler(&self, timeout: Duration) -> Result<()> {
        let kubeconfig = self.run_dir.join("scheduler.kubeconfig");
        let config = self.run_dir.join("kube-scheduler.yaml");
        let yaml = format!(
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {}
leaderElection:
  leaderElect: false
",
            quote(&kubeconfig)?
        );
        std::fs::write(&config, yaml)
            .map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
        self.start_component(
            "kube-scheduler",
            1,
            timeout,
            |p| {
                args([
                    format!("--config={}", config.display()),
                    format!("--authentication-kubeconfig={}", kubeconfig.display()),
                    format!("--authorization-kubeconfig={}", kubeconfig.display()),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={}", p[0]),
                    "--v=1".into(),
                ])
            },
            |p| healthz(p[0]),
        )
        .await
        .map(|_| ())
    }

    async fn start_controller_manager(&self, pki: &Pki, timeout: Duration) -> Result<()> {
        let kubeconfig = self.run_dir.join("controller-manager.kubeconfig");
        self.start_component(
            "kube-controller-manager",
            1,
            timeout,
            |p| {
                args([
                    format!("--kubeconfig={}", kubeconfig.display()),
                    format!("--authentication-kubeconfig={}", kubeconfig.display()),
                    format!("--authorization-kubeconfig={}", kubeconfig.display()),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={}", p[0]),
                    "--leader-elect=false".into(),
                    "--use-service-account-credentials=true".into(),
                    format!(
                        "--service-account-private-key-file={}",
                        pki.sa_key().display()
                    ),
                    format!("--root-ca-file={}", pki.ca_cert().display()),
                    format!("--cluster-signing-cert-file={}", pki.ca_cert().display()),
                    format!("--cluster-signing-key-file={}", pki.ca_key().display()),
                    "--service-cluster-ip-range=10.0.0.0/24".into(),
                    "--controllers=*".into(),
                    // Fast node-lifecycle reactions; still well above TestNode's 5 s renew.
                    "--node-monitor-period=1s".into(),
                    "--node-monitor-grace-period=15s".into(),
                    "--v=1".into(),
                ])
            },
            |p| healthz(p[0]),
        )
        .await
        .map(|_| ())
    }

    /// Spawns `name` on `nports` fresh ports and polls `probe` until ready; retries with new
    /// ports if the process lost a port race, and fails fast if it exits.
    async fn start_component<A, P, Fut>(
        &self,
        name: &str,
        nports: usize,
        timeout: Duration,
        make_args: A,
        probe: P,
    ) -> Result<Vec<u16>>
    where
        A: Fn(&[u16]) -> Result<Vec<OsString>>,
        P: Fn(&[u16]) -> Fut,
        Fut: Future<Output = Probe<()>>,
    {
        let program = self.bin_dir.join(name);
        let logs = self.run_dir.join("logs");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = free_ports(nports)?;
            let argv = make_args(&ports)?;
            let child = ChildProc::spawn(name, &program, &argv, &logs)?;
            tracing::info!(component = name, pid = child.pid(), ?ports, "started");
            lock(&self.children).push(child);
            let result = poll(&format!("{name} ready"), timeout, || {
                let exited = self.exited_error(name);
                let fut = probe(&ports);
                async move {
                    match exited {
                        Some(e) => Probe::Fail(e),
                        None => fut.await,
                    }
                }
            })
            .await;
            match result {
                Ok(()) => return Ok(ports),
                Err(e) if e.is_port_race() && attempt < PORT_ATTEMPTS => {
                    tracing::warn!(component = name, ?ports, "lost a port race; retrying");
                    lock(&self.children).retain(|c| c.name() != name);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn exited_error(&self, name: &str) -> Option<Error> {
        lock(&self.children)
            .iter_mut()
            .find(|c| c.name() == name)
            .and_then(|c| c.exited_error())
    }

    /// Fails with the first component (registry included) that has exited, with its log
    /// tail; for watchdogs that should not keep running against a half-dead env.
    pub fn check_alive(&self) -> Result<()> {
        if let Some(e) = lock(&self.children)
            .iter_mut()
            .find_map(|c| c.exited_error())
        {
            return Err(e);
        }
        match lock(&self.registry).as_mut().and_then(|r| r.exited_error()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A new admin client (`system:masters`). Must be called inside a Tokio runtime; the
    /// client belongs to that runtime, so make one per runtime rather than caching it.
    pub fn client(&self) -> Result<Client> {
        let config = self.admin_config.clone().ok_or_else(|| Error::Invalid {
            what: "test environment".into(),
            detail: "not started".into(),
        })?;
        Ok(Client::try_from(config)?)
    }

    /// The admin client configuration (runtime-independent; clone freely).
    pub fn client_config(&self) -> Option<&kube::Config> {
        self.admin_config.as_ref()
    }

    /// Absolute path of the admin kubeconfig.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join("admin.kubeconfig")
    }

    /// Kubeconfig of another identity: `scheduler` or `controller-manager`.
    pub fn kubeconfig_for(&self, identity: &str) -> PathBuf {
        self.run_dir.join(format!("{identity}.kubeconfig"))
    }

    /// `https://127.0.0.1:PORT`.
    pub fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// `127.0.0.1:PORT` of the env's registry (plain HTTP).
    pub fn registry_addr(&self) -> &str {
        &self.registry_addr
    }

    /// The run directory (data, logs, PKI, kubeconfigs).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The API server's audit log (requests of `cocoon-system` service accounts).
    pub fn audit_log(&self) -> crate::AuditLog {
        crate::AuditLog::at(self.run_dir.join(AUDIT_LOG_FILE))
    }

    /// Where the upstream binaries (including `kubectl`) are.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Directory with the generated certificates and keys.
    pub fn pki_dir(&self) -> PathBuf {
        self.run_dir.join("pki")
    }

    /// The last `lines` lines of every component log, each under a header.
    pub fn log_tails(&self, lines: usize) -> String {
        log_tails_in(&self.run_dir, lines)
    }

    /// Start time and the memory right after start.
    pub fn startup_report(&self) -> Option<&StartupReport> {
        self.report.as_ref()
    }

    /// Current RSS of every component.
    pub fn memory(&self) -> Vec<ComponentMemory> {
        let mut out: Vec<ComponentMemory> = lock(&self.children)
            .iter()
            .map(|c| ComponentMemory {
                component: c.name().to_string(),
                pid: c.pid(),
                rss_kib: rss_kib(c.pid()),
            })
            .collect();
        if let Some(pid) = lock(&self.registry).as_ref().and_then(|r| r.pid()) {
            out.push(ComponentMemory {
                component: "registry".into(),
                pid,
                rss_kib: rss_kib(pid),
            });
        }
        out
    }

    /// Process ids of all components (start order, registry last).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.memory()
            .into_iter()
            .map(|m| (m.component, m.pid))
            .collect()
    }

    /// Stops everything gracefully and removes the run dir (unless kept).
    pub fn shutdown(mut self) {
        self.teardown();
    }

    /// SIGTERM in reverse start order (registry last), SIGKILL after the grace period.
    fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut children = std::mem::take(&mut *lock(&self.children));
        for c in children.iter_mut().rev() {
            c.stop(STOP_GRACE);
        }
        if let Some(r) = lock(&self.registry).take() {
            r.shutdown();
        }
        self.finish_run_dir();
    }

    /// Kills everything at once; used at process exit where `&'static` is all we have.
    pub(crate) fn kill_now(&self) {
        let mut children = std::mem::take(&mut *lock(&self.children));
        for c in children.iter_mut().rev() {
            c.kill();
        }
        if let Some(mut r) = lock(&self.registry).take() {
            r.kill();
        }
        self.finish_run_dir();
    }

    fn finish_run_dir(&self) {
        if self.keep {
            eprintln!("cocoon-testenv: kept run dir {}", self.run_dir.display());
        } else {
            remove_run_dir(&self.run_dir);
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Locks a mutex even if a panicking test poisoned it: teardown must still run.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn args<const N: usize>(list: [String; N]) -> Result<Vec<OsString>> {
    Ok(list.into_iter().map(OsString::from).collect())
}

/// One `/readyz` probe through `client`.
pub(crate) async fn readyz(client: &Client) -> Probe<()> {
    get_text(client, "/readyz").await
}

async fn get_text(client: &Client, path: &str) -> Probe<()> {
    let req = match http::Request::get(path).body(Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            return Probe::Fail(Error::Invalid {
                what: "probe request".into(),
                detail: e.to_string(),
            });
        }
    };
    match client.request_text(req).await {
        Ok(body) if body.trim() == "ok" || body.contains("check passed") => Probe::Ready(()),
        Ok(body) => Probe::NotYet(body),
        Err(e) => Probe::NotYet(e.to_string()),
    }
}

/// `/healthz` of the scheduler or controller-manager: loopback, self-signed in-memory
/// serving cert, no authentication needed.
async fn healthz(port: u16) -> Probe<()> {
    let uri = match format!("https://127.0.0.1:{port}").parse() {
        Ok(u) => u,
        Err(e) => {
            return Probe::Fail(Error::Invalid {
                what: "healthz url".into(),
                detail: format!("{e}"),
            });
        }
    };
    let mut config = kube::Config::new(uri);
    // An empty trust store plus accept_invalid_certs: skip verification without kube
    // falling back to the platform verifier.
    config.root_cert = Some(Vec::new());
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(PROBE_TIMEOUT);
    config.read_timeout = Some(PROBE_TIMEOUT);
    match Client::try_from(config) {
        Ok(client) => get_text(&client, "/healthz").await,
        Err(e) => Probe::Fail(e.into()),
    }
}
