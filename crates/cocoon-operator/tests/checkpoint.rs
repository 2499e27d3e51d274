//! The CocoonCheckpoint API and controller (issue 38, up to the node hand-off) on the real
//! control plane and the real registry: the CRD's CEL refusals, source validation naming the
//! field, the request on a valid source's pod, and deletion removing the artifact only when
//! the artifact records this checkpoint as its owner.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::checkpoint::{
    CheckpointRequest, FINALIZER, REQUEST_ANNOTATION, checkpoint_artifact,
    checkpoint_owner_annotations,
};
use cocoon_api::contract::oci;
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec, NameRef,
};
use cocoon_api::crd::set::{CocoonSet, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::admin::Readiness;
use cocoon_operator::checkpoint;
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
use cocoon_registry::RegistryClient;
use cocoon_testsupport::{BoxError, scripted};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), BoxError>;

const WAIT: Duration = Duration::from_secs(60);

/// Starts the checkpoint controller on `ns`; it stops when the token is dropped.
fn start_controller(client: &Client, ns: &str, registry_addr: &str) -> tokio_util::sync::DropGuard {
    let tags: Arc<dyn TagRegistry> = Arc::new(OciTagRegistry::new(cocoon_testsupport::registry(
        registry_addr,
    )));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-operator".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(checkpoint::Context::new(
        client.clone(),
        recorder,
        Arc::new(Metrics::new()),
        tags,
    ));
    let token = CancellationToken::new();
    let (stop, ns) = (token.clone(), ns.to_owned());
    tokio::spawn(async move {
        let until = async move { stop.cancelled().await };
        checkpoint::run(ctx, Some(&ns), 2, until, Arc::new(Readiness::default())).await
    });
    token.drop_guard()
}

fn by_pod(name: &str, pod: &str) -> CocoonCheckpoint {
    CocoonCheckpoint::new(
        name,
        CocoonCheckpointSpec {
            source: CheckpointSource {
                pod_ref: Some(NameRef { name: pod.into() }),
                cocoon_set_ref: None,
            },
        },
    )
}

fn by_set(name: &str, set: &str) -> CocoonCheckpoint {
    CocoonCheckpoint::new(
        name,
        CocoonCheckpointSpec {
            source: CheckpointSource {
                pod_ref: None,
                cocoon_set_ref: Some(NameRef { name: set.into() }),
            },
        },
    )
}

/// A pod as the node agent keeps a managed VM's pod (`managed` optional), bound to `node-a`
/// and reported Running; `owner` makes it a CocoonSet's pod.
async fn running_pod(
    pods: &Api<Pod>,
    ns: &str,
    name: &str,
    managed: bool,
    owner: Option<&CocoonSet>,
) -> TestResult {
    let mut annotations = json!({"vm.cocoonstack.io/name": vm_name_for_pod(ns, name),
                                 "vm.cocoonstack.io/id": "vm-1"});
    if managed {
        annotations["cocoonset.cocoonstack.io/managed"] = json!("true");
    }
    let mut pod = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": "node-a", "restartPolicy": "Never",
                 "containers": [{"name": "agent", "image": "cocoon/placeholder"}]}
    });
    if let Some(cs) = owner {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet",
            "name": cs.name_any(), "uid": cs.uid().unwrap_or_default(), "controller": true
        }]);
    }
    let pod: Pod = serde_json::from_value(pod)?;
    pods.create(&PostParams::default(), &pod).await?;
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn wait_phase(
    crs: &Api<CocoonCheckpoint>,
    name: &str,
    phase: CheckpointPhase,
) -> Result<CocoonCheckpoint, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name} reaches {phase}"), WAIT, || async {
        let cr = crs.get_opt(name).await.ok().flatten()?;
        (cr.phase() == Some(phase)).then_some(cr)
    })
    .await
}

fn ready_message(cr: &CocoonCheckpoint) -> String {
    cr.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

async fn wait_warning(client: &Client, ns: &str, regarding: &str, reason: &str) -> TestResult {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    cocoon_testenv::wait_until(
        &format!("Warning {reason} on {regarding}"),
        WAIT,
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                        && e.reason.as_deref() == Some(reason)
                        && e.type_.as_deref() == Some("Warning")
                })
                .then_some(())
        },
    )
    .await?;
    Ok(())
}

