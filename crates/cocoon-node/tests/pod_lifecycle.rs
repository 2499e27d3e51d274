//! The node agent's pod lifecycle on the real control plane and the real registry, with
//! in-process agents on the simulated runtime: bring-up, hibernate/wake (same node and across
//! nodes), delete snapshot policies, restart recovery mid-hibernate, and crash handling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::agent::{AgentParts, run_agent};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::pods::{Handler, OrphanPolicy, PodConfig, Timing};
use cocoon_node::runtime::Runtime;
use cocoon_node::runtime::sim::{CrashKind, SimConfig, SimHandle, SimRuntime, Verb};
use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_testenv::{
    Shared, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(60);

/// One in-process agent on its own node name and simulator root.
struct TestAgent {
    token: CancellationToken,
    task: JoinHandle<()>,
    sim: SimHandle,
    handler: Arc<Handler>,
}

impl TestAgent {
    /// Kills the agent the way a crash would: every task stops mid-operation.
    async fn kill(self) {
        self.token.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

fn registry(env: &Shared) -> RegistryClient {
    RegistryClient::new(RegistryConfig::for_registry(env.registry_addr()).expect("registry config"))
        .expect("registry client")
}

async fn start_agent(
    env: &Shared,
    node: &str,
    root: &Path,
) -> Result<TestAgent, Box<dyn std::error::Error>> {
    let mut cfg = SimConfig::new(root);
    cfg.permissive_pull = true;
    cfg.lease_delay = Duration::from_millis(50);
    cfg.tick_interval = Duration::from_millis(200);
    let leases = cfg.lease_path.clone();
    let rt = SimRuntime::open(cfg)?;
    let sim = rt.handle();
    let runtime: Arc<dyn Runtime> = Arc::new(rt);
    let timing = Timing {
        drift_first: Duration::from_secs(1),
        drift_every: Duration::from_secs(2),
        lifecycle_reconcile: Duration::from_secs(1),
        retry_start: Duration::from_millis(200),
        retry_max: Duration::from_secs(2),
        ..Timing::default()
    };
    let parts = AgentParts {
        pods: PodConfig {
            node_name: node.to_owned(),
            orphan_policy: OrphanPolicy::Destroy,
            leases_path: leases,
            restore_mode: "ondemand".into(),
            cocoon_root_dir: root.to_owned(),
            timing,
        },
        client: env.client()?,
        runtime,
        registry: Some(registry(env)),
        metrics: Arc::new(NodeMetrics::new(root.to_owned())),
        registration: None,
    };
    let token = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = token.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = run_agent(parts, t, Some(tx)).await {
            eprintln!("agent failed: {e}");
        }
    });
    let handler = tokio::time::timeout(WAIT, rx).await??;
    Ok(TestAgent {
        token,
        task,
        sim,
        handler,
    })
}

fn vm_pod(ns: &str, name: &str, node: &str, extra: &[(&str, &str)]) -> Pod {
    let mut a: BTreeMap<String, String> = [
        (ann::VM_NAME, vm_name_for_pod(ns, name)),
        (ann::IMAGE, "ubuntu-test:1".into()),
        (ann::MODE, "run".into()),
        (ann::MANAGED, "true".into()),
        (ann::GENERATION, "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        a.insert((*k).to_owned(), (*v).to_owned());
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(a),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("cocoon/vm".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ann_of(p: &Pod, k: &str) -> Option<String> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k).cloned())
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the pod is Running+Ready with VM id, IP and lifecycle `ready`; returns it.
async fn wait_running(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Pod, Box<dyn std::error::Error>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let res = wait_until(&format!("{ns}/{name} running"), WAIT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let phase = p.status.as_ref()?.phase.clone()?;
            let lc = Lifecycle::from_meta(&p.metadata);
            (phase == "Running"
                && is_ready(&p)
                && ann_of(&p, ann::VM_ID).is_some()
                && ann_of(&p, ann::VM_IP).is_some()
                && lc.state == Some(LifecycleState::Ready))
            .then_some(p)
        }
    })
    .await;
    if res.is_err() {
        // Show what the agent did publish, to make a failure readable.
        let p = api.get(name).await?;
        eprintln!(
            "{ns}/{name}: annotations={:?} status={:?}",
            p.metadata.annotations, p.status
        );
    }
    Ok(res?)
}

async fn wait_lifecycle(
    client: &Client,
    ns: &str,
    name: &str,
    state: LifecycleState,
    generation: i64,
) -> Result<Pod, Box<dyn std::error::Error>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(wait_until(
        &format!("{ns}/{name} lifecycle {state}@{generation}"),
        WAIT,
        || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.ok()?;
                let lc = Lifecycle::from_meta(&p.metadata);
                (lc.state == Some(state) && lc.observed_generation >= generation).then_some(p)
            }
        },
    )
    .await?)
}

async fn patch_ann(client: &Client, ns: &str, name: &str, v: serde_json::Value) -> TestResult {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": v}})),
    )
    .await?;
    Ok(())
}

