//! `cocoon-operator node` configuration and systemd integration, through the real binary:
//! `node --help` lists every setting of the table; `--config FILE` refuses an unknown key or a
//! bad value naming the file, and the environment overrides it; under a `NOTIFY_SOCKET` the
//! agent (on the simulated runtime, against the real control plane) sends `READY=1` once its
//! Node is registered, then `WATCHDOG=1`, and `STOPPING=1` on SIGTERM.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cocoon_node::settings::SETTINGS;
use cocoon_testenv::unique_name;
use cocoon_testsupport::BoxError;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

const BIN: &str = env!("CARGO_BIN_EXE_cocoon-operator");
const WAIT: Duration = Duration::from_secs(120);

/// `cocoon-operator node ARGS` with none of the agent's settings inherited from the test's
/// environment, plus `envs`.
fn node(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("node").args(args).stdin(Stdio::null());
    for s in SETTINGS {
        if s.name != "HOME" {
            cmd.env_remove(s.name);
        }
    }
    cmd.env_remove("RUST_BACKTRACE").env("NO_COLOR", "1");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

fn run(mut cmd: Command) -> (Option<i32>, String) {
    let Output { status, stderr, .. } = cmd.output().expect("run cocoon-operator node");
    (status.code(), String::from_utf8_lossy(&stderr).into_owned())
}

#[test]
fn node_help_lists_every_setting_with_its_default() {
    let out = Command::new(BIN)
        .args(["node", "--help"])
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--config <FILE>"), "{help}");
    for s in SETTINGS {
        let default = if s.default.is_empty() {
            "unset"
        } else {
            s.default
        };
        assert!(
            help.contains(&format!("  {} [default: {default}]\n", s.name)),
            "node --help lacks {} [default: {default}]",
            s.name
        );
    }
    assert!(
        SETTINGS.len() >= 46,
        "the agent reads about 46 variables, and more"
    );
}

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("node.yaml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

#[test]
fn config_file_errors_name_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "VK_NODE_NAME: a\nVK_NODE_NAM: x\n");
    let (code, stderr) = run(node(&["--config", &file], &[]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{file}: unknown key \"VK_NODE_NAM\" (did you mean VK_NODE_NAME?)"
        )),
        "{stderr}"
    );

    let file = write(
        dir.path(),
        "OCI_REGISTRY: 127.0.0.1:5000\nVK_NODE_IP: 127.0.0.1\nVK_RESERVE_PERCENT: 101\n",
    );
    let (code, stderr) = run(node(&["--config", &file], &[]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "parse VK_RESERVE_PERCENT=\"101\": must be 0-100 (set in {file})"
        )),
        "{stderr}"
    );

    let file = write(dir.path(), "VK_LOG_LEVEL: loud\n");
    let (code, stderr) = run(node(&["--config", &file], &[]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "parse VK_LOG_LEVEL: invalid log level \"loud\" (set in {file})"
        )),
        "{stderr}"
    );

    let (code, stderr) = run(node(&["--config", "/nonexistent/node.yaml"], &[]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("read /nonexistent/node.yaml: "), "{stderr}");
}

