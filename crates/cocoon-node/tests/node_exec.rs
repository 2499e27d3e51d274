//! A real node agent as a Node of the real control plane: the agent registers its Node
//! (InternalIP 127.0.0.1, its kubelet port), serves the kubelet API over TLS and `/metrics`
//! over HTTP.
//!
//! * `kubectl exec` and `kubectl logs` through the API server with the upstream kubectl
//!   binary, into a simulated VM: stdout, stdin piped through, a non-zero exit code surfacing
//!   as kubectl's exit code, a pod with no live VM, and logs. Both client paths are exercised:
//!   kubectl's WebSocket (translated to SPDY by the API server) and kubectl's SPDY (proxied as
//!   is).
//! * Per-VM metrics (`cocoon_vk_vm_*`) on `/metrics`. (`/stats/summary` through the API
//!   server's node proxy is refused for a loopback node address, so it is not used here.)

mod common;

use std::ops::Deref;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{
    AgentOptions, BoxError, TestAgent, TestResult, WAIT, cleanup_node, vm_pod, wait_vm_ready,
};

use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::kubelet::{KubeletLimits, KubeletServer, MetricsServer, NO_LIVE_VM_BODY};
use cocoon_node::metrics::NodeMetrics;
use cocoon_runtime::sim::{FailRule, Verb};
use cocoon_testenv::{
    Shared, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An in-process agent registered as a real Node whose kubelet API the API server can reach.
struct KubeletAgent {
    agent: TestAgent,
    kubelet: KubeletServer,
    metrics: MetricsServer,
}

impl Deref for KubeletAgent {
    type Target = TestAgent;

    fn deref(&self) -> &TestAgent {
        &self.agent
    }
}

impl KubeletAgent {
    async fn stop(self) {
        self.agent.stop().await;
        self.kubelet.shutdown().await;
        self.metrics.shutdown().await;
    }

    /// `GET /metrics` of the agent's listener.
    async fn scrape(&self) -> TestResult<String> {
        let mut tcp = tokio::net::TcpStream::connect(self.metrics.local_addr()).await?;
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or("no response head")?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("scrape: {head}").into());
        }
        Ok(body.to_owned())
    }
}

async fn start(env: &Shared, node: &str, root: &Path) -> TestResult<KubeletAgent> {
    let (token, backend, kubelet) =
        common::start_kubelet(env, node, root, KubeletLimits::default()).await?;
    let metrics = Arc::new(NodeMetrics::new(root.to_owned()));
    let metrics_server =
        MetricsServer::start("127.0.0.1:0".parse()?, metrics.clone(), &token).await?;
    let mut opts = AgentOptions::new(root);
    opts.timing.vm_stats_every = Duration::from_millis(200);
    opts.metrics = Some(metrics);
    let agent =
        common::start_registered_agent(env, node, root, kubelet.port(), &backend, token, opts)
            .await?;
    Ok(KubeletAgent {
        agent,
        kubelet,
        metrics: metrics_server,
    })
}

