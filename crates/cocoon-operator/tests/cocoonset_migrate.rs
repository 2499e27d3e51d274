//! Cross-node migration of the main (step 8 of `cocoonset.md`) end to end, on the real
//! control plane, scheduler and registry. The node side is the scripted STAND-IN FOR THE
//! NODE AGENT of `cocoon_testsupport::scripted` (`hibernating_node_actor`): for a bound
//! pod carrying `vm.cocoonstack.io/hibernate=true` it pushes a real `<vm>:hibernate` artifact
//! and then, in one patch, clears the VM id and writes lifecycle `hibernated` at the pod's
//! stamped generation; any other bound pod (a restore-marked one included) comes up with a
//! fresh VM id, lifecycle `ready`, a running container and the Ready condition. It completes
//! pod deletions as a kubelet does. "Full" nodes are cordoned ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::metrics::{Metrics, SetLabels};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    HIBERNATE, ScriptedNode, WAIT, controller, cordon, hibernating_node_actor, node_of, nodes,
    phase_is, push_tag, registry_client, spec, suspend_timing, wait_event, wait_set, wait_tag,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const VM_ID: &str = "vm.cocoonstack.io/id";
const KEEP: &str = "vm.cocoonstack.io/keep-snapshot-on-delete";
const RESTORE: &str = "vm.cocoonstack.io/restore-from-hibernate";

/// What a watch saw over the test: every status phase of the set, and whether the main was
/// ever flagged keep-snapshot-on-delete. A watch, not polling, so a short phase is not missed.
#[derive(Default)]
struct Seen {
    phases: Mutex<Vec<CocoonSetPhase>>,
    keep_flagged: AtomicBool,
}

impl Seen {
    fn saw(&self, p: CocoonSetPhase) -> bool {
        self.phases.lock().map(|v| v.contains(&p)).unwrap_or(false)
    }
}

fn observe(client: &Client, ns: &str) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let s = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher(sets, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        // A watch error (an expired resource version, a dropped connection) is followed by
        // the backoff's re-list: skip it rather than end the loop.
        while let Some(ev) = stream.next().await {
            let Ok(cs) = ev else { continue };
            if let (Some(p), Ok(mut v)) = (cs.status.and_then(|s| s.phase), s.phases.lock())
                && v.last() != Some(&p)
            {
                v.push(p);
            }
        }
    });
    let s = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        // A watch error (an expired resource version, a dropped connection) is followed by
        // the backoff's re-list: skip it rather than end the loop.
        while let Some(ev) = stream.next().await {
            let Ok(pod) = ev else { continue };
            if pod.name_any() == "demo-0"
                && pod.annotations().get(KEEP).map(String::as_str) == Some("true")
            {
                s.keep_flagged.store(true, Ordering::SeqCst);
            }
        }
    });
    seen
}

async fn pin(sets: &Api<CocoonSet>, node: &str) -> TestResult {
    sets.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"nodeName": node}})),
    )
    .await?;
    Ok(())
}

/// Creates set `demo` in `pool` with `replicas` (as [`spec`] takes them) and waits until it runs.
async fn create_running(sets: &Api<CocoonSet>, pool: &str, replicas: i32) -> TestResult {
    sets.create(
        &PostParams::default(),
        &CocoonSet::new("demo", spec(pool, replicas)),
    )
    .await?;
    wait_set(sets, "demo", "Running", |cs| {
        phase_is(cs, CocoonSetPhase::Running)
    })
    .await?;
    Ok(())
}

fn vm_id(p: &Pod) -> String {
    p.annotations().get(VM_ID).cloned().unwrap_or_default()
}

/// Waits until the set settled (Running at its generation) with the main bound to `node`,
/// running a VM and no longer carrying the hibernate annotation; returns the main.
async fn settled_on(sets: &Api<CocoonSet>, pods: &Api<Pod>, node: &str) -> Result<Pod, BoxError> {
    wait_set(sets, "demo", "Running", |cs| {
        phase_is(cs, CocoonSetPhase::Running)
    })
    .await?;
    let main = cocoon_testenv::wait_until(&format!("demo-0 live on {node}"), WAIT, || async {
        let p = pods.get_opt("demo-0").await.ok().flatten()?;
        let on = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        (on && !vm_id(&p).is_empty() && p.annotations().get(HIBERNATE).is_none()).then_some(p)
    })
    .await?;
    Ok(main)
}

