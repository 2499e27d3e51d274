//! The real binaries as child processes: the node agent's command on the simulated runtime,
//! and a child whose stdout log lines are kept for a test to read.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

/// `<bin> node` for Node `node` in pool `pool`, authenticating with `kubeconfig`, pushing to
/// `registry`, on the simulated runtime rooted at `root` (VMs, snapshots, leases), with every
/// listener on an ephemeral loopback port and room for 8 pods. The caller adds what its test
/// needs (images, a client CA, a log format) and the stdio.
pub fn sim_node_command(
    bin: &str,
    kubeconfig: &Path,
    registry: &str,
    node: &str,
    pool: &str,
    root: &Path,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("node")
        .env("KUBECONFIG", kubeconfig)
        .env("OCI_REGISTRY", registry)
        .env("VK_NODE_NAME", node)
        .env("VK_NODE_POOL", pool)
        .env("VK_NODE_IP", "127.0.0.1")
        .env("VK_KUBELET_PORT", "0")
        .env("VK_METRICS_ADDR", "127.0.0.1:0")
        .env("VK_RUNTIME", "sim")
        .env("VK_SIM_ROOT", root)
        .env("COCOON_ROOT_DIR", root)
        .env("VK_LEASES_PATH", root.join("leases.json"))
        .env("VK_NODE_PODS", "8")
        .env_remove("VK_LOG_LEVEL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// A child process whose stdout lines (its log) are collected as they come.
pub struct LoggedChild {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl LoggedChild {
    /// Spawns `cmd` with stdout piped into [`LoggedChild::lines`] and stderr inherited.
    pub fn spawn(mut cmd: Command) -> std::io::Result<LoggedChild> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        Ok(LoggedChild { child, lines })
    }

    /// A copy of the lines logged so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}
