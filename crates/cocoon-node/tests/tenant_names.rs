//! Tenant isolation, issue 26: names a tenant writes never reach another namespace's VMs or
//! snapshots. On the real control plane and the real registry with in-process agents on the
//! simulator:
//!
//! * item 1: clone-mode images naming a victim's VM repository, fork baseline, warm-wake copy,
//!   `:hibernate` tag or a snapshot id prefix are refused or resolve to nothing of the
//!   victim's; every pushed snapshot records its owner, and a restore refuses an artifact
//!   recorded for another owner;
//! * item 2: `managed` and an unmanaged pod's pre-assigned id are fixed at admission, and a
//!   pre-assigned id that is a runtime VM's exact id or in the VM-name form is refused (an id
//!   prefix is admitted: it reaches nothing, issue 35 item 1); a managed pod flipped to
//!   unmanaged and deleted does not leak its VM;
//! * item 4: a pod being refused never counts as a holder;
//! * item 10: `VK_ACCEPT_LEGACY_VM_NAMES` runs a legacy-named pod through create, hibernate
//!   and wake; without it the pod is refused; the spec's `clone-from-dir` validation speaks
//!   before the root check;
//! * item 8: unused clone bases beyond `VK_CLONE_BASE_KEEP` are collected.

mod common;

use common::{
    AgentOptions, BoxError, TestResult, WAIT, ann_of, golden_host, hibernate_pod, kill_and_delete,
    node_agent, patch_ann, push_golden, registry, run_pod, start_agent, start_agent_with,
    two_tenants, vm_pod, wait_failed, wait_gone, wait_refused, wait_running, wake_pod,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::oci::{ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_POD};
use cocoon_api::contract::{AnnotationCodec, Lifecycle};
use cocoon_api::naming::{clone_base_snapshot_name, fork_snapshot_name, vm_name_for_pod};
use cocoon_node::pods::{OrphanPolicy, TenantConfig};
use cocoon_runtime::sim::{OutOfBandVm, Verb};
use cocoon_testenv::{
    Shared, TestNode, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// The golden snapshot pushed to `<repo>:<tag>` for every tag in `tags`, with `extra`
/// manifest annotations; returns the guest's state token.
async fn push_golden_tags(
    env: &Shared,
    repo: &str,
    tags: &[&str],
    extra: &[(&str, &str)],
) -> TestResult<String> {
    let golden = golden_host().await?;
    for tag in tags {
        push_golden(env, &golden, repo, tag, extra).await?;
    }
    Ok(golden.token)
}

/// Item 1: clone images that name the victim's VM-owned snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clone_images_never_resolve_into_another_namespaces_vm_snapshots() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, api_a, api_b) = two_tenants(&client, "tn-a", "tn-b").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());

        // Victim A: a running main with a fork baseline (a sub-agent forked from it), and a
        // hibernated VM whose `:hibernate` tag and warm-wake copy exist.
        run_pod(&client, &ns_a, "main", &node, &[]).await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let token_a = agent.sim.guest_token(&vm_a)?;
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
        assert!(agent.sim.snapshot_dir(&fork_snapshot_name(&vm_a)).is_some());
        run_pod(&client, &ns_a, "hib", &node, &[]).await?;
        let vm_hib = vm_name_for_pod(&ns_a, "hib");
        let token_hib = agent.sim.guest_token(&vm_hib)?;
        hibernate_pod(&client, &ns_a, "hib", 2).await?;
        let hib_info = reg
            .snapshot_info(&vm_hib, "hibernate")
            .await?
            .ok_or("A's hibernate tag")?;
        assert!(agent.sim.snapshot_dir(&vm_hib).is_some(), "A's warm copy");

        // Every snapshot this agent pushes records its owner.
        let a = reg.manifest_annotations(&vm_hib, "hibernate").await?;
        assert_eq!(a.get(ANNOTATION_OWNER_NAMESPACE), Some(&ns_a));
        assert_eq!(a.get(ANNOTATION_OWNER_POD).map(String::as_str), Some("hib"));

        // The runtime contract (and the simulator) resolves a snapshot reference by exact
        // id, name or id prefix of ≥ 3 characters: A's warm copy answers to these too.
        let index: serde_json::Value = serde_json::from_slice(&std::fs::read(
            tmp.path().join("snapshot/db/snapshots.json"),
        )?)?;
        let snap_id = index["snapshots"][&vm_hib]["id"]
            .as_str()
            .ok_or("A's local snapshot id")?
            .to_owned();
        let prefix = &snap_id[..6];
        agent.sim.clear_calls();

        // Tenant B: clone images naming A's snapshots.
        let fork_a = fork_snapshot_name(&vm_a);
        let hib_tagged = format!("{vm_hib}:hibernate");
        let hib_latest = format!("{vm_hib}:latest");
        let refused: [(&str, &str); 4] = [
            ("fork", fork_a.as_str()),
            ("warm", vm_hib.as_str()),
            ("tag", hib_tagged.as_str()),
            ("routine", hib_latest.as_str()),
        ];
        for (name, image) in refused {
            api_b
                .create(
                    &PostParams::default(),
                    &vm_pod(
                        &ns_b,
                        name,
                        &node,
                        &[(ann::MODE, "clone"), (ann::IMAGE, image)],
                    ),
                )
                .await?;
        }
        // An image that is an id prefix of A's snapshot (and one that is its full id).
        for (name, image) in [("prefix", prefix), ("id", snap_id.as_str())] {
            api_b
                .create(
                    &PostParams::default(),
                    &vm_pod(
                        &ns_b,
                        name,
                        &node,
                        &[(ann::MODE, "clone"), (ann::IMAGE, image)],
                    ),
                )
                .await?;
        }
        for (name, image) in refused {
            let msg = wait_refused(&client, &ns_b, name, "create").await?;
            assert!(
                msg.starts_with(&format!("annotation cocoonset.cocoonstack.io/image: image {image:?} names a")),
                "{name}: {msg}"
            );
        }
        for name in ["prefix", "id"] {
            // Looked up by its exact clone-base name (`<image>:latest`), which nothing has;
            // the registry has no such repository either.
            let msg = wait_failed(&client, &ns_b, name).await?;
            assert!(msg.starts_with("ensure snapshot "), "{name}: {msg}");
            let p = api_b.get(name).await?;
            assert_eq!(ann_of(&p, ann::VM_ID), None, "{name}: no VM");
        }
        for verb in [Verb::Clone, Verb::Run, Verb::SnapshotSave, Verb::Remove, Verb::Stop] {
            assert_eq!(agent.sim.call_count(verb), 0, "{verb:?}: {:?}", agent.sim.calls());
        }
        assert!(
            agent
                .sim
                .calls_of(Verb::SnapshotRemove)
                .iter()
                .all(|c| !format!("{c:?}").contains(&vm_hib)),
            "nothing of A's removed"
        );
        assert!(agent.sim.snapshot_dir(&vm_hib).is_some(), "A's warm copy kept");
        assert!(agent.sim.snapshot_dir(&fork_a).is_some(), "A's fork baseline kept");
        assert_eq!(
            reg.snapshot_info(&vm_hib, "hibernate")
                .await?
                .map(|i| i.snapshot_id),
            Some(hib_info.snapshot_id.clone()),
            "A's tag untouched"
        );

        // A restore from an artifact recorded for another owner is refused: B's pod `twin`
        // finds, under its own VM name, a `:hibernate` that records A's pod (the 24-bit
        // collision case, staged by pushing it there).
        let vm_twin = vm_name_for_pod(&ns_b, "twin");
        push_golden_tags(
            env,
            &vm_twin,
            &["hibernate"],
            &[(ANNOTATION_OWNER_NAMESPACE, &ns_a), (ANNOTATION_OWNER_POD, "hib")],
        )
        .await?;
        api_b
            .create(
                &PostParams::default(),
                &vm_pod(&ns_b, "twin", &node, &[(ann::RESTORE_FROM_HIBERNATE, "true")]),
            )
            .await?;
        let msg = wait_failed(&client, &ns_b, "twin").await?;
        assert!(
            msg.contains(&format!(
                "snapshot {vm_twin}:hibernate belongs to {ns_a}/hib (manifest annotation cocoonstack.snapshot.owner-namespace), not to pod {ns_b}/twin"
            )),
            "{msg}"
        );
        assert!(
            agent
                .sim
                .calls_of(Verb::SnapshotImport)
                .iter()
                .all(|c| !c.targets.iter().any(|t| t.contains(&vm_twin))),
            "nothing pulled for the twin: {:?}",
            agent.sim.calls_of(Verb::SnapshotImport)
        );

        // A VM snapshot copied under a plain repository name (say, with a registry tool that
        // keeps manifest annotations) is never a clone base, for another namespace or for its
        // own: a clone base on the host is one copy shared by every namespace naming the image,
        // so B could otherwise reuse what A pulled.
        let copied = unique_name("copied-base");
        push_golden_tags(
            env,
            &copied,
            &["v1"],
            &[(ANNOTATION_OWNER_NAMESPACE, &ns_a), (ANNOTATION_OWNER_POD, "hib")],
        )
        .await?;
        let copied_ref = format!("{copied}:v1");
        let clone_of_copy = |ns: &str| {
            vm_pod(
                ns,
                "copy",
                &node,
                &[(ann::MODE, "clone"), (ann::IMAGE, copied_ref.as_str())],
            )
        };
        api_a
            .create(&PostParams::default(), &clone_of_copy(&ns_a))
            .await?;
        api_b
            .create(&PostParams::default(), &clone_of_copy(&ns_b))
            .await?;
        for ns in [&ns_a, &ns_b] {
            let msg = wait_failed(&client, ns, "copy").await?;
            assert!(
                msg.contains(&format!(
                    "image {copied}:v1: the artifact is the VM snapshot of {ns_a}/hib"
                )),
                "{ns}: {msg}"
            );
        }
        assert!(
            agent.sim.snapshot_dir(&clone_base_snapshot_name(&copied, "v1")).is_none(),
            "the owned artifact was never imported as a clone base"
        );

        // A's own paths still work: the wake gets its own state.
        wake_pod(&client, &ns_a, "hib", 3).await?;
        assert_eq!(agent.sim.guest_token(&vm_hib)?, token_hib, "A's wake");
        assert_eq!(agent.sim.guest_token(&vm_a)?, token_a, "A's main");

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Item 2: the unmanaged → managed flip, pre-assigned ids that alias a runtime VM, and
/// the managed → unmanaged flip before a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn managed_and_pre_assigned_ids_are_fixed_at_admission() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, _, api_b) = two_tenants(&client, "tf-a", "tf-b").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());
        run_pod(&client, &ns_a, "main", &node, &[]).await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let id_a = agent.sim.vm_info(&vm_a)?.id;
        let token_a = agent.sim.guest_token(&vm_a)?;
        agent.sim.clear_calls();

        let unmanaged = |name: &str, id: &str| {
            vm_pod(
                &ns_b,
                name,
                &node,
                &[
                    (ann::MANAGED, "false"),
                    (ann::VM_ID, id),
                    (ann::VM_IP, "10.250.0.9"),
                ],
            )
        };
        // Pre-assigned ids that alias A's VM: its exact id, and its name (refused by the
        // VM-name form alone, issue 35 item 1).
        let aliases = [
            ("by-id", id_a.as_str(), "is the id of a VM on this node"),
            ("by-name", vm_a.as_str(), "has the form of a VM name"),
        ];
        for (name, id, _) in aliases {
            api_b.create(&PostParams::default(), &unmanaged(name, id)).await?;
        }
        for (name, id, why) in aliases {
            let msg = wait_refused(&client, &ns_b, name, "create").await?;
            assert!(
                msg.starts_with(&format!("annotation vm.cocoonstack.io/id: {id:?} {why}")),
                "{name}: {msg}"
            );
        }
        // An id prefix is only a label (no runtime verb ever receives a synthetic record's
        // id), and refusing it would tell B which ids exist: admitted (issue 35 item 1).
        let prefix = &id_a[..5];
        let by_prefix = vm_pod(
            &ns_b,
            "by-prefix",
            &node,
            &[
                (ann::MANAGED, "false"),
                (ann::VM_ID, prefix),
                (ann::VM_IP, "10.250.0.19"),
            ],
        );
        api_b.create(&PostParams::default(), &by_prefix).await?;
        wait_running(&client, &ns_b, "by-prefix").await?;

        // An unmanaged pod with an id the runtime does not know is tracked (synthetic)...
        api_b
            .create(&PostParams::default(), &unmanaged("flip", "ext-static-1"))
            .await?;
        let key = format!("{ns_b}/flip");
        let h = agent.handler.clone();
        wait_until("flip tracked", WAIT, || {
            let h = h.clone();
            let key = key.clone();
            async move { h.tracked_vm(&key).filter(|v| v.synthetic).map(|_| ()) }
        })
        .await?;
        // ...then points its id at A's VM and flips to managed + hibernate.
        patch_ann(
            &client,
            &ns_b,
            "flip",
            json!({
                ann::VM_ID: id_a,
                ann::MANAGED: "true",
                ann::HIBERNATE: "true",
                ann::GENERATION: "2",
            }),
        )
        .await?;
        let msg = wait_refused(&client, &ns_b, "flip", "update").await?;
        assert_eq!(
            msg,
            "annotation cocoonset.cocoonstack.io/managed: changed from false to true after the pod was tracked; managed is fixed at create"
        );
        // Only the id changed: refused as well.
        patch_ann(
            &client,
            &ns_b,
            "flip",
            json!({ann::MANAGED: "false", ann::GENERATION: "3"}),
        )
        .await?;
        wait_until("id change refused", WAIT, || {
            let api = api_b.clone();
            async move {
                let p = api.get("flip").await.ok()?;
                Lifecycle::from_meta(&p.metadata)
                    .message
                    .starts_with("annotation vm.cocoonstack.io/id: changed from \"ext-static-1\"")
                    .then_some(())
            }
        })
        .await?;
        for verb in [Verb::SnapshotSave, Verb::Remove, Verb::Stop, Verb::Clone, Verb::Run] {
            assert_eq!(agent.sim.call_count(verb), 0, "{verb:?}: {:?}", agent.sim.calls());
        }
        assert!(agent.sim.vm_info(&vm_a)?.alive, "A's VM still runs");
        assert_eq!(agent.sim.guest_token(&vm_a)?, token_a);
        assert!(
            !reg.has_manifest(&vm_name_for_pod(&ns_b, "flip"), "hibernate").await?,
            "nothing pushed as B's hibernation"
        );
        // Deleting the flipped pod never touches the VM its id names.
        api_b.delete("flip", &DeleteParams::default()).await?;
        wait_gone(&client, &ns_b, "flip").await?;
        assert!(agent.sim.vm_info(&vm_a)?.alive, "A's VM survives B's delete");
        assert_eq!(agent.sim.call_count(Verb::Remove), 0);

        // The reverse flip: a managed pod turned unmanaged, then deleted, does not leak its VM.
        run_pod(&client, &ns_b, "rev", &node, &[]).await?;
        let vm_rev = vm_name_for_pod(&ns_b, "rev");
        assert!(agent.sim.vm_info(&vm_rev)?.alive);
        patch_ann(&client, &ns_b, "rev", json!({ann::MANAGED: "false"})).await?;
        wait_refused(&client, &ns_b, "rev", "update").await?;
        api_b.delete("rev", &DeleteParams::default()).await?;
        wait_gone(&client, &ns_b, "rev").await?;
        assert!(
            agent.sim.vm_info(&vm_rev).is_err(),
            "the flipped pod's VM was removed with it"
        );

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Item 4: a pod that is being refused never holds the VM name it names. The victim's VM is
/// here but held by no pod (an orphan kept for adoption); B names it with one pod while a
/// second pod forks from it, several rounds at once. Every fork is refused, and A's own pod
/// then adopts its VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_pod_is_never_a_holder() {
    run_test(|env| async move {
        let client = env.client()?;
        let (ns_a, ns_b, api_a, api_b) = two_tenants(&client, "th-a", "th-b").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let vm_a = vm_name_for_pod(&ns_a, "main");
        let orphan = vm_a.clone();
        let agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            tmp.path(),
            AgentOptions {
                orphan_policy: OrphanPolicy::Keep,
                ..AgentOptions::new(tmp.path())
            },
            move |sim| {
                sim.create_vm(OutOfBandVm {
                    name: orphan,
                    ..OutOfBandVm::default()
                })?;
                Ok(())
            },
        )
        .await?;
        let id_a = agent.sim.vm_info(&vm_a)?.id;
        const ROUNDS: usize = 6;
        for i in 0..ROUNDS {
            let thief = vm_pod(&ns_b, &format!("thief-{i}"), &node, &[(ann::VM_NAME, &vm_a)]);
            let fork = vm_pod(
                &ns_b,
                &format!("fork-{i}"),
                &node,
                &[(ann::FORK_FROM, vm_a.as_str()), (ann::MODE, "clone")],
            );
            let pp = PostParams::default();
            let (a, b) = tokio::join!(api_b.create(&pp, &thief), api_b.create(&pp, &fork));
            a?;
            b?;
        }
        for i in 0..ROUNDS {
            let msg = wait_refused(&client, &ns_b, &format!("fork-{i}"), "create").await?;
            assert_eq!(
                msg,
                format!(
                    "annotation vm.cocoonstack.io/fork-from: VM {vm_a:?} does not belong to namespace {ns_b:?}"
                ),
                "fork-{i}"
            );
            wait_refused(&client, &ns_b, &format!("thief-{i}"), "create").await?;
        }
        assert_eq!(agent.sim.call_count(Verb::SnapshotSave), 0, "no fork baseline saved");
        assert_eq!(agent.sim.call_count(Verb::Clone), 0, "nothing forked");
        assert!(agent.sim.snapshot_dir(&fork_snapshot_name(&vm_a)).is_none());

        // The victim's own pod is not refused: it adopts its VM.
        api_a
            .create(&PostParams::default(), &vm_pod(&ns_a, "main", &node, &[]))
            .await?;
        let p = common::wait_running_with(&client, &ns_a, "main", false).await?;
        assert_eq!(ann_of(&p, ann::VM_ID), Some(id_a), "A adopted its own VM");

        kill_and_delete(&client, agent, &[&ns_a, &ns_b]).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Item 10: the mixed-fleet opt-in. Without `VK_ACCEPT_LEGACY_VM_NAMES` a legacy-named pod is
/// refused; with it the pod runs through create, hibernate and wake. The spec's own
/// `clone-from-dir` validation speaks before the root check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_vm_names_run_only_with_the_opt_in() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "tl").await?;
        let tmp = tempfile::tempdir()?;
        let (strict, mixed) = (unique_name("node"), unique_name("node"));
        let _n1 = TestNode::in_pool(&client, &strict, "default").await?;
        let _n2 = TestNode::in_pool(&client, &mixed, "default").await?;
        let strict_agent = start_agent(env, &strict, &tmp.path().join("strict")).await?;
        let root = tmp.path().join("mixed");
        let mixed_agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &mixed,
            &root,
            AgentOptions {
                tenant: TenantConfig {
                    accept_legacy_vm_names: true,
                    ..TenantConfig::default()
                },
                ..AgentOptions::new(&root)
            },
            |_| Ok(()),
        )
        .await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry(env.registry_addr());

        // Refused without the opt-in.
        let legacy_old = format!("vk-{ns}-old");
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "old", &strict, &[(ann::VM_NAME, legacy_old.as_str())]),
        )
        .await?;
        let msg = wait_refused(&client, &ns, "old", "create").await?;
        assert!(msg.contains("has the legacy unhashed form"), "{msg}");
        assert_eq!(strict_agent.sim.call_count(Verb::Run), 0);

        // With it: create, hibernate (pushed under the legacy name), wake with its state.
        let legacy = format!("vk-{ns}-leg");
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "leg", &mixed, &[(ann::VM_NAME, legacy.as_str())]),
        )
        .await?;
        wait_running(&client, &ns, "leg").await?;
        let token = mixed_agent.sim.guest_token(&legacy)?;
        hibernate_pod(&client, &ns, "leg", 2).await?;
        assert!(reg.has_manifest(&legacy, "hibernate").await?, "pushed");
        assert!(mixed_agent.sim.vm_info(&legacy).is_err(), "VM removed");
        wake_pod(&client, &ns, "leg", 3).await?;
        assert_eq!(
            mixed_agent.sim.guest_token(&legacy)?,
            token,
            "woken with its state"
        );

        // `clone-from-dir` with mode run: the spec's message, not the root check's.
        api.create(
            &PostParams::default(),
            &vm_pod(&ns, "dir", &strict, &[(ann::CLONE_FROM_DIR, "/srv/snap")]),
        )
        .await?;
        let msg = wait_failed(&client, &ns, "dir").await?;
        assert_eq!(
            msg,
            "annotation vm.cocoonstack.io/clone-from-dir is incompatible with mode=run"
        );

        strict_agent.kill().await;
        mixed_agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Item 8: cycling clone-image tags leaves at most `VK_CLONE_BASE_KEEP` unused clone bases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unused_clone_bases_are_collected_beyond_the_limit() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "tg").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let root = tmp.path().join(&node);
        let agent = start_agent_with(
            env.client()?,
            env.registry_addr(),
            &node,
            &root,
            AgentOptions {
                tenant: TenantConfig {
                    clone_base_keep: 1,
                    ..TenantConfig::default()
                },
                ..AgentOptions::new(&root)
            },
            |_| Ok(()),
        )
        .await?;
        let repo = unique_name("base");
        push_golden_tags(env, &repo, &["v1", "v2", "v3"], &[]).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let base = |tag: &str| clone_base_snapshot_name(&repo, tag);
        for (i, tag) in ["v1", "v2", "v3"].into_iter().enumerate() {
            let name = format!("c{i}");
            let image = format!("{repo}:{tag}");
            api.create(
                &PostParams::default(),
                &vm_pod(
                    &ns,
                    &name,
                    &node,
                    &[(ann::MODE, "clone"), (ann::IMAGE, image.as_str())],
                ),
            )
            .await?;
            wait_running(&client, &ns, &name).await?;
            assert!(agent.sim.snapshot_dir(&base(tag)).is_some(), "{tag} pulled");
            if tag != "v3" {
                api.delete(&name, &DeleteParams::default()).await?;
                wait_gone(&client, &ns, &name).await?;
            }
        }
        // v3 is in use, v2 is the one unused base kept, v1 went.
        assert!(agent.sim.snapshot_dir(&base("v3")).is_some(), "in use");
        assert!(
            agent.sim.snapshot_dir(&base("v2")).is_some(),
            "kept (limit 1)"
        );
        assert!(agent.sim.snapshot_dir(&base("v1")).is_none(), "collected");

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