fn no_capacity_count(m: &Metrics, ns: &str) -> u64 {
    m.migrate_unschedulable
        .get_or_create(&SetLabels {
            namespace: ns.into(),
            cocoonset: "demo".into(),
        })
        .get()
}

/// The MigrateNoCapacity events' notes.
async fn no_capacity_notes(client: &Client, ns: &str) -> Result<Vec<String>, kube::Error> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MigrateNoCapacity"))
        .filter_map(|e| e.note)
        .collect())
}

fn other(nodes: &[cocoon_testenv::TestNode], not: &[&str]) -> String {
    nodes
        .iter()
        .map(|n| n.name().to_string())
        .find(|n| !not.contains(&n.as_str()))
        .unwrap_or_default()
}

#[tokio::test]
async fn pin_to_another_node_moves_the_main_on_its_snapshot() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-mig").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(&client, &pool, 2).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let seen = observe(&client, &ns);
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        create_running(&sets, &pool, 1).await?;
        let source = node_of(&pods, "demo-0").await?;
        let old = pods.get("demo-0").await?;
        let sub_node = node_of(&pods, "demo-1").await?;
        let target = other(&nodes, &[&source]);

        pin(&sets, &target).await?;
        let main = settled_on(&sets, &pods, &target).await?;
        assert!(
            seen.saw(CocoonSetPhase::Migrating),
            "phases {:?}",
            seen.phases.lock().map(|v| v.clone())
        );
        assert!(
            seen.keep_flagged.load(Ordering::SeqCst),
            "old main flagged keep-snapshot-on-delete"
        );
        assert_ne!(main.uid(), old.uid(), "the main was recreated");
        assert_eq!(
            main.annotations().get(RESTORE).map(String::as_str),
            Some("true"),
            "recreated from the snapshot"
        );
        assert_ne!(vm_id(&main), vm_id(&old), "a new VM runs on the target");
        wait_tag(&reg, &vm0, false).await?;
        // Only slot 0 moves.
        assert_eq!(node_of(&pods, "demo-1").await?, sub_node);
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn full_target_reports_no_capacity_then_completes_when_it_frees() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-mnc").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(&client, &pool, 2).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        create_running(&sets, &pool, 0).await?;
        let source = node_of(&pods, "demo-0").await?;
        let target = other(&nodes, &[&source]);
        cordon(&client, &target, true).await?;

        pin(&sets, &target).await?;
        wait_event(&client, &ns, "MigrateNoCapacity").await?;
        let cs = sets.get("demo").await?;
        assert!(phase_is(&cs, CocoonSetPhase::Migrating), "{:?}", cs.status);
        // The snapshot is kept while the restored main waits for a seat.
        assert!(reg.has_manifest(&vm0, "hibernate").await?);
        for note in no_capacity_notes(&client, &ns).await? {
            assert!(
                note.starts_with("main pod demo-0 unschedulable: "),
                "{note}"
            );
            assert!(!note.contains(&target), "names the target: {note}");
        }
        assert!(no_capacity_count(&running.metrics, &ns) >= 1);

        cordon(&client, &target, false).await?;
        let main = settled_on(&sets, &pods, &target).await?;
        assert_eq!(
            main.annotations().get(RESTORE).map(String::as_str),
            Some("true")
        );
        wait_tag(&reg, &vm0, false).await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn repin_and_unpin_of_a_pending_main_recreate_it_under_the_current_pin() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-mrp").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(&client, &pool, 3).await?;
        let _actor = hibernating_node_actor(&client, &ns, env.registry_addr());
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        create_running(&sets, &pool, 0).await?;
        let a = node_of(&pods, "demo-0").await?;
        let b = other(&nodes, &[&a]);
        let c = other(&nodes, &[&a, &b]);

        // Re-pin away from a full node: the pending main is recreated under the new pin.
        cordon(&client, &b, true).await?;
        pin(&sets, &b).await?;
        wait_event(&client, &ns, "MigrateNoCapacity").await?;
        let pending = pods.get("demo-0").await?;
        pin(&sets, &c).await?;
        let main = settled_on(&sets, &pods, &c).await?;
        assert_ne!(main.uid(), pending.uid(), "the pending main was replaced");
        assert_eq!(
            main.annotations().get(RESTORE).map(String::as_str),
            Some("true"),
            "still restored from the snapshot"
        );
        wait_tag(&reg, &vm0, false).await?;

        // Unpin while pending: recreated with no affinity, lands on the only free node.
        cordon(&client, &a, true).await?;
        pin(&sets, &b).await?;
        cocoon_testenv::wait_until("demo-0 pending under the pin", WAIT, || async {
            let p = pods.get_opt("demo-0").await.ok().flatten()?;
            let unbound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none();
            (unbound && p.uid() != main.uid()).then_some(())
        })
        .await?;
        cordon(&client, &a, false).await?;
        cordon(&client, &c, true).await?;
        pin(&sets, "").await?;
        let unpinned = settled_on(&sets, &pods, &a).await?;
        let affinity = unpinned.spec.as_ref().and_then(|s| s.affinity.clone());
        assert!(affinity.is_none(), "no pin, no affinity: {affinity:?}");
        wait_tag(&reg, &vm0, false).await?;
        cordon(&client, &b, false).await?;
        cordon(&client, &c, false).await?;
        TestResult::Ok(())
    })
    .await;
}

