//! A wake reads `<vm>:hibernate` through the owner check and pulls the digest it checked; when
//! that read fails (a transient registry error), the wake fails closed instead of pulling by
//! tag (issue 35 item 6). On the real control plane and the real registry, with an in-process
//! agent on the simulator whose registry traffic goes through a TCP forwarder that answers
//! `503` to the next few reads of one repository's `:hibernate` manifest (what a registry
//! behind an overloaded load balancer answers) and passes everything else through unchanged.

mod common;

use std::sync::{Arc, Mutex};

use common::{
    AgentOptions, BoxError, TestResult, hibernate_pod, kill_and_delete, patch_ann, push_golden,
    run_pod, start_agent_with, wait_lifecycle, wake_pod,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::oci::{ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_POD};
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::RetryPolicy;
use cocoon_runtime::sim::Verb;
use cocoon_testenv::{TestNode, create_namespace, run_test, unique_name};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head the forwarder reads before it decides.
const MAX_HEAD: usize = 64 * 1024;

/// A TCP forwarder to the registry. Every request goes upstream on its own connection
/// (`Connection: close` is added to its head, so the next one opens a new connection and its
/// request line is seen too); the next `refuse` requests whose line contains `needle` are
/// answered `503` instead; every request line forwarded is recorded.
#[derive(Clone, Default)]
struct Faults {
    inner: Arc<Mutex<FaultState>>,
}

#[derive(Default)]
struct FaultState {
    needle: String,
    refuse: u32,
    refused: u32,
    forwarded: Vec<String>,
}

impl Faults {
    /// Refuses the next `n` requests whose line contains `needle`; clears the record.
    fn arm(&self, needle: &str, n: u32) {
        let mut s = self.inner.lock().expect("faults");
        s.needle = needle.to_owned();
        s.refuse = n;
        s.refused = 0;
        s.forwarded.clear();
    }

    /// (requests refused, request lines forwarded) since [`Faults::arm`].
    fn seen(&self) -> (u32, Vec<String>) {
        let s = self.inner.lock().expect("faults");
        (s.refused, s.forwarded.clone())
    }

    /// Whether this request line is refused (and counted).
    fn refuses(&self, line: &str) -> bool {
        let mut s = self.inner.lock().expect("faults");
        if s.refuse > 0 && !s.needle.is_empty() && line.contains(&s.needle) {
            s.refuse -= 1;
            s.refused += 1;
            return true;
        }
        s.forwarded.push(line.to_owned());
        false
    }
}

/// Starts the forwarder to `upstream`; returns its address.
async fn forwarder(upstream: String, faults: Faults) -> TestResult<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (upstream, faults) = (upstream.clone(), faults.clone());
            tokio::spawn(async move {
                let _ = forward(conn, &upstream, &faults).await;
            });
        }
    });
    Ok(addr)
}

