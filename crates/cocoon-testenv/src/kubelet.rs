//! A real kubelet on one ordinary node of the env, for tests that run the shipped manifests as
//! pods: upstream `kubelet` (built by `upstream/build.sh` beside the control plane) on a private
//! Debian `containerd` (runc, cgroupfs driver), both in a run dir of their own.
//!
//! Relaxed for a shared test host: no QoS cgroups or node-allocatable enforcement, swap and
//! cgroup v1 allowed, eviction and image GC thresholds out of reach, kubelet API on the
//! host-only node address [`KUBELET_NODE_IP`].
//! The node is tainted [`KUBELET_TAINT_KEY`]`:NoSchedule`, so only pods that tolerate it land
//! there, and its pods have no pod network: the CNI config is loopback only, so a pod that must
//! reach the API server runs with `hostNetwork` (the API server listens on 127.0.0.1).
//!
//! The sandbox ("pause") image is `upstream/build.sh`'s static build of Kubernetes' own
//! `build/pause/linux/pause.c`, packed with podman and imported into containerd, since no
//! image can be pulled here. Images under test are loaded the same way
//! ([`Kubelet::import_image`]).
//!
//! Teardown (and the sweep of run dirs left by killed test processes) kills the containers'
//! init processes and this containerd's shims (matched by its socket path), stops kubelet and
//! containerd, removes the containers' cgroups and the kubelet's `/var/log/containers` links
//! into the run dir, unmounts everything under the run dir and deletes the Node. (The kubelet
//! also always serves `/var/lib/kubelet/device-plugins/kubelet.sock`, whatever its root dir;
//! nothing here uses device plugins.)

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

use crate::error::{Error, Result};
use crate::kubeconfig::quote;
use crate::process::{ChildProc, free_ports, tail_file};
use crate::rundir::{make_run_dir, remove_run_dir, stale_run_dirs};
use crate::wait::{Probe, poll};

/// Taint (effect `NoSchedule`) on the kubelet's node; pods meant for it tolerate this key.
pub const KUBELET_TAINT_KEY: &str = "cocoon-testenv/kubelet";
/// The kubelet node's `InternalIP`, so the address of its host-network pods: a `/32` on `lo`
/// from the benchmarking range (RFC 2544, never routed), added by the env when missing. Not in
/// 127/8, because the kubelet will not publish a loopback node IP (its pods would then have no
/// `podIP`) and the API server refuses loopback endpoint addresses; on `lo`, so nothing the
/// tests serve on it is reachable from outside this host.
pub const KUBELET_NODE_IP: &str = "198.18.0.1";
/// The sandbox image containerd is configured with (imported at start, never pulled).
pub const PAUSE_IMAGE: &str = "localhost/cocoon-testenv/pause:testenv";
/// containerd namespace the CRI plugin (and so the kubelet) uses.
const CRI_NAMESPACE: &str = "k8s.io";
/// Run dirs are `<tmp>/cocoon-kubelet-<pid>-<n>`.
const RUN_DIR_PREFIX: &str = "cocoon-kubelet";
/// Where the setup script that installs containerd, runc and podman lives.
const SETUP_SCRIPT: &str = "scripts/setup.sh";
/// How long the kubelet and containerd get to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// containerd keeps one directory per task (container) here, under its state dir.
const TASK_DIR: &str = "io.containerd.runtime.v2.task";

/// What a kubelet needs to know about the control plane it joins.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// The Node name to register.
    pub node_name: String,
    /// `https://127.0.0.1:PORT` of the API server.
    pub apiserver_url: String,
    /// The env's PKI (its CA signs the kubelet's client certificate).
    pub pki_dir: PathBuf,
    /// Upstream bin dir (`kubelet`, `pause`, `kubectl`).
    pub bin_dir: PathBuf,
    /// Admin kubeconfig, for deleting the Node at teardown.
    pub admin_kubeconfig: PathBuf,
    /// Budget for containerd to answer and for the Node to report Ready.
    pub timeout: Duration,
    /// Keep the run dir after teardown.
    pub keep_run_dir: bool,
}

