//! Issue 26 item 3 on the real control plane and the real registry: the operator's registry
//! GC acts only on VM names it recomputes from the object's own pods. Each test runs the
//! attack from a tenant namespace against a victim namespace's `:hibernate` tag, with the
//! controllers scoped to the tenant's namespace, and shows the tag survive and the
//! `ForeignVMNameIgnored` Warning on the tenant's object. The node side of the set test is the
//! scripted stand-in of `cocoon_testsupport::scripted` (it runs and deletes the pods).

use std::time::Duration;

use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::crd::set::CocoonSet;
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_pod};
use cocoon_operator::{cocoonset, hibernation};
use cocoon_registry::RegistryClient;
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    Script, WAIT, controller, node_actor, nodes, push_tag, registry_client, spec, wait_set,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const FOREIGN: &str = "ForeignVMNameIgnored";
const DELETE_VM_NAMES: &str = "cocoonset.cocoonstack.io/delete-vm-names";
const RECLAIM: &str = "cocoonset.cocoonstack.io/hibernate-reclaim";

/// The Warning messages with `reason` regarding object `name` in `ns`.
async fn warnings(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter_map(|e| e.note)
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for a Warning `reason` on `name` whose message contains `needle`.
async fn wait_warning(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    needle: &str,
) -> Result<Vec<String>, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(
        &format!("{reason} on {name} naming {needle}"),
        WAIT,
        || async {
            let seen = warnings(client, ns, name, reason).await;
            seen.iter().any(|m| m.contains(needle)).then_some(seen)
        },
    )
    .await
}

/// The tenant's set `demo` (main + `replicas` sub-agents) running under the scripted node
/// stand-in and the CocoonSet controller scoped to the tenant's namespace.
struct RunningSet {
    sets: Api<CocoonSet>,
    _nodes: Vec<cocoon_testenv::TestNode>,
    _actor: cocoon_testsupport::scripted::ScriptedNode,
    _controller: cocoon_testsupport::scripted::Controller<cocoonset::Context>,
}

impl RunningSet {
    async fn start(
        client: &Client,
        tenant: &str,
        registry: &str,
        replicas: i32,
    ) -> Result<Self, BoxError> {
        let pool = cocoon_testenv::unique_name("pool");
        let nodes = nodes(client, &pool, 1).await?;
        let actor = node_actor(client, tenant, Script::default());
        let controller =
            controller(client, tenant, registry_client(registry)).sets(cocoonset::Timing {
                wait_for_main: Duration::from_millis(500),
                requeue_after_write: Duration::from_millis(200),
                ..cocoonset::Timing::default()
            });
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), tenant);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, replicas)),
        )
        .await?;
        let agents = u32::try_from(replicas + 1)?;
        wait_set(&sets, "demo", "every agent runs", |cs| {
            cs.status
                .as_ref()
                .is_some_and(|s| s.ready_agents as u32 == agents)
        })
        .await?;
        Ok(RunningSet {
            sets,
            _nodes: nodes,
            _actor: actor,
            _controller: controller,
        })
    }
}

/// The victim's tag `vm` is still in the registry, and the tenant's set `demo` carries a
/// `ForeignVMNameIgnored` Warning for the annotation `source` that names `vm`; returns the
/// set's `ForeignVMNameIgnored` messages.
async fn left_and_reported(
    client: &Client,
    reg: &RegistryClient,
    tenant: &str,
    source: &str,
    vm: &str,
) -> Result<Vec<String>, BoxError> {
    assert!(
        reg.has_manifest(vm, "hibernate").await?,
        "the victim's tag {vm} named in {source} survives"
    );
    let seen = wait_warning(client, tenant, "demo", FOREIGN, source).await?;
    assert!(
        seen.iter().any(|m| m.contains(vm)),
        "the Warning about {source} names {vm}: {seen:?}"
    );
    Ok(seen)
}

/// Patches an annotation nothing reads on the tenant's main pod `demo-0`. The set watch wakes
/// nothing on an annotation-only patch of the set (cocoonset.md §1), but an owned pod's
/// annotation change starts a pass; a wait that needs the controller to look again nudges.
async fn nudge(pods: &Api<Pod>, n: u32) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {"test.cocoon/nudge": n.to_string()}}});
    pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Waits for `what` with `look`, nudging a pass before each look.
async fn nudging<T, F, Fut>(pods: &Api<Pod>, what: &str, mut look: F) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut n = 0u32;
    let seen = cocoon_testenv::wait_until(what, WAIT, || {
        n += 1;
        let next = look();
        async move {
            nudge(pods, n).await.ok()?;
            next.await
        }
    })
    .await?;
    Ok(seen)
}

