//! CreatePod bring-up paths that depend on evidence rather than on the pod's own markers, on
//! the real control plane and the real registry with in-process agents on the simulator:
//! the derived restore from a `:hibernate` tag (node spec §6.3), its image-identity guard,
//! and the startup orphan policy (§9.1 step 7).

mod common;

use common::{
    BoxError, IMAGE, TestAgent, WAIT, ann_of, is_ready, patch_ann, registry, start_agent,
    start_agent_prepared, vm_pod, wait_gone, wait_running, wait_running_with,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::pods::OrphanPolicy;
use cocoon_registry::RegistryClient;
use cocoon_runtime::sim::{OutOfBandVm, Verb};
use cocoon_testenv::{create_namespace, delete_namespace, run_test, unique_name, wait_until};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

/// Waits for an Event with `reason` about exactly this pod incarnation (by UID).
async fn wait_event(client: &Client, pod: &Pod, reason: &str) -> Result<Event, BoxError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    Ok(wait_until(&format!("event {reason} on {uid}"), WAIT, || {
        let api = api.clone();
        let uid = uid.clone();
        async move {
            let list = api.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })
        }
    })
    .await?)
}

/// Runs pod `name` on `agent`, hibernates it (tag pushed, VM removed), then deletes the pod
/// object without `keep-snapshot-on-delete`: the node forgets it and drops its local copy,
/// so only the registry tag remains as evidence. Returns the guest state token.
async fn hibernate_and_forget(
    client: &Client,
    reg: &RegistryClient,
    agent: &TestAgent,
    ns: &str,
    node: &str,
    name: &str,
) -> Result<String, BoxError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let vm = vm_name_for_pod(ns, name);
    api.create(&PostParams::default(), &vm_pod(ns, name, node, &[]))
        .await?;
    wait_running(client, ns, name).await?;
    let token = agent.sim.guest_token(&vm)?;
    patch_ann(
        client,
        ns,
        name,
        json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
    )
    .await?;
    wait_until(&format!("{ns}/{name} hibernated"), WAIT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let lc = Lifecycle::from_meta(&p.metadata);
            (lc.state == Some(LifecycleState::Hibernated) && lc.observed_generation >= 2)
                .then_some(())
        }
    })
    .await?;
    assert!(reg.has_manifest(&vm, "hibernate").await?, "tag pushed");
    assert!(agent.sim.vm_info(&vm).is_err(), "hibernate removed the VM");
    api.delete(name, &DeleteParams::default()).await?;
    wait_gone(client, ns, name).await?;
    assert!(
        reg.has_manifest(&vm, "hibernate").await?,
        "deleting a hibernated pod keeps the registry tag"
    );
    assert!(
        agent.sim.snapshot_dir(&vm).is_none(),
        "without keep-snapshot-on-delete the local copy is dropped"
    );
    Ok(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recreated_pod_restores_from_hibernate_evidence() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-derived").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, tmp.path()).await?;
        let reg = registry(env.registry_addr());
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let vm = vm_name_for_pod(&ns, "d");
        let token = hibernate_and_forget(&client, &reg, &agent, &ns, &node, "d").await?;

        // Recreated with the same name and image, mode=run, and no restore marker.
        agent.sim.clear_calls();
        api.create(&PostParams::default(), &vm_pod(&ns, "d", &node, &[]))
            .await?;
        let p = wait_running(&client, &ns, "d").await?;
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            token,
            "the derived restore keeps the hibernated guest state"
        );
        assert_eq!(
            agent.sim.call_count(Verb::Run),
            0,
            "no fresh boot, even with mode=run"
        );
        assert!(
            agent.sim.call_count(Verb::Clone) >= 1,
            "cloned from the tag"
        );
        assert!(
            agent.sim.call_count(Verb::SnapshotImport) >= 1,
            "the only copy was in the registry"
        );
        assert_eq!(
            ann_of(&p, ann::RESTORE_FROM_HIBERNATE),
            None,
            "the derived marker is never patched onto the pod"
        );
        let ev = wait_event(&client, &p, "HibernateSnapshotExists").await?;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(
            ev.note.as_deref(),
            Some(
                format!("restoring vm {vm} from its hibernate snapshot instead of fresh-booting")
                    .as_str()
            )
        );
        assert_eq!(
            agent.metric(r#"cocoon_vk_hibernate_evidence_total{verdict="restored"}"#),
            1.0,
            "one restored verdict"
        );

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hibernate_evidence_from_another_image_refuses_the_pod() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-guard").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        // A Node object must exist, or the pod garbage collector deletes pods bound to it.
        let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
        let agent = start_agent(env, &node, tmp.path()).await?;
        let reg = registry(env.registry_addr());
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let vm = vm_name_for_pod(&ns, "g");
        hibernate_and_forget(&client, &reg, &agent, &ns, &node, "g").await?;

        agent.sim.clear_calls();
        let other = "ubuntu-test:2";
        let p = api
            .create(
                &PostParams::default(),
                &vm_pod(&ns, "g", &node, &[(ann::IMAGE, other)]),
            )
            .await?;
        let want = format!(
            "hibernate snapshot of vm {vm} came from image \"{IMAGE}\" but the pod requests \"{other}\"; delete the hibernate tag to discard the hibernated state"
        );
        let ev = wait_event(&client, &p, "HibernateEvidenceFailed").await?;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.note, Some(format!("create: {want}")));
        // CreatePod is retried, so the lifecycle alternates creating/failed; wait for failed.
        let failed = wait_until("lifecycle failed with the guard's message", WAIT, || {
            let api = api.clone();
            async move {
                let p = api.get("g").await.ok()?;
                let lc = Lifecycle::from_meta(&p.metadata);
                (lc.state == Some(LifecycleState::Failed)).then_some((p, lc))
            }
        })
        .await?;
        assert_eq!(failed.1.message, want, "lifecycle message is the error text");
        assert!(!is_ready(&failed.0), "a refused pod is not Ready");
        assert_eq!(ann_of(&failed.0, ann::VM_ID), None, "no VM annotated");
        assert!(agent.sim.vm_info(&vm).is_err(), "no VM brought up");
        assert_eq!(agent.sim.call_count(Verb::Run), 0, "no fresh boot");
        assert_eq!(agent.sim.call_count(Verb::Clone), 0, "no restore either");
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the hibernated state is kept until someone deletes the tag"
        );
        assert!(
            agent.metric(r#"cocoon_vk_hibernate_evidence_total{verdict="image_conflict"}"#) >= 1.0,
            "image_conflict verdict counted"
        );
        assert_eq!(
            agent.metric(r#"cocoon_vk_hibernate_evidence_total{verdict="restored"}"#),
            0.0
        );

        agent.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphan_policy_destroys_alerts_or_keeps_out_of_band_vms() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-orphan").await?;
        let tmp = tempfile::tempdir()?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let orphans = "cocoon_vk_orphan_vm_total";
        for (policy, label) in [
            (OrphanPolicy::Destroy, "destroy"),
            (OrphanPolicy::Alert, "alert"),
            (OrphanPolicy::Keep, "keep"),
        ] {
            let node = unique_name("node");
            let _node_obj = cocoon_testenv::TestNode::in_pool(&client, &node, "default").await?;
            // The out-of-band VM carries the name of the pod that later adopts it: a pod may
            // only adopt its own VM (tenant isolation).
            let adopter = format!("adopt-{label}");
            let orphan = vm_name_for_pod(&ns, &adopter);
            let mut orphan_id = String::new();
            let agent = start_agent_prepared(env, &node, &tmp.path().join(label), policy, |sim| {
                orphan_id = sim
                    .create_vm(OutOfBandVm {
                        name: orphan.clone(),
                        ..OutOfBandVm::default()
                    })?
                    .id;
                Ok(())
            })
            .await?;
            // The handler is handed out only after the startup reconcile ran the policy.
            match policy {
                OrphanPolicy::Destroy => {
                    assert!(agent.sim.vm_info(&orphan).is_err(), "destroy removes it");
                    assert_eq!(agent.sim.call_count(Verb::Remove), 1, "{label}");
                    assert_eq!(agent.metric(orphans), 0.0, "destroy does not alert");
                }
                OrphanPolicy::Alert | OrphanPolicy::Keep => {
                    assert_eq!(
                        agent.sim.vm_info(&orphan)?.id,
                        orphan_id,
                        "{label} keeps it"
                    );
                    assert_eq!(agent.sim.call_count(Verb::Remove), 0, "{label}");
                    let want = if policy == OrphanPolicy::Alert {
                        1.0
                    } else {
                        0.0
                    };
                    assert_eq!(agent.metric(orphans), want, "{label} orphan counter");
                    // Indexed by name: a pod for that VM name adopts it instead of colliding.
                    let pod = adopter.clone();
                    api.create(
                        &PostParams::default(),
                        &vm_pod(&ns, &pod, &node, &[(ann::VM_NAME, orphan.as_str())]),
                    )
                    .await?;
                    let p = wait_running_with(&client, &ns, &pod, false).await?;
                    assert_eq!(ann_of(&p, ann::VM_ID), Some(orphan_id.clone()), "{label}");
                    assert_eq!(agent.sim.call_count(Verb::Run), 0, "{label}: adopted");
                    assert_eq!(agent.sim.call_count(Verb::Clone), 0, "{label}: adopted");
                }
            }
            agent.kill().await;
        }
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
