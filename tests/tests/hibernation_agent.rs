//! The CocoonHibernation controller end to end with the REAL node agent: the agent runs
//! in-process on the simulated runtime, against the real control plane and the real registry,
//! and the controller (scoped to the test namespace) drives it only through the pod's
//! `vm.cocoonstack.io/hibernate` annotation. Nothing here writes what the node side writes.

use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::hibernation::decide::Timing;
use cocoon_registry::RegistryClient;
use cocoon_testenv::{Shared, TestNode, create_namespace, delete_namespace, run_test, unique_name};
use cocoon_testsupport::{Agent, AgentOptions, Operator, OperatorOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const FINALIZER: &str = "cocoonhibernation.cocoonset.cocoonstack.io/finalizer";

fn registry(env: &Shared) -> RegistryClient {
    cocoon_testsupport::registry(env.registry_addr())
}

/// The real controllers scoped to `ns`, the CocoonHibernation one re-checking every 500 ms.
fn start_controller(client: &Client, ns: &str, env: &Shared) -> Operator {
    Operator::start(
        client,
        ns,
        env.registry_addr(),
        OperatorOptions {
            hibernation: Timing {
                requeue: Duration::from_millis(500),
                ..Timing::default()
            },
            ..OperatorOptions::default()
        },
    )
}

/// A managed VM pod bound to `node`, exactly as the CocoonSet controller would create it.
fn vm_pod(ns: &str, name: &str, node: &str) -> Pod {
    cocoon_testsupport::vm_pod(ns, name, node, &[(ann::SNAPSHOT_POLICY, "never")])
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.annotations().get(key).cloned()
}

fn container_running(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        })
}

/// Waits until the agent reports the pod's VM up: id written, container running, `ready`.
async fn wait_vm_running(pods: &Api<Pod>, name: &str) -> Result<Pod, cocoon_testenv::Error> {
    cocoon_testenv::poll(&format!("{name} VM running"), WAIT, || async {
        let Ok(p) = pods.get(name).await else {
            return cocoon_testenv::Probe::NotYet("pod not readable".into());
        };
        let lc = Lifecycle::from_meta(&p.metadata);
        if annotation(&p, ann::VM_ID).is_some()
            && container_running(&p)
            && lc.state == Some(LifecycleState::Ready)
        {
            cocoon_testenv::Probe::Ready(p)
        } else {
            cocoon_testenv::Probe::NotYet(format!(
                "annotations={:?} status={:?}",
                p.metadata.annotations,
                p.status.as_ref().map(|s| (&s.phase, &s.container_statuses))
            ))
        }
    })
    .await
}

async fn wait_phase(
    crs: &Api<CocoonHibernation>,
    name: &str,
    phase: HibernationPhase,
) -> Result<CocoonHibernation, cocoon_testenv::Error> {
    cocoon_testenv::poll(&format!("{name} reaches {phase}"), WAIT, || async {
        match crs.get_opt(name).await {
            Ok(Some(cr)) if cr.status.as_ref().and_then(|s| s.phase) == Some(phase) => {
                cocoon_testenv::Probe::Ready(cr)
            }
            Ok(Some(cr)) => cocoon_testenv::Probe::NotYet(format!("status {:?}", cr.status)),
            Ok(None) => cocoon_testenv::Probe::NotYet("CR absent".into()),
            Err(e) => cocoon_testenv::Probe::NotYet(e.to_string()),
        }
    })
    .await
}

async fn wait_tag(
    reg: &RegistryClient,
    vm: &str,
    present: bool,
) -> Result<(), cocoon_testenv::Error> {
    let what = format!("{vm}:hibernate present={present}");
    cocoon_testenv::wait_until(&what, WAIT, || async {
        (reg.has_manifest(vm, "hibernate").await.ok()? == present).then_some(())
    })
    .await
}

fn hibernation_cr(name: &str, pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
        },
    )
}