/// Renames the tenant's pod `pod` to the VM `vm` and waits until the controller has seen it
/// (the set's status lists the pod under that name), so what the test does next is planned
/// with the renamed pod.
async fn rename_pod_seen(
    sets: &Api<CocoonSet>,
    pods: &Api<Pod>,
    pod: &str,
    vm: &str,
) -> Result<(), BoxError> {
    let rename = json!({"metadata": {"annotations": {"vm.cocoonstack.io/name": vm}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&rename))
        .await?;
    nudging(
        pods,
        &format!("the set's status lists {pod} as {vm}"),
        || async {
            let cs = sets.get("demo").await.ok()?;
            cs.status?
                .agents
                .iter()
                .any(|a| a.vm_name == vm)
                .then_some(())
        },
    )
    .await
}

/// A tenant annotates its own set with a victim's VM name (the stash and the reclaim record)
/// and deletes the set: teardown GC collects the set's own tag and leaves the victim's.
#[tokio::test]
async fn set_teardown_leaves_a_foreign_vm_named_in_its_annotations() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let tenant = cocoon_testenv::create_namespace(&client, "gc-tenant").await?;
        let victim = cocoon_testenv::create_namespace(&client, "gc-victim").await?;
        let reg = registry_client(env.registry_addr());
        let victim_vm = vm_name_for_agent(&victim, "demo", 0);
        let victim_sub = vm_name_for_agent(&victim, "demo", 1);
        push_tag(&reg, &victim_vm, "hibernate", "img:1").await?;
        push_tag(&reg, &victim_sub, "hibernate", "img:1").await?;
        let own_vm = vm_name_for_agent(&tenant, "demo", 0);
        push_tag(&reg, &own_vm, "hibernate", "img:1").await?;

        let running = RunningSet::start(&client, &tenant, env.registry_addr(), 0).await?;
        let sets = &running.sets;

        // The attack: the victim's VMs written into the tenant's own set.
        let record = json!({"generation": 1, "vms": [victim_sub]}).to_string();
        let patch = json!({"metadata": {"annotations": {
            "cocoonset.cocoonstack.io/delete-vm-names": victim_vm,
            "cocoonset.cocoonstack.io/hibernate-reclaim": record,
        }}});
        sets.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        sets.delete("demo", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the set is torn down", WAIT, || async {
            sets.get_opt("demo").await.ok()?.is_none().then_some(())
        })
        .await?;

        assert!(
            !reg.has_manifest(&own_vm, "hibernate").await?,
            "the set's own tag is collected"
        );
        left_and_reported(&client, &reg, &tenant, DELETE_VM_NAMES, &victim_vm).await?;
        let seen = left_and_reported(&client, &reg, &tenant, RECLAIM, &victim_sub).await?;
        assert_eq!(
            seen.iter().filter(|m| m.contains(&victim_vm)).count(),
            1,
            "reported once: {seen:?}"
        );
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

/// A tenant rewrites its own sub-agent pod's `vm.cocoonstack.io/name` to a victim's VM, then
/// scales the set down and deletes it: the scale-down stashes the pod's name (the stash is
/// only a list of candidates), and teardown GC collects the set's own tags and leaves the
/// victim's, reporting the name it skipped.
#[tokio::test]
async fn scale_down_of_a_pod_renamed_to_a_foreign_vm_leaves_its_tag() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let tenant = cocoon_testenv::create_namespace(&client, "gc-scaler").await?;
        let victim = cocoon_testenv::create_namespace(&client, "gc-scaled").await?;
        let reg = registry_client(env.registry_addr());
        let victim_sub = vm_name_for_agent(&victim, "demo", 1);
        push_tag(&reg, &victim_sub, "hibernate", "img:1").await?;
        let own_main = vm_name_for_agent(&tenant, "demo", 0);
        let own_sub = vm_name_for_agent(&tenant, "demo", 1);
        push_tag(&reg, &own_main, "hibernate", "img:1").await?;
        push_tag(&reg, &own_sub, "hibernate", "img:1").await?;

        let running = RunningSet::start(&client, &tenant, env.registry_addr(), 1).await?;
        let sets = &running.sets;

        // The attack: the sub-agent pod now names the victim's VM.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
        rename_pod_seen(sets, &pods, "demo-1", &victim_sub).await?;
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"replicas": 0}}})),
        )
        .await?;
        cocoon_testenv::wait_until("the sub-agent pod is gone", WAIT, || async {
            pods.get_opt("demo-1").await.ok()?.is_none().then_some(())
        })
        .await?;
        assert!(
            reg.has_manifest(&victim_sub, "hibernate").await?,
            "the scale-down itself deletes no tag"
        );

        sets.delete("demo", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the set is torn down", WAIT, || async {
            sets.get_opt("demo").await.ok()?.is_none().then_some(())
        })
        .await?;
        for own in [&own_main, &own_sub] {
            assert!(
                !reg.has_manifest(own, "hibernate").await?,
                "the set's own tag {own} is collected"
            );
        }
        // The scale-down stashed the renamed pod's name in delete-vm-names.
        left_and_reported(&client, &reg, &tenant, DELETE_VM_NAMES, &victim_sub).await?;
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The unsuspend reclaim (seed step 10.6) attacked: a tenant records a victim's VM as owed a
/// reclaim and renames its own woken sub-agent pod to that VM, so the VM looks woken. The
/// reclaim reports the name, leaves the victim's tag, and drops the name from the record.
#[tokio::test]
async fn the_unsuspend_reclaim_leaves_a_foreign_vm_recorded_by_a_tenant() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let tenant = cocoon_testenv::create_namespace(&client, "gc-reclaimer").await?;
        let victim = cocoon_testenv::create_namespace(&client, "gc-reclaimed").await?;
        let reg = registry_client(env.registry_addr());
        let victim_sub = vm_name_for_agent(&victim, "demo", 1);
        push_tag(&reg, &victim_sub, "hibernate", "img:1").await?;

        let running = RunningSet::start(&client, &tenant, env.registry_addr(), 1).await?;
        let sets = &running.sets;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
        rename_pod_seen(sets, &pods, "demo-1", &victim_sub).await?;
        let record = json!({"generation": 1, "vms": [victim_sub]}).to_string();
        let patch = json!({"metadata": {"annotations": {
            "cocoonset.cocoonstack.io/hibernate-reclaim": record,
        }}});
        sets.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // The record is an annotation-only patch of the set, which wakes no pass (§1): the
        // next pass for any reason acts on it, here a nudge of an owned pod.
        nudging(&pods, "the foreign name leaves the record", || async {
            let cs = sets.get("demo").await.ok()?;
            (!cs.annotations()
                .get("cocoonset.cocoonstack.io/hibernate-reclaim")
                .is_some_and(|r| r.contains(&victim_sub)))
            .then_some(())
        })
        .await?;
        left_and_reported(&client, &reg, &tenant, RECLAIM, &victim_sub).await?;
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

