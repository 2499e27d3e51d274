//! Bounds on the work a tenant can make the node agent do through the kubelet API (issue 26
//! item 8), against the real control plane: a real node agent on the simulated runtime is a
//! Node whose kubelet API the API server reaches (`kubectl logs`/`exec`), and direct HTTPS
//! calls authenticate as the API server does (its kubelet client certificate, authorized by a
//! SubjectAccessReview on the real API server).
//!
//! * A guest printing more than `VK_LOG_MAX_BYTES` (and lines longer than
//!   `VK_LOG_MAX_LINE_BYTES`) gets at most the cap back.
//! * Followers beyond `VK_LOG_FOLLOWERS_PER_POD` / `_PER_NODE` are refused while the first N
//!   stream, and N followers of one pod cost one runtime read per poll, not N.
//! * One-shot log reads beyond `VK_LOG_READS_PER_NODE` at once are refused.
//! * Exec sessions beyond `VK_EXEC_SESSIONS_PER_POD` / `_PER_NODE` are refused with the limit
//!   named while N run.
//! * An idle exec session and an idle followed log are closed after
//!   `VK_STREAMING_CONNECTION_IDLE_TIMEOUT` (test-shortened).
//! * Connections that never finish a TLS handshake hold at most
//!   `VK_KUBELET_PREAUTH_CONNECTIONS` slots and are dropped after
//!   `VK_KUBELET_TLS_HANDSHAKE_TIMEOUT`; an authenticated stream does not count.

mod common;

use std::ops::Deref;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::kubelet::{self, Creds};
use common::{
    AgentOptions, BoxError, TestAgent, TestResult, WAIT, cleanup_node, vm_pod, wait_vm_ready,
};

use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::kubelet::{KubeletLimits, KubeletServer};
use cocoon_node::metrics::NodeMetrics;
use cocoon_runtime::sim::Verb;
use cocoon_testenv::{
    Shared, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// An in-process agent registered as a real Node, its kubelet API under `limits`.
struct BoundedAgent {
    agent: TestAgent,
    kubelet: KubeletServer,
    creds: Creds,
}

impl Deref for BoundedAgent {
    type Target = TestAgent;

    fn deref(&self) -> &TestAgent {
        &self.agent
    }
}

impl BoundedAgent {
    async fn stop(self) {
        self.agent.stop().await;
        self.kubelet.shutdown().await;
    }

    /// A streaming GET as the API server (its kubelet client certificate).
    async fn stream(
        &self,
        path: &str,
    ) -> Result<
        (
            u16,
            String,
            tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        ),
        String,
    > {
        kubelet::stream_get(
            self.kubelet.local_addr(),
            self.kubelet.certificate_der(),
            path,
            &self.creds,
        )
        .await
    }

    /// One request as the API server.
    async fn get(&self, path: &str) -> Result<(u16, String), String> {
        kubelet::request(
            self.kubelet.local_addr(),
            self.kubelet.certificate_der(),
            "GET",
            path,
            &self.creds,
        )
        .await
    }
}

async fn start(
    env: &Shared,
    node: &str,
    root: &Path,
    limits: KubeletLimits,
) -> TestResult<BoundedAgent> {
    let (token, backend, kubelet) = common::start_kubelet(env, node, root, limits).await?;
    let mut opts = AgentOptions::new(root);
    opts.metrics = Some(Arc::new(NodeMetrics::new(root.to_owned())));
    let agent =
        common::start_registered_agent(env, node, root, kubelet.port(), &backend, token, opts)
            .await?;
    Ok(BoundedAgent {
        agent,
        kubelet,
        creds: Creds::cert(common::apiserver_kubelet_client(env)?),
    })
}

async fn create_ready(api: &Api<Pod>, ns: &str, name: &str, node: &str) -> TestResult {
    api.create(&PostParams::default(), &vm_pod(ns, name, node, &[]))
        .await?;
    wait_vm_ready(api, name).await
}

/// A namespace and an agent under `limits` on a fresh Node (both named from `prefix`, the
/// agent's root below `tmp`), with the pods `pods` of that namespace created on it and ready:
/// `(ns, node, agent, api)`.
async fn setup(
    env: &Shared,
    prefix: &str,
    tmp: &Path,
    limits: KubeletLimits,
    pods: &[&str],
) -> TestResult<(String, String, BoundedAgent, Api<Pod>)> {
    let client = env.client()?;
    let ns = create_namespace(&client, prefix).await?;
    let node = unique_name(prefix);
    let agent = start(env, &node, &tmp.join(&node), limits).await?;
    let api: Api<Pod> = Api::namespaced(client, &ns);
    for pod in pods {
        create_ready(&api, &ns, pod, &node).await?;
    }
    Ok((ns, node, agent, api))
}

/// Stops the agent, then deletes its Node and the test namespace.
async fn teardown(env: &Shared, agent: BoundedAgent, node: &str, ns: &str) -> TestResult {
    agent.stop().await;
    cleanup_node(env, node).await?;
    delete_namespace(&env.client()?, ns).await?;
    Ok(())
}

/// The upstream kubectl against the test control plane.
fn kubectl(env: &Shared, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::from(env.kubectl());
    cmd.args(args)
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn kubectl_output(env: &Shared, args: &[&str]) -> TestResult<std::process::Output> {
    Ok(tokio::time::timeout(WAIT, kubectl(env, args).output()).await??)
}

/// Reads `stream` until its text contains `want`, or fails at the deadline / its end.
async fn read_until<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    seen: &mut String,
    want: &str,
) -> TestResult {
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 16 << 10];
    while !seen.contains(want) {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .map_err(|_| format!("no {want:?} within {WAIT:?}; got {seen:?}"))??;
        if n == 0 {
            return Err(format!("stream ended before {want:?}; got {seen:?}").into());
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(())
}

/// Reads `stream` to its end (the server closed it), failing at the deadline.
async fn read_to_end_within<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    within: Duration,
) -> TestResult<String> {
    let mut all = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut all)).await {
        Ok(_) => Ok(String::from_utf8_lossy(&all).into_owned()),
        Err(_) => Err(format!("the stream was not closed within {within:?}").into()),
    }
}

