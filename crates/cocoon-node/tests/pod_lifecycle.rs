//! The node agent's pod lifecycle on the real control plane and the real registry, with
//! in-process agents on the simulated runtime: bring-up, hibernate/wake (same node and across
//! nodes), delete snapshot policies, restart recovery mid-hibernate, and crash handling.

mod common;

use std::path::PathBuf;

use common::{
    BoxError, TestAgent, TestResult, WAIT, ann_of, hibernate_pod, patch_ann, registry, start_agent,
    vm_pod, wait_gone, wait_lifecycle, wait_running,
};

use cocoon_api::contract::LifecycleState;
use cocoon_api::contract::annotations as ann;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::RegistryClient;
use cocoon_runtime::sim::{CrashKind, Verb};
use cocoon_testenv::{create_namespace, delete_namespace, run_test, unique_name, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn root(tmp: &tempfile::TempDir, node: &str) -> PathBuf {
    tmp.path().join(node)
}

/// One test's namespace and a fresh Node object (without it the pod garbage collector deletes
/// pods bound to the node), with the agent's root directory under a temporary directory.
struct OnNode {
    client: Client,
    ns: String,
    node: String,
    root: PathBuf,
    _tmp: tempfile::TempDir,
    _node_obj: cocoon_testenv::TestNode,
}

async fn on_new_node(env: &cocoon_testenv::Shared, prefix: &str) -> Result<OnNode, BoxError> {
    let client = env.client()?;
    let ns = create_namespace(&client, prefix).await?;
    let tmp = tempfile::tempdir()?;
    let node = unique_name("node");
    let node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
    Ok(OnNode {
        root: root(&tmp, &node),
        client,
        ns,
        node,
        _tmp: tmp,
        _node_obj: node_obj,
    })
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
    let p = hibernate_pod(client, ns, name, 2).await?;
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
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-life").await?;
        let agent = start_agent(env, &node, &root).await?;
        let reg = registry(env.registry_addr());
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
        Ok::<_, BoxError>(())
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
        let reg = registry(env.registry_addr());
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
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_killed_mid_hibernate_resumes_without_losing_state() {
    run_test(|env| async move {
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-crash").await?;
        let dir = root;
        let agent = start_agent(env, &node, &dir).await?;
        let reg = registry(env.registry_addr());
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
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashed_vm_restarts_in_place_then_repeated_crash_evicts() {
    run_test(|env| async move {
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-evict").await?;
        let agent = start_agent(env, &node, &root).await?;
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
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_from_shares_one_baseline_snapshot() {
    run_test(|env| async move {
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-fork").await?;
        let agent = start_agent(env, &node, &root).await?;
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
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A wake publishes its status from several tasks at once (the bring-up, the first probe, the
/// lifecycle reconciler). Whatever order their writes land in, every woken pod must end Ready
/// on its own: here the drift check, which would repair a stale status, never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_wakes_end_ready_without_the_drift_check() {
    run_test(|env| async move {
        const PODS: usize = 40;
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-wakes").await?;
        let mut opts = common::AgentOptions::new(&root);
        opts.timing.drift_first = std::time::Duration::from_secs(3600);
        opts.timing.drift_every = std::time::Duration::from_secs(3600);
        let _agent = common::start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            &root,
            opts,
            |_| Ok(()),
        )
        .await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let names: Vec<String> = (0..PODS).map(|i| format!("w{i}")).collect();
        for name in &names {
            api.create(
                &PostParams::default(),
                &vm_pod(&ns, name, &node, &[(ann::SNAPSHOT_POLICY, "never")]),
            )
            .await?;
        }
        for name in &names {
            wait_running(&client, &ns, name).await?;
        }
        for round in 0..2 {
            let generation = 2 * round + 2;
            futures::future::try_join_all(
                names
                    .iter()
                    .map(|name| hibernate_pod(&client, &ns, name, generation)),
            )
            .await?;
            futures::future::try_join_all(
                names
                    .iter()
                    .map(|name| patch_ann(&client, &ns, name, json!({ann::HIBERNATE: null}))),
            )
            .await?;
            for name in &names {
                wait_running(&client, &ns, name).await?;
            }
        }
        delete_namespace(&client, &ns).await?;
        Ok::<(), BoxError>(())
    })
    .await;
}

/// Bring-up and wake are Ready once the DHCP lease lands, not at the next tick of the probe
/// warm-up (§11.1) or of the ready-after-IP poll (§6.9): with both an hour long and the lease
/// landing a second after the boot (after the first, synchronous probe), the pod still gets
/// Ready, once fresh and once woken. Without the lease watch it stayed not ready for the hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_when_the_lease_lands_not_at_the_next_poll() {
    run_test(|env| async move {
        let hour = std::time::Duration::from_secs(3600);
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-lease").await?;
        let mut opts = common::AgentOptions::new(&root);
        opts.sim.lease_delay = std::time::Duration::from_secs(1);
        opts.timing.probe.warmup_start = hour;
        opts.timing.probe.warmup_cap = hour;
        opts.timing.ready_ip_poll = hour;
        let _agent = common::start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            &root,
            opts,
            |_| Ok(()),
        )
        .await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "a", &node, &[(ann::SNAPSHOT_POLICY, "never")]),
        )
        .await?;
        wait_running(&client, &ns, "a").await?;
        hibernate_pod(&client, &ns, "a", 2).await?;
        patch_ann(&client, &ns, "a", json!({ann::HIBERNATE: null})).await?;
        wait_running(&client, &ns, "a").await?;
        delete_namespace(&client, &ns).await?;
        Ok::<(), BoxError>(())
    })
    .await;
}

/// The sim's `stop` and `remove` calls naming VM `id`, in order, with the stop's timeout.
fn stop_and_remove_calls(agent: &TestAgent, id: &str) -> Vec<(Verb, Option<u64>)> {
    agent
        .sim
        .calls()
        .into_iter()
        .filter(|c| {
            matches!(c.verb, Verb::Stop | Verb::Remove) && c.targets.iter().any(|t| t == id)
        })
        .map(|c| (c.verb, c.args["timeout_secs"].as_u64()))
        .collect()
}

/// Issue 40: deleting a pod shuts its guest down within the pod's grace period
/// (`vm stop --timeout <grace>`) before the forced remove; a guest that ignores the stop is
/// still removed once the grace period runs out, with a `VMStopTimeout` Warning Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_stops_the_guest_within_its_grace_period_then_removes_it() {
    run_test(|env| async move {
        let OnNode {
            client,
            ns,
            node,
            root,
            _tmp,
            _node_obj,
        } = on_new_node(env, "node-stop").await?;
        let agent = start_agent(env, &node, &root).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        for name in ["polite", "stubborn"] {
            api.create(&PostParams::default(), &vm_pod(&ns, name, &node, &[]))
                .await?;
        }
        let polite =
            ann_of(&wait_running(&client, &ns, "polite").await?, ann::VM_ID).ok_or("polite id")?;
        let stubborn = ann_of(&wait_running(&client, &ns, "stubborn").await?, ann::VM_ID)
            .ok_or("stubborn id")?;
        agent
            .sim
            .ignore_shutdown(&vm_name_for_pod(&ns, "stubborn"), true);

        // A guest that answers: stop with the pod's grace period, then the remove.
        api.delete("polite", &DeleteParams::default().grace_period(7))
            .await?;
        wait_gone(&client, &ns, "polite").await?;
        let calls = stop_and_remove_calls(&agent, &polite);
        assert_eq!(
            calls,
            [(Verb::Stop, Some(7)), (Verb::Remove, None)],
            "stop --timeout 7, then rm"
        );
        assert!(agent.sim.vm_info(&polite).is_err(), "removed");

        // A guest that never shuts down: the agent waits out the grace period, then removes.
        let asked = std::time::Instant::now();
        api.delete("stubborn", &DeleteParams::default().grace_period(2))
            .await?;
        wait_gone(&client, &ns, "stubborn").await?;
        assert!(
            asked.elapsed() >= std::time::Duration::from_secs(2),
            "the guest got its grace period: {:?}",
            asked.elapsed()
        );
        assert_eq!(
            stop_and_remove_calls(&agent, &stubborn),
            [(Verb::Stop, Some(2)), (Verb::Remove, None)]
        );
        assert!(agent.sim.vm_info(&stubborn).is_err(), "removed by force");
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
        let want = format!("vm {stubborn} did not stop within 2s; removing it by force");
        wait_until("VMStopTimeout event", WAIT, || {
            let events = events.clone();
            let want = want.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("VMStopTimeout")
                            && e.type_.as_deref() == Some("Warning")
                            && e.involved_object.name.as_deref() == Some("stubborn")
                            && e.message.as_deref() == Some(want.as_str())
                    })
                    .then_some(())
            }
        })
        .await?;
        let list = events.list(&Default::default()).await?;
        assert!(
            !list.items.iter().any(|e| {
                e.reason.as_deref() == Some("VMStopTimeout")
                    && e.involved_object.name.as_deref() == Some("polite")
            }),
            "a guest that stopped in time is not evented"
        );
        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
