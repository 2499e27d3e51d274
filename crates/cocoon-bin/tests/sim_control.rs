//! Chaos from outside the process: the real `cocoon-operator node` binary on the simulated
//! runtime, on the real control plane, with its VMs crashed, killed and deleted and its verbs
//! failed through `cocoon-operator sim` (the real binary again, over the agent's control
//! socket). The agent's VM event watcher reacts as `node.md` §10 says: a stopped VM restarts in
//! place (same id, pod kept Running); a second crash inside the 30 s cooldown removes the VM and
//! evicts with `RestartCooldown`; a killed VM whose start fails is evicted with `RestartFailed`
//! and the start error text; a VM deleted out of band evicts with `VMGone`.
//!
//! The pods carry a test finalizer so that the evicted pod object (its `Failed` status with the
//! terminated container's reason) stays readable after the agent deletes it; the finalizer is
//! only this test's hold on the object and changes nothing the agent does.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_runtime::sim::VmRow;
use cocoon_testenv::{Shared, create_namespace, delete_namespace, unique_name, wait_until};
use cocoon_testsupport::binaries::sim_node_command;
use cocoon_testsupport::{BoxError, vm_pod};
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
/// This test's hold on evicted pod objects.
const KEEP: &str = "cocoon.test/keep-evicted-pod";
const BIN: &str = env!("CARGO_BIN_EXE_cocoon-operator");

/// The real node agent binary for `node` on the simulated runtime rooted at `root`, logging to
/// `log`.
fn spawn_agent(
    env: &Shared,
    node: &str,
    root: &Path,
    log: &Path,
) -> Result<tokio::process::Child, BoxError> {
    let out = std::fs::File::create(log)?;
    Ok(sim_node_command(
        BIN,
        env.kubeconfig_path(),
        env.registry_addr(),
        node,
        &unique_name("pool"),
        root,
    )
    .env("VK_SIM_PERMISSIVE_PULL", "true")
    .stdout(Stdio::null())
    .stderr(out)
    .spawn()?)
}