fn log_path(ns: &str, pod: &str, query: &str) -> String {
    format!("/containerLogs/{ns}/{pod}/agent?{query}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_are_capped_and_followers_bounded_and_sharing_one_reader() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let limits = KubeletLimits {
            log_max_bytes: 64 << 10,
            log_max_line_bytes: 1024,
            log_followers_per_pod: 2,
            log_followers_per_node: 3,
            ..KubeletLimits::default()
        };
        let (ns, node, agent, _api) =
            setup(env, "bounds-logs", tmp.path(), limits, &["a", "b"]).await?;
        let (vm_a, vm_b) = (vm_name_for_pod(&ns, "a"), vm_name_for_pod(&ns, "b"));

        // The guest prints 8 MiB on one line, then 5000 lines, then a 2 KiB line, then "end".
        let mut flood = vec![b'x'; 8 << 20];
        flood.push(b'\n');
        for i in 0..5000 {
            flood.extend_from_slice(format!("line-{i:05} {}\n", "y".repeat(60)).as_bytes());
        }
        flood.extend_from_slice(b"big:");
        flood.extend(std::iter::repeat_n(b'z', 2 << 10));
        flood.extend_from_slice(b"\nend\n");
        agent.sim.guest_print(&vm_a, &flood)?;

        // Through the API server: at most the cap, the newest lines, no line over the cap.
        let out = kubectl_output(env, &["logs", "-n", &ns, "a", "--tail=100000"]).await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{out:?}");
        assert!(
            text.len() <= limits.log_max_bytes,
            "{} bytes of log returned, cap {}",
            text.len(),
            limits.log_max_bytes
        );
        assert!(text.ends_with("end\n"), "the newest line is kept");
        assert!(text.contains("line-04999 "), "the newest lines are kept");
        assert!(
            text.lines().all(|l| l.len() <= limits.log_max_line_bytes),
            "a line longer than the line cap came back"
        );
        let big = text
            .lines()
            .find(|l| l.starts_with("big:"))
            .ok_or("the long line (cut) is there")?;
        assert_eq!(big.len(), limits.log_max_line_bytes, "cut to the line cap");

        // Followers: N per pod stream, the N+1st is refused with the limit named.
        let follow = log_path(&ns, "a", "follow=true&tailLines=1");
        let (s1, body1, mut f1) = agent.stream(&follow).await?;
        let (s2, body2, mut f2) = agent.stream(&follow).await?;
        assert_eq!((s1, s2), (200, 200), "{body1:?} {body2:?}");
        let (status, body) = agent.get(&follow).await?;
        assert_eq!(status, 429, "{body}");
        assert!(
            body.contains("too many concurrent log followers for pod")
                && body.contains("VK_LOG_FOLLOWERS_PER_POD"),
            "{body}"
        );
        // Through the API server, `kubectl logs -f` gets the 429 as "too many requests" (the
        // API server keeps the status, not the body) and gives up after its retries.
        let out = kubectl_output(env, &["logs", "-f", "-n", &ns, "a"]).await?;
        assert!(!out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("too many requests"),
            "{out:?}"
        );
        // Another pod has its own per-pod count, within the node's.
        let follow_b = log_path(&ns, "b", "follow=true&tailLines=1");
        let (s3, _, f3) = agent.stream(&follow_b).await?;
        assert_eq!(s3, 200);
        let (status, body) = agent.get(&follow_b).await?;
        assert_eq!(status, 429, "{body}");
        assert!(
            body.contains("on this node") && body.contains("VK_LOG_FOLLOWERS_PER_NODE"),
            "{body}"
        );

        // Both followers of `a` get what the guest prints next.
        agent.sim.guest_print(&vm_a, b"fresh-1\n")?;
        let (mut seen1, mut seen2) = (body1, body2);
        read_until(&mut f1, &mut seen1, "fresh-1").await?;
        read_until(&mut f2, &mut seen2, "fresh-1").await?;

        // Two followers of `a`, one of `b`: one runtime read per pod per poll (0.5 s), not
        // one per follower. 8 reads of `a` take at least 3.5 s (with a reader per follower
        // they would take 2 s).
        let reads_of = |vm: &str| {
            agent
                .sim
                .calls_of(Verb::Logs)
                .iter()
                .filter(|c| c.targets.iter().any(|t| t == vm))
                .count()
        };
        let base = reads_of(&vm_a);
        let started = Instant::now();
        wait_until("8 followed-log reads of a", WAIT, || async {
            (reads_of(&vm_a) >= base + 8).then_some(())
        })
        .await?;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(3400),
            "8 reads of one pod's log in {took:?}: a reader per follower"
        );
        assert!(reads_of(&vm_b) > 0, "b is followed too");

        // A follower that leaves frees its slot: the next one is accepted.
        drop(f2);
        wait_until("a follower slot of a freed", WAIT, || async {
            // Output makes the server notice the closed connection.
            agent.sim.guest_print(&vm_a, b"nudge\n").ok()?;
            let (status, _, s) = agent.stream(&follow).await.ok()?;
            (status == 200).then_some(s)
        })
        .await?;
        drop((f1, f3));

        teardown(env, agent, &node, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A `kubectl exec -i` that stays open: the guest's `cat` reads stdin to its end, which the
/// test holds back.
struct OpenExec {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
}

impl OpenExec {
    /// Starts it and waits until the simulated runtime runs it (the `nth` `cat` exec on this
    /// node).
    async fn start(
        env: &Shared,
        agent: &BoundedAgent,
        ns: &str,
        pod: &str,
        nth: usize,
    ) -> TestResult<OpenExec> {
        let mut cmd = kubectl(env, &["exec", "-i", "-n", ns, pod, "--", "cat"]);
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn()?;
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin.write_all(b"ping\n").await?;
        stdin.flush().await?;
        let cats = || {
            agent
                .sim
                .calls_of(Verb::Exec)
                .iter()
                .filter(|c| c.args["argv"] == serde_json::json!(["cat"]))
                .count()
        };
        let reached = wait_until(
            &format!("exec {nth} (cat) in the runtime"),
            WAIT,
            || async { (cats() >= nth).then_some(()) },
        )
        .await;
        if let Err(e) = reached {
            let out = child.wait_with_output().await?;
            return Err(
                format!("exec {nth} into {pod} did not reach the runtime: {e} {out:?}").into(),
            );
        }
        Ok(OpenExec { child, stdin })
    }

    /// Closes stdin (the guest's `cat` ends) and waits for kubectl.
    async fn finish(self) -> TestResult<std::process::Output> {
        drop(self.stdin);
        Ok(tokio::time::timeout(WAIT, self.child.wait_with_output()).await??)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_sessions_beyond_the_limits_are_refused() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let limits = KubeletLimits {
            exec_sessions_per_pod: 2,
            exec_sessions_per_node: 3,
            ..KubeletLimits::default()
        };
        let (ns, node, agent, _api) =
            setup(env, "bounds-exec", tmp.path(), limits, &["a", "b"]).await?;

        let a1 = OpenExec::start(env, &agent, &ns, "a", 1).await?;
        let a2 = OpenExec::start(env, &agent, &ns, "a", 2).await?;
        let out = kubectl_output(env, &["exec", "-n", &ns, "a", "--", "echo", "third"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "a third exec into a ran: {out:?}");
        assert!(
            stderr.contains("too many concurrent exec sessions for pod")
                && stderr.contains("VK_EXEC_SESSIONS_PER_POD"),
            "{stderr}"
        );
        // b has its own count; the node's third session is b's first.
        let b1 = OpenExec::start(env, &agent, &ns, "b", 3).await?;
        let out = kubectl_output(env, &["exec", "-n", &ns, "b", "--", "echo", "x"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "a fourth exec on the node ran: {out:?}"
        );
        assert!(
            stderr.contains("on this node") && stderr.contains("VK_EXEC_SESSIONS_PER_NODE"),
            "{stderr}"
        );

        // The running sessions were not disturbed; once one ends, its slot is free again.
        let done = a1.finish().await?;
        assert!(done.status.success(), "{done:?}");
        assert_eq!(String::from_utf8_lossy(&done.stdout), "ping\n");
        wait_until("an exec slot of a freed", WAIT, || async {
            let out = kubectl_output(env, &["exec", "-n", &ns, "a", "--", "echo", "again"])
                .await
                .ok()?;
            (out.status.success() && out.stdout == b"again\n").then_some(())
        })
        .await?;
        a2.finish().await?;
        b1.finish().await?;

        teardown(env, agent, &node, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_streams_are_closed_after_the_streaming_idle_timeout() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let idle = Duration::from_secs(3);
        let limits = KubeletLimits {
            streaming_idle_timeout: idle,
            ..KubeletLimits::default()
        };
        let (ns, node, agent, _api) = setup(env, "bounds-idle", tmp.path(), limits, &["a"]).await?;
        let vm_a = vm_name_for_pod(&ns, "a");

        // An exec whose stdin stays open but moves nothing is closed by the agent.
        let e = OpenExec::start(env, &agent, &ns, "a", 1).await?;
        let quiet_since = Instant::now();
        let OpenExec { mut child, stdin } = e;
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .map_err(|_| "the idle exec was not closed")??;
        let took = quiet_since.elapsed();
        drop(stdin);
        assert!(
            took >= idle - Duration::from_millis(500),
            "closed after {took:?}, before the idle timeout"
        );
        assert!(!status.success(), "an idle-closed exec is not a success");

        // A followed log stays open past the timeout while the guest keeps printing, and is
        // closed once the guest has printed nothing for the timeout.
        let follow = log_path(&ns, "a", "follow=true&tailLines=1");
        let (status, mut seen, mut follower) = agent.stream(&follow).await?;
        assert_eq!(status, 200);
        let started = Instant::now();
        let feeder = {
            let sim = agent.sim.clone();
            let vm = vm_a.clone();
            tokio::spawn(async move {
                for i in 0..8 {
                    let _ = sim.guest_print(&vm, format!("tick-{i}\n").as_bytes());
                    tokio::time::sleep(Duration::from_millis(700)).await;
                }
            })
        };
        read_until(&mut follower, &mut seen, "tick-7").await?;
        let quiet_since = Instant::now();
        assert!(
            started.elapsed() > idle,
            "the busy follower outlived the idle timeout"
        );
        feeder.await?;
        read_to_end_within(&mut follower, WAIT).await?;
        let took = quiet_since.elapsed();
        assert!(
            took >= idle - Duration::from_millis(500),
            "closed after {took:?}, before the idle timeout"
        );

        teardown(env, agent, &node, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_awaiting_authentication_are_bounded_and_time_out() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let handshake = Duration::from_secs(2);
        let limits = KubeletLimits {
            preauth_connections: 2,
            tls_handshake_timeout: handshake,
            ..KubeletLimits::default()
        };
        let (ns, node, agent, _api) =
            setup(env, "bounds-preauth", tmp.path(), limits, &["a"]).await?;
        let addr = agent.kubelet.local_addr();

        // An authenticated stream does not hold a pre-authentication slot.
        let (status, _, follower) = agent
            .stream(&log_path(&ns, "a", "follow=true&tailLines=1"))
            .await?;
        assert_eq!(status, 200);
        // One connection that never starts its handshake: one slot left, requests work.
        let mut stalled1 = tokio::net::TcpStream::connect(addr).await?;
        let (status, body) = agent.get("/healthz").await?;
        assert_eq!((status, body.as_str()), (200, "ok"));
        // Two: no slot left; a new connection is closed at once.
        let stalled2_opened = Instant::now();
        let mut stalled2 = tokio::net::TcpStream::connect(addr).await?;
        let refused = agent.get("/healthz").await;
        assert!(
            refused.is_err(),
            "a third pre-auth connection was served: {refused:?}"
        );
        // The stalled ones are dropped once the handshake timeout has passed ...
        for s in [&mut stalled1, &mut stalled2] {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(WAIT, s.read(&mut b))
                .await
                .map_err(|_| "a stalled handshake was not dropped")?
                .unwrap_or(0);
            assert_eq!(n, 0, "the server closes a stalled handshake");
        }
        let took = stalled2_opened.elapsed();
        assert!(
            took >= handshake - Duration::from_millis(300),
            "a stalled handshake was dropped after {took:?}, before the timeout"
        );
        // ... and then requests are served again.
        wait_until(
            "a request served after the stalled handshakes were dropped",
            WAIT,
            || async {
                let (status, _) = agent.get("/healthz").await.ok()?;
                (status == 200).then_some(())
            },
        )
        .await?;
        drop(follower);

        teardown(env, agent, &node, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn log_reads_beyond_the_node_limit_are_refused() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let limits = KubeletLimits {
            log_reads_per_node: 2,
            ..KubeletLimits::default()
        };
        let (ns, node, agent, _api) =
            setup(env, "bounds-reads", tmp.path(), limits, &["a"]).await?;
        let agent = Arc::new(agent);
        let path = log_path(&ns, "a", "tailLines=5");

        // Two reads held in the runtime use up the node's log reads; a third is refused.
        agent.sim.block(Verb::Logs, None);
        let held: Vec<_> = (0..2)
            .map(|_| {
                let (agent, path) = (agent.clone(), path.clone());
                tokio::spawn(async move { agent.get(&path).await })
            })
            .collect();
        assert!(
            agent.sim.wait_blocked(Verb::Logs, 2, WAIT).await,
            "two log reads reached the runtime"
        );
        let (status, body) = agent.get(&path).await?;
        assert_eq!(status, 429, "{body}");
        assert!(
            body.contains("too many concurrent log reads on this node")
                && body.contains("VK_LOG_READS_PER_NODE"),
            "{body}"
        );
        agent.sim.unblock(Verb::Logs);
        for h in held {
            let (status, body) = h.await??;
            assert_eq!(status, 200, "{body}");
        }
        let (status, _) = agent.get(&path).await?;
        assert_eq!(status, 200, "the reads were given back");

        let agent = Arc::try_unwrap(agent).map_err(|_| "agent still shared")?;
        teardown(env, agent, &node, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
