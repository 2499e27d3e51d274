//! Clone bring-up paths and wake recovery on the real control plane and the real registry,
//! with in-process agents on the simulator: `mode=clone` from a registry snapshot artifact
//! (no local snapshot, so it is pulled), concurrent clones of one artifact pulling it once
//! (also when the caller that started the pull is cancelled), `clone-from-dir`, and a wake cut by an agent crash that the restarted agent finishes
//! without losing the guest's state.

mod common;

use std::path::PathBuf;

use common::{
    BoxError, WAIT, ann_of, golden_host, hibernate_pod, patch_ann, push_golden, registry, run_pod,
    start_agent, vm_pod, wait_running,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle};
use cocoon_api::naming::{clone_base_snapshot_name, vm_name_for_pod};
use cocoon_runtime::sim::Verb;
use cocoon_runtime::tarfmt;
use cocoon_testenv::{
    TestNode, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clone_pulls_a_registry_snapshot_artifact() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-clone").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, &tmp.path().join(&node)).await?;
        let golden = golden_host().await?;
        let repo = unique_name("golden");
        push_golden(env, &golden, &repo, "v1", &[]).await?;
        let image = format!("{repo}:v1");
        let local = clone_base_snapshot_name(&repo, "v1");
        assert!(
            agent.sim.snapshot_dir(&local).is_none(),
            "no local snapshot before the clone"
        );

        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "c",
                &node,
                &[(ann::MODE, "clone"), (ann::IMAGE, &image)],
            ),
        )
        .await?;
        wait_running(&client, &ns, "c").await?;
        let vm = vm_name_for_pod(&ns, "c");
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            golden.token,
            "the clone carries the artifact's guest state"
        );
        assert_eq!(
            agent.sim.call_count(Verb::SnapshotImport),
            1,
            "pulled from the registry once"
        );
        assert!(
            agent.sim.snapshot_dir(&local).is_some(),
            "the pulled snapshot is kept as the clone base"
        );

        // A second clone of the same artifact uses the local base: no second pull.
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "d",
                &node,
                &[(ann::MODE, "clone"), (ann::IMAGE, &image)],
            ),
        )
        .await?;
        wait_running(&client, &ns, "d").await?;
        assert_eq!(agent.sim.call_count(Verb::SnapshotImport), 1);

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clone_from_dir_brings_up_the_directory_snapshot() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-dir").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        // Only directories under the configured clone root may be cloned from.
        let allowed = tmp.path().canonicalize()?.join("allowed");
        std::fs::create_dir_all(&allowed)?;
        let root = tmp.path().join(&node);
        let mut opts = common::AgentOptions::new(&root);
        opts.clone_from_dir_roots = vec![allowed.clone()];
        let agent =
            common::start_agent_with(env.client()?, env.registry_addr(), &node, &root, opts, |_| {
                Ok(())
            })
            .await?;
        let golden = golden_host().await?;

        // Stage the snapshot as a directory: its files plus snapshot.json; once under the
        // root, once beside it in a directory that merely shares the root's name as a prefix.
        let tar = golden
            .rt
            .snapshot_export("golden")
            .await?
            .read_to_end()
            .await?;
        let record = golden.rt.snapshot_inspect("golden").await?;
        let outside = tmp.path().canonicalize()?.join("allowed-not").join("staged");
        for staged in [allowed.join("staged-snapshot"), outside.clone()] {
            std::fs::create_dir_all(&staged)?;
            tarfmt::read_snapshot_tar(tar.as_slice(), &staged)?;
            std::fs::write(
                staged.join(tarfmt::ENVELOPE_NAME),
                tarfmt::envelope_bytes(&record)?,
            )?;
        }
        let staged: PathBuf = allowed.join("staged-snapshot");
        let dir = staged.to_str().ok_or("utf-8 path")?;
        let outside = outside.to_str().ok_or("utf-8 path")?;

        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "g",
                &node,
                &[(ann::MODE, "clone"), (ann::CLONE_FROM_DIR, outside)],
            ),
        )
        .await?;
        let refused = common::wait_lifecycle(
            &client,
            &ns,
            "g",
            cocoon_api::contract::LifecycleState::Failed,
            1,
        )
        .await?;
        assert_eq!(
            Lifecycle::from_meta(&refused.metadata).message,
            format!(
                "annotation vm.cocoonstack.io/clone-from-dir: {outside:?} is not under a configured clone root (VK_CLONE_FROM_DIR_ROOTS)"
            )
        );
        assert_eq!(
            agent.sim.call_count(Verb::Clone),
            0,
            "nothing cloned from the unlisted directory"
        );
        api.create(
            &PostParams::default(),
            &vm_pod(
                &ns,
                "f",
                &node,
                &[(ann::MODE, "clone"), (ann::CLONE_FROM_DIR, dir)],
            ),
        )
        .await?;
        wait_running(&client, &ns, "f").await?;
        let vm = vm_name_for_pod(&ns, "f");
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            golden.token,
            "the clone carries the directory snapshot's guest state"
        );
        let clones = agent.sim.calls_of(Verb::Clone);
        assert!(
            clones.iter().any(|c| c.args.to_string().contains(dir)),
            "cloned --from-dir {dir}: {clones:?}"
        );
        assert_eq!(
            agent.sim.call_count(Verb::SnapshotImport),
            0,
            "nothing pulled"
        );

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_cut_by_an_agent_crash_finishes_after_restart() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-wake").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let dir = tmp.path().join(&node);
        let agent = start_agent(env, &node, &dir).await?;
        let reg = registry(env.registry_addr());
        run_pod(&client, &ns, "w", &node, &[]).await?;
        let vm = vm_name_for_pod(&ns, "w");
        let token = agent.sim.guest_token(&vm)?;

        hibernate_pod(&client, &ns, "w", 2).await?;
        assert!(reg.has_manifest(&vm, "hibernate").await?);

        // Wake, and kill the agent while the wake's clone is in flight.
        agent.sim.block(Verb::Clone, Some(&vm));
        patch_ann(
            &client,
            &ns,
            "w",
            json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
        )
        .await?;
        assert!(
            agent.sim.wait_blocked(Verb::Clone, 1, WAIT).await,
            "wake clone started"
        );
        agent.kill().await;

        let again = start_agent(env, &node, &dir).await?;
        let p = wait_running(&client, &ns, "w").await?;
        let lc = Lifecycle::from_meta(&p.metadata);
        assert!(lc.observed_generation >= 3, "wake observed: {lc:?}");
        assert_eq!(again.sim.guest_token(&vm)?, token, "no VM state lost");
        assert_eq!(
            ann_of(&p, ann::VM_ID).as_deref(),
            Some(again.sim.vm_info(&vm)?.id.as_str()),
            "the annotated VM is the running one"
        );
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the hibernation snapshot is still in the registry"
        );

        again.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clones_of_one_artifact_pull_it_once() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-flight").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, &tmp.path().join(&node)).await?;
        let golden = golden_host().await?;
        let repo = unique_name("golden");
        push_golden(env, &golden, &repo, "v1", &[]).await?;
        let image = format!("{repo}:v1");

        // Hold the pull at its import so that every clone is waiting on it at once.
        agent.sim.block(Verb::SnapshotImport, None);
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let names = ["p1", "p2", "p3"];
        for name in names {
            api.create(
                &PostParams::default(),
                &vm_pod(
                    &ns,
                    name,
                    &node,
                    &[(ann::MODE, "clone"), (ann::IMAGE, &image)],
                ),
            )
            .await?;
        }
        assert!(
            agent.sim.wait_blocked(Verb::SnapshotImport, 1, WAIT).await,
            "the pull started"
        );
        // Every pod's create is inside its bring-up (tracked, no VM yet) before the release.
        wait_until("all creates waiting on the pull", WAIT, || async {
            names
                .iter()
                .all(|n| agent.handler.is_tracked(&format!("{ns}/{n}")))
                .then_some(())
        })
        .await?;
        agent.sim.unblock(Verb::SnapshotImport);
        for name in names {
            let p = wait_running(&client, &ns, name).await?;
            assert!(ann_of(&p, ann::VM_ID).is_some());
            assert_eq!(
                agent.sim.guest_token(&vm_name_for_pod(&ns, name))?,
                golden.token
            );
        }
        assert_eq!(
            agent.sim.call_count(Verb::SnapshotImport),
            1,
            "three clones, one pull"
        );

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_caller_leaves_the_shared_pull_running() {
    run_test(|env| async move {
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let agent = start_agent(env, &node, &tmp.path().join(&node)).await?;
        let golden = golden_host().await?;
        let repo = unique_name("golden");
        push_golden(env, &golden, &repo, "v1", &[]).await?;
        let local = clone_base_snapshot_name(&repo, "v1");

        agent.sim.block(Verb::SnapshotImport, None);
        let (h, r, l) = (agent.handler.clone(), repo.clone(), local.clone());
        let first = tokio::spawn(async move { h.shared_pull(&r, "v1", &l).await });
        assert!(
            agent.sim.wait_blocked(Verb::SnapshotImport, 1, WAIT).await,
            "the first caller's pull started"
        );
        // The caller that started the pull goes away; the pull must not.
        first.abort();
        assert!(first.await.is_err_and(|e| e.is_cancelled()));
        let (h2, h3) = (agent.handler.clone(), agent.handler.clone());
        let (r2, r3, l2, l3) = (repo.clone(), repo.clone(), local.clone(), local.clone());
        let second = tokio::spawn(async move { h2.shared_pull(&r2, "v1", &l2).await });
        let third = tokio::spawn(async move { h3.shared_pull(&r3, "v1", &l3).await });
        agent.sim.unblock(Verb::SnapshotImport);
        second.await??;
        third.await??;
        assert_eq!(
            agent.sim.call_count(Verb::SnapshotImport),
            1,
            "the later callers joined the first pull"
        );
        assert!(
            agent.sim.snapshot_dir(&local).is_some(),
            "the pulled snapshot is registered"
        );
        agent.kill().await;
        Ok::<_, BoxError>(())
    })
    .await;
}
