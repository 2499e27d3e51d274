//! Issue 35 item 2, the node agent's side, on the real control plane and the real registry
//! with an in-process agent on the simulator: nothing is destroyed or overwritten on a name
//! alone.
//!
//! * every snapshot the agent pushes records its namespace's UID, and a namespace deleted and
//!   re-created under the same name cannot restore the old one's snapshot;
//! * a hibernate never replaces a `:hibernate` that records another owner (a VM name that
//!   collides with another namespace's): the hibernate fails with the reason, the VM keeps
//!   running, the tag keeps its digest, and a `ForeignSnapshotIgnored` Warning names both;
//! * a pod whose VM name collides with a suspended pod's of another namespace never drops that
//!   pod's local warm-wake copy when it is deleted (its create fails on the foreign
//!   `:hibernate`, so its delete plans the drop of the local snapshots of its VM name): the
//!   copy and the tag stay, a `ForeignSnapshotIgnored` Warning names both, and the suspended
//!   pod wakes with its state.

mod common;

use std::collections::HashMap;

use common::{
    BoxError, WAIT, ann_of, golden_host, hibernate_pod, node_agent, patch_ann, push_golden,
    registry, run_pod, vm_pod, wait_failed, wait_gone, wait_lifecycle, wait_running,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::oci::{
    ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_NAMESPACE_UID, ANNOTATION_OWNER_POD,
};
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::{MAX_NAME_LEN, vm_name_for_pod};
use cocoon_registry::Reference;
use cocoon_testenv::{create_namespace, delete_namespace, ensure_namespace, run_test, wait_until};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

async fn namespace_uid(client: &Client, ns: &str) -> Result<String, BoxError> {
    Ok(Api::<Namespace>::all(client.clone())
        .get(ns)
        .await?
        .metadata
        .uid
        .ok_or("namespace uid")?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_namespace_cannot_restore_the_old_ones_snapshot() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "reborn").await?;
        let old_uid = namespace_uid(&client, &ns).await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, _agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());

        // The old namespace's pod hibernates: its snapshot records the namespace's UID.
        run_pod(&client, &ns, "hib", &node, &[]).await?;
        let vm = vm_name_for_pod(&ns, "hib");
        hibernate_pod(&client, &ns, "hib", 2).await?;
        let a = reg.manifest_annotations(&vm, "hibernate").await?;
        assert_eq!(a.get(ANNOTATION_OWNER_NAMESPACE), Some(&ns));
        assert_eq!(a.get(ANNOTATION_OWNER_POD).map(String::as_str), Some("hib"));
        assert_eq!(a.get(ANNOTATION_OWNER_NAMESPACE_UID), Some(&old_uid));

        // The namespace goes; its snapshot stays in the registry.
        delete_namespace(&client, &ns).await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        wait_until("the old namespace is gone", WAIT, || async {
            namespaces.get_opt(&ns).await.ok()?.is_none().then_some(())
        })
        .await?;
        assert!(reg.has_manifest(&vm, "hibernate").await?, "the tag outlives it");

        // Someone else creates a namespace of the same name and a pod of the same name that
        // asks to restore: refused, the old snapshot is not theirs.
        ensure_namespace(&client, &ns).await?;
        let new_uid = namespace_uid(&client, &ns).await?;
        assert_ne!(new_uid, old_uid);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        pods.create(
            &PostParams::default(),
            &vm_pod(&ns, "hib", &node, &[(ann::RESTORE_FROM_HIBERNATE, "true")]),
        )
        .await?;
        let msg = wait_failed(&client, &ns, "hib").await?;
        assert!(
            msg.contains(&format!(
                "snapshot {vm}:hibernate belongs to {ns}/hib of namespace uid {old_uid} (the namespace now has uid {new_uid})"
            )),
            "{msg}"
        );
        let p = pods.get("hib").await?;
        assert_eq!(ann_of(&p, ann::VM_ID), None, "no VM came up: {p:?}");
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hibernate_never_replaces_another_owners_tag() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "own-push").await?;
        let victim = create_namespace(&client, "own-victim").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());

        // The tenant's pod runs; then the victim's snapshot appears under the same VM name
        // (the 24-bit collision case, staged by pushing it there).
        run_pod(&client, &ns, "twin", &node, &[]).await?;
        let vm = vm_name_for_pod(&ns, "twin");
        let token = agent.sim.guest_token(&vm)?;
        let golden = golden_host().await?;
        push_golden(
            env,
            &golden,
            &vm,
            "hibernate",
            &[
                (ANNOTATION_OWNER_NAMESPACE, &victim),
                (ANNOTATION_OWNER_POD, "sleeper"),
            ],
        )
        .await?;
        let digest = |reg: cocoon_registry::RegistryClient, vm: String| async move {
            reg.head_manifest(&vm, &Reference::parse("hibernate")?)
                .await?
                .and_then(|h| h.digest)
                .map(|d| d.to_string())
                .ok_or_else(|| BoxError::from("the victim's tag"))
        };
        let before = digest(reg.clone(), vm.clone()).await?;

        // The tenant hibernates: the push is refused, the VM keeps running.
        common::patch_ann(
            &client,
            &ns,
            "twin",
            serde_json::json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
        )
        .await?;
        let p = wait_lifecycle(&client, &ns, "twin", LifecycleState::Failed, 2).await?;
        let msg = Lifecycle::from_meta(&p.metadata).message;
        assert!(
            msg.contains(&format!("belongs to pod {victim}/sleeper")),
            "the hibernate fails with the reason: {msg}"
        );
        assert_eq!(
            digest(reg.clone(), vm.clone()).await?,
            before,
            "the victim's tag is not replaced"
        );
        assert_eq!(agent.sim.guest_token(&vm)?, token, "the VM still runs");
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let note = wait_until(
            "a ForeignSnapshotIgnored Warning naming both",
            WAIT,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find_map(|e| {
                    (e.reason.as_deref() == Some("ForeignSnapshotIgnored")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("twin"))
                    .then_some(e.note)
                    .flatten()
                })
            },
        )
        .await?;
        assert!(
            note.contains(&format!("pod {victim}/sleeper"))
                && note.contains(&format!("pod {ns}/twin")),
            "{note}"
        );
        for n in [&ns, &victim] {
            delete_namespace(&client, n).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The last 26 characters both pod names share (the kept tail of a shortened VM name).
const TAIL: &str = "lytics-warehouse-primary-0";

/// A colliding pair of pod names for namespaces `victim_ns` and `tenant_ns` (which share their
/// first 26 characters): `(vm, v<i>-<TAIL>, a<j>-<TAIL>)`, found by a birthday search over the
/// 6-hex hash that alone tells the two shortened VM names apart.
fn colliding_pods(victim_ns: &str, tenant_ns: &str) -> Option<(String, String, String)> {
    let victims: HashMap<String, String> = (0..16_384u32)
        .map(|i| {
            let pod = format!("v{i:x}-{TAIL}");
            (vm_name_for_pod(victim_ns, &pod), pod)
        })
        .collect();
    (0..1_048_576u32).find_map(|j| {
        let pod = format!("a{j:x}-{TAIL}");
        let vm = vm_name_for_pod(tenant_ns, &pod);
        victims.get(&vm).map(|v| (vm.clone(), v.clone(), pod))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_colliding_pods_delete_never_drops_another_owners_local_copy() {
    run_test(|env| async move {
        let client = env.client()?;
        // 26 shared characters: the kept head of both VM names.
        let victim = create_namespace(&client, "owner-drop-local-namespace-v").await?;
        let tenant = create_namespace(&client, "owner-drop-local-namespace-a").await?;
        let (vm, victim_pod, tenant_pod) =
            colliding_pods(&victim, &tenant).ok_or("no colliding pair found")?;
        assert_eq!(vm.len(), MAX_NAME_LEN, "a shortened name: {vm}");
        assert_eq!(
            vm,
            vm_name_for_pod(&tenant, &tenant_pod),
            "the pair collides"
        );
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, agent) = node_agent(env, &client, tmp.path()).await?;
        let reg = registry(env.registry_addr());

        // 1. The victim's pod runs and hibernates: `:hibernate` records it, and the local copy
        // stays on the node.
        run_pod(&client, &victim, &victim_pod, &node, &[]).await?;
        let token = agent.sim.guest_token(&vm)?;
        hibernate_pod(&client, &victim, &victim_pod, 2).await?;
        let a = reg.manifest_annotations(&vm, "hibernate").await?;
        assert_eq!(a.get(ANNOTATION_OWNER_NAMESPACE), Some(&victim));
        assert_eq!(a.get(ANNOTATION_OWNER_POD), Some(&victim_pod));
        let digest = |reg: cocoon_registry::RegistryClient, vm: String| async move {
            reg.head_manifest(&vm, &Reference::parse("hibernate")?)
                .await?
                .and_then(|h| h.digest)
                .map(|d| d.to_string())
                .ok_or_else(|| BoxError::from("the victim's tag"))
        };
        let before = digest(reg.clone(), vm.clone()).await?;
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "the local copy after the hibernate"
        );

        // The seat release of a suspended set: the pod is flagged keep-snapshot-on-delete and
        // deleted; its local warm-wake copy stays.
        patch_ann(
            &client,
            &victim,
            &victim_pod,
            serde_json::json!({ann::KEEP_SNAPSHOT_ON_DELETE: "true"}),
        )
        .await?;
        let key = format!("{victim}/{victim_pod}");
        wait_until("the keep flag seen", WAIT, || async {
            agent
                .handler
                .tracked_pod(&key)
                .and_then(|p| ann_of(&p, ann::KEEP_SNAPSHOT_ON_DELETE))
        })
        .await?;
        let victims: Api<Pod> = Api::namespaced(client.clone(), &victim);
        victims
            .delete(&victim_pod, &DeleteParams::default())
            .await?;
        wait_gone(&client, &victim, &victim_pod).await?;
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "kept on the seat release"
        );

        // 2. The tenant's pod with the colliding VM name is admitted (no live holder); its
        // bring-up reads the `:hibernate` evidence, which records the victim, and fails closed
        // (no VM). Its delete then plans the drop of the local snapshots of that VM name (the
        // name is its own and no other pod holds it).
        let tenants: Api<Pod> = Api::namespaced(client.clone(), &tenant);
        tenants
            .create(
                &PostParams::default(),
                &vm_pod(&tenant, &tenant_pod, &node, &[]),
            )
            .await?;
        let msg = wait_failed(&client, &tenant, &tenant_pod).await?;
        assert!(
            msg.contains(&format!("belongs to {victim}/{victim_pod}")),
            "the evidence read refuses the victim's tag: {msg}"
        );
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "the failed create kept it"
        );
        tenants
            .delete(&tenant_pod, &DeleteParams::default())
            .await?;
        wait_gone(&client, &tenant, &tenant_pod).await?;

        // 3. The victim's local copy and tag stay (the delete is done once the pod is gone);
        // the Warning names both.
        assert!(
            agent.sim.snapshot_dir(&vm).is_some(),
            "the victim's local copy survives the colliding pod's delete"
        );
        assert_eq!(
            digest(reg.clone(), vm.clone()).await?,
            before,
            "the victim's tag keeps its digest"
        );
        let events: Api<Event> = Api::namespaced(client.clone(), &tenant);
        let note = wait_until(
            "a ForeignSnapshotIgnored Warning naming both",
            WAIT,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find_map(|e| {
                    (e.reason.as_deref() == Some("ForeignSnapshotIgnored")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(tenant_pod.as_str()))
                    .then_some(e.note)
                    .flatten()
                })
            },
        )
        .await?;
        assert!(
            note.contains(&format!("pod {victim}/{victim_pod}"))
                && note.contains(&format!("pod {tenant}/{tenant_pod}")),
            "{note}"
        );

        // The victim wakes (its pod recreated, restore-marked) with its state.
        victims
            .create(
                &PostParams::default(),
                &vm_pod(
                    &victim,
                    &victim_pod,
                    &node,
                    &[(ann::RESTORE_FROM_HIBERNATE, "true")],
                ),
            )
            .await?;
        wait_running(&client, &victim, &victim_pod).await?;
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            token,
            "the victim's state is back"
        );

        for n in [&tenant, &victim] {
            delete_namespace(&client, n).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}
