//! Issue 35 item 5 end to end: a CocoonSet's main migrates from node A to node B with two real
//! node agents (in-process `run_agent` on the simulated runtime) and the operator's controllers,
//! each reaching the registry (docker-registry 2.8 with `auth.token`) only through the registry
//! token service with its own Kubernetes identity: node A pushes the main's `:hibernate` while
//! the main is bound to A, node B pulls it once the migration bound the new main to B, and the
//! operator deletes it after the wake. Which repositories each identity reaches is held in
//! crates/cocoon-operator/tests/registry_token.rs.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::registry::OciTagRegistry;
use cocoon_testsupport::registry_token::{TokenRegistry, sa_token};
use cocoon_testsupport::{Agent, AgentOptions, Operator, OperatorOptions, node_of, wait_set};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";
const MAIN: &str = "demo-0";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_with_token_auth_carries_the_state_from_a_to_b() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "rt-mig").await?;
        let nodes_ns = cocoon_testenv::create_namespace(&client, "rt-mig-nodes").await?;
        let ops_ns = cocoon_testenv::create_namespace(&client, "rt-mig-ops").await?;
        let pool = cocoon_testenv::unique_name("rtpool");
        let op_token = sa_token(&client, &ops_ns, "cocoon-operator").await?;
        let tr = TokenRegistry::start(
            &client,
            &[
                ("REGISTRY_TOKEN_NODE_SA_NAMESPACE", nodes_ns.clone()),
                (
                    "REGISTRY_TOKEN_OPERATOR_USERS",
                    format!("system:serviceaccount:{ops_ns}:cocoon-operator"),
                ),
            ],
        )
        .await?;
        let (mut nodes, mut agents, mut roots) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..2 {
            let name = cocoon_testenv::unique_name(&format!("rt-mig-{i}"));
            nodes.push(cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?);
            // Each agent's registry identity: the ServiceAccount named like its node.
            let token = sa_token(&client, &nodes_ns, &name).await?;
            let root = tempfile::tempdir()?;
            let opts = AgentOptions {
                registry: Some(tr.client_as(Some(&token))?),
                ..AgentOptions::fast()
            };
            agents.push(Agent::start(env.client()?, &name, root.path(), &tr.base(), opts).await?);
            roots.push(root);
        }
        let (a, b) = (agents[0].node.clone(), agents[1].node.clone());
        let tags = Arc::new(OciTagRegistry::new(tr.client_as(Some(&op_token))?));
        let mut opts = OperatorOptions::fast();
        opts.sets.migrate_poll = Duration::from_millis(500);
        let operator = Operator::start_with_tags(&client, &ns, tags, opts);

        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 0;
        spec.node_name = a.clone();
        sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
            .await?;
        let main_vm = vm_name_for_agent(&ns, SET, 0);
        let sim_a = agents[0].sim.clone();
        let token = cocoon_testenv::wait_until(&format!("{main_vm} running on {a}"), WAIT, || {
            let (sim, vm) = (sim_a.clone(), main_vm.clone());
            async move { sim.guest_token(&vm).ok() }
        })
        .await?;

        // The migration: pin the set to B.
        sets.patch(
            SET,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"nodeName": b}})),
        )
        .await?;
        let sim_b = agents[1].sim.clone();
        cocoon_testenv::wait_until(&format!("{main_vm} running on {b}"), WAIT, || {
            let (sim, vm) = (sim_b.clone(), main_vm.clone());
            async move { sim.guest_token(&vm).ok() }
        })
        .await?;
        assert_eq!(
            sim_b.guest_token(&main_vm)?,
            token,
            "the main runs on B with the state it had on A (B pulled A's snapshot)"
        );
        wait_set(&sets, SET, "Running on the target", WAIT, |cs| {
            cs.status.as_ref().is_some_and(|s| {
                s.phase == Some(CocoonSetPhase::Running)
                    && Some(s.observed_generation) == cs.metadata.generation
                    && s.ready_agents == 1
            })
        })
        .await?;
        assert_eq!(node_of(&pods.get(MAIN).await?), b);
        // The operator, with its own identity, dropped the snapshot after the wake.
        let operator_reg = tr.client_as(Some(&op_token))?;
        cocoon_testenv::wait_until(&format!("{main_vm}:hibernate dropped"), WAIT, || {
            let reg = operator_reg.clone();
            let vm = main_vm.clone();
            async move { matches!(reg.has_manifest(&vm, "hibernate").await, Ok(false)).then_some(()) }
        })
        .await?;
        operator.kill().await;
        for agent in &mut agents {
            agent.stop().await;
        }
        for n in nodes {
            n.delete().await?;
        }
        drop(roots);
        Ok::<(), BoxError>(())
    })
    .await;
}
