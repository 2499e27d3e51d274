//! Issue 35 item 2 on the real control plane and the real registry: a VM name that collides
//! with another namespace's (the 24-bit hash of shortened names) never lets the operator
//! delete that namespace's artifact. The victim's `:hibernate` records its owner; the
//! tenant's set owns, by name, a toolbox whose VM name is the victim's, names it in
//! `delete-vm-names` and is deleted: the victim's tag survives with its digest, the set's own
//! tag is collected, and a `ForeignSnapshotIgnored` Warning on the set names both. The same
//! holds for a CocoonHibernation whose pod's VM name collides, deleted with it recorded.
//!
//! The colliding pair is found at test time for this run's namespaces (they are unique per
//! run): both share their first 26 characters and both pod names end in the same 26
//! characters, so the VM names differ only in the 6-hex hash; a birthday search over
//! victim pod names and tenant set names finds one in a few thousand hashes.

use std::collections::HashMap;
use std::time::Duration;

use cocoon_api::contract::oci::{
    ANNOTATION_OWNER_NAMESPACE, ANNOTATION_OWNER_NAMESPACE_UID, ANNOTATION_OWNER_POD,
};
use cocoon_api::crd::set::{CocoonSet, ToolboxSpec};
use cocoon_api::naming::{MAX_NAME_LEN, vm_name_for_agent, vm_name_for_pod};
use cocoon_operator::cocoonset;
use cocoon_registry::{Reference, RegistryClient};
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted::{
    Script, WAIT, controller, node_actor, nodes, push_snapshot_tag, registry_client, spec, wait_set,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const FOREIGN_SNAPSHOT: &str = "ForeignSnapshotIgnored";
/// The last 26 characters both pod names share (the kept tail of a shortened VM name).
const TAIL: &str = "lytics-warehouse-primary-0";

/// A colliding pair for namespaces `victim_ns` and `tenant_ns`: the victim's pod
/// `v<i>-<TAIL>` and the tenant's set `t<j>` whose toolbox `<TAIL>` is pod `t<j>-<TAIL>`.
fn colliding_pair(victim_ns: &str, tenant_ns: &str) -> Option<(String, String, String)> {
    let victims: HashMap<String, String> = (0..16_384u32)
        .map(|i| {
            let pod = format!("v{i:x}-{TAIL}");
            (vm_name_for_pod(victim_ns, &pod), pod)
        })
        .collect();
    (0..1_048_576u32).find_map(|j| {
        let set = format!("t{j:x}");
        let vm = vm_name_for_pod(tenant_ns, &format!("{set}-{TAIL}"));
        victims.get(&vm).map(|pod| (vm.clone(), pod.clone(), set))
    })
}

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

async fn digest(reg: &RegistryClient, vm: &str) -> Result<Option<String>, BoxError> {
    Ok(reg
        .head_manifest(vm, &Reference::parse("hibernate")?)
        .await?
        .and_then(|h| h.digest)
        .map(|d| d.to_string()))
}

#[tokio::test]
async fn a_colliding_toolbox_of_another_namespace_never_deletes_the_victims_tag() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        // 26 shared characters: the kept head of both VM names.
        let victim =
            cocoon_testenv::create_namespace(&client, "owner-collision-namespaces-v").await?;
        let tenant =
            cocoon_testenv::create_namespace(&client, "owner-collision-namespaces-t").await?;
        let (vm, victim_pod, set) =
            colliding_pair(&victim, &tenant).ok_or("no colliding pair found")?;
        let tenant_pod = format!("{set}-{TAIL}");
        assert_eq!(vm.len(), MAX_NAME_LEN, "a shortened name: {vm}");
        assert_eq!(vm, vm_name_for_pod(&victim, &victim_pod));
        assert_eq!(
            vm,
            vm_name_for_pod(&tenant, &tenant_pod),
            "the pair collides"
        );

        // The victim: a suspended pod's `:hibernate`, recording its owner.
        let victim_uid = Api::<Namespace>::all(client.clone())
            .get(&victim)
            .await?
            .uid()
            .ok_or("namespace uid")?;
        let reg = registry_client(env.registry_addr());
        push_snapshot_tag(
            &reg,
            &vm,
            "hibernate",
            "img:1",
            &[
                (ANNOTATION_OWNER_NAMESPACE, victim.as_str()),
                (ANNOTATION_OWNER_POD, victim_pod.as_str()),
                (ANNOTATION_OWNER_NAMESPACE_UID, victim_uid.as_str()),
            ],
        )
        .await?;
        let before = digest(&reg, &vm).await?.ok_or("victim tag pushed")?;
        // The tenant's own main records the tenant: its teardown collects it.
        let own_main = vm_name_for_agent(&tenant, &set, 0);
        let own_pod = format!("{set}-0");
        push_snapshot_tag(
            &reg,
            &own_main,
            "hibernate",
            "img:1",
            &[
                (ANNOTATION_OWNER_NAMESPACE, tenant.as_str()),
                (ANNOTATION_OWNER_POD, own_pod.as_str()),
            ],
        )
        .await?;

        // The tenant's set, with the colliding toolbox, under the scripted node stand-in.
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let _actor = node_actor(&client, &tenant, Script::default());
        let _controller = controller(&client, &tenant, registry_client(env.registry_addr())).sets(
            cocoonset::Timing {
                wait_for_main: Duration::from_millis(500),
                requeue_after_write: Duration::from_millis(200),
                ..cocoonset::Timing::default()
            },
        );
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &tenant);
        let mut s = spec(&pool, 0);
        s.toolboxes = vec![ToolboxSpec {
            name: TAIL.into(),
            image: "ghcr.io/cocoonstack/cocoon/ubuntu:24.04".into(),
            ..ToolboxSpec::default()
        }];
        sets.create(&PostParams::default(), &CocoonSet::new(&set, s))
            .await?;
        wait_set(&sets, &set, "the main and the toolbox run", |cs| {
            cs.status
                .as_ref()
                .is_some_and(|st| st.ready_agents == 1 && st.ready_toolboxes == 1)
        })
        .await?;

        // The attack: the colliding name in the stash, then the set deleted.
        let patch = json!({"metadata": {"annotations": {
            "cocoonset.cocoonstack.io/delete-vm-names": vm,
        }}});
        sets.patch(&set, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        sets.delete(&set, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the set is torn down", WAIT, || async {
            sets.get_opt(&set).await.ok()?.is_none().then_some(())
        })
        .await?;

        assert!(
            !reg.has_manifest(&own_main, "hibernate").await?,
            "the set's own tag (recording the set's pod) is collected"
        );
        assert_eq!(
            digest(&reg, &vm).await?,
            Some(before),
            "the victim's :hibernate survives unchanged"
        );
        let seen = cocoon_testenv::wait_until(
            "a ForeignSnapshotIgnored Warning naming both",
            WAIT,
            || async {
                let seen = warnings(&client, &tenant, &set, FOREIGN_SNAPSHOT).await;
                seen.iter()
                    .any(|m| {
                        m.contains(&format!("{victim}/{victim_pod}"))
                            && m.contains(&format!("{tenant}/{tenant_pod}"))
                            && m.contains(&vm)
                    })
                    .then_some(seen)
            },
        )
        .await?;
        assert_eq!(seen.len(), 1, "reported once: {seen:?}");
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}