/// A running kubelet and its containerd. Torn down by [`Kubelet::shutdown`] or drop.
#[derive(Debug)]
pub struct Kubelet {
    node: String,
    dir: PathBuf,
    socket: PathBuf,
    bin_dir: PathBuf,
    admin_kubeconfig: PathBuf,
    keep: bool,
    /// containerd, then the kubelet; stopped in reverse.
    children: Mutex<Vec<ChildProc>>,
    torn_down: Mutex<bool>,
}

impl Kubelet {
    /// Starts containerd, imports the pause image, starts the kubelet and waits until its
    /// Node is Ready.
    pub async fn start(client: &Client, opts: KubeletOptions) -> Result<Kubelet> {
        for name in crate::paths::KUBELET_BINARIES {
            let path = opts.bin_dir.join(name);
            if !path.is_file() {
                return Err(Error::MissingBinary {
                    what: name.into(),
                    path,
                    script: crate::paths::BUILD_SCRIPT,
                });
            }
        }
        let kubelet_bin = opts.bin_dir.join("kubelet");
        let pause_bin = opts.bin_dir.join("pause");
        for tool in [
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
            "podman",
        ] {
            if find_on_path(tool).is_none() {
                return Err(Error::MissingBinary {
                    what: tool.into(),
                    path: PathBuf::from(tool),
                    script: SETUP_SCRIPT,
                });
            }
        }
        sweep_stale();
        let dir = make_run_dir(RUN_DIR_PREFIX)?;
        if opts.keep_run_dir {
            crate::rundir::mark_keep(&dir);
        }
        let kubelet = Kubelet {
            node: opts.node_name.clone(),
            socket: dir.join("containerd.sock"),
            dir,
            bin_dir: opts.bin_dir.clone(),
            admin_kubeconfig: opts.admin_kubeconfig.clone(),
            keep: opts.keep_run_dir,
            children: Mutex::new(Vec::new()),
            torn_down: Mutex::new(false),
        };
        tracing::info!(node = %opts.node_name, dir = %kubelet.dir.display(), "starting kubelet");
        // On error, dropping `kubelet` tears down whatever was started.
        kubelet
            .boot(client, &opts, &kubelet_bin, &pause_bin)
            .await?;
        Ok(kubelet)
    }

