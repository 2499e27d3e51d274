//! Idle suspend on the node (issue 39), with real node agents registered as Nodes of the real
//! control plane, `kubectl exec` through the API server, and simulated VMs that echo TCP at
//! their addresses (198.19.0.0/16, routed local on `lo`) and can be made busy:
//!
//! * an open exec session (or a followed log), traffic through the VM's echo and CPU above the threshold each
//!   publish `last-activity` (kind `session`, `traffic`, `cpu`), no more often than the pod's
//!   publish interval (half its `idle-suspend-after`), and an idle VM costs no pod write; the
//!   other tenant's pod on the same node never gets activity it did not have;
//! * an exec into a pod hibernated by a suspend writes `wake-request`, is held while the VM
//!   is away, and runs once the pod is woken (the test stands in for the operator);
//! * a flood of execs at a suspended pod writes `wake-request` at most once per few seconds,
//!   and each held exec ends, after `VK_EXEC_WAKE_WAIT`, with a clear error.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{
    AgentOptions, BoxError, TestAgent, TestResult, WAIT, ann_of, cleanup_node, hibernate_pod,
    vm_pod, wait_vm_ready, wake_pod,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::idle::{LAST_ACTIVITY, LAST_ACTIVITY_KIND, SUSPEND_AFTER, WAKE_REQUEST};
