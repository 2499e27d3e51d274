//! Issue 35 item 2, the node agent's side, on the real control plane and the real registry
//! with an in-process agent on the simulator: nothing is destroyed or overwritten on a name
//! alone.
//!
//! * every snapshot the agent pushes records its namespace's UID, and a namespace deleted and
//!   re-created under the same name cannot restore the old one's snapshot;
//! * a hibernate never replaces a `:hibernate` that records another owner (a VM name that
//!   collides with another namespace's): the hibernate fails with the reason, the VM keeps
//!   running, the tag keeps its digest, and a `ForeignSnapshotIgnored` Warning names both.

mod common;

use common::{
    BoxError, WAIT, ann_of, golden_host, hibernate_pod, node_agent, push_golden, registry, run_pod,
    vm_pod, wait_failed, wait_lifecycle,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::oci::{
    ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_NAMESPACE_UID, ANNOTATION_OWNER_POD,
};
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::Reference;
use cocoon_testenv::{create_namespace, delete_namespace, ensure_namespace, run_test, wait_until};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

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