async fn wait_gone(client: &Client, ns: &str, name: &str) -> TestResult {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("{ns}/{name} deleted"), WAIT, || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await?;
    Ok(())
}

fn root(tmp: &tempfile::TempDir, node: &str) -> PathBuf {
    tmp.path().join(node)
}

/// Hibernates a running pod at generation 2 and checks the promises of §8.2.
async fn hibernate(
    client: &Client,
    reg: &RegistryClient,
    agent: &TestAgent,
    ns: &str,
    name: &str,
) -> TestResult {
    let vm = vm_name_for_pod(ns, name);
    patch_ann(
        client,
        ns,
        name,
        json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
    )
    .await?;
    let p = wait_lifecycle(client, ns, name, LifecycleState::Hibernated, 2).await?;
    assert!(
        reg.has_manifest(&vm, "hibernate").await?,
        ":hibernate tag pushed"
    );
    assert_eq!(ann_of(&p, ann::VM_ID), None, "VM id cleared");
    assert_eq!(ann_of(&p, ann::VM_IP), None, "VM ip cleared");
    assert!(agent.sim.vm_info(&vm).is_err(), "VM removed");
    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase.as_deref(),
        Some("Running"),
        "a hibernated pod stays alive"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_hibernate_wake_and_delete() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-life").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, &root(&tmp, &node)).await?;
        let reg = registry(env);
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "a", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        let p = wait_running(&client, &ns, "a").await?;
        let vm = vm_name_for_pod(&ns, "a");
        let first_id = ann_of(&p, ann::VM_ID).unwrap_or_default();
        assert_eq!(
            agent.sim.vm_info(&vm)?.id,
            first_id,
            "annotated id is the runtime's"
        );
        let token = agent.sim.guest_token(&vm)?;

        hibernate(&client, &reg, &agent, &ns, "a").await?;

        // Wake: clearing the annotation clones a fresh VM carrying the same guest state.
        patch_ann(&client, &ns, "a", json!({ann::HIBERNATE: null})).await?;
        let p = wait_running(&client, &ns, "a").await?;
        let woken_id = ann_of(&p, ann::VM_ID).unwrap_or_default();
        assert_ne!(woken_id, first_id, "a wake is a new VM");
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            token,
            "guest state survives hibernate/wake"
        );

        // Delete with policy never: no :latest, VM and local snapshots gone, pod gone.
        api.delete("a", &DeleteParams::default()).await?;
        wait_gone(&client, &ns, "a").await?;
        assert!(agent.sim.vm_info(&vm).is_err(), "VM removed on delete");
        assert!(
            !reg.has_manifest(&vm, "latest").await?,
            "policy never pushes nothing"
        );
        assert!(
            agent.sim.snapshot_dir(&vm).is_none(),
            "local snapshot dropped"
        );

        // Policy always: a routine :latest on delete.
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "b", &node, &[(ann::SNAPSHOT_POLICY, "always")]),
        )
        .await?;
        wait_running(&client, &ns, "b").await?;
        api.delete("b", &DeleteParams::default()).await?;
        wait_gone(&client, &ns, "b").await?;
        let vm_b = vm_name_for_pod(&ns, "b");
        assert!(
            reg.has_manifest(&vm_b, "latest").await?,
            "policy always pushes :latest"
        );

        // keep-snapshot-on-delete keeps the local warm-wake copy of a hibernated pod.
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "c", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        wait_running(&client, &ns, "c").await?;
        hibernate(&client, &reg, &agent, &ns, "c").await?;
        patch_ann(
            &client,
            &ns,
            "c",
            json!({ann::KEEP_SNAPSHOT_ON_DELETE: "true"}),
        )
        .await?;
        let vm_c = vm_name_for_pod(&ns, "c");
        wait_until("keep flag seen", WAIT, || async {
            agent
                .handler
                .tracked_pod(&format!("{ns}/c"))
                .and_then(|p| ann_of(&p, ann::KEEP_SNAPSHOT_ON_DELETE))
        })
        .await?;
        api.delete("c", &DeleteParams::default()).await?;
        wait_gone(&client, &ns, "c").await?;
        assert!(
            agent.sim.snapshot_dir(&vm_c).is_some(),
            "keep-snapshot-on-delete keeps the local snapshot"
        );

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_on_another_node_pulls_from_the_registry() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-x").await?;
        let tmp = tempfile::tempdir()?;
        let (na, nb) = (unique_name("node"), unique_name("node"));
        // Node objects must exist, or the pod garbage collector deletes pods bound to them.
        let _na_obj = cocoon_testenv::TestNode::in_pool(&client, &na, "default").await?;
        let _nb_obj = cocoon_testenv::TestNode::in_pool(&client, &nb, "default").await?;
        let a = start_agent(env, &na, &root(&tmp, &na)).await?;
        let b = start_agent(env, &nb, &root(&tmp, &nb)).await?;
        let reg = registry(env);
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "m", &na, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        wait_running(&client, &ns, "m").await?;
        let vm = vm_name_for_pod(&ns, "m");
        let token = a.sim.guest_token(&vm)?;
        hibernate(&client, &reg, &a, &ns, "m").await?;
        // Seat release: the operator deletes the pod (keeping the node-local copy) ...
        patch_ann(
            &client,
            &ns,
            "m",
            json!({ann::KEEP_SNAPSHOT_ON_DELETE: "true"}),
        )
        .await?;
        api.delete("m", &DeleteParams::default()).await?;
        wait_gone(&client, &ns, "m").await?;
        // ... and recreates it, restore-marked, on the other node.
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "m",
                &nb,
                &[
                    (ann::SNAPSHOT_POLICY, "never"),
                    (ann::RESTORE_FROM_HIBERNATE, "true"),
                ],
            ),
        )
        .await?;
        wait_running(&client, &ns, "m").await?;
        assert_eq!(
            b.sim.guest_token(&vm)?,
            token,
            "state token continuity across nodes"
        );
        assert!(
            b.sim.call_count(Verb::SnapshotImport) >= 1,
            "node B pulled from the registry"
        );
        assert!(a.sim.vm_info(&vm).is_err(), "node A runs nothing");
        a.kill().await;
        b.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_killed_mid_hibernate_resumes_without_losing_state() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-crash").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let dir = root(&tmp, &node);
        let agent = start_agent(env, &node, &dir).await?;
        let reg = registry(env);
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "k", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        wait_running(&client, &ns, "k").await?;
        let vm = vm_name_for_pod(&ns, "k");
        let token = agent.sim.guest_token(&vm)?;
        agent.sim.block(Verb::SnapshotSave, None);
        patch_ann(
            &client,
            &ns,
            "k",
            json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
        )
        .await?;
        assert!(
            agent.sim.wait_blocked(Verb::SnapshotSave, 1, WAIT).await,
            "save started"
        );
        agent.kill().await;
        // The interrupted hibernate left the VM running and no tag.
        assert!(!reg.has_manifest(&vm, "hibernate").await?);
        let again = start_agent(env, &node, &dir).await?;
        wait_lifecycle(&client, &ns, "k", LifecycleState::Hibernated, 2).await?;
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "resumed hibernate pushed the tag"
        );
        assert!(
            again.sim.vm_info(&vm).is_err(),
            "resumed hibernate removed the VM"
        );
        patch_ann(&client, &ns, "k", json!({ann::HIBERNATE: null})).await?;
        wait_running(&client, &ns, "k").await?;
        assert_eq!(again.sim.guest_token(&vm)?, token, "no VM state lost");
        again.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashed_vm_restarts_in_place_then_repeated_crash_evicts() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-evict").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, &root(&tmp, &node)).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "c", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        let p = wait_running(&client, &ns, "c").await?;
        let vm = vm_name_for_pod(&ns, "c");
        let id = ann_of(&p, ann::VM_ID).unwrap_or_default();
        agent.sim.crash(&vm, CrashKind::Stopped)?;
        wait_until("restarted in place", WAIT, || async {
            (agent.sim.call_count(Verb::Start) == 1
                && agent.sim.vm_info(&vm).is_ok_and(|i| i.alive))
            .then_some(())
        })
        .await?;
        assert_eq!(
            agent.sim.vm_info(&vm)?.id,
            id,
            "same VM, restarted in place"
        );
        assert!(
            api.get_opt("c").await?.is_some(),
            "pod kept after one crash"
        );
        // A second crash inside the 30 s cooldown evicts: VM removed, pod deleted.
        agent.sim.crash(&vm, CrashKind::Error)?;
        wait_gone(&client, &ns, "c").await?;
        assert!(agent.sim.vm_info(&vm).is_err(), "crash-looping VM removed");
        assert_eq!(agent.sim.call_count(Verb::Start), 1, "no second restart");
        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_from_shares_one_baseline_snapshot() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-fork").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, &root(&tmp, &node)).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "main", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        wait_running(&client, &ns, "main").await?;
        let src = vm_name_for_pod(&ns, "main");
        let token = agent.sim.guest_token(&src)?;
        agent.sim.clear_calls();
        for sub in ["sub-1", "sub-2"] {
            let pod = vm_pod(
                &ns,
                sub,
                &node,
                &[
                    (ann::SNAPSHOT_POLICY, "never"),
                    (ann::FORK_FROM, &src),
                    (ann::MODE, "clone"),
                ],
            );
            api.create(&PostParams::default(), &pod).await?;
        }
        for sub in ["sub-1", "sub-2"] {
            wait_running(&client, &ns, sub).await?;
            let vm = vm_name_for_pod(&ns, sub);
            assert_eq!(
                agent.sim.guest_token(&vm)?,
                token,
                "a fork carries the source's state"
            );
        }
        assert_eq!(
            agent.sim.call_count(Verb::SnapshotSave),
            1,
            "one fork baseline for the lineage"
        );
        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