/// Output of one kubectl run.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the upstream kubectl with `args`, optional stdin bytes, and `websockets` choosing
/// kubectl's remote-command transport (WebSocket, or SPDY end to end).
async fn kubectl(
    env: &Shared,
    args: &[&str],
    stdin: Option<&[u8]>,
    websockets: bool,
) -> TestResult<Run> {
    let mut cmd = tokio::process::Command::from(env.kubectl());
    cmd.args(args)
        .env(
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS",
            if websockets { "true" } else { "false" },
        )
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).await?;
        // Closing stdin is the client's EOF, which must reach the guest.
        drop(pipe);
    }
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await??;
    Ok(Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_exec_and_logs_through_the_api_server() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-exec").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node-exec");
        let agent = start(env, &node, &tmp.path().join(&node)).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "a", &node, &[]))
            .await?;
        wait_vm_ready(&api, "a").await?;

        for websockets in [true, false] {
            let via = if websockets { "websocket" } else { "spdy" };
            // stdout of a plain command.
            let r = kubectl(
                env,
                &[
                    "exec", "-n", &ns, "a", "-c", "agent", "--", "echo", "hello", "cocoon",
                ],
                None,
                websockets,
            )
            .await?;
            assert_eq!(r.code, Some(0), "{via}: echo: {r:?}");
            assert_eq!(r.stdout, "hello cocoon\n", "{via}: echo: {r:?}");

            // stdin piped through to the guest, and back out on stdout.
            let input = format!("piped through {via}\nsecond line\n");
            let r = kubectl(
                env,
                &["exec", "-i", "-n", &ns, "a", "--", "cat"],
                Some(input.as_bytes()),
                websockets,
            )
            .await?;
            assert_eq!(r.code, Some(0), "{via}: cat: {r:?}");
            assert_eq!(r.stdout, input, "{via}: cat: {r:?}");

            // stderr and a non-zero exit code: kubectl exits with the guest's code.
            let r = kubectl(
                env,
                &[
                    "exec",
                    "-n",
                    &ns,
                    "a",
                    "--",
                    "sh",
                    "-c",
                    "cat /no/such/file; exit 7",
                ],
                None,
                websockets,
            )
            .await?;
            assert_eq!(r.code, Some(7), "{via}: exit 7: {r:?}");
            assert!(
                r.stderr.contains("/no/such/file"),
                "{via}: the guest's stderr is carried: {r:?}"
            );
        }

        // Issue 40: cocoon's own exec failure (v0.5.x: `Error: exec: …`, exit 1) is a runtime
        // error, so the kubelet API answers a failure status naming it, never "exit code 1".
        let vm_a = vm_name_for_pod(&ns, "a");
        agent.sim.fail(
            FailRule::new(
                Verb::Exec,
                "Error: exec: dial agent: connection refused (cocoon-agent may still be starting; retry shortly)",
            )
            .times(1)
            .target(vm_a.clone()),
        );
        let r = kubectl(env, &["exec", "-n", &ns, "a", "--", "true"], None, true).await?;
        assert_ne!(r.code, Some(0), "cocoon failed: {r:?}");
        assert!(r.stderr.contains("dial agent"), "the cause is named: {r:?}");
        assert!(
            !r.stderr.contains("command terminated with exit code"),
            "not reported as the guest's exit: {r:?}"
        );

        // The exec ran in the VM: a file written by one exec is read by the next.
        let r = kubectl(
            env,
            &[
                "exec",
                "-n",
                &ns,
                "a",
                "--",
                "sh",
                "-c",
                "echo marker > /root/m && cat /root/m",
            ],
            None,
            true,
        )
        .await?;
        assert_eq!((r.code, r.stdout.as_str()), (Some(0), "marker\n"), "{r:?}");
        assert_eq!(
            agent
                .sim
                .guest_file(&vm_name_for_pod(&ns, "a"), "/root/m")?
                .as_deref(),
            Some("marker\n"),
            "written into the simulated guest"
        );

        // Logs through the API server: the VM's console log.
        let r = kubectl(env, &["logs", "-n", &ns, "a", "--tail=50"], None, true).await?;
        assert_eq!(r.code, Some(0), "logs: {r:?}");
        assert!(
            r.stdout.contains("exec"),
            "console log lists the execs: {r:?}"
        );

        // A pod whose VM is not up: exec fails with "no live VM", logs say so too.
        let idle_vm = vm_name_for_pod(&ns, "idle");
        agent.sim.block(Verb::Run, Some(&idle_vm));
        api.create(&PostParams::default(), &vm_pod(&ns, "idle", &node, &[]))
            .await?;
        assert!(
            agent.sim.wait_blocked(Verb::Run, 1, WAIT).await,
            "bring-up of idle started"
        );
        assert!(agent.handler.tracked_vm(&format!("{ns}/idle")).is_none());
        for websockets in [true, false] {
            let r = kubectl(
                env,
                &["exec", "-n", &ns, "idle", "--", "true"],
                None,
                websockets,
            )
            .await?;
            assert_ne!(r.code, Some(0), "no VM, no exec: {r:?}");
            assert!(
                r.stderr.contains("no live VM"),
                "error names the cause: {r:?}"
            );
        }
        let r = kubectl(env, &["logs", "-n", &ns, "idle"], None, true).await?;
        assert_eq!(
            (r.code, r.stdout.as_str()),
            (Some(0), NO_LIVE_VM_BODY),
            "{r:?}"
        );
        agent.sim.unblock(Verb::Run);

        agent.stop().await;
        cleanup_node(env, &node).await?;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_vm_metrics_follow_the_tracked_vms() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-metrics").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node-metrics");
        let agent = start(env, &node, &tmp.path().join(&node)).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "m", &node, &[]))
            .await?;
        wait_vm_ready(&api, "m").await?;
        let vm = vm_name_for_pod(&ns, "m");
        let labels =
            format!("{{vm=\"{vm}\",pod=\"m\",namespace=\"{ns}\",backend=\"cloud-hypervisor\"}}");

        // The sampler refreshes the rows in the background; wait for the VM's row.
        let body = wait_until("per-VM metric rows", WAIT, || async {
            let body = agent.scrape().await.ok()?;
            body.contains(&format!("cocoon_vk_vm_memory_rss_bytes{labels}"))
                .then_some(body)
        })
        .await?;
        let value = |name: &str| -> Option<f64> {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{labels} ")))
                .and_then(|v| v.trim().parse().ok())
        };
        for name in [
            "cocoon_vk_vm_cpu_seconds_total",
            "cocoon_vk_vm_memory_rss_bytes",
            "cocoon_vk_vm_disk_cow_bytes",
            "cocoon_vk_vm_network_rx_bytes_total",
            "cocoon_vk_vm_network_tx_bytes_total",
        ] {
            assert!(value(name).is_some(), "missing {name}{labels} in\n{body}");
        }
        let stats = agent.sim.stats(&vm)?;
        assert!(stats.rss_bytes > 0, "the simulator reports an RSS");
        assert!(
            value("cocoon_vk_vm_memory_rss_bytes").is_some_and(|v| v > 0.0),
            "RSS exported"
        );
        assert!(
            value("cocoon_vk_vm_disk_cow_bytes").is_some_and(|v| v > 0.0),
            "the guest disk's allocated size"
        );

        // A deleted VM drops out of the rows.
        api.delete("m", &DeleteParams::default()).await?;
        wait_until("row removed", WAIT, || async {
            let body = agent.scrape().await.ok()?;
            (!body.contains(&labels)).then_some(())
        })
        .await?;

        agent.stop().await;
        cleanup_node(env, &node).await?;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