/// A re-target back while the source is between two of its hibernate writes: the node agent
/// has written `hibernating` and pushed the snapshot, but not yet cleared the VM id. The
/// controller wakes the main in place, and must keep the tag until the main runs a VM woken
/// from it: the old VM is about to be removed and the snapshot is then the only copy of its
/// state. (Dropping it there made the real agent's wake find no snapshot, discard the local
/// copy as stale, and fail with `WakePullFailed` for good.)
#[tokio::test]
async fn retarget_back_before_the_source_clears_its_vm_keeps_the_snapshot() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-mback").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(&client, &pool, 2).await?;
        let ScriptedNode { hold, .. } = hibernating_node_actor(&client, &ns, env.registry_addr());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(suspend_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());
        let vm0 = vm_name_for_agent(&ns, "demo", 0);
        create_running(&sets, &pool, 0).await?;
        let source = node_of(&pods, "demo-0").await?;
        let target = other(&nodes, &[&source]);
        let old = pods.get("demo-0").await?;

        // The test plays the source agent from here on: quiesce seen, `hibernating`
        // written, snapshot pushed, VM id not yet cleared.
        hold.lock()
            .map_err(|_| "hold lock")?
            .insert("demo-0".into());
        pin(&sets, &target).await?;
        cocoon_testenv::wait_until("demo-0 quiesced", WAIT, || async {
            let p = pods.get_opt("demo-0").await.ok().flatten()?;
            (p.annotations().get(HIBERNATE).map(String::as_str) == Some("true")).then_some(())
        })
        .await?;
        let patch = json!({"metadata": {"annotations": {
            "vm.cocoonstack.io/lifecycle-state": "hibernating"}}});
        pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        push_tag(&reg, &vm0, "hibernate", "img").await?;

        pin(&sets, &source).await?;
        cocoon_testenv::wait_until("quiesce cleared by the re-target", WAIT, || async {
            let p = pods.get_opt("demo-0").await.ok().flatten()?;
            p.annotations().get(HIBERNATE).is_none().then_some(())
        })
        .await?;
        // Passes run one at a time per set, each probing the tag once: four more probes
        // mean at least three whole passes saw the cleared quiesce beside the tag. A drop
        // ends the wait early (the set then settles and stops probing).
        let probes = || running.stats.registry_calls.load(Ordering::Relaxed);
        let before = probes();
        cocoon_testenv::wait_until("four more passes, or the tag dropped", WAIT, || async {
            let tag = reg.has_manifest(&vm0, "hibernate").await.ok()?;
            (probes() >= before + 4 || !tag).then_some(())
        })
        .await?;
        assert!(
            reg.has_manifest(&vm0, "hibernate").await?,
            "the snapshot was dropped while the VM it came from was being removed"
        );
        let cs = sets.get("demo").await?;
        assert!(phase_is(&cs, CocoonSetPhase::Migrating), "{:?}", cs.status);

        // The source finishes (VM id cleared, `hibernated`) and wakes the main in place.
        hold.lock().map_err(|_| "hold lock")?.clear();
        let patch = json!({"metadata": {"annotations": {
            "vm.cocoonstack.io/id": null,
            "vm.cocoonstack.io/lifecycle-state": "hibernated"}}});
        pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let main = settled_on(&sets, &pods, &source).await?;
        assert_eq!(main.uid(), old.uid(), "woken in place, not recreated");
        assert_ne!(vm_id(&main), vm_id(&old), "a woken VM runs");
        wait_tag(&reg, &vm0, false).await?;
        TestResult::Ok(())
    })
    .await;
}
