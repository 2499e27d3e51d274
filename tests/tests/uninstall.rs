//! Issue 36 item 5: uninstalling strands finalizers unless the objects go first. README
//! "Uninstalling" says: delete the CocoonSets and CocoonHibernations while the operator runs,
//! wait, then uninstall; with the operator already gone, strip the finalizers with a JSON patch,
//! which leaves their snapshot tags in the registry. Both halves, on the real control plane (its
//! namespace controller and garbage collector), the real registry, the real controllers and a
//! real node agent on the simulated runtime:
//!
//! * a namespace holding a Running CocoonSet, a Suspended one and a Hibernated
//!   CocoonHibernation deletes cleanly while the operator runs: the namespace goes, the
//!   suspended set's `:hibernate` tag and the hibernation's are collected, and the `:latest` the
//!   agent pushes when the Running set's main is deleted stays (its `snapshotPolicy` keeps it);
//! * with the operator stopped the same kind of namespace hangs (`NamespaceFinalizersRemaining`),
//!   and the README's `kubectl patch ... --type=json` on each object frees it; the set's
//!   `:hibernate` tag stays behind, as the README warns.

use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::finalizers;
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy};
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_pod};
use cocoon_operator::hibernation::decide::Timing;
use cocoon_registry::RegistryClient;
use cocoon_testenv::{Shared, TestNode, unique_name, wait_until};
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions, push_tag};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
/// The README's patch that strips an object's finalizers.
const STRIP_FINALIZERS: &str = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;

/// Both controllers scoped to `ns`, with the short requeues tests use.
fn operator(client: &Client, ns: &str, env: &Shared) -> Operator {
    let mut opts = OperatorOptions::fast();
    opts.hibernation = Timing {
        requeue: Duration::from_millis(500),
        ..Timing::default()
    };
    Operator::start(client, ns, env.registry_addr(), opts)
}

fn hibernation(name: &str, pod: &str) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire: Desire::Hibernate,
        },
    )
}

async fn has_tag(reg: &RegistryClient, vm: &str, tag: &str) -> Result<bool, BoxError> {
    Ok(reg.has_manifest(vm, tag).await?)
}

/// Waits until the namespace no longer exists.
async fn wait_namespace_gone(client: &Client, ns: &str) -> Result<(), BoxError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    wait_until(&format!("namespace {ns} gone"), WAIT, || async {
        namespaces.get_opt(ns).await.ok()?.is_none().then_some(())
    })
    .await?;
    Ok(())
}

/// Waits until `get` finds the object carrying `finalizer`.
async fn wait_finalizer<K>(api: &Api<K>, name: &str, finalizer: &str) -> Result<K, BoxError>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(
        wait_until(&format!("{name} carries {finalizer}"), WAIT, || async {
            let o = api.get_opt(name).await.ok()??;
            o.finalizers().iter().any(|f| f == finalizer).then_some(o)
        })
        .await?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_with_a_set_and_a_hibernation_deletes_cleanly_while_the_operator_runs() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "uninstall-clean").await?;
        let pool = unique_name("pool");
        let tmp = tempfile::tempdir()?;
        let node_name = unique_name("uninstall-node");
        let node = TestNode::in_pool(&client, &node_name, &pool).await?;
        node.wait_schedulable(WAIT).await?;
        let mut agent = Agent::start(
            env.client()?,
            &node_name,
            &tmp.path().join("root"),
            env.registry_addr(),
            AgentOptions::fast(),
        )
        .await?;
        let op = operator(&client, &ns, env);
        let reg = cocoon_testsupport::registry(env.registry_addr());
        let result = clean_scenario(&client, &ns, &pool, &node_name, &reg).await;
        op.stop().await;
        agent.stop().await;
        let _ = cocoon_testenv::delete_namespace(&client, &ns).await;
        node.delete().await?;
        result
    })
    .await;
}