async fn forward(mut client: TcpStream, upstream: &str, faults: &Faults) -> TestResult {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 2;
        }
        if buf.len() > MAX_HEAD {
            return Ok(());
        }
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let line = head.lines().next().unwrap_or_default().to_owned();
    if faults.refuses(&line) {
        client
            .write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
        return Ok(());
    }
    let kept: String = head
        .split_inclusive("\r\n")
        .filter(|h| !h.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(kept.as_bytes()).await?;
    server.write_all(b"Connection: close\r\n").await?;
    server.write_all(&buf[head_end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// The registry paths of `vm` among request lines.
fn of_repo<'a>(lines: &'a [String], vm: &str) -> Vec<&'a String> {
    let prefix = format!(" /v2/{vm}/");
    lines.iter().filter(|l| l.contains(&prefix)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wake_whose_hibernate_manifest_cannot_be_read_fails_closed() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "wake-closed").await?;
        let intruder = create_namespace(&client, "wake-intruder").await?;
        let tmp = tempfile::tempdir()?;
        let faults = Faults::default();
        let proxy = forwarder(env.registry_addr().to_owned(), faults.clone()).await?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent_with(
            client.clone(),
            &proxy,
            &node,
            tmp.path(),
            AgentOptions::new(tmp.path()),
            |_| Ok(()),
        )
        .await?;
        // Every read of the gate is refused: all attempts of the client's retry policy.
        let attempts = RetryPolicy::default().attempts;

        // The victim: a VM hibernated to the registry (and kept locally, as hibernate does);
        // then its `:hibernate` is replaced by a snapshot that records another owner, as a
        // node or a colliding name could push it.
        run_pod(&client, &ns, "victim", &node, &[]).await?;
        let vm = vm_name_for_pod(&ns, "victim");
        hibernate_pod(&client, &ns, "victim", 2).await?;
        assert!(agent.sim.snapshot_dir(&vm).is_some(), "the local copy");
        let golden = common::golden_host().await?;
        push_golden(
            env,
            &golden,
            &vm,
            "hibernate",
            &[
                (ANNOTATION_OWNER_NAMESPACE, intruder.as_str()),
                (ANNOTATION_OWNER_POD, "x"),
            ],
        )
        .await?;

        // The registry stumbles on exactly the owner check's reads: the wake fails with the
        // registry's error and pulls nothing (before the fix it went on to pull `:hibernate` by
        // tag, the forged snapshot, and woke the victim's pod from it).
        agent.sim.clear_calls();
        faults.arm(&format!("GET /v2/{vm}/manifests/hibernate "), attempts);
        patch_ann(
            &client,
            &ns,
            "victim",
            json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
        )
        .await?;
        let p = wait_lifecycle(&client, &ns, "victim", LifecycleState::Failed, 3).await?;
        let msg = Lifecycle::from_meta(&p.metadata).message;
        assert!(
            msg.contains(&format!("wake {vm}: get manifest {vm}:hibernate"))
                && msg.contains("503")
                && msg.contains("refusing to pull"),
            "{msg}"
        );
        let (refused, forwarded) = faults.seen();
        assert_eq!(refused, attempts, "the owner check's reads were refused");
        assert!(
            of_repo(&forwarded, &vm).is_empty(),
            "nothing of {vm} was fetched after the failed read: {forwarded:#?}"
        );
        for verb in [Verb::SnapshotImport, Verb::Clone, Verb::SnapshotRemove] {
            assert_eq!(agent.sim.calls_of(verb), [], "{verb:?}");
        }
        assert!(agent.sim.vm_info(&vm).is_err(), "no VM was woken");
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "the local copy stays"
        );

        // The next update retries; the registry answers now, and the owner check refuses the
        // forged snapshot: still nothing pulled, nothing woken, the local copy kept.
        patch_ann(
            &client,
            &ns,
            "victim",
            json!({ann::HIBERNATE: null, ann::GENERATION: "4"}),
        )
        .await?;
        let msg = wait_failed_at(&client, &ns, "victim", 4).await?;
        assert!(
            msg.contains(&intruder),
            "the refusal names the recorded owner: {msg}"
        );
        for verb in [Verb::SnapshotImport, Verb::Clone, Verb::SnapshotRemove] {
            assert_eq!(agent.sim.calls_of(verb), [], "{verb:?}");
        }
        assert!(agent.sim.vm_info(&vm).is_err(), "no VM was woken");
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "the local copy stays"
        );

        // A pod's own snapshot, read through the same trouble: the first wake fails, the
        // retry (the registry answers again) wakes it with its own state.
        run_pod(&client, &ns, "own", &node, &[]).await?;
        let own = vm_name_for_pod(&ns, "own");
        let token = agent.sim.guest_token(&own)?;
        hibernate_pod(&client, &ns, "own", 2).await?;
        faults.arm(&format!("GET /v2/{own}/manifests/hibernate "), attempts);
        patch_ann(
            &client,
            &ns,
            "own",
            json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
        )
        .await?;
        let msg = wait_failed_at(&client, &ns, "own", 3).await?;
        assert!(msg.contains("refusing to pull"), "{msg}");
        assert!(agent.sim.vm_info(&own).is_err(), "not woken unchecked");
        wake_pod(&client, &ns, "own", 4).await?;
        assert_eq!(
            agent.sim.guest_token(&own)?,
            token,
            "woken from its own snapshot"
        );

        kill_and_delete(&client, agent, &[&ns, &intruder]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The lifecycle message once the pod failed at `generation` or later.
async fn wait_failed_at(
    client: &kube::Client,
    ns: &str,
    name: &str,
    generation: i64,
) -> TestResult<String> {
    let p = wait_lifecycle(client, ns, name, LifecycleState::Failed, generation).await?;
    Ok(Lifecycle::from_meta(&p.metadata).message)
}