#[test]
fn the_environment_overrides_the_config_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The file's bad level is overridden; the next missing setting is what stops the agent.
    let file = write(dir.path(), "VK_LOG_LEVEL: loud\nVK_NODE_IP: 127.0.0.1\n");
    let (code, stderr) = run(node(&["--config", &file], &[("VK_LOG_LEVEL", "info")]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("construct registry client: OCI_REGISTRY must be set"),
        "{stderr}"
    );
    assert!(!stderr.contains("loud"), "{stderr}");

    // A bad value from the environment is not blamed on the file.
    let file = write(
        dir.path(),
        "OCI_REGISTRY: 127.0.0.1:5000\nVK_NODE_IP: 127.0.0.1\nVK_RESERVE_PERCENT: 10\n",
    );
    let (code, stderr) = run(node(&["--config", &file], &[("VK_RESERVE_PERCENT", "101")]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("parse VK_RESERVE_PERCENT=\"101\": must be 0-100"),
        "{stderr}"
    );
    assert!(!stderr.contains("set in"), "{stderr}");
}

/// The next notification, or an error after `within`.
async fn next(sock: &tokio::net::UnixDatagram, within: Duration) -> Result<String, BoxError> {
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(within, sock.recv(&mut buf))
        .await
        .map_err(|_| format!("no notification within {within:?}"))??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Under systemd (`NOTIFY_SOCKET`, `WATCHDOG_USEC`), with its settings from `--config` and one
/// overridden by the environment: `READY=1` comes first, once the Node (named by the file,
/// pool from the environment) is registered; then `WATCHDOG=1`; `STOPPING=1` on SIGTERM, and
/// the agent exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_notifies_systemd_ready_watchdog_and_stopping() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("sim");
        std::fs::create_dir_all(&root)?;
        let node_name = unique_name("notify-node");
        let yaml = format!(
            "KUBECONFIG: {kubeconfig}\nOCI_REGISTRY: {registry}\nVK_NODE_NAME: {node_name}\n\
             VK_NODE_POOL: file-pool\nVK_NODE_IP: 127.0.0.1\nVK_KUBELET_PORT: 0\n\
             VK_METRICS_ADDR: 127.0.0.1:0\nVK_RUNTIME: sim\nVK_SIM_ROOT: {root}\n\
             COCOON_ROOT_DIR: {root}\nVK_LEASES_PATH: {root}/leases.json\nVK_NODE_PODS: 8\n",
            kubeconfig = env.kubeconfig_path().display(),
            registry = env.registry_addr(),
            root = root.display(),
        );
        let file = write(tmp.path(), &yaml);
        let sock_path = tmp.path().join("notify.sock");
        let sock = tokio::net::UnixDatagram::bind(&sock_path)?;
        let pool = unique_name("env-pool");
        let log = tmp.path().join("agent.log");
        let mut cmd = node(
            &["--config", &file],
            &[
                ("NOTIFY_SOCKET", sock_path.to_str().ok_or("utf-8")?),
                ("WATCHDOG_USEC", "2000000"),
                ("VK_NODE_POOL", &pool),
            ],
        );
        cmd.stdout(std::fs::File::create(&log)?)
            .stderr(Stdio::inherit());
        let mut agent = tokio::process::Command::from(cmd)
            .kill_on_drop(true)
            .spawn()?;
        let outcome = async {
            let first = next(&sock, WAIT).await?;
            assert!(
                first.starts_with("READY=1\n"),
                "first notification: {first:?}"
            );
            // READY=1 means registered: the Node is there, as the file and environment say.
            let nodes: Api<Node> = Api::all(client.clone());
            let n = nodes.get(&node_name).await?;
            let labels = n.metadata.labels.unwrap_or_default();
            assert_eq!(
                labels.get("cocoonstack.io/pool"),
                Some(&pool),
                "the environment's pool overrides the file's"
            );
            let ping = next(&sock, Duration::from_secs(10)).await?;
            assert_eq!(ping, "WATCHDOG=1");
            let pid = agent.id().ok_or("agent exited early")?;
            let kill = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()?;
            assert!(kill.success());
            let stopping = loop {
                let msg = next(&sock, Duration::from_secs(30)).await?;
                if msg != "WATCHDOG=1" {
                    break msg;
                }
            };
            assert_eq!(stopping, "STOPPING=1");
            let status = tokio::time::timeout(Duration::from_secs(60), agent.wait()).await??;
            assert!(status.success(), "agent exit: {status}");
            Ok::<(), BoxError>(())
        }
        .await;
        if outcome.is_err() {
            let _ = agent.start_kill();
            eprintln!(
                "--- node agent log ---\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let nodes: Api<Node> = Api::all(client);
        match nodes.delete(&node_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        outcome
    })
    .await;
}
