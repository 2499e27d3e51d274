//! The teardown of a CocoonSet with a REAL node agent (`cocoon_testsupport::Agent`, the
//! production node agent on the simulated runtime) and the operator in-process under an
//! identity of its own, so that the API server's audit log counts its writes (issue 36, item
//! 9: teardown deletes only what is still there, each pod once).
//!
//! The agent removes each VM slowly (the simulated `remove` takes a while), so the pods stay
//! terminating across several passes of the operator: every deletion-start and every
//! deletion of a pod wakes one.

use std::time::Duration;

use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy};
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_toolbox};
use cocoon_testenv::{AuditRecord, TestNode};
use cocoon_testsupport::{
    Agent, AgentOptions, AuditedIdentity, BoxError, Operator, OperatorOptions, push_tag,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";

/// The set's teardown writes no more than the plan needs for the objects that exist: the
/// delete stash (one patch of the set), one DELETE per pod present, the finalizer's removal
/// (one patch of the set). No pod is deleted twice, none answers 404, nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_teardown_deletes_each_pod_once_and_writes_no_more_than_the_plan() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-teardown").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        let root = tempfile::tempdir()?;
        let name = cocoon_testenv::unique_name("cst-node");
        let node = TestNode::in_pool(&client, &name, &pool).await?;
        node.wait_schedulable(WAIT).await?;
        let opts = AgentOptions {
            // Each VM takes a while to go: its pod stays terminating across passes.
            tweak: |cfg| cfg.latencies.remove = Duration::from_millis(800),
            ..AgentOptions::fast()
        };
        let agent =
            Agent::start(env.client()?, &name, root.path(), env.registry_addr(), opts).await?;
        let identity = AuditedIdentity::new(env, &client, "cst-operator").await?;
        let _op = Operator::start(
            &identity.client,
            &ns,
            env.registry_addr(),
            OperatorOptions::fast(),
        );
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = cocoon_testsupport::registry(env.registry_addr());

        // Main + 2 sub-agents + 1 toolbox (the bench's set), every :latest kept.
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 2;
        spec.snapshot_policy = SnapshotPolicy::Always;
        spec.toolboxes = vec![cocoon_api::crd::set::ToolboxSpec {
            name: "tb".into(),
            image: "ubuntu:24.04".into(),
            ..Default::default()
        }];
        sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
            .await?;
        cocoon_testsupport::wait_set(&sets, SET, "Running 3/3, toolbox 1/1", WAIT, |cs| {
            cs.status.as_ref().is_some_and(|s| {
                s.phase == Some(CocoonSetPhase::Running)
                    && Some(s.observed_generation) == cs.metadata.generation
                    && s.ready_agents == 3
                    && s.ready_toolboxes == 1
            })
        })
        .await?;
        let main_vm = vm_name_for_agent(&ns, SET, 0);
        push_tag(&reg, &main_vm, "hibernate").await?;
        let present: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(present.len(), 4, "{present:?}");
        // The plan's writes for what exists: the stash, one DELETE per pod, the finalizer.
        let bound = 1 + present.len() + 1;

        let t0 = Timestamp::now();
        sets.delete(SET, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("the set and its pods gone", WAIT, || async {
            let set_gone = matches!(sets.get_opt(SET).await, Ok(None));
            let pods_gone = pods
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty();
            (set_gone && pods_gone).then_some(())
        })
        .await?;
        // Every write the operator made is in the log once its marker read is.
        identity.writes_in(&audit, &ns).await?;
        let writes: Vec<AuditRecord> = audit
            .writes_of(&identity.user, &ns)?
            .into_iter()
            .filter(|w| w.received.is_some_and(|r| r >= t0))
            .collect();
        let shown: Vec<String> = writes
            .iter()
            .map(|w| format!("{} {} {} -> {}", w.verb, w.resource, w.name, w.code))
            .collect();

        let failed: Vec<&String> = shown
            .iter()
            .zip(&writes)
            .filter(|(_, w)| w.code >= 400)
            .map(|(s, _)| s)
            .collect();
        assert!(
            failed.is_empty(),
            "no failed write (a pod already gone is not deleted): {failed:?} of {shown:#?}"
        );
        let mut deleted: Vec<String> = writes
            .iter()
            .filter(|w| w.verb == "delete" && w.resource == "pods")
            .map(|w| w.name.clone())
            .collect();
        deleted.sort();
        let mut want = present.clone();
        want.sort();
        assert_eq!(
            deleted, want,
            "each pod present deleted once, none again while it goes: {shown:#?}"
        );
        assert!(
            writes.len() <= bound,
            "{} writes, the plan needs {bound} (stash, {} pods, finalizer): {shown:#?}",
            writes.len(),
            present.len()
        );

        // Nothing lost: every VM was snapshotted to :latest by the agent before it went, and
        // the registry GC (after the pods were gone) kept those and dropped :hibernate.
        let vms = [
            main_vm.clone(),
            vm_name_for_agent(&ns, SET, 1),
            vm_name_for_agent(&ns, SET, 2),
            vm_name_for_toolbox(&ns, SET, "tb"),
        ];
        for vm in &vms {
            assert!(reg.has_manifest(vm, "latest").await?, "{vm}:latest kept");
        }
        assert!(
            !reg.has_manifest(&main_vm, "hibernate").await?,
            "{main_vm}:hibernate deleted"
        );
        assert!(agent.vms().await.is_empty(), "no VM left on the node");

        let mut agent = agent;
        agent.stop().await;
        drop(node);
        identity.delete(&client).await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
