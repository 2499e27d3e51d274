//! The real scheduler binds pods to TestNodes by pool, and leaves pods for a pool without
//! nodes Pending/Unschedulable; the not-ready taint is lifted by the node-lifecycle controller.

use std::time::Duration;

use cocoon_testenv::node::{POOL_LABEL, PROVIDER_TAINT};
use cocoon_testenv::{
    TestNode, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Toleration};
use kube::api::{Api, ObjectMeta, PostParams};

const SCHEDULABLE: Duration = Duration::from_secs(60);
const BIND: Duration = Duration::from_secs(30);

/// A placeholder pod with the operator's contract tolerations, selecting `pool`.
fn pod(name: &str, pool: &str) -> Pod {
    let tolerate = |key: &str, effect: Option<&str>| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: effect.map(Into::into),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "vm".into(),
                image: Some("cocoon/placeholder".into()),
                ..Default::default()
            }],
            restart_policy: Some("Never".into()),
            node_selector: Some([(POOL_LABEL.to_string(), pool.to_string())].into()),
            tolerations: Some(vec![
                tolerate(PROVIDER_TAINT, None),
                tolerate("node.kubernetes.io/not-ready", Some("NoExecute")),
                tolerate("node.kubernetes.io/unreachable", Some("NoExecute")),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

fn pod_scheduled(pod: &Pod) -> Option<(String, Option<String>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn scheduler_binds_by_pool_and_leaves_unmatched_pods_pending() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "sched").await?;
        // Pool values are unique too: other tests may share this env and its nodes.
        let (pool_a, pool_b, pool_c) = (
            unique_name("pool-a"),
            unique_name("pool-b"),
            unique_name("pool-c"),
        );
        let node_a = TestNode::in_pool(&client, &unique_name("node-a"), &pool_a).await?;
        let node_b = TestNode::in_pool(&client, &unique_name("node-b"), &pool_b).await?;
        node_a.wait_schedulable(SCHEDULABLE).await?;
        node_b.wait_schedulable(SCHEDULABLE).await?;

        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        pods.create(&PostParams::default(), &pod("in-pool-a", &pool_a))
            .await?;
        pods.create(&PostParams::default(), &pod("in-pool-c", &pool_c))
            .await?;

        let bound = wait_until("pod in-pool-a bound", BIND, || {
            let pods = pods.clone();
            async move {
                let p = pods.get("in-pool-a").await.ok()?;
                p.spec?.node_name
            }
        })
        .await?;
        anyhow::ensure!(
            bound == node_a.name(),
            "bound to {bound}, expected {}",
            node_a.name()
        );

        let (status, reason) = wait_until("pod in-pool-c Unschedulable", BIND, || {
            let pods = pods.clone();
            async move {
                let p = pods.get("in-pool-c").await.ok()?;
                pod_scheduled(&p).filter(|(s, _)| s == "False")
            }
        })
        .await?;
        anyhow::ensure!(
            status == "False" && reason.as_deref() == Some("Unschedulable"),
            "PodScheduled={status} reason={reason:?}"
        );
        let still = pods.get("in-pool-c").await?;
        anyhow::ensure!(
            still.spec.and_then(|s| s.node_name).is_none(),
            "pool-c pod got a node"
        );

        delete_namespace(&client, &ns).await?;
        node_a.delete().await?;
        node_b.delete().await?;
        Ok::<_, anyhow::Error>(())
    })
    .await;
}
