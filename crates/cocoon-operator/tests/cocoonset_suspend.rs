//! Suspend, unsuspend and the release-policy wake of the CocoonSet controller end to end, on
//! the real control plane, scheduler and registry. The node side is a scripted STAND-IN FOR
//! THE NODE AGENT (`cocoon_testsupport::scripted::hibernating_node_actor`), not
//! `cocoon_node::agent`: for a bound pod carrying `vm.cocoonstack.io/hibernate=true` it
//! pushes a real `<vm>:hibernate` artifact (recording the pod's image) and then, in one patch,
//! clears the VM id and writes lifecycle `hibernated` at the pod's stamped generation; for any
//! other bound pod it comes up with a VM id, lifecycle `ready` at the stamp, a running
//! container and the Ready condition. It completes pod deletions as a kubelet does.

use std::time::Duration;

use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, CocoonSetSpec, HibernatePolicy};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::cocoonset::Timing;
use cocoon_operator::metrics::{Metrics, PlacementLabels};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    HIBERNATE, ScriptedNode, WAIT, controller, cordon, hibernating_node_actor, node_of, nodes,
    phase_is, registry_client, set_suspend, spec, stop_refusing, suspend_timing, wait_event,
    wait_set_watched as wait_set, wait_tag,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const RECLAIM: &str = "cocoonset.cocoonstack.io/hibernate-reclaim";
const HINT: &str = "cocoonset.cocoonstack.io/hibernated-on-node";
const RESTORE: &str = "vm.cocoonstack.io/restore-from-hibernate";

fn timing(deadline: Duration) -> Timing {
    Timing {
        suspend_deadline: deadline,
        ..suspend_timing()
    }
}

fn ann_of(cs: &CocoonSet, key: &str) -> Option<String> {
    cs.annotations().get(key).cloned()
}