async fn create_pod(pods: &Api<Pod>, name: &str, vm: &str) -> Result<(), kube::Error> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "vm.cocoonstack.io/name": vm,
            "cocoonset.cocoonstack.io/generation": "1",
            "vm.cocoonstack.io/id": "vm-decoy",
            "vm.cocoonstack.io/lifecycle-state": "ready",
            "vm.cocoonstack.io/lifecycle-observed-generation": "1",
        }},
        "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}],
                 "restartPolicy": "Never"}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await?;
    // Running, as a decoy on an ordinary node would be: the wake path's VMLive.
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "agent", "ready": true, "restartCount": 0, "image": "cocoon/placeholder",
        "imageID": "", "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}
    }]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// A decoy pod in namespace A carrying namespace B's VM name, and a CocoonHibernation on it:
/// waking the CR (the woken VM "runs") and deleting it (with `status.vmName` naming B's VM)
/// leave B's tag.
#[tokio::test]
async fn a_decoy_pod_and_hibernation_leave_another_namespaces_tag() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let tenant = cocoon_testenv::create_namespace(&client, "gc-decoy").await?;
        let victim = cocoon_testenv::create_namespace(&client, "gc-prey").await?;
        let reg = registry_client(env.registry_addr());
        let victim_vm = vm_name_for_pod(&victim, "demo-0");
        push_tag(&reg, &victim_vm, "hibernate", "img:1").await?;

        let _running = controller(&client, &tenant, registry_client(env.registry_addr()))
            .hibernation(hibernation::decide::Timing {
                requeue: Duration::from_millis(500),
                ..hibernation::decide::Timing::default()
            });
        let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &tenant);
        create_pod(&pods, "decoy", &victim_vm).await?;
        let cr = CocoonHibernation::new(
            "decoy",
            CocoonHibernationSpec {
                pod_ref: PodRef {
                    name: "decoy".into(),
                },
                desire: Desire::Wake,
            },
        );
        crs.create(&PostParams::default(), &cr).await?;

        // Without the gate the pass reports Active and drops the "woken" VM's tag.
        let failed = cocoon_testenv::wait_until("the CR reports the decoy", WAIT, || async {
            let cr = crs.get_opt("decoy").await.ok().flatten()?;
            (cr.status.as_ref()?.phase == Some(HibernationPhase::Failed)).then_some(cr)
        })
        .await?;
        let status = failed.status.clone().unwrap_or_default();
        assert_eq!(status.vm_name, "", "the foreign name is never recorded");
        let seen = wait_warning(&client, &tenant, "decoy", FOREIGN, &victim_vm).await?;
        assert!(
            seen[0].starts_with("vm.cocoonstack.io/name: "),
            "names the annotation: {seen:?}"
        );
        assert!(
            reg.has_manifest(&victim_vm, "hibernate").await?,
            "wake left it"
        );
        let pod = pods.get("decoy").await?;
        assert!(
            !pod.annotations()
                .contains_key("vm.cocoonstack.io/hibernate"),
            "the decoy pod is left alone"
        );

        // A status.vmName naming B's VM (an older operator wrote it, or the podRef moved):
        // deleting the CR reports it and leaves the tag.
        crs.patch_status(
            "decoy",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"vmName": victim_vm}})),
        )
        .await?;
        crs.delete("decoy", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the CR is gone", WAIT, || async {
            crs.get_opt("decoy").await.ok()?.is_none().then_some(())
        })
        .await?;
        assert!(
            reg.has_manifest(&victim_vm, "hibernate").await?,
            "deletion left it"
        );
        let seen = wait_warning(&client, &tenant, "decoy", FOREIGN, "status.vmName").await?;
        assert!(seen.iter().any(|m| m.contains(&victim_vm)), "{seen:?}");
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}