use cocoon_api::contract::timefmt::parse_rfc3339;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::activity::ActivityConfig;
use cocoon_node::kubelet::{KubeletLimits, KubeletServer};
use cocoon_runtime::sim::{IpPool, Verb};
use cocoon_testenv::{
    Shared, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

/// The echo port of the simulated VMs.
const ECHO_PORT: u16 = 7000;
/// The pods' `idle-suspend-after`: a publish interval of 2 s.
const SUSPEND_AFTER_TEXT: &str = "4s";
const INTERVAL: Duration = Duration::from_secs(2);

/// A /24 of 198.19.0.0/16 for one agent's VMs (random: test processes run side by side).
fn vm_pool() -> IpPool {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let third = 1 + (h.finish() % 254) as u8;
    IpPool::parse(&format!("198.19.{third}.0/24")).expect("pool")
}

/// A registered agent with its kubelet API, VMs that echo on [`ECHO_PORT`], and `activity`.
async fn start(
    env: &Shared,
    node: &str,
    root: &Path,
    activity: ActivityConfig,
) -> TestResult<(TestAgent, KubeletServer)> {
    cocoon_testenv::ensure_sim_vm_range()?;
    let (token, backend, kubelet) =
        common::start_kubelet(env, node, root, KubeletLimits::default()).await?;
    let mut opts = AgentOptions::new(root);
    opts.sim.ip_pool = vm_pool();
    opts.sim.echo_ports = vec![ECHO_PORT];
    opts.timing.activity = activity;
    let agent =
        common::start_registered_agent(env, node, root, kubelet.port(), &backend, token, opts)
            .await?;
    Ok((agent, kubelet))
}

/// `kubectl exec -n ns pod -- argv…` as a child process (`-i` with a piped stdin when
/// `stdin`).
fn kubectl_exec(
    env: &Shared,
    ns: &str,
    pod: &str,
    argv: &[&str],
    stdin: bool,
) -> TestResult<Child> {
    let mut cmd = tokio::process::Command::from(env.kubectl());
    cmd.args(["exec", "-n", ns, pod]);
    if stdin {
        cmd.arg("-i");
    }
    cmd.arg("--")
        .args(argv)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(cmd.spawn()?)
}

/// The pod's published activity: (time, kind).
fn activity_of(p: &Pod) -> Option<(DateTime<Utc>, String)> {
    let at = parse_rfc3339(&ann_of(p, LAST_ACTIVITY)?)?;
    Some((at, ann_of(p, LAST_ACTIVITY_KIND)?))
}

/// Waits until the pod's activity has `kind` and is later than `after`; returns its time.
async fn wait_activity(
    api: &Api<Pod>,
    name: &str,
    kind: &str,
    after: Option<DateTime<Utc>>,
) -> TestResult<DateTime<Utc>> {
    Ok(wait_until(
        &format!("{name}: activity {kind} after {after:?}"),
        WAIT,
        || async {
            let (at, k) = activity_of(&api.get(name).await.ok()?)?;
            (k == kind && after.is_none_or(|a| at > a)).then_some(at)
        },
    )
    .await?)
}

/// Waits until `rounds` more activity samples of the agent's VMs were taken (its `vm_stats`
/// calls): a window measured in the agent's own work, not in wall time.
async fn samples(agent: &TestAgent, rounds: usize) -> TestResult {
    let now = agent
        .sim
        .call_counts()
        .get(&Verb::Stats)
        .copied()
        .unwrap_or(0);
    if !agent.sim.wait_calls(Verb::Stats, now + rounds, WAIT).await {
        return Err(format!("{rounds} more VM samples within {WAIT:?}").into());
    }
    Ok(())
}

/// Waits until pod `name` stays unwritten (same resourceVersion) over a window of `rounds`
/// samples; returns the pod.
async fn quiet(agent: &TestAgent, api: &Api<Pod>, name: &str, rounds: usize) -> TestResult<Pod> {
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        let before = api.get(name).await?;
        samples(agent, rounds).await?;
        let after = api.get(name).await?;
        if before.metadata.resource_version == after.metadata.resource_version {
            return Ok(after);
        }
        if tokio::time::Instant::now() >= end {
            return Err(format!("{name} is written to all the time").into());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_traffic_and_cpu_are_published_per_interval_and_idle_costs_nothing() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns_a = create_namespace(&client, "idle-a").await?;
        let ns_b = create_namespace(&client, "idle-b").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("idle-act");
        let (agent, kubelet) = start(
            env,
            &node,
            &tmp.path().join(&node),
            ActivityConfig::default(),
        )
        .await?;
        let api_a: Api<Pod> = Api::namespaced(client.clone(), &ns_a);
        let api_b: Api<Pod> = Api::namespaced(client.clone(), &ns_b);
        let idle = [(SUSPEND_AFTER, SUSPEND_AFTER_TEXT)];
        api_a
            .create(&PostParams::default(), &vm_pod(&ns_a, "a", &node, &idle))
            .await?;
        api_b
            .create(&PostParams::default(), &vm_pod(&ns_b, "b", &node, &idle))
            .await?;
        wait_vm_ready(&api_a, "a").await?;
        wait_vm_ready(&api_b, "b").await?;
        // Two pods, two samples a round, two rounds a publish interval: 12 samples are three
        // intervals.
        const WINDOW: usize = 12;

        // Idle VMs: no activity, and no write at all over three publish intervals.
        let a = quiet(&agent, &api_a, "a", WINDOW).await?;
        assert_eq!(activity_of(&a), None, "an idle VM has no activity");

        // An open exec session (stdin held open): `session`, advancing once per interval.
        let mut session = kubectl_exec(env, &ns_a, "a", &["cat"], true)?;
        let mut times = vec![wait_activity(&api_a, "a", "session", None).await?];
        for _ in 0..3 {
            let last = times.last().copied();
            times.push(wait_activity(&api_a, "a", "session", last).await?);
        }
        for pair in times.windows(2) {
            let gap = (pair[1] - pair[0]).to_std()?;
            assert!(
                gap >= INTERVAL,
                "activity written {gap:?} apart, the publish interval is {INTERVAL:?}: {times:?}"
            );
        }
        drop(session.stdin.take());
        let out = tokio::time::timeout(WAIT, session.wait_with_output()).await??;
        assert!(out.status.success(), "the session ends cleanly: {out:?}");

        // Traffic through the VM's echo: `traffic`.
        let ip = ann_of(&api_a.get("a").await?, ann::VM_IP).ok_or("VM IP")?;
        let conn = tokio::net::TcpStream::connect((ip.as_str(), ECHO_PORT)).await?;
        let conn = std::sync::Arc::new(tokio::sync::Mutex::new(conn));
        let since = activity_of(&api_a.get("a").await?).map(|(t, _)| t);
        wait_until("a: traffic published", WAIT, || {
            let api = api_a.clone();
            let conn = conn.clone();
            async move {
                let mut conn = conn.lock().await;
                conn.write_all(b"ping").await.ok()?;
                let mut back = [0u8; 4];
                conn.read_exact(&mut back).await.ok()?;
                let (at, kind) = activity_of(&api.get("a").await.ok()?)?;
                (kind == "traffic" && since.is_none_or(|s| at > s)).then_some(())
            }
        })
        .await?;
        drop(conn);

        // A busy guest: `cpu`.
        let vm = vm_name_for_pod(&ns_a, "a");
        agent.sim.set_busy(&vm, true)?;
        wait_activity(&api_a, "a", "cpu", None).await?;
        agent.sim.set_busy(&vm, false)?;

        // Idle again: the writes stop.
        let a = quiet(&agent, &api_a, "a", WINDOW).await?;

        // A followed log (`kubectl logs -f`) is an open session too.
        let last = activity_of(&a).map(|(t, _)| t);
        let mut follow = tokio::process::Command::from(env.kubectl())
            .args(["logs", "-f", "-n", &ns_a, "a", "-c", "agent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        wait_activity(&api_a, "a", "session", last).await?;
        follow.kill().await?;
        quiet(&agent, &api_a, "a", WINDOW).await?;
        // The other tenant's VM on the same node was idle throughout: never any activity.
        let b = api_b.get("b").await?;
        assert_eq!(
            activity_of(&b),
            None,
            "activity of ns-a reached ns-b: {:?}",
            b.metadata.annotations
        );

        agent.kill().await;
        kubelet.shutdown().await;
        cleanup_node(env, &node).await?;
        delete_namespace(&client, &ns_a).await?;
        delete_namespace(&client, &ns_b).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exec_into_a_suspended_pod_asks_for_a_wake_and_runs_once_it_is_back() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "idle-wake").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("idle-wake");
        let activity = ActivityConfig {
            exec_wake_wait: Duration::from_secs(90),
            ..ActivityConfig::default()
        };
        let (agent, kubelet) = start(env, &node, &tmp.path().join(&node), activity).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "p", &node, &[]))
            .await?;
        wait_vm_ready(&api, "p").await?;
        hibernate_pod(&client, &ns, "p", 2).await?;

        let mut exec = kubectl_exec(env, &ns, "p", &["echo", "woke"], false)?;
        wait_until("p: wake requested", WAIT, || async {
            ann_of(&api.get("p").await.ok()?, WAKE_REQUEST)
        })
        .await?;
        // Held: the exec waits for the VM rather than failing.
        assert!(
            exec.try_wait()?.is_none(),
            "the exec is held while the pod is suspended"
        );

        // The operator's part: the pod is woken.
        wake_pod(&client, &ns, "p", 3).await?;
        let out = tokio::time::timeout(WAIT, exec.wait_with_output()).await??;
        assert!(out.status.success(), "the held exec ran: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "woke\n");

        agent.kill().await;
        kubelet.shutdown().await;
        cleanup_node(env, &node).await?;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_execs_at_a_suspended_pod_writes_few_wake_requests_and_each_fails_clearly() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "idle-flood").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("idle-flood");
        let activity = ActivityConfig {
            exec_wake_wait: Duration::from_secs(2),
            ..ActivityConfig::default()
        };
        let (agent, kubelet) = start(env, &node, &tmp.path().join(&node), activity).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "p", &node, &[]))
            .await?;
        wait_vm_ready(&api, "p").await?;
        hibernate_pod(&client, &ns, "p", 2).await?;

        // Every change of the wake request, as the API server stores it.
        let mut events = watcher::watch_object(api.clone(), "p")
            .map(|e| e.ok().flatten().and_then(|p| ann_of(&p, WAKE_REQUEST)))
            .boxed();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
        let recorder = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut last = None;
                while let Some(v) = events.next().await {
                    if v.is_some() && v != last {
                        *seen.lock().unwrap().entry(v.clone().unwrap()).or_default() += 1;
                        last = v;
                    }
                }
            })
        };

        // Execs arrive every 250 ms for 7 s; each is held up to 2 s, so many reach the node.
        let start = tokio::time::Instant::now();
        let mut execs = Vec::new();
        while start.elapsed() < Duration::from_secs(7) {
            execs.push(kubectl_exec(env, &ns, "p", &["true"], false)?);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut suspended = 0;
        for exec in execs {
            let out = tokio::time::timeout(WAIT, exec.wait_with_output()).await??;
            assert!(
                !out.status.success(),
                "an exec into a suspended pod failed: {out:?}"
            );
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("is still suspended after 2s") {
                suspended += 1;
            }
        }
        assert!(
            suspended >= 3,
            "held execs end with the clear error ({suspended})"
        );
        // 7 s of execs, one write per pod per 5 s: at most two writes.
        let writes = seen.lock().unwrap().len();
        assert!(
            (1..=2).contains(&writes),
            "wake-request written {writes} times: {:?}",
            seen.lock().unwrap()
        );
        recorder.abort();

        agent.kill().await;
        kubelet.shutdown().await;
        cleanup_node(env, &node).await?;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