#[tokio::test]
async fn retain_suspend_round_trip_restores_a_pod_deleted_while_suspended() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-susp").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(timing(WAIT));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, 1)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let (vm0, vm1) = (
            vm_name_for_agent(&ns, "demo", 0),
            vm_name_for_agent(&ns, "demo", 1),
        );

        set_suspend(&sets, "demo", true).await?;
        let cs = wait_set(&sets, "demo", "Suspended", |cs| {
            phase_is(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        let record = ann_of(&cs, RECLAIM).unwrap_or_default();
        assert!(
            record.contains(&vm0) && record.contains(&vm1),
            "record {record}"
        );
        assert!(ann_of(&cs, "cocoonset.cocoonstack.io/suspending-since").is_none());
        for p in ["demo-0", "demo-1"] {
            let pod = pods.get(p).await?;
            assert_eq!(
                pod.annotations().get(HIBERNATE).map(String::as_str),
                Some("true")
            );
        }
        assert!(reg.has_manifest(&vm0, "hibernate").await?);
        assert!(reg.has_manifest(&vm1, "hibernate").await?);

        // A sub-agent deleted while suspended is owed a restore at unsuspend.
        pods.delete("demo-1", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("demo-1 gone", WAIT, || async {
            pods.get_opt("demo-1").await.ok()?.is_none().then_some(())
        })
        .await?;

        set_suspend(&sets, "demo", false).await?;
        let cs = wait_set(&sets, "demo", "Running, record reclaimed", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann_of(cs, RECLAIM).is_none()
        })
        .await?;
        assert!(ann_of(&cs, RECLAIM).is_none());
        let sub = pods.get("demo-1").await?;
        assert_eq!(
            sub.annotations().get(RESTORE).map(String::as_str),
            Some("true"),
            "the recreated sub-agent restores its snapshot"
        );
        let main = pods.get("demo-0").await?;
        assert!(main.annotations().get(HIBERNATE).is_none());
        wait_tag(&reg, &vm0, false).await?;
        wait_tag(&reg, &vm1, false).await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn suspend_timeout_surfaces_and_recovers_and_registry_down_counts() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-stime").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let ScriptedNode { refuse, .. } = hibernating_node_actor(&client, &ns, env.registry_addr());
        let running = controller(&client, &ns, registry_client(env.registry_addr()))
            .sets(timing(Duration::from_secs(3)));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, 0)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;

        // The node agent refuses the hibernate: Suspending, then Failed with SuspendTimedOut.
        if let Ok(mut s) = refuse.lock() {
            s.insert("demo-0".into());
        }
        set_suspend(&sets, "demo", true).await?;
        wait_set(&sets, "demo", "Suspending", |cs| {
            phase_is(cs, CocoonSetPhase::Suspending)
                && ann_of(cs, "cocoonset.cocoonstack.io/suspending-since").is_some()
        })
        .await?;
        wait_set(&sets, "demo", "Failed", |cs| {
            phase_is(cs, CocoonSetPhase::Failed)
        })
        .await?;
        wait_event(&client, &ns, "SuspendTimedOut").await?;
        // Re-entry with a fresh deadline.
        wait_set(&sets, "demo", "Suspending again", |cs| {
            phase_is(cs, CocoonSetPhase::Suspending)
        })
        .await?;

        // The node agent gives in but the registry is down: the probe error still ends in
        // Failed, then Suspended once the registry is back.
        running.registry.set_down(true);
        stop_refusing(&refuse, &pods, "demo-0").await?;
        // The deadline restarted on the last Failed → Suspending; a registry that keeps
        // failing ends in Failed again.
        wait_set(&sets, "demo", "Suspending (registry down)", |cs| {
            phase_is(cs, CocoonSetPhase::Suspending)
        })
        .await?;
        wait_set(&sets, "demo", "Failed (registry down)", |cs| {
            phase_is(cs, CocoonSetPhase::Failed)
        })
        .await?;
        running.registry.set_down(false);
        wait_set(&sets, "demo", "Suspended", |cs| {
            phase_is(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        set_suspend(&sets, "demo", false).await?;
        wait_set(&sets, "demo", "Running, reclaimed", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann_of(cs, RECLAIM).is_none()
        })
        .await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn operator_restart_mid_suspend_loses_nothing() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-srst").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let ScriptedNode { refuse, .. } = hibernating_node_actor(&client, &ns, env.registry_addr());
        let first =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(timing(WAIT));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, 1)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        if let Ok(mut s) = refuse.lock() {
            s.insert("demo-1".into());
        }
        set_suspend(&sets, "demo", true).await?;
        let cs = wait_set(&sets, "demo", "Suspending", |cs| {
            phase_is(cs, CocoonSetPhase::Suspending)
        })
        .await?;
        assert!(
            ann_of(&cs, RECLAIM).is_some(),
            "record written before the hibernate"
        );
        first.stop().await;

        let _second =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(timing(WAIT));
        stop_refusing(&refuse, &pods, "demo-1").await?;
        wait_set(&sets, "demo", "Suspended", |cs| {
            phase_is(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        set_suspend(&sets, "demo", false).await?;
        wait_set(&sets, "demo", "Running, reclaimed", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann_of(cs, RECLAIM).is_none()
        })
        .await?;
        wait_tag(&reg, &vm_name_for_agent(&ns, "demo", 1), false).await?;
        TestResult::Ok(())
    })
    .await;
}

fn release_spec(pool: &str) -> CocoonSetSpec {
    let mut s = spec(pool, 0);
    s.hibernate_policy = HibernatePolicy::Release;
    s
}

fn wakes(m: &Metrics, ns: &str, placement: &str) -> u64 {
    m.slot_release_wake
        .get_or_create(&PlacementLabels {
            namespace: ns.into(),
            cocoonset: "demo".into(),
            placement: placement.into(),
        })
        .get()
}

/// Suspends a release-policy set and waits for its seat to be freed; returns the hint.
async fn release(sets: &Api<CocoonSet>, pods: &Api<Pod>, node: &str) -> Result<(), BoxError> {
    set_suspend(sets, "demo", true).await?;
    let cs = wait_set(sets, "demo", "Suspended, hint", |cs| {
        phase_is(cs, CocoonSetPhase::Suspended) && ann_of(cs, HINT).is_some()
    })
    .await?;
    assert_eq!(ann_of(&cs, HINT).as_deref(), Some(node));
    cocoon_testenv::wait_until("main released", WAIT, || async {
        pods.get_opt("demo-0").await.ok()?.is_none().then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn release_wakes_warm_on_the_hint_then_cold_elsewhere_and_waits_for_capacity() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-rel").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(&client, &pool, 2).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(timing(WAIT));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", release_spec(&pool)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let first = node_of(&pods, "demo-0").await?;

        // Warm wake: back on the hinted node.
        release(&sets, &pods, &first).await?;
        assert!(reg.has_manifest(&vm0, "hibernate").await?);
        set_suspend(&sets, "demo", false).await?;
        wait_set(&sets, "demo", "Running, hint cleared", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann_of(cs, HINT).is_none()
        })
        .await?;
        let main = pods.get("demo-0").await?;
        assert_eq!(
            main.annotations().get(RESTORE).map(String::as_str),
            Some("true")
        );
        assert_eq!(node_of(&pods, "demo-0").await?, first);
        assert_eq!(wakes(&running.metrics, &ns, "hint-node"), 1);
        wait_tag(&reg, &vm0, false).await?;

        // Cold wake: the hinted node is full (cordoned), the main lands elsewhere.
        let hinted = node_of(&pods, "demo-0").await?;
        release(&sets, &pods, &hinted).await?;
        cordon(&client, &hinted, true).await?;
        // Both nodes full first: WakeNoCapacity while unschedulable.
        let other = nodes
            .iter()
            .map(|n| n.name().to_string())
            .find(|n| *n != hinted)
            .unwrap_or_default();
        cordon(&client, &other, true).await?;
        set_suspend(&sets, "demo", false).await?;
        wait_set(&sets, "demo", "Waking", |cs| {
            phase_is(cs, CocoonSetPhase::Waking)
        })
        .await?;
        wait_event(&client, &ns, "WakeNoCapacity").await?;
        cordon(&client, &other, false).await?;
        wait_set(&sets, "demo", "Running after cold wake", |cs| {
            phase_is(cs, CocoonSetPhase::Running) && ann_of(cs, HINT).is_none()
        })
        .await?;
        assert_eq!(node_of(&pods, "demo-0").await?, other);
        assert_eq!(wakes(&running.metrics, &ns, "pool"), 1);
        assert!(
            running
                .metrics
                .slot_release_wake_unschedulable
                .get_or_create(&cocoon_operator::metrics::SetLabels {
                    namespace: ns.clone(),
                    cocoonset: "demo".into(),
                })
                .get()
                >= 1
        );
        wait_tag(&reg, &vm0, false).await?;
        cordon(&client, &hinted, false).await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn image_edited_while_released_boots_fresh_and_drops_the_tag() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-img").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(timing(WAIT));
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", release_spec(&pool)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let node = node_of(&pods, "demo-0").await?;
        release(&sets, &pods, &node).await?;
        assert!(reg.has_manifest(&vm0, "hibernate").await?);

        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": false,
                "agent": {"image": "ghcr.io/cocoonstack/cocoon/ubuntu:26.04"}}})),
        )
        .await?;
        let cs = wait_set(&sets, "demo", "Running on the new image", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        assert!(ann_of(&cs, HINT).is_none());
        assert!(!reg.has_manifest(&vm0, "hibernate").await?, "tag dropped");
        let main = pods.get("demo-0").await?;
        assert!(main.annotations().get(RESTORE).is_none(), "fresh boot");
        wait_set(&sets, "demo", "record reclaimed", |cs| {
            ann_of(cs, RECLAIM).is_none()
        })
        .await?;
        TestResult::Ok(())
    })
    .await;
}