async fn clean_scenario(
    client: &Client,
    ns: &str,
    pool: &str,
    node: &str,
    reg: &RegistryClient,
) -> Result<(), BoxError> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let chs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);

    // Two CocoonSets on the real agent, main only, snapshotPolicy main-only: `live` stays
    // Running, `sleepy` is suspended (the agent pushes its main's `:hibernate`).
    for name in ["live", "sleepy"] {
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.to_string();
        spec.snapshot_policy = SnapshotPolicy::MainOnly;
        spec.agent.mode = AgentMode::Run;
        sets.create(&PostParams::default(), &CocoonSet::new(name, spec))
            .await?;
    }
    for name in ["live", "sleepy"] {
        wait_until(
            &format!("{name} Running with its main's VM"),
            WAIT,
            || async {
                let cs = sets.get_opt(name).await.ok()??;
                let st = cs.status.as_ref()?;
                (st.phase == Some(CocoonSetPhase::Running)
                    && st.agents.iter().any(|a| !a.vm_id.is_empty())
                    && cs.finalizers().iter().any(|f| f == finalizers::COCOONSET))
                .then_some(())
            },
        )
        .await?;
    }
    sets.patch(
        "sleepy",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": true}})),
    )
    .await?;
    wait_until("sleepy Suspended", WAIT, || async {
        let cs = sets.get_opt("sleepy").await.ok()??;
        (cs.status.as_ref()?.phase == Some(CocoonSetPhase::Suspended)).then_some(())
    })
    .await?;
    let live_main = vm_name_for_agent(ns, "live", 0);
    let sleepy_main = vm_name_for_agent(ns, "sleepy", 0);
    assert!(
        has_tag(reg, &sleepy_main, "hibernate").await?,
        "the agent pushed {sleepy_main}:hibernate on suspend"
    );

    // A VM pod the real agent runs, hibernated by a CocoonHibernation (its :hibernate pushed).
    pods.create(
        &PostParams::default(),
        &cocoon_testsupport::vm_pod(ns, "solo-0", node, &[(ann::SNAPSHOT_POLICY, "never")]),
    )
    .await?;
    let solo_vm = vm_name_for_pod(ns, "solo-0");
    chs.create(&PostParams::default(), &hibernation("solo-0", "solo-0"))
        .await?;
    wait_until("solo-0 Hibernated", WAIT, || async {
        let cr = chs.get_opt("solo-0").await.ok()??;
        (cr.status.as_ref()?.phase == Some(HibernationPhase::Hibernated)).then_some(())
    })
    .await?;
    wait_finalizer(&chs, "solo-0", finalizers::COCOONHIBERNATION).await?;
    assert!(
        has_tag(reg, &solo_vm, "hibernate").await?,
        "the agent pushed it"
    );

    // Delete the whole namespace, operator running.
    Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await?;
    wait_namespace_gone(client, ns).await?;

    assert!(
        !has_tag(reg, &sleepy_main, "hibernate").await?,
        "the suspended set's deletion collected {sleepy_main}:hibernate"
    );
    assert!(
        !has_tag(reg, &solo_vm, "hibernate").await?,
        "the hibernation's deletion collected {solo_vm}:hibernate"
    );
    assert!(
        has_tag(reg, &live_main, "latest").await?,
        "the agent's delete snapshot {live_main}:latest stays (main-only keeps the main's)"
    );
    // Leave the shared registry as found.
    for vm in [&live_main, &sleepy_main] {
        reg.delete_tag_if_present(vm, "latest").await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_operator_gone_the_documented_patch_frees_a_terminating_namespace() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "uninstall-stuck").await?;
        let reg = cocoon_testsupport::registry(env.registry_addr());
        let result = stuck_scenario(env, &client, &ns, &reg).await;
        let _ = cocoon_testenv::delete_namespace(&client, &ns).await;
        result
    })
    .await;
}

async fn stuck_scenario(
    env: &Shared,
    client: &Client,
    ns: &str,
    reg: &RegistryClient,
) -> Result<(), BoxError> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let chs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // The operator adds its finalizers (the set's pool has no node, so it stays Pending; the
    // hibernation's pod does not exist), then goes away, as after `helm uninstall`.
    let op = operator(client, ns, env);
    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = unique_name("nowhere");
    sets.create(&PostParams::default(), &CocoonSet::new("stuck", spec))
        .await?;
    chs.create(&PostParams::default(), &hibernation("stuck", "no-such-pod"))
        .await?;
    wait_finalizer(&sets, "stuck", finalizers::COCOONSET).await?;
    wait_finalizer(&chs, "stuck", finalizers::COCOONHIBERNATION).await?;
    op.stop().await;
    let main_vm = vm_name_for_agent(ns, "stuck", 0);
    push_tag(reg, &main_vm, "hibernate").await?;

    // Deleting the namespace now hangs: the namespace controller reports the finalizers left.
    namespaces.delete(ns, &DeleteParams::default()).await?;
    let remaining = wait_until(
        "the namespace reports finalizers remaining",
        WAIT,
        || async {
            let n = namespaces.get_opt(ns).await.ok()??;
            n.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "NamespaceFinalizersRemaining" && c.status == "True")
                .and_then(|c| c.message)
        },
    )
    .await?;
    assert!(
        remaining.contains(finalizers::COCOONSET)
            && remaining.contains(finalizers::COCOONHIBERNATION),
        "{remaining}"
    );
    let cs = sets.get("stuck").await?;
    assert!(
        cs.metadata.deletion_timestamp.is_some(),
        "the set is Terminating"
    );
    assert!(
        chs.get("stuck")
            .await?
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // The README's recovery, verbatim: kubectl patch with the JSON patch on each object.
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )?;
    for resource in ["cocoonset", "cocoonhibernation"] {
        let documented = format!(
            "kubectl -n <namespace> patch {resource} <name> --type=json -p '{STRIP_FINALIZERS}'"
        );
        assert!(readme.contains(&documented), "README shows {documented}");
    }
    for (resource, name) in [("cocoonset", "stuck"), ("cocoonhibernation", "stuck")] {
        let out = env
            .kubectl()
            .args(["-n", ns, "patch", resource, name, "--type=json", "-p"])
            .arg(STRIP_FINALIZERS)
            .output()?;
        assert!(
            out.status.success(),
            "kubectl patch {resource} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_namespace_gone(client, ns).await?;

    // Nothing collected the set's tag: it stays in the registry, as the README warns.
    assert!(
        has_tag(reg, &main_vm, "hibernate").await?,
        "{main_vm}:hibernate stays after the finalizers were stripped"
    );
    reg.delete_tag_if_present(&main_vm, "hibernate").await?;
    Ok(())
}
