//! Tenant isolation on the node, on the real control plane and the real registry with an
//! in-process agent on the simulator: raw pods of namespace B that name, restore, fork from,
//! rename themselves onto, or (after an agent restart) claim by id a VM of namespace A are all
//! refused with a `TenantIsolationRefused` Event and lifecycle `failed` naming the annotation;
//! A's VMs, their local snapshots and their registry tags stay untouched, and A's own paths
//! (a sub-agent forking from its main, a wake from `:hibernate`) keep working. An unmanaged
//! decoy of one namespace is never a fork source, so it never reaches another namespace's VM
//! through its pre-assigned id (issue 35 item 1).

mod common;

use common::{
    AgentOptions, BoxError, WAIT, ann_of, hibernate_pod, is_running_ready, kill_and_delete,
    node_agent, patch_ann, registry, run_pod, start_agent, start_agent_with, two_tenants, vm_pod,
    wait_failed, wait_gone, wait_refused, wait_running, wake_pod,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::{fork_snapshot_name, vm_name_for_pod};
use cocoon_runtime::sim::{OutOfBandVm, SimRuntime, Verb};
use cocoon_testenv::{
    TestNode, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_namespace_cannot_take_restore_fork_or_snapshot_a_vm() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, api_a, api_b) = two_tenants(&client, "tenant-a", "tenant-b").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());

        // Tenant A: a running main, and a second VM hibernated to the registry.
        run_pod(&client, &ns_a, "main", &node, &[]).await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let id_a = agent.sim.vm_info(&vm_a)?.id;
        let token_a = agent.sim.guest_token(&vm_a)?;
        run_pod(&client, &ns_a, "hib", &node, &[]).await?;
        let vm_hib = vm_name_for_pod(&ns_a, "hib");
        let token_hib = agent.sim.guest_token(&vm_hib)?;
        hibernate_pod(&client, &ns_a, "hib", 2).await?;
        let hib_tag = reg
            .snapshot_info(&vm_hib, "hibernate")
            .await?
            .ok_or("A's hibernate tag pushed")?
            .snapshot_id;
        assert!(agent.sim.snapshot_dir(&vm_hib).is_some(), "A's local copy");

        // Tenant B: a pod of its own that runs, for the rename attempt below.
        run_pod(&client, &ns_b, "own", &node, &[]).await?;
        let vm_b = vm_name_for_pod(&ns_b, "own");
        let id_b = agent.sim.vm_info(&vm_b)?.id;
        agent.sim.clear_calls();

        // B names A's running VM (the adopt path), A's hibernated VM with and without the
        // restore marker, and forks from A's main.
        /// (pod name, annotations, expected refusal prefix)
        type Attempt<'a> = (&'a str, Vec<(&'a str, &'a str)>, String);
        let attempts: [Attempt; 4] = [
            (
                "take",
                vec![(ann::VM_NAME, vm_a.as_str())],
                format!(
                    "annotation vm.cocoonstack.io/name: VM {vm_a:?} does not belong to pod {ns_b}/take"
                ),
            ),
            (
                "restore",
                vec![
                    (ann::VM_NAME, vm_hib.as_str()),
                    (ann::RESTORE_FROM_HIBERNATE, "true"),
                ],
                format!(
                    "annotation vm.cocoonstack.io/name: VM {vm_hib:?} does not belong to pod {ns_b}/restore"
                ),
            ),
            (
                "derive",
                vec![(ann::VM_NAME, vm_hib.as_str())],
                format!(
                    "annotation vm.cocoonstack.io/name: VM {vm_hib:?} does not belong to pod {ns_b}/derive"
                ),
            ),
            (
                "fork",
                vec![(ann::FORK_FROM, vm_a.as_str()), (ann::MODE, "clone")],
                format!(
                    "annotation vm.cocoonstack.io/fork-from: VM {vm_a:?} does not belong to namespace {ns_b:?}"
                ),
            ),
        ];
        for (name, extra, _) in &attempts {
            api_b
                .create(&PostParams::default(), &vm_pod(&ns_b, name, &node, extra))
                .await?;
        }
        for (name, _, want) in &attempts {
            let msg = wait_refused(&client, &ns_b, name, "create").await?;
            assert!(msg.starts_with(want.as_str()), "{name}: {msg}");
            let p = api_b.get(name).await?;
            assert_eq!(ann_of(&p, ann::VM_ID), None, "{name}: no VM annotated");
        }

        // B renames its own running pod onto A's main and asks for a hibernate: that would
        // save B's VM as A's snapshot and push it as A's `:hibernate`.
        patch_ann(
            &client,
            &ns_b,
            "own",
            json!({ann::VM_NAME: vm_a, ann::HIBERNATE: "true", ann::GENERATION: "2"}),
        )
        .await?;
        let msg = wait_refused(&client, &ns_b, "own", "update").await?;
        assert_eq!(
            msg,
            format!(
                "annotation vm.cocoonstack.io/name: changed from {vm_b:?} to {vm_a:?}; the VM name of a pod never changes"
            )
        );

        // Nothing of A's was touched: no bring-up, save, removal or clone at all.
        for verb in [
            Verb::Run,
            Verb::Clone,
            Verb::Remove,
            Verb::Stop,
            Verb::SnapshotSave,
            Verb::SnapshotImport,
        ] {
            assert_eq!(
                agent.sim.call_count(verb),
                0,
                "{verb:?}: {:?}",
                agent.sim.calls()
            );
        }
        assert_eq!(agent.sim.vm_info(&vm_a)?.id, id_a, "A's VM kept");
        assert!(agent.sim.vm_info(&vm_a)?.alive, "A's VM still running");
        assert_eq!(agent.sim.guest_token(&vm_a)?, token_a, "A's guest state");
        assert!(
            agent.sim.snapshot_dir(&fork_snapshot_name(&vm_a)).is_none(),
            "no fork baseline of A's VM was saved"
        );
        assert!(
            !reg.has_manifest(&vm_a, "hibernate").await?,
            "nothing pushed into A's main's repository"
        );
        assert_eq!(agent.sim.vm_info(&vm_b)?.id, id_b, "B's own VM kept too");

        // Deleting B's refused pods must not drop A's local snapshots either.
        for (name, _, _) in &attempts {
            api_b.delete(name, &DeleteParams::default()).await?;
        }
        for (name, _, _) in &attempts {
            wait_gone(&client, &ns_b, name).await?;
        }
        assert!(
            agent.sim.snapshot_dir(&vm_hib).is_some(),
            "A's local hibernate copy survives B's deletes"
        );
        assert_eq!(
            reg.snapshot_info(&vm_hib, "hibernate")
                .await?
                .map(|i| i.snapshot_id),
            Some(hib_tag),
            "A's registry tag is untouched"
        );

        // A's own paths still work: a sub-agent forks from its main, and the hibernated VM
        // wakes with its state.
        api_a
            .create(
                &PostParams::default(),
                &vm_pod(
                    &ns_a,
                    "sub-1",
                    &node,
                    &[(ann::FORK_FROM, vm_a.as_str()), (ann::MODE, "clone")],
                ),
            )
            .await?;
        wait_running(&client, &ns_a, "sub-1").await?;
        assert_eq!(
            agent.sim.guest_token(&vm_name_for_pod(&ns_a, "sub-1"))?,
            token_a,
            "the sub-agent forked from A's main"
        );
        wake_pod(&client, &ns_a, "hib", 3).await?;
        assert_eq!(agent.sim.guest_token(&vm_hib)?, token_hib, "A's wake");

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The startup reconcile adopts by `vm.cocoonstack.io/id`: a pod of B that annotates A's VM
/// id (with its own VM name) must not be handed A's VM after an agent restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_agent_does_not_adopt_another_namespace_vm_by_id() {
    run_test(|env| async move {
        let client = env.client()?;
        // B's namespace sorts first, so the reconcile meets the thief before A's own pod.
        let (ns_a, ns_b, _api_a, api_b) = two_tenants(&client, "tenant-1a", "tenant-0b").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        run_pod(&client, &ns_a, "main", &node, &[]).await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let id_a = agent.sim.vm_info(&vm_a)?.id;
        let token_a = agent.sim.guest_token(&vm_a)?;
        agent.kill().await;

        // While the agent is down, B's pod claims A's VM id under its own VM name.
        api_b
            .create(
                &PostParams::default(),
                &vm_pod(&ns_b, "thief", &node, &[(ann::VM_ID, id_a.as_str())]),
            )
            .await?;
        let agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            tmp.path(),
            AgentOptions::new(tmp.path()),
            |_| Ok(()),
        )
        .await?;
        let key_b = format!("{ns_b}/thief");
        assert!(
            agent
                .handler
                .tracked_vm(&key_b)
                .is_none_or(|v| v.id() != id_a),
            "the reconcile did not hand A's VM to B"
        );
        // B's pod gets a VM of its own instead; A's is untouched.
        let p = wait_running(&client, &ns_b, "thief").await?;
        assert_ne!(ann_of(&p, ann::VM_ID), Some(id_a.clone()), "B's own VM");
        assert!(agent.sim.vm_info(&vm_name_for_pod(&ns_b, "thief"))?.alive);
        let key_a = format!("{ns_a}/main");
        assert_eq!(
            agent.handler.tracked_vm(&key_a).map(|v| v.id().to_owned()),
            Some(id_a.clone()),
            "A's pod keeps its VM"
        );
        assert_eq!(agent.sim.vm_info(&vm_a)?.id, id_a);
        assert_eq!(agent.sim.guest_token(&vm_a)?, token_a);

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A VM with the legacy unhashed name of an earlier operator is kept for the pod that already
/// runs it (adopted by its id at startup); a new pod with a legacy name is refused, since that
/// form is ambiguous between namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_legacy_named_vm_is_kept_only_for_the_pod_that_runs_it() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "tenant-l").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let root = tmp.path().join(&node);
        // The VM an earlier agent brought up for pod `old`, under the legacy name.
        let legacy = format!("vk-{ns}-old");
        let id = {
            let rt = SimRuntime::open(common::sim_config(&root))?;
            rt.handle()
                .create_vm(OutOfBandVm {
                    name: legacy.clone(),
                    ..OutOfBandVm::default()
                })?
                .id
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "old",
                &node,
                // As the earlier agent left it: the VM id and lifecycle `ready`.
                &[
                    (ann::VM_NAME, legacy.as_str()),
                    (ann::VM_ID, id.as_str()),
                    (ann::LIFECYCLE_STATE, "ready"),
                ],
            ),
        )
        .await?;
        let agent = start_agent(env, &node, &root).await?;
        let p = common::wait_running_with(&client, &ns, "old", false).await?;
        assert_eq!(ann_of(&p, ann::VM_ID), Some(id.clone()), "adopted by id");
        assert_eq!(agent.sim.call_count(Verb::Run), 0, "no fresh boot");

        let fresh = format!("vk-{ns}-new");
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "new", &node, &[(ann::VM_NAME, fresh.as_str())]),
        )
        .await?;
        let msg = wait_refused(&client, &ns, "new", "create").await?;
        assert_eq!(
            msg,
            format!(
                "annotation vm.cocoonstack.io/name: VM {fresh:?} has the legacy unhashed form, which does not prove it belongs to namespace {ns:?}; only a VM this node already runs for the pod is kept (new pods use {:?})",
                vm_name_for_pod(&ns, "new")
            )
        );
        assert_eq!(agent.sim.call_count(Verb::Run), 0, "nothing booted for it");

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Issue 35 item 1, fork through an unmanaged decoy: an unmanaged pod's pre-assigned
/// `vm.cocoonstack.io/id` is never handed to the runtime, so a managed pod forking from the
/// decoy's VM name can never snapshot (and so read the memory and disk of) the VM that id
/// names or is an id prefix of.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unmanaged_decoy_is_never_a_fork_source() {
    run_test(|env| async move {
        let client = env.client()?;
        // Victim namespace B, attacker namespace A, one node.
        let (ns_b, ns_a, api_b, api_a) = two_tenants(&client, "victim-b", "attacker-a").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let decoy = |name: &str, id: &str, ip: &str| {
            vm_pod(
                &ns_a,
                name,
                &node,
                &[
                    (ann::MANAGED, "false"),
                    (ann::VM_ID, id),
                    (ann::VM_IP, ip),
                ],
            )
        };
        let fork_of = |name: &str, src: &str| {
            vm_pod(
                &ns_a,
                name,
                &node,
                &[(ann::FORK_FROM, src), (ann::MODE, "clone")],
            )
        };

        // 1. Before B's VM exists, A creates an unmanaged decoy whose pre-assigned id is the
        //    VM name B's next pod will get (names are computable). Refused at admission by the
        //    id's spelling, whatever exists on the node.
        let vm_b = vm_name_for_pod(&ns_b, "main");
        let vm_decoy = vm_name_for_pod(&ns_a, "decoy");
        api_a
            .create(
                &PostParams::default(),
                &decoy("decoy", &vm_b, "10.250.0.21"),
            )
            .await?;
        let msg = wait_refused(&client, &ns_a, "decoy", "create").await?;
        assert_eq!(
            msg,
            format!(
                "annotation vm.cocoonstack.io/id: {vm_b:?} has the form of a VM name (vk-…, fork-vk-…), which the runtime would resolve to that VM; an unmanaged pod's id cannot take it"
            )
        );

        // 2. B's pod then runs on the node.
        run_pod(&client, &ns_b, "main", &node, &[]).await?;
        let id_b = agent.sim.vm_info(&vm_b)?.id;
        let token_b = agent.sim.guest_token(&vm_b)?;

        // 3. A's second decoy pre-assigns a 3-character prefix of B's VM id. It is admitted
        //    (the id is a label of its synthetic record, never passed to the runtime; refusing
        //    it would tell A that some VM's id starts with it) and runs.
        let prefix = &id_b[..3];
        let vm_decoy_p = vm_name_for_pod(&ns_a, "decoy-p");
        api_a
            .create(
                &PostParams::default(),
                &decoy("decoy-p", prefix, "10.250.0.22"),
            )
            .await?;
        wait_running(&client, &ns_a, "decoy-p").await?;
        agent.sim.clear_calls();

        // 4. A's managed pods fork from the decoys' VM names.
        api_a
            .create(&PostParams::default(), &fork_of("thief", &vm_decoy_p))
            .await?;
        api_a
            .create(&PostParams::default(), &fork_of("thief-2", &vm_decoy))
            .await?;
        //    The admitted decoy is an unmanaged holder: refused, naming fork-from (and never
        //    running: with the old rule it came up as a fork of B's VM).
        let settled = wait_until(&format!("{ns_a}/thief settles"), WAIT, || {
            let api = api_a.clone();
            async move {
                let p = api.get("thief").await.ok()?;
                let state = Lifecycle::from_meta(&p.metadata).state?;
                matches!(state, LifecycleState::Failed | LifecycleState::Ready).then_some(state)
            }
        })
        .await?;
        let vm_thief = vm_name_for_pod(&ns_a, "thief");
        assert_eq!(
            settled,
            LifecycleState::Failed,
            "A's fork of the decoy runs; its guest token {:?}, B's {token_b:?}",
            agent.sim.guest_token(&vm_thief).ok()
        );
        let msg = wait_refused(&client, &ns_a, "thief", "create").await?;
        assert_eq!(
            msg,
            format!(
                "annotation vm.cocoonstack.io/fork-from: VM {vm_decoy_p:?} is held by {ns_a}/decoy-p, which is not a managed VM pod; an unmanaged pod's record is never a fork source"
            )
        );
        //    The refused decoy holds nothing: its name is looked up by exact name only, and
        //    the miss names no other VM.
        let msg = wait_failed(&client, &ns_a, "thief-2").await?;
        assert_eq!(
            msg,
            format!("inspect fork source vm {vm_decoy}: VM not found")
        );

        // 5. B's VM is intact: same id, running, same guest state, never snapshotted or
        //    cloned, and B's pod is still Ready.
        let info = agent.sim.vm_info(&vm_b)?;
        assert_eq!(info.id, id_b, "B's VM kept");
        assert!(info.alive, "B's VM still running");
        assert_eq!(agent.sim.guest_token(&vm_b)?, token_b, "B's guest state");
        for verb in [Verb::SnapshotSave, Verb::Clone, Verb::Run, Verb::Remove, Verb::Stop] {
            assert_eq!(
                agent.sim.call_count(verb),
                0,
                "{verb:?}: {:?}",
                agent.sim.calls()
            );
        }
        for snap in [&vm_decoy_p, &vm_decoy, &vm_b] {
            assert!(
                agent.sim.snapshot_dir(&fork_snapshot_name(snap)).is_none(),
                "no fork baseline {}",
                fork_snapshot_name(snap)
            );
        }
        for thief in ["thief", "thief-2"] {
            assert!(
                agent
                    .sim
                    .vm_info(&vm_name_for_pod(&ns_a, thief))
                    .is_err(),
                "{thief}: no VM"
            );
        }
        assert!(
            is_running_ready(&api_b.get("main").await?),
            "B's pod still Running and Ready"
        );

        // 6. A's own path still works: a sub-agent forks from A's managed main.
        run_pod(&client, &ns_a, "main", &node, &[]).await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let token_a = agent.sim.guest_token(&vm_a)?;
        api_a
            .create(&PostParams::default(), &fork_of("sub-1", &vm_a))
            .await?;
        wait_running(&client, &ns_a, "sub-1").await?;
        assert_eq!(
            agent.sim.guest_token(&vm_name_for_pod(&ns_a, "sub-1"))?,
            token_a,
            "the sub-agent forked from A's main"
        );
        assert_eq!(agent.sim.guest_token(&vm_b)?, token_b, "B's guest state");

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
