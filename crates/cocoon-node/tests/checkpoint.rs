//! Issue 38, the node agent's side of a checkpoint, on the real control plane and the real
//! registry with an in-process agent on the simulator. The test plays the operator's part of
//! the hand-off (docs/checkpoints.md): it writes the CocoonCheckpoint's status (`Pending`, the
//! node, the pod, the VM, the derived artifact) and the request annotation on the source pod.
//!
//! * a request the CR backs is taken: `Ready` with the numbers, the artifact under the
//!   derived repository and tag records the checkpoint as its owner, the source VM keeps its
//!   id and stays ready, a Normal `SnapshotPushed` names the bytes; with the node's v1 and v2
//!   formats;
//! * a forged request (a repository that is not the derived one; the request copied onto
//!   another pod of the namespace) is refused with a Warning `TenantIsolationRefused` on the
//!   pod, the CR stays `Pending` and nothing is pushed.

mod common;

use common::{AgentOptions, BoxError, WAIT, ann_of, is_running_ready, registry, run_pod};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::checkpoint::{
    CHECKPOINT_TAG, CheckpointRequest, OWNER_POD_PREFIX, REQUEST_ANNOTATION, checkpoint_artifact,
};
use cocoon_api::contract::events::node as ev;
use cocoon_api::contract::oci::{self, ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_POD};
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_registry::Reference;
use cocoon_testenv::{Shared, TestNode, create_namespace, run_test, unique_name, wait_until};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Creates checkpoint `name` of pod `pod` and hands it off as the operator does: status
/// `Pending` naming `node`, the pod, its VM and the derived artifact. Returns the UID.
async fn hand_off(
    client: &Client,
    ns: &str,
    name: &str,
    pod: &str,
    node: &str,
) -> Result<String, BoxError> {
    let api: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let spec = CocoonCheckpointSpec {
        source: CheckpointSource {
            pod_ref: Some(NameRef { name: pod.into() }),
            cocoon_set_ref: None,
        },
    };
    let created = api
        .create(&PostParams::default(), &CocoonCheckpoint::new(name, spec))
        .await?;
    let uid = created.metadata.uid.ok_or("no uid")?;
    let artifact = checkpoint_artifact(ns, name, &uid)?;
    let status = json!({"status": {
        "phase": "Pending", "node": node, "podName": pod, "source": format!("pod/{pod}"),
        "vmName": vm_name_for_pod(ns, pod), "repository": artifact.repository,
        "tag": artifact.tag,
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(uid)
}

/// The request the operator writes for checkpoint `name` (UID `uid`) of pod `pod`.
fn request(ns: &str, name: &str, uid: &str, pod: &str) -> Result<CheckpointRequest, BoxError> {
    let artifact = checkpoint_artifact(ns, name, uid)?;
    Ok(CheckpointRequest {
        name: name.into(),
        uid: uid.into(),
        vm_name: vm_name_for_pod(ns, pod),
        repository: artifact.repository,
        tag: artifact.tag,
    })
}

async fn put_request(
    client: &Client,
    ns: &str,
    pod: &str,
    req: &CheckpointRequest,
) -> Result<(), BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = json!({"metadata": {"annotations": {REQUEST_ANNOTATION: req.to_annotation()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Waits for an Event of `reason` on pod `ns/pod`; returns its note.
async fn wait_event(
    client: &Client,
    ns: &str,
    pod: &str,
    reason: &str,
) -> Result<String, BoxError> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let note = wait_until(&format!("{reason} on {ns}/{pod}"), WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let on_pod = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod);
            (on_pod && e.reason.as_deref() == Some(reason)).then(|| e.note.unwrap_or_default())
        })
    })
    .await?;
    Ok(note)
}

/// One run: an agent with `knobs`, a pod, a checkpoint of it; returns the manifest bytes.
async fn checkpoint_once(env: &Shared, knobs: [u64; 4]) -> Result<Vec<u8>, BoxError> {
    let client = env.client()?;
    let ns = create_namespace(&client, "ckpt").await?;
    let tmp = tempfile::tempdir()?;
    let node = unique_name("node-ckpt");
    let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
    let mut opts = AgentOptions::new(tmp.path());
    opts.snapshot_knobs = knobs;
    if knobs[0] > 0 {
        // A memory image large enough to be encoded (files under 1 MiB stay raw).
        opts.sim.memory_file_size = 6 << 20;
        opts.sim.memory_fill = cocoon_runtime::sim::MemoryFill::Realistic;
    }
    let _agent = common::start_agent_with(
        env.client()?,
        env.registry_addr(),
        &node,
        tmp.path(),
        opts,
        |_| Ok(()),
    )
    .await?;
    let before = run_pod(&client, &ns, "main", &node, &[]).await?;
    let vm_id = ann_of(&before, ann::VM_ID).ok_or("no VM id")?;

    let uid = hand_off(&client, &ns, "snap", "main", &node).await?;
    put_request(&client, &ns, "main", &request(&ns, "snap", &uid, "main")?).await?;
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
    let ready = wait_until("snap Ready", WAIT, || async {
        let c = ckpts.get_opt("snap").await.ok().flatten()?;
        (c.phase() == Some(CheckpointPhase::Ready)).then_some(c)
    })
    .await?;
    let st = ready.status.ok_or("no status")?;
    assert!(st.digest.starts_with("sha256:"), "digest {:?}", st.digest);
    assert!(st.bytes_on_wire > 0 && st.data_bytes > 0, "{st:?}");
    assert!(!st.taken_at.is_empty(), "takenAt");

    // The artifact: under the derived repository and tag, recording the checkpoint as owner.
    let artifact = checkpoint_artifact(&ns, "snap", &uid)?;
    let reg = registry(env.registry_addr());
    let fetched = reg
        .get_manifest(&artifact.repository, &Reference::parse(CHECKPOINT_TAG)?)
        .await?;
    assert_eq!(
        fetched.digest.to_string(),
        st.digest,
        "the status names the tag's digest"
    );
    let owner = reg
        .manifest_annotations(&artifact.repository, CHECKPOINT_TAG)
        .await?;
    assert_eq!(owner.get(ANNOTATION_OWNER_NAMESPACE), Some(&ns));
    assert_eq!(
        owner.get(ANNOTATION_OWNER_POD).map(String::as_str),
        Some(format!("{OWNER_POD_PREFIX}snap").as_str())
    );

    // The source keeps running: same VM id, still ready.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let after = pods.get("main").await?;
    assert_eq!(ann_of(&after, ann::VM_ID), Some(vm_id), "same VM id");
    assert!(is_running_ready(&after), "the source stays ready");
    let note = wait_event(&client, &ns, "main", ev::SNAPSHOT_PUSHED).await?;
    assert!(note.starts_with("pushed "), "{note}");
    Ok(fetched.bytes.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_pod_is_checkpointed_in_v1_and_v2_and_keeps_running() {
    run_test(|env| async move {
        let v1 = checkpoint_once(env, [0; 4]).await?;
        let v1 = String::from_utf8_lossy(&v1).into_owned();
        assert!(v1.contains(oci::ARTIFACT_SNAPSHOT_V1), "{v1}");
        let v2 = checkpoint_once(env, [3, 1, 0, 0]).await?;
        let v2 = String::from_utf8_lossy(&v2).into_owned();
        assert!(v2.contains(oci::ARTIFACT_SNAPSHOT_V2), "{v2}");
        Ok::<(), BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_request_is_refused_and_nothing_is_pushed() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "ckptforge").await?;
        let tmp = tempfile::tempdir()?;
        let (node, _node_obj, _agent) = common::node_agent(env, &client, tmp.path()).await?;
        run_pod(&client, &ns, "main", &node, &[]).await?;
        run_pod(&client, &ns, "decoy", &node, &[]).await?;
        let uid = hand_off(&client, &ns, "snap", "main", &node).await?;
        let honest = request(&ns, "snap", &uid, "main")?;
        let reg = registry(env.registry_addr());

        // A tenant rewrites the request to push into a repository of its choice.
        let mut forged = honest.clone();
        forged.repository = "ckpt-team-b-loot-0123456789ab".into();
        put_request(&client, &ns, "main", &forged).await?;
        let note = wait_event(&client, &ns, "main", ev::TENANT_ISOLATION_REFUSED).await?;
        assert!(note.contains("is not the derived"), "{note}");

        // The honest request copied onto another pod of the namespace.
        put_request(&client, &ns, "decoy", &honest).await?;
        let note = wait_event(&client, &ns, "decoy", ev::TENANT_ISOLATION_REFUSED).await?;
        assert!(note.contains("not the checkpoint's source"), "{note}");

        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        let c = ckpts.get("snap").await?;
        assert_eq!(
            c.phase(),
            Some(CheckpointPhase::Pending),
            "nothing was taken"
        );
        for repo in [forged.repository.as_str(), honest.repository.as_str()] {
            assert!(
                !reg.has_manifest(repo, CHECKPOINT_TAG).await?,
                "nothing pushed to {repo}"
            );
        }
        Ok::<(), BoxError>(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_while_saving_starts_over_after_its_restart() {
    use cocoon_runtime::sim::Verb;
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "ckptfault").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node-ckpt");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let dir = tmp.path().join(&node);
        let agent = common::start_agent(env, &node, &dir).await?;
        let before = run_pod(&client, &ns, "main", &node, &[]).await?;
        let vm_id = ann_of(&before, ann::VM_ID).ok_or("no VM id")?;
        let reg = registry(env.registry_addr());

        // The save hangs; the agent dies with the checkpoint in Saving.
        agent.sim.block(Verb::SnapshotSave, None);
        let uid = hand_off(&client, &ns, "snap", "main", &node).await?;
        put_request(&client, &ns, "main", &request(&ns, "snap", &uid, "main")?).await?;
        assert!(
            agent.sim.wait_blocked(Verb::SnapshotSave, 1, WAIT).await,
            "the save started"
        );
        let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        assert_eq!(
            ckpts.get("snap").await?.phase(),
            Some(CheckpointPhase::Saving)
        );
        agent.kill().await;
        let artifact = checkpoint_artifact(&ns, "snap", &uid)?;
        assert!(
            !reg.has_manifest(&artifact.repository, CHECKPOINT_TAG)
                .await?,
            "no artifact under the tag before the final manifest put"
        );

        // Restarted, it finds the request and the CR in Saving: starts over, ends Ready.
        let _again = common::start_agent(env, &node, &dir).await?;
        wait_until("snap Ready after the restart", WAIT, || async {
            let c = ckpts.get_opt("snap").await.ok().flatten()?;
            (c.phase() == Some(CheckpointPhase::Ready)).then_some(())
        })
        .await?;
        assert!(
            reg.has_manifest(&artifact.repository, CHECKPOINT_TAG)
                .await?
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let after = pods.get("main").await?;
        assert_eq!(ann_of(&after, ann::VM_ID), Some(vm_id), "same VM id");
        assert!(is_running_ready(&after), "the source keeps running");
        Ok::<(), BoxError>(())
    })
    .await;
}