/// The CocoonHibernation side: a tenant's CR whose pod's VM name collides with the victim's
/// (so the name gate passes), deleted with that name in `status.vmName`, leaves the victim's
/// tag and reports it.
#[tokio::test]
async fn deleting_a_colliding_hibernation_never_deletes_the_victims_tag() {
    use cocoon_api::crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
    use cocoon_operator::hibernation;
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let victim =
            cocoon_testenv::create_namespace(&client, "owner-collision-namespaces-v").await?;
        let tenant =
            cocoon_testenv::create_namespace(&client, "owner-collision-namespaces-t").await?;
        let (vm, victim_pod, set) =
            colliding_pair(&victim, &tenant).ok_or("no colliding pair found")?;
        let tenant_pod = format!("{set}-{TAIL}");
        assert_eq!(
            vm,
            vm_name_for_pod(&tenant, &tenant_pod),
            "the pair collides"
        );
        let reg = registry_client(env.registry_addr());
        push_snapshot_tag(
            &reg,
            &vm,
            "hibernate",
            "img:1",
            &[
                (ANNOTATION_OWNER_NAMESPACE, victim.as_str()),
                (ANNOTATION_OWNER_POD, victim_pod.as_str()),
            ],
        )
        .await?;
        let before = digest(&reg, &vm).await?.ok_or("victim tag pushed")?;

        let _running = controller(&client, &tenant, registry_client(env.registry_addr()))
            .hibernation(hibernation::decide::Timing {
                requeue: Duration::from_millis(500),
                ..hibernation::decide::Timing::default()
            });
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &tenant);
        let cr = CocoonHibernation::new(
            "h",
            CocoonHibernationSpec {
                pod_ref: PodRef {
                    name: tenant_pod.clone(),
                },
                desire: Desire::Hibernate,
            },
        );
        crs.create(&PostParams::default(), &cr).await?;
        cocoon_testenv::wait_until("the controller holds the CR", WAIT, || async {
            let cr = crs.get_opt("h").await.ok().flatten()?;
            (!cr.finalizers().is_empty()).then_some(())
        })
        .await?;
        crs.patch_status(
            "h",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"vmName": vm}})),
        )
        .await?;
        crs.delete("h", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the CR is gone", WAIT, || async {
            crs.get_opt("h").await.ok()?.is_none().then_some(())
        })
        .await?;
        assert_eq!(
            digest(&reg, &vm).await?,
            Some(before),
            "the victim's :hibernate survives unchanged"
        );
        let seen = cocoon_testenv::wait_until(
            "a ForeignSnapshotIgnored Warning naming both",
            WAIT,
            || async {
                let seen = warnings(&client, &tenant, "h", FOREIGN_SNAPSHOT).await;
                seen.iter()
                    .any(|m| {
                        m.contains(&format!("{victim}/{victim_pod}"))
                            && m.contains(&format!("{tenant}/{tenant_pod}"))
                    })
                    .then_some(seen)
            },
        )
        .await?;
        assert_eq!(seen.len(), 1, "reported once: {seen:?}");
        for ns in [&tenant, &victim] {
            cocoon_testenv::delete_namespace(&client, ns).await?;
        }
        Ok::<_, BoxError>(())
    })
    .await;
}