async fn wait_gone(crs: &Api<CocoonCheckpoint>, name: &str) -> TestResult {
    cocoon_testenv::wait_until(&format!("{name} is gone"), WAIT, || async {
        matches!(crs.get_opt(name).await, Ok(None)).then_some(())
    })
    .await?;
    Ok(())
}

fn api_message(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    }
}

#[tokio::test]
async fn the_api_server_refuses_both_sources_none_and_any_spec_edit() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ckpt-cel").await?;
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        let mut both = by_pod("both", "demo-0");
        both.spec.source.cocoon_set_ref = Some(NameRef {
            name: "demo".into(),
        });
        let none = CocoonCheckpoint::new(
            "none",
            CocoonCheckpointSpec {
                source: CheckpointSource::default(),
            },
        );
        for bad in [both, none] {
            let err = crs
                .create(&PostParams::default(), &bad)
                .await
                .expect_err("refused");
            let m = api_message(err);
            assert!(
                m.contains(
                    "spec.source: exactly one of spec.source.podRef or spec.source.cocoonSetRef"
                ),
                "{m}"
            );
        }
        crs.create(&PostParams::default(), &by_pod("good", "demo-0"))
            .await?;
        let edit = json!({"spec": {"source": {"podRef": {"name": "demo-1"}}}});
        let err = crs
            .patch("good", &PatchParams::default(), &Patch::Merge(&edit))
            .await
            .expect_err("refused");
        let m = api_message(err);
        assert!(m.contains("the spec of a checkpoint cannot change"), "{m}");
        // A bad name in fromCheckpoint is the CRD's refusal too.
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.agent.from_checkpoint = Some("Not_A_Name".into());
        let err = sets
            .create(&PostParams::default(), &CocoonSet::new("fork", spec))
            .await
            .expect_err("refused");
        let m = api_message(err);
        assert!(m.contains("spec.agent.fromCheckpoint"), "{m}");
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn a_source_that_is_not_a_running_managed_pod_of_the_namespace_fails_naming_the_field() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ckpt-bad").await?;
        let other = cocoon_testenv::create_namespace(&client, "ckpt-other").await?;
        let _ctl = start_controller(&client, &ns, env.registry_addr());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        running_pod(&pods, &ns, "plain", false, None).await?;
        // A Running managed pod, but of another namespace.
        running_pod(&Api::namespaced(client.clone(), &other), &other, "theirs", true, None).await?;

        let cases = [
            (by_pod("missing", "nope"), r#"spec.source.podRef.name: pod "nope" is not a Running managed pod of namespace"#),
            (by_pod("unmanaged", "plain"), r#"spec.source.podRef.name: pod "plain" is not a Running managed pod of namespace"#),
            (by_pod("elsewhere", "theirs"), r#"spec.source.podRef.name: pod "theirs" is not a Running managed pod of namespace"#),
            (by_set("noset", "ghost"), r#"spec.source.cocoonSetRef.name: CocoonSet "ghost" not found in namespace"#),
        ];
        for (cr, _) in &cases {
            crs.create(&PostParams::default(), cr).await?;
        }
        for (cr, want) in &cases {
            let name = cr.name_any();
            let got = wait_phase(&crs, &name, CheckpointPhase::Failed).await?;
            let m = ready_message(&got);
            assert!(m.starts_with(want), "{name}: {m}");
            assert!(m.contains(&format!("{ns:?}")), "{name}: {m}");
            wait_warning(&client, &ns, &name, checkpoint::decide::EVENT_FAILED).await?;
        }
        // Nothing was requested of any pod.
        let plain = pods.get("plain").await?;
        assert!(!plain.annotations().contains_key(REQUEST_ANNOTATION));
        // A checkpoint that never got an artifact just loses its finalizer.
        crs.delete("unmanaged", &DeleteParams::default()).await?;
        wait_gone(&crs, "unmanaged").await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn a_valid_source_goes_pending_with_the_derived_artifact_and_the_request_on_its_pod() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ckpt-ok").await?;
        let _ctl = start_controller(&client, &ns, env.registry_addr());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        running_pod(&pods, &ns, "raw", true, None).await?;
        let cs = sets
            .create(
                &PostParams::default(),
                &CocoonSet::new("demo", CocoonSetSpec::with_image("ubuntu:24.04")),
            )
            .await?;
        running_pod(&pods, &ns, "demo-0", true, Some(&cs)).await?;

        for (cr, pod, source) in [
            (by_pod("by-pod", "raw"), "raw", "pod/raw"),
            (by_set("by-set", "demo"), "demo-0", "cocoonset/demo"),
        ] {
            let name = cr.name_any();
            crs.create(&PostParams::default(), &cr).await?;
            let got = wait_phase(&crs, &name, CheckpointPhase::Pending).await?;
            assert!(got.finalizers().iter().any(|f| f == FINALIZER));
            let s = got.status.clone().expect("status");
            let derived = checkpoint_artifact(&ns, &name, &got.uid().expect("uid"))?;
            assert_eq!(
                (s.repository.as_str(), s.tag.as_str()),
                (derived.repository.as_str(), derived.tag.as_str())
            );
            assert_eq!(s.vm_name, vm_name_for_pod(&ns, pod));
            assert_eq!(s.node, "node-a");
            assert_eq!(s.source, source);
            assert_eq!(s.observed_generation, got.metadata.generation.unwrap_or(0));
            let request =
                cocoon_testenv::wait_until(&format!("request on {pod}"), WAIT, || async {
                    let p = pods.get(pod).await.ok()?;
                    CheckpointRequest::parse(p.annotations().get(REQUEST_ANNOTATION)?).ok()
                })
                .await?;
            assert!(request.matches_checkpoint(&ns, &name, &got.uid().expect("uid")));
            assert_eq!(request.vm_name, s.vm_name);
            // Deleting it takes the request off the pod with the finalizer.
            crs.delete(&name, &DeleteParams::default()).await?;
            wait_gone(&crs, &name).await?;
            let p = pods.get(pod).await?;
            assert!(!p.annotations().contains_key(REQUEST_ANNOTATION), "{pod}");
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

#[tokio::test]
async fn delete_removes_its_own_artifact_and_keeps_one_recording_another_owner() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "ckpt-del").await?;
        let _ctl = start_controller(&client, &ns, env.registry_addr());
        let reg: RegistryClient = cocoon_testsupport::registry(env.registry_addr());
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
        running_pod(&pods, &ns, "raw", true, None).await?;

        // Ours: the artifact records this checkpoint as its owner.
        crs.create(&PostParams::default(), &by_pod("mine", "raw"))
            .await?;
        let mine = wait_phase(&crs, "mine", CheckpointPhase::Pending).await?;
        let a = checkpoint_artifact(&ns, "mine", &mine.uid().expect("uid"))?;
        let owner = checkpoint_owner_annotations(&ns, "mine");
        let owner: Vec<(&str, &str)> = owner
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        scripted::push_snapshot_tag(&reg, &a.repository, &a.tag, "ubuntu:24.04", &owner).await?;
        assert!(reg.has_manifest(&a.repository, &a.tag).await?);
        crs.delete("mine", &DeleteParams::default()).await?;
        wait_gone(&crs, "mine").await?;
        assert!(
            !reg.has_manifest(&a.repository, &a.tag).await?,
            "the artifact is gone"
        );

        // Another owner's artifact under the derived name (planted: a pod's record) is kept,
        // reported, and the checkpoint still goes.
        crs.create(&PostParams::default(), &by_pod("planted", "raw"))
            .await?;
        let planted = wait_phase(&crs, "planted", CheckpointPhase::Pending).await?;
        let b = checkpoint_artifact(&ns, "planted", &planted.uid().expect("uid"))?;
        let theirs = [
            (oci::ANNOTATION_OWNER_NAMESPACE, ns.as_str()),
            (oci::ANNOTATION_OWNER_POD, "planted"),
        ];
        scripted::push_snapshot_tag(&reg, &b.repository, &b.tag, "ubuntu:24.04", &theirs).await?;
        // Keep the CR while the Event is checked: the controller emits it before the finalizer goes.
        crs.delete("planted", &DeleteParams::default()).await?;
        wait_gone(&crs, "planted").await?;
        wait_warning(&client, &ns, "planted", "ForeignSnapshotIgnored").await?;
        assert!(
            reg.has_manifest(&b.repository, &b.tag).await?,
            "another owner's artifact is kept"
        );
        Ok::<_, BoxError>(())
    })
    .await;
}
