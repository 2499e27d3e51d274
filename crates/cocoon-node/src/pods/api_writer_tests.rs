//! The API writer ([`super::api_writer`]): writes for one incarnation of a pod never land on the
//! next one of the same name, on the real control plane: a status patch, an annotation patch and
//! an eviction computed for a deleted pod
//! are refused once a new pod holds the name (the kubelet pins its status patches the same way).
//!
//! Found in CI: an eviction racing the operator's rebuild of a main wrote `Failed`/`VMGone` onto
//! the freshly created main, which then sat Failed with no VM.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::contract::AnnotationDelta;
use cocoon_runtime::sim::{SimConfig, SimRuntime};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;

use super::{Handler, PodConfig, Timing, pod_key};
use crate::config::OrphanPolicy;
use crate::metrics::NodeMetrics;

const WAIT: Duration = Duration::from_secs(30);

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            // Bound to a node nobody serves: no kubelet touches it.
            node_name: Some("incarnation-nowhere".into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("example.invalid/agent:1".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[tokio::test]
async fn writes_for_a_deleted_pod_never_reach_its_successor() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "incarnation").await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let root = tempfile::tempdir()?;
        let rt = SimRuntime::open(SimConfig::new(root.path()))?;
        let shutdown = CancellationToken::new();
        let handler = Handler::new(
            PodConfig {
                node_name: "incarnation-nowhere".into(),
                orphan_policy: OrphanPolicy::Keep,
                leases_path: root.path().join("leases"),
                restore_mode: "ondemand".into(),
                cocoon_root_dir: root.path().to_owned(),
                clone_from_dir_roots: Vec::new(),
                tenant: Default::default(),
                timing: Timing::default(),
                host_reach: Default::default(),
            },
            client.clone(),
            Arc::new(rt),
            None,
            Recorder::new(
                client.clone(),
                Reporter {
                    controller: "vk-cocoon".into(),
                    instance: Some("incarnation-test".into()),
                },
            ),
            Arc::new(NodeMetrics::new(root.path())),
            shutdown.clone(),
        );

        let old = api.create(&PostParams::default(), &pod("p")).await?;
        let gone = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        api.delete("p", &gone).await?;
        cocoon_testenv::wait_until("the first p gone", WAIT, || async {
            matches!(api.get_opt("p").await, Ok(None)).then_some(())
        })
        .await?;
        let new = api.create(&PostParams::default(), &pod("p")).await?;
        assert_ne!(old.metadata.uid, new.metadata.uid, "a new incarnation");

        let failed = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("VMGone".into()),
            ..PodStatus::default()
        };
        let status = handler.api.write_status(&old, &failed).await;
        assert!(status.is_err(), "the stale status write is refused");
        let delta =
            AnnotationDelta::from([("example.com/stale".to_owned(), Some("yes".to_owned()))]);
        let annotations = handler.api.patch_annotations(&old, delta.clone()).await;
        assert!(
            annotations.is_err(),
            "the stale annotation write is refused"
        );
        handler
            .evict(&pod_key(&old), &old, "VMGone", "vm no longer exists")
            .await;

        let live = api.get("p").await?;
        assert_eq!(
            live.metadata.uid, new.metadata.uid,
            "the successor was not evicted"
        );
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "nor is it being deleted"
        );
        assert_ne!(
            live.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed"),
            "the successor's status is its own"
        );
        assert!(
            !live
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("example.com/stale"),
            "the successor's annotations are its own"
        );

        // The same writes for the live incarnation land.
        handler.api.write_status(&new, &failed).await?;
        handler.api.patch_annotations(&new, delta).await?;
        let live = api.get("p").await?;
        assert_eq!(live.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
        assert_eq!(
            live.metadata
                .annotations
                .unwrap_or_default()
                .get("example.com/stale")
                .map(String::as_str),
            Some("yes")
        );
        shutdown.cancel();
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await;
}