    async fn boot(
        &self,
        client: &Client,
        opts: &KubeletOptions,
        kubelet_bin: &Path,
        pause_bin: &Path,
    ) -> Result<()> {
        let logs = self.dir.join("logs");
        mkdir(&logs)?;
        self.start_containerd(opts.timeout).await?;
        self.import_pause(pause_bin)?;

        let (cert, key) =
            crate::pki::issue_node_client(&opts.pki_dir, &self.node, &self.dir, "kubelet-client")?;
        let kubeconfig = self.dir.join("kubelet.kubeconfig");
        write_file(
            &kubeconfig,
            &format!(
                "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: kubelet
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: kubelet
  context: {{cluster: testenv, user: kubelet}}
current-context: kubelet
",
                server = opts.apiserver_url,
                ca = quote(&opts.pki_dir.join("ca.crt"))?,
                cert = quote(&cert)?,
                key = quote(&key)?,
            ),
        )?;
        ensure_node_ip()?;
        let ports = free_ports(2)?;
        let config = self.dir.join("kubelet.yaml");
        write_file(
            &config,
            &kubelet_config(
                ports[0],
                ports[1],
                &opts.pki_dir.join("ca.crt"),
                &self.socket,
                &self.dir.join("pod-logs"),
            )?,
        )?;
        let args: Vec<OsString> = [
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", self.dir.join("root").display()),
            format!("--cert-dir={}", self.dir.join("serving").display()),
            format!("--hostname-override={}", self.node),
            format!("--node-ip={KUBELET_NODE_IP}"),
            "--v=1".into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let child = ChildProc::spawn("kubelet", kubelet_bin, &args, &logs)?;
        tracing::info!(pid = child.pid(), node = %self.node, "kubelet started");
        lock(&self.children).push(child);

        let nodes: Api<Node> = Api::all(client.clone());
        poll(&format!("node {} Ready", self.node), opts.timeout, || {
            let exited = self.exited_error();
            let nodes = nodes.clone();
            let name = self.node.clone();
            async move {
                if let Some(e) = exited {
                    return Probe::Fail(e);
                }
                match nodes.get_opt(&name).await {
                    Ok(Some(n)) => match node_ready(&n) {
                        Some(true) => Probe::Ready(()),
                        other => Probe::NotYet(format!("Ready={other:?}")),
                    },
                    Ok(None) => Probe::NotYet("not registered yet".into()),
                    Err(e) => Probe::NotYet(e.to_string()),
                }
            }
        })
        .await
        .map_err(|e| self.with_logs(e))?;
        tracing::info!(node = %self.node, "kubelet node Ready");
        Ok(())
    }

    async fn start_containerd(&self, timeout: Duration) -> Result<()> {
        let cni = self.dir.join("cni");
        mkdir(&cni)?;
        // Loopback only: pods get `lo` and nothing else, and the runtime reports its network
        // ready, so the node becomes Ready.
        write_file(
            &cni.join("10-loopback.conflist"),
            r#"{"cniVersion":"0.4.0","name":"testenv-loopback","plugins":[{"type":"loopback"}]}"#,
        )?;
        let config = self.dir.join("containerd.toml");
        write_file(&config, &containerd_config(&self.dir, &self.socket)?)?;
        let program = find_on_path("containerd").ok_or_else(|| Error::MissingBinary {
            what: "containerd".into(),
            path: "containerd".into(),
            script: SETUP_SCRIPT,
        })?;
        let args = vec![OsString::from("--config"), config.into_os_string()];
        let child = ChildProc::spawn("containerd", &program, &args, &self.dir.join("logs"))?;
        tracing::info!(pid = child.pid(), "containerd started");
        lock(&self.children).push(child);
        poll("containerd answers", timeout, || {
            let exited = self.exited_error();
            let out = self.ctr(&["version"]).output();
            async move {
                if let Some(e) = exited {
                    return Probe::Fail(e);
                }
                match out {
                    Ok(o) if o.status.success() => Probe::Ready(()),
                    Ok(o) => Probe::NotYet(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                    Err(e) => Probe::NotYet(e.to_string()),
                }
            }
        })
        .await
    }

    /// Packs the static pause binary into an image with podman and imports it.
    fn import_pause(&self, pause_bin: &Path) -> Result<()> {
        let ctx = self.dir.join("pause-image");
        mkdir(&ctx)?;
        std::fs::copy(pause_bin, ctx.join("pause"))
            .map_err(|e| Error::io(format!("copying {}", pause_bin.display()), e))?;
        write_file(
            &ctx.join("Containerfile"),
            "FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT [\"/pause\"]\n",
        )?;
        // As measured for the operator image: podman 4.3 here needs runc and explicit rlimits.
        run(Command::new("podman")
            .args([
                "--runtime",
                "runc",
                "build",
                "--quiet",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "-t",
                PAUSE_IMAGE,
            ])
            .arg(&ctx))?;
        let archive = self.dir.join("pause.tar");
        run(Command::new("podman")
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(&archive)
            .arg(PAUSE_IMAGE))?;
        self.import_image(&archive)
    }

    /// Imports an image archive (`podman save` / `docker save` / OCI layout tar) into the CRI
    /// namespace, where the kubelet finds it (`imagePullPolicy: Never` or `IfNotPresent`).
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        let archive_s = archive.to_string_lossy();
        run(&mut self.ctr(&["images", "import", &archive_s]))
    }

    /// The Node name this kubelet registered.
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The run dir (configs, logs, containerd's and the kubelet's state).
    pub fn run_dir(&self) -> &Path {
        &self.dir
    }

    /// The containerd socket (for `ctr -a`).
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// Tails of the kubelet's and containerd's logs and of every container log of pods in
    /// `namespace`, each under a header; for failure messages.
    pub fn log_tails(&self, namespace: &str, lines: usize) -> String {
        let mut out = crate::rundir::log_tails_in(&self.dir, lines);
        let pod_logs = self.dir.join("pod-logs");
        let prefix = format!("{namespace}_");
        let mut files = Vec::new();
        if let Ok(pods) = std::fs::read_dir(&pod_logs) {
            for pod in pods.flatten() {
                if !pod.file_name().to_string_lossy().starts_with(&prefix) {
                    continue;
                }
                for container in std::fs::read_dir(pod.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    for log in std::fs::read_dir(container.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        files.push(log.path());
                    }
                }
            }
        }
        files.sort();
        for f in files {
            let shown = f
                .strip_prefix(&pod_logs)
                .unwrap_or(&f)
                .display()
                .to_string();
            out.push_str(&format!(
                "==> pod log {shown} <==\n{}\n",
                tail_file(&f, lines)
            ));
        }
        out
    }

    /// Stops everything (see the module docs) and removes the run dir unless kept.
    pub fn shutdown(self) {
        self.teardown(true);
    }

    fn teardown(&self, graceful: bool) {
        {
            let mut done = self.torn_down.lock().unwrap_or_else(|p| p.into_inner());
            if *done {
                return;
            }
            *done = true;
        }
        let tasks = task_ids(&self.dir);
        kill_container_inits(&self.dir);
        let mut children = std::mem::take(&mut *lock(&self.children));
        for c in children.iter_mut().rev() {
            if graceful {
                c.stop(STOP_GRACE);
            } else {
                c.kill();
            }
        }
        kill_shims(&self.socket);
        remove_cgroups(&tasks);
        unmount_under(&self.dir);
        remove_container_log_links(&self.dir);
        let out = Command::new(self.bin_dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args([
                "delete",
                "node",
                &self.node,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
        if let Ok(o) = out
            && !o.status.success()
        {
            tracing::warn!(node = %self.node, stderr = %String::from_utf8_lossy(&o.stderr), "could not delete the kubelet's Node");
        }
        if self.keep {
            eprintln!(
                "cocoon-testenv: kept kubelet run dir {}",
                self.dir.display()
            );
        } else {
            remove_run_dir(&self.dir);
        }
    }

    /// Kills everything at once (process exit).
    pub(crate) fn kill_now(&self) {
        self.teardown(false);
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", CRI_NAMESPACE])
            .args(args);
        cmd
    }

    fn exited_error(&self) -> Option<Error> {
        lock(&self.children)
            .iter_mut()
            .find_map(|c| c.exited_error())
    }

    fn with_logs(&self, e: Error) -> Error {
        match e {
            Error::Timeout { what, after, last } => Error::Timeout {
                what,
                after,
                last: format!("{last}\n{}", crate::rundir::log_tails_in(&self.dir, 20)),
            },
            other => other,
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.teardown(true);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `Ready` of a Node: `Some(true|false)` once the kubelet has posted it.
fn node_ready(n: &Node) -> Option<bool> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// The kubelet's configuration: API on the host-only node address, healthz on loopback, cgroupfs, and every host check a shared test
/// machine fails (swap, cgroup v1, QoS cgroups, allocatable enforcement) relaxed.
fn kubelet_config(
    port: u16,
    healthz_port: u16,
    client_ca: &Path,
    socket: &Path,
    pod_logs: &Path,
) -> Result<String> {
    Ok(format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {KUBELET_NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
containerRuntimeEndpoint: {endpoint}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
podLogsDir: {pod_logs}
registerNode: true
registerWithTaints:
- key: {KUBELET_TAINT_KEY}
  value: \"true\"
  effect: NoSchedule
# Out of reach: a busy shared disk must neither evict the pods under test nor collect the
# images they were given (nothing could pull them again).
evictionHard:
  memory.available: \"1Mi\"
  nodefs.available: \"0%\"
  imagefs.available: \"0%\"
  nodefs.inodesFree: \"0%\"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: \"\"
clusterDomain: cluster.local
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
",
        ca = quote(client_ca)?,
        endpoint = serde_json::to_string(&format!("unix://{}", socket.display())).map_err(|e| {
            Error::Invalid {
                what: "containerd socket path".into(),
                detail: e.to_string(),
            }
        })?,
        pod_logs = quote(pod_logs)?,
    ))
}

/// containerd's configuration: everything under `dir`, CRI with runc (cgroupfs), the pause
/// image given, the loopback-only CNI config.
fn containerd_config(dir: &Path, socket: &Path) -> Result<String> {
    Ok(format!(
        "version = 2
root = {root}
state = {state}
[grpc]
  address = {socket}
[ttrpc]
  address = \"\"
[metrics]
  address = \"\"
[plugins]
  [plugins.\"io.containerd.grpc.v1.cri\"]
    sandbox_image = \"{PAUSE_IMAGE}\"
    stream_server_address = \"127.0.0.1\"
    stream_server_port = \"0\"
    enable_selinux = false
    restrict_oom_score_adj = true
    [plugins.\"io.containerd.grpc.v1.cri\".containerd]
      snapshotter = \"overlayfs\"
      default_runtime_name = \"runc\"
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]
        runtime_type = \"io.containerd.runc.v2\"
        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins.\"io.containerd.grpc.v1.cri\".cni]
      bin_dir = \"/usr/lib/cni\"
      conf_dir = {cni}
  [plugins.\"io.containerd.internal.v1.opt\"]
    path = {opt}
",
        root = quote(&dir.join("containerd/root"))?,
        state = quote(&dir.join("containerd/state"))?,
        socket = quote(socket)?,
        cni = quote(&dir.join("cni"))?,
        opt = quote(&dir.join("containerd/opt"))?,
    ))
}

/// Tears down what killed test processes left: their containers, shims, mounts and run dirs.
fn sweep_stale() {
    for dir in stale_run_dirs(&std::env::temp_dir(), RUN_DIR_PREFIX) {
        tracing::info!(dir = %dir.display(), "cleaning up the kubelet run dir of a dead process");
        let tasks = task_ids(&dir);
        kill_container_inits(&dir);
        kill_shims(&dir.join("containerd.sock"));
        remove_cgroups(&tasks);
        unmount_under(&dir);
        remove_container_log_links(&dir);
        remove_run_dir(&dir);
    }
}

fn task_root(dir: &Path) -> PathBuf {
    dir.join("containerd/state")
        .join(TASK_DIR)
        .join(CRI_NAMESPACE)
}

/// Ids of the containers (sandboxes included) containerd has task directories for.
fn task_ids(dir: &Path) -> Vec<String> {
    std::fs::read_dir(task_root(dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// SIGKILL to every container's init process (pid 1 of its pid namespace, so the whole
/// container goes with it).
fn kill_container_inits(dir: &Path) {
    for id in task_ids(dir) {
        let pid_file = task_root(dir).join(&id).join("init.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
            .filter(|p| *p > 1)
        {
            // SAFETY: a plain kill(2). The pid comes from this run's own containerd state.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// SIGKILL to the containerd shims serving the containerd at `socket` (their command line
/// names it after `-address`); they outlive containerd by design.
fn kill_shims(socket: &Path) {
    let socket = socket.to_string_lossy();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if shim_of(&argv, &socket) {
            // SAFETY: a plain kill(2) of a shim of this run's containerd.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// True when `argv` is a `containerd-shim*` serving the containerd at `socket`.
fn shim_of(argv: &[&[u8]], socket: &str) -> bool {
    let Some(program) = argv.first() else {
        return false;
    };
    let program = String::from_utf8_lossy(program);
    let base = program.rsplit('/').next().unwrap_or_default();
    base.starts_with("containerd-shim")
        && argv
            .windows(2)
            .any(|w| w[0] == b"-address" && w[1] == socket.as_bytes())
}

/// Removes the (now empty) cgroups runc made for the containers: `/sys/fs/cgroup/*/k8s.io/<id>`
/// on cgroup v1, `/sys/fs/cgroup/k8s.io/<id>` on v2. Best effort.
fn remove_cgroups(ids: &[String]) {
    let root = Path::new("/sys/fs/cgroup");
    let mut bases = vec![root.to_path_buf()];
    bases.extend(
        std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path()),
    );
    for base in bases {
        for id in ids {
            let _ = std::fs::remove_dir(base.join(CRI_NAMESPACE).join(id));
        }
    }
}

/// The kubelet links every container log into this fixed directory, whatever its own dirs.
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";

/// Removes the kubelet's `/var/log/containers` links that point into `dir`.
fn remove_container_log_links(dir: &Path) {
    for entry in std::fs::read_dir(CONTAINER_LOG_LINKS)
        .into_iter()
        .flatten()
        .flatten()
    {
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Lazily unmounts every mount point under `dir`, deepest first (container root filesystems,
/// sandbox shm, projected volumes, the kubelet's bind mount of its root dir).
fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points = mount_points_under(&mountinfo, dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in points {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2(2) with a valid NUL-terminated path.
        let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            tracing::warn!(path = %p.display(), error = %std::io::Error::last_os_error(), "umount failed");
        }
    }
}

/// Mount points (field 5 of mountinfo, octal escapes decoded) at or under `dir`.
fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find_on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Adds [`KUBELET_NODE_IP`]`/32` to `lo` unless it is there.
fn ensure_node_ip() -> Result<()> {
    ensure_loopback_address(KUBELET_NODE_IP)
}

/// Adds `addr/32` to `lo` unless it is there: an address of this host that the API server
/// accepts in an EndpointSlice (it refuses loopback ones) and nothing outside reaches (use
/// one of 198.18.0.0/15, the benchmarking range). Another test process may add it at the same
/// moment, so a refused add counts when the address is there afterwards.
pub fn ensure_loopback_address(addr: &str) -> Result<()> {
    let ip = ip_tool()?;
    let present = || -> Result<bool> {
        let out = Command::new(&ip)
            .args(["-4", "-o", "addr", "show", "dev", "lo"])
            .output()
            .map_err(|e| Error::io("running ip addr show dev lo", e))?;
        Ok(has_address(&String::from_utf8_lossy(&out.stdout), addr))
    };
    if present()? {
        return Ok(());
    }
    let added = run(Command::new(&ip).args(["addr", "add", &format!("{addr}/32"), "dev", "lo"]));
    match added {
        Err(_) if present()? => Ok(()),
        other => other,
    }
}

/// Host-only range the simulated VMs of the tests take their addresses from
/// (`VK_SIM_IP_POOL` subnets): inside 198.18.0.0/15 like [`KUBELET_NODE_IP`], away from it.
pub const SIM_VM_RANGE: &str = "198.19.0.0/16";

/// Makes every address of [`SIM_VM_RANGE`] local to the host (`ip route add local
/// 198.19.0.0/16 dev lo`) unless it is, so a simulated VM's echo can bind its address and the
/// tests (and the API server's endpoints) reach it. Another test process may add it at the
/// same moment, so a refused add counts when the route is there afterwards.
pub fn ensure_sim_vm_range() -> Result<()> {
    let ip = ip_tool()?;
    let present = || -> Result<bool> {
        let out = Command::new(&ip)
            .args(["-4", "route", "show", "table", "local", SIM_VM_RANGE])
            .output()
            .map_err(|e| Error::io("running ip route show table local", e))?;
        Ok(String::from_utf8_lossy(&out.stdout).contains(SIM_VM_RANGE))
    };
    if present()? {
        return Ok(());
    }
    let added = run(Command::new(&ip).args(["route", "add", "local", SIM_VM_RANGE, "dev", "lo"]));
    match added {
        Err(_) if present()? => Ok(()),
        other => other,
    }
}

/// The `ip` (iproute2) binary.
fn ip_tool() -> Result<PathBuf> {
    find_on_path("ip").ok_or_else(|| Error::MissingBinary {
        what: "ip (iproute2)".into(),
        path: "ip".into(),
        script: SETUP_SCRIPT,
    })
}

/// Whether `ip -o addr show` output lists `addr` (as `inet ADDR/len`).
fn has_address(ip_addr_show: &str, addr: &str) -> bool {
    ip_addr_show.split_whitespace().any(|w| {
        w.split_once('/')
            .is_some_and(|(a, len)| a == addr && len.parse::<u8>().is_ok())
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("running {shown}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Kubectl(format!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).map_err(|e| Error::io(format!("creating {}", p.display()), e))
}

fn write_file(p: &Path, contents: &str) -> Result<()> {
    std::fs::write(p, contents).map_err(|e| Error::io(format!("writing {}", p.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_address_is_found_in_ip_addr_show_output() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   1: lo    inet 198.18.0.1/32 scope global lo\\       valid_lft forever\n";
        assert!(has_address(out, "198.18.0.1"));
        assert!(has_address(out, "127.0.0.1"));
        assert!(!has_address(out, "198.18.0.10"));
        assert!(!has_address(out, "198.18.0"));
        assert!(!has_address("", "198.18.0.1"));
    }

    #[test]
    fn shims_are_matched_by_their_containerd_socket_only() {
        let sock = "/tmp/cocoon-kubelet-1-0/containerd.sock";
        let shim = |prog: &str, addr: &str| -> Vec<Vec<u8>> {
            [prog, "-namespace", "k8s.io", "-id", "abc", "-address", addr]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect()
        };
        let cases: [(Vec<Vec<u8>>, bool); 5] = [
            (shim("/usr/bin/containerd-shim-runc-v2", sock), true),
            (shim("containerd-shim-runc-v2", sock), true),
            (
                shim(
                    "/usr/bin/containerd-shim-runc-v2",
                    "/run/containerd/containerd.sock",
                ),
                false,
            ),
            (shim("/usr/bin/containerd", sock), false),
            (Vec::new(), false),
        ];
        for (argv, want) in cases {
            let refs: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            assert_eq!(shim_of(&refs, sock), want, "{argv:?}");
        }
    }

    #[test]
    fn mount_points_under_a_dir_with_escapes() {
        let info = "\
36 25 0:32 / /tmp/cocoon-kubelet-1-0/root rw - ext4 /dev/vda rw
37 25 0:33 / /tmp/cocoon-kubelet-1-0/a\\040b rw - tmpfs tmpfs rw
38 25 0:34 / /tmp/cocoon-kubelet-1-00/x rw - tmpfs tmpfs rw
39 25 0:35 / /sys/fs/cgroup rw - tmpfs tmpfs rw
";
        let got = mount_points_under(info, Path::new("/tmp/cocoon-kubelet-1-0"));
        assert_eq!(
            got,
            [
                PathBuf::from("/tmp/cocoon-kubelet-1-0/root"),
                PathBuf::from("/tmp/cocoon-kubelet-1-0/a b"),
            ]
        );
    }

    #[test]
    fn configs_quote_paths() {
        let cfg = kubelet_config(
            1,
            2,
            Path::new("/p/ca.crt"),
            Path::new("/d/c.sock"),
            Path::new("/d/logs"),
        )
        .expect("config");
        assert!(
            cfg.contains("containerRuntimeEndpoint: \"unix:///d/c.sock\""),
            "{cfg}"
        );
        assert!(cfg.contains("clientCAFile: \"/p/ca.crt\""), "{cfg}");
        assert!(
            cfg.contains(&format!("- key: {KUBELET_TAINT_KEY}")),
            "{cfg}"
        );
        let ctrd = containerd_config(Path::new("/d"), Path::new("/d/c.sock")).expect("config");
        assert!(ctrd.contains("root = \"/d/containerd/root\""), "{ctrd}");
        assert!(
            ctrd.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")),
            "{ctrd}"
        );
    }
}