fn ready_condition(cr: &CocoonHibernation) -> Option<(String, String)> {
    cr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// The CR drives a real hibernate (snapshot pushed as `:hibernate`, VM removed, lifecycle
/// `hibernated`), then a real wake (fresh VM, same guest state), and drops the tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cr_hibernates_and_wakes_a_real_agent_pod() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "cha-round").await?;
        let tmp = tempfile::tempdir()?;
        let node_name = unique_name("cha-node");
        let node =
            TestNode::create(&client, &node_name, [("cocoon-test", "hibernation-agent")]).await?;
        let mut agent = Agent::start(
            env.client()?,
            &node_name,
            &tmp.path().join("root"),
            env.registry_addr(),
            AgentOptions::fast(),
        )
        .await?;
        let stop = start_controller(&client, &ns, env);
        let reg = registry(env);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);

        pods.create(&PostParams::default(), &vm_pod(&ns, "demo-0", &node_name))
            .await?;
        let pod = wait_vm_running(&pods, "demo-0").await?;
        let vm = vm_name_for_pod(&ns, "demo-0");
        let first_id = annotation(&pod, ann::VM_ID).expect("VM id");
        let token = agent.sim.guest_token(&vm)?;
        assert!(
            !reg.has_manifest(&vm, "hibernate").await?,
            "no :hibernate tag before the CR asks for one"
        );

        // Hibernate.
        crs.create(
            &PostParams::default(),
            &hibernation_cr("demo-0", "demo-0", Desire::Hibernate),
        )
        .await?;
        let cr = wait_phase(&crs, "demo-0", HibernationPhase::Hibernated).await?;
        assert!(cr.finalizers().iter().any(|f| f == FINALIZER));
        assert_eq!(
            cr.status.as_ref().map(|s| s.vm_name.as_str()),
            Some(vm.as_str()),
            "status.vmName names the pod's VM"
        );
        assert_eq!(
            ready_condition(&cr),
            Some(("True".to_owned(), "Hibernated".to_owned())),
            "Ready is True once Hibernated"
        );
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the agent pushed <vm>:hibernate to the registry"
        );
        let pod = pods.get("demo-0").await?;
        let lc = Lifecycle::from_meta(&pod.metadata);
        assert_eq!(
            lc.state,
            Some(LifecycleState::Hibernated),
            "lifecycle hibernated"
        );
        assert_eq!(
            annotation(&pod, ann::HIBERNATE).as_deref(),
            Some("true"),
            "the controller set the hibernate annotation"
        );
        assert_eq!(annotation(&pod, ann::VM_ID), None, "VM id cleared");
        assert!(agent.sim.vm_info(&vm).is_err(), "the VM was removed");

        // Wake.
        crs.patch(
            "demo-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"desire": Desire::Wake.as_str()}})),
        )
        .await?;
        let cr = wait_phase(&crs, "demo-0", HibernationPhase::Active).await?;
        assert_eq!(
            cr.status.as_ref().map(|s| s.observed_generation),
            cr.metadata.generation,
            "Active at the current generation"
        );
        assert_eq!(
            ready_condition(&cr),
            Some(("True".to_owned(), "Active".to_owned())),
            "Ready is True once Active"
        );
        let pod = pods.get("demo-0").await?;
        assert_eq!(
            annotation(&pod, ann::HIBERNATE),
            None,
            "the hibernate annotation is gone"
        );
        assert!(container_running(&pod), "the container runs again");
        let woken_id = annotation(&pod, ann::VM_ID).expect("woken VM id");
        assert_ne!(woken_id, first_id, "the wake is a fresh VM");
        assert_eq!(
            agent.sim.vm_info(&vm)?.id,
            woken_id,
            "the annotated id is the runtime's"
        );
        assert_eq!(
            agent.sim.guest_token(&vm)?,
            token,
            "guest state survives hibernate and wake"
        );
        wait_tag(&reg, &vm, false).await?;

        crs.delete("demo-0", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the CR is gone", WAIT, || async {
            crs.get_opt("demo-0").await.ok()?.is_none().then_some(())
        })
        .await?;
        drop(stop);
        agent.stop().await;
        delete_namespace(&client, &ns).await?;
        node.delete().await?;
        Ok::<_, cocoon_testsupport::BoxError>(())
    })
    .await;
}

/// Deleting a Hibernated CR garbage-collects the `:hibernate` tag the agent pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_cr_collects_the_hibernate_tag() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "cha-gc").await?;
        let tmp = tempfile::tempdir()?;
        let node_name = unique_name("cha-node");
        let node =
            TestNode::create(&client, &node_name, [("cocoon-test", "hibernation-agent")]).await?;
        let mut agent = Agent::start(
            env.client()?,
            &node_name,
            &tmp.path().join("root"),
            env.registry_addr(),
            AgentOptions::fast(),
        )
        .await?;
        let stop = start_controller(&client, &ns, env);
        let reg = registry(env);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);

        pods.create(&PostParams::default(), &vm_pod(&ns, "gc-0", &node_name))
            .await?;
        wait_vm_running(&pods, "gc-0").await?;
        let vm = vm_name_for_pod(&ns, "gc-0");

        crs.create(
            &PostParams::default(),
            &hibernation_cr("gc-0", "gc-0", Desire::Hibernate),
        )
        .await?;
        wait_phase(&crs, "gc-0", HibernationPhase::Hibernated).await?;
        assert!(
            reg.has_manifest(&vm, "hibernate").await?,
            "the agent pushed <vm>:hibernate"
        );

        crs.delete("gc-0", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the CR is gone (finalizer removed)", WAIT, || async {
            crs.get_opt("gc-0").await.ok()?.is_none().then_some(())
        })
        .await?;
        assert!(
            !reg.has_manifest(&vm, "hibernate").await?,
            "deleting the last CR of the VM dropped <vm>:hibernate"
        );
        let pod = pods.get("gc-0").await?;
        assert_eq!(
            Lifecycle::from_meta(&pod.metadata).state,
            Some(LifecycleState::Hibernated),
            "the pod itself stays hibernated"
        );

        drop(stop);
        agent.stop().await;
        delete_namespace(&client, &ns).await?;
        node.delete().await?;
        Ok::<_, cocoon_testsupport::BoxError>(())
    })
    .await;
}