/// `cocoon-operator sim --root ROOT -o json ARGS…`: its stdout, or an error with its stderr.
async fn sim(root: &Path, args: &[&str]) -> Result<String, BoxError> {
    let out = tokio::process::Command::new(BIN)
        .arg("sim")
        .arg("--root")
        .arg(root)
        .args(["-o", "json"])
        .args(args)
        .env_remove("VK_SIM_ROOT")
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "sim {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

async fn vms(root: &Path) -> Result<Vec<VmRow>, BoxError> {
    #[derive(serde::Deserialize)]
    struct Vms {
        vms: Vec<VmRow>,
    }
    Ok(serde_json::from_str::<Vms>(&sim(root, &["list"]).await?)?.vms)
}

async fn vm(root: &Path, name: &str) -> Result<Option<VmRow>, BoxError> {
    Ok(vms(root).await?.into_iter().find(|r| r.name == name))
}

async fn start_calls(root: &Path) -> Result<u64, BoxError> {
    let v: serde_json::Value = serde_json::from_str(&sim(root, &["calls", "start"]).await?)?;
    v["start"]
        .as_u64()
        .ok_or_else(|| format!("calls start: {v}").into())
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<Pod, BoxError> {
    Ok(wait_until(&format!("pod {name} Running"), WAIT, || async {
        let p = pods.get_opt(name).await.ok().flatten()?;
        let phase = p.status.as_ref()?.phase.as_deref()?;
        (phase == "Running" && ann_of(&p, ann::VM_ID).is_some()).then_some(p)
    })
    .await?)
}

fn ann_of(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

/// The terminated container's (reason, message) of an evicted pod, once the agent wrote it.
fn terminated(p: &Pod) -> Option<(String, String)> {
    let st = p.status.as_ref()?;
    let t = st
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?;
    Some((
        t.reason.clone().unwrap_or_default(),
        t.message.clone().unwrap_or_default(),
    ))
}

/// Waits until the agent evicted `name` (deleted it and wrote its terminal status) and checks
/// the reason and message.
async fn wait_evicted(
    pods: &Api<Pod>,
    name: &str,
    reason: &str,
    message: &str,
) -> Result<(), BoxError> {
    let p = wait_until(&format!("pod {name} evicted"), WAIT, || async {
        let p = pods.get_opt(name).await.ok().flatten()?;
        (p.metadata.deletion_timestamp.is_some() && terminated(&p).is_some()).then_some(p)
    })
    .await?;
    assert_eq!(
        terminated(&p),
        Some((reason.to_owned(), message.to_owned())),
        "pod {name}: eviction reason and message"
    );
    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(phase.as_deref(), Some("Failed"), "pod {name}: phase");
    Ok(())
}

async fn scenario(env: &Shared, ns: &str, root: &Path, node: &str) -> Result<(), BoxError> {
    let client = env.client()?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until(&format!("node {node} Ready"), WAIT, || async {
        let n = nodes.get_opt(node).await.ok().flatten()?;
        cocoon_testenv::node::is_ready(&n).then_some(())
    })
    .await?;
    assert!(
        std::fs::metadata(root.join("control.sock"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .ok()
            == Some(0o600),
        "the agent serves an owner-only control socket under its simulator root"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in ["a", "b", "c"] {
        let mut pod = vm_pod(ns, name, node, &[(ann::SNAPSHOT_POLICY, "never")]);
        pod.metadata.finalizers = Some(vec![KEEP.to_owned()]);
        pods.create(&PostParams::default(), &pod).await?;
    }
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        let p = wait_running(&pods, name).await?;
        let id = ann_of(&p, ann::VM_ID).unwrap_or_default();
        let row = vm(root, &vm_name_for_pod(ns, name)).await?;
        assert_eq!(
            row.map(|r| (r.id, r.state, r.alive)),
            Some((id.clone(), "running".to_owned(), true)),
            "sim list shows pod {name}'s VM"
        );
        ids.push(id);
    }

    // a: stopped out of band → restarted in place, pod kept.
    let vm_a = vm_name_for_pod(ns, "a");
    let base = start_calls(root).await?;
    let out = sim(root, &["stop", &vm_a]).await?;
    assert!(
        out.contains("\"state\":\"stopped\""),
        "stop reports the new state: {out}"
    );
    wait_until("a restarted in place", WAIT, || async {
        let row = vm(root, &vm_a).await.ok()??;
        let n = start_calls(root).await.ok()?;
        (row.state == "running" && row.alive && n == base + 1).then_some(())
    })
    .await?;
    assert_eq!(
        vm(root, &vm_a).await?.map(|r| r.id),
        Some(ids[0].clone()),
        "the same VM, restarted in place"
    );
    let p = pods.get("a").await?;
    assert!(p.metadata.deletion_timestamp.is_none(), "pod a kept");
    assert_eq!(
        p.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "pod a stays Running"
    );
    // a again, inside the 30 s cooldown → VM removed, pod evicted.
    sim(root, &["crash", &vm_a]).await?;
    wait_evicted(
        &pods,
        "a",
        "RestartCooldown",
        "restart cooldown not elapsed",
    )
    .await?;
    assert_eq!(
        vm(root, &vm_a).await?,
        None,
        "the crash-looping VM is removed"
    );
    assert_eq!(start_calls(root).await?, base + 1, "no second restart");

    // b: process killed while its start fails → RestartFailed with the start error text.
    let vm_b = vm_name_for_pod(ns, "b");
    let text = "simulated: hypervisor refused to start";
    sim(
        root,
        &[
            "fail-verb",
            "start",
            "1",
            "--target",
            &vm_b,
            "--message",
            text,
        ],
    )
    .await?;
    let out = sim(root, &["kill", &vm_b]).await?;
    assert!(out.contains("\"state\":\"stopped (stale)\""), "kill: {out}");
    wait_evicted(&pods, "b", "RestartFailed", text).await?;
    assert_eq!(
        vm(root, &vm_b).await?,
        None,
        "the VM that did not start is removed"
    );

    // c: deleted out of band → VMGone.
    let vm_c = vm_name_for_pod(ns, "c");
    sim(root, &["delete", &vm_c]).await?;
    wait_evicted(&pods, "c", "VMGone", "vm no longer exists").await?;
    let err = sim(root, &["delete", &vm_c])
        .await
        .expect_err("already gone");
    assert!(
        err.to_string().contains(&format!("VM not found: {vm_c}")),
        "a refused request says why: {err}"
    );
    Ok(())
}

/// Releases this test's hold on the pods, then deletes the namespace and the agent's Node.
async fn cleanup(env: &Shared, ns: &str, node: &str) -> Result<(), BoxError> {
    let client = env.client()?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for p in pods.list(&ListParams::default()).await? {
        let name = p.metadata.name.unwrap_or_default();
        let patch = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
        match pods.patch(&name, &PatchParams::default(), &patch).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    delete_namespace(&client, ns).await?;
    let nodes: Api<Node> = Api::all(client);
    match nodes.delete(node, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn dump_log(log: &Path) {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = &lines[lines.len().saturating_sub(60)..];
    eprintln!("--- node agent log (tail) ---\n{}", tail.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vm_event_watcher_reacts_to_chaos_injected_from_outside() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "simctl").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("simctl-node");
        let root: PathBuf = tmp.path().join("sim");
        std::fs::create_dir_all(&root)?;
        let log = tmp.path().join("agent.log");
        let mut agent = spawn_agent(env, &node, &root, &log)?;
        // A failed assertion must not leave pods held by the test finalizer behind.
        let outcome = AssertUnwindSafe(scenario(env, &ns, &root, &node))
            .catch_unwind()
            .await;
        let _ = agent.start_kill();
        let _ = agent.wait().await;
        let cleaned = cleanup(env, &ns, &node).await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(panic) => {
                dump_log(&log);
                std::panic::resume_unwind(panic)
            }
        };
        cleaned?;
        if outcome.is_err() {
            dump_log(&log);
        }
        outcome
    })
    .await;
}

#[tokio::test]
async fn sim_without_an_agent_says_so_and_names_bad_flags() {
    let tmp = tempfile::tempdir().expect("tmp");
    let missing = tmp.path().join("nowhere");
    let out = tokio::process::Command::new(BIN)
        .args(["sim", "--root"])
        .arg(&missing)
        .arg("list")
        .env_remove("VK_SIM_ROOT")
        .output()
        .await
        .expect("run");
    assert!(!out.status.success(), "fails without an agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no simulated runtime agent at {}: ",
            missing.display()
        )),
        "{err}"
    );
    for (args, needle) in [
        (&["sim", "list"][..], "--root <DIR>"),
        (
            &["sim", "--root", "/x", "fail-verb", "fly", "1"][..],
            "unknown verb \"fly\"",
        ),
        (
            &["sim", "--root", "/x", "fail-verb", "start", "0"][..],
            "<N>",
        ),
    ] {
        let out = tokio::process::Command::new(BIN)
            .args(args)
            .env_remove("VK_SIM_ROOT")
            .output()
            .await
            .expect("run");
        assert!(!out.status.success(), "{args:?} is rejected");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
