//! The CocoonSet controller's create path waits on nothing but watch events: with every
//! requeue interval it has (`requeue_after_write`, `wait_for_main`, the suspend and migrate
//! polls) set to an hour, a set of main + 2 sub-agents + 1 toolbox still goes from its POST to
//! `Running` with REAL node agents (in-process, simulated runtime): each pass that changed
//! something is followed by the watch event of its own change, or goes on in the same pass
//! where no event would come (the finalizer, an annotation-only change of the set, wakes no
//! watch). A pass that ended on a requeue where no event follows would hold the set for the
//! hour and the wait below would run out.
//!
//! The same holds for the cross-node migration of the main (issue 36 item 7): fifty migrations
//! back and forth between two real node agents, each settled on its target well within the
//! hour, so no step of any of them waited for the migrate poll.

use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, ToolboxSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::cocoonset::Timing;
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions, registry};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const HOUR: Duration = Duration::from_secs(3600);
/// Migrations in a row (`COCOON_EVENT_MIGRATIONS` overrides).
const MIGRATIONS: usize = 50;

/// Production rules with every requeue interval of the CocoonSet controller set to an hour.
fn event_driven() -> OperatorOptions {
    OperatorOptions {
        sets: Timing {
            requeue_after_write: HOUR,
            wait_for_main: HOUR,
            suspend_poll: HOUR,
            migrate_poll: HOUR,
            ..Timing::default()
        },
        ..OperatorOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_reaches_running_without_any_requeue() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-events").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let root = tempfile::tempdir()?;
        let node_name = cocoon_testenv::unique_name("cse-node");
        let node = cocoon_testenv::TestNode::in_pool(&client, &node_name, &pool).await?;
        node.wait_schedulable(WAIT).await?;
        let mut agent = Agent::start(
            env.client()?,
            &node_name,
            root.path(),
            env.registry_addr(),
            AgentOptions::default(),
        )
        .await?;
        let operator = Operator::start(&client, &ns, env.registry_addr(), event_driven());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 2;
        spec.toolboxes = vec![ToolboxSpec {
            name: "tb".into(),
            image: "ubuntu:24.04".into(),
            ..ToolboxSpec::default()
        }];
        sets.create(&PostParams::default(), &CocoonSet::new("demo", spec))
            .await?;
        let running =
            cocoon_testenv::wait_until("demo Running 3/3, toolboxes 1/1", WAIT, || async {
                let cs = sets.get_opt("demo").await.ok().flatten()?;
                cs.status
                    .as_ref()
                    .is_some_and(|s| {
                        s.phase == Some(CocoonSetPhase::Running)
                            && Some(s.observed_generation) == cs.metadata.generation
                            && (s.ready_agents, s.desired_agents) == (3, 3)
                            && (s.ready_toolboxes, s.desired_toolboxes) == (1, 1)
                    })
                    .then_some(())
            })
            .await;

        operator.stop().await;
        agent.stop().await;
        drop(node);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        running?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Issue 36 item 7: a migration's last step drops the `:hibernate` tag, a registry write no
/// watch reports; the pass that drops it must look again (and hand over) itself, or the set
/// stays `Migrating` until the migrate poll. With every poll at an hour, each of the
/// migrations below settles on its target (the set Running at its generation, the main bound
/// there with a live VM, the tag gone) within the wait, with the guest's state kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_settle_without_any_requeue() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-mig-events").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let mut nodes = Vec::new();
        let mut agents = Vec::new();
        let mut roots = Vec::new();
        for _ in 0..2 {
            let name = cocoon_testenv::unique_name("csm-node");
            let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
            node.wait_schedulable(WAIT).await?;
            let root = tempfile::tempdir()?;
            let agent = Agent::start(
                env.client()?,
                &name,
                root.path(),
                env.registry_addr(),
                AgentOptions::fast(),
            )
            .await?;
            nodes.push(node);
            agents.push(agent);
            roots.push(root);
        }
        let names: Vec<String> = nodes.iter().map(|n| n.name().to_owned()).collect();
        let operator = Operator::start(&client, &ns, env.registry_addr(), event_driven());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry(env.registry_addr());
        let vm = vm_name_for_agent(&ns, "demo", 0);

        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 0;
        spec.node_name = names[0].clone();
        sets.create(&PostParams::default(), &CocoonSet::new("demo", spec))
            .await?;
        let count = std::env::var("COCOON_EVENT_MIGRATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MIGRATIONS);
        let settled_on = |target: String| {
            let (sets, pods, reg, vm) = (sets.clone(), pods.clone(), reg.clone(), vm.clone());
            async move {
                cocoon_testenv::wait_until(&format!("demo settled on {target}"), WAIT, || async {
                    let cs = sets.get_opt("demo").await.ok().flatten()?;
                    let s = cs.status.as_ref()?;
                    let running = s.phase == Some(CocoonSetPhase::Running)
                        && Some(s.observed_generation) == cs.metadata.generation;
                    let p = pods.get_opt("demo-0").await.ok().flatten()?;
                    let id = p.annotations().get(ann::VM_ID).cloned().unwrap_or_default();
                    let live = p.spec.as_ref()?.node_name.as_deref() == Some(target.as_str())
                        && !id.is_empty()
                        && s.agents.first().is_some_and(|a| a.vm_id == id);
                    let tag = reg.has_manifest(&vm, "hibernate").await.ok()?;
                    (running && live && !tag).then_some(())
                })
                .await
            }
        };
        let mut outcome: Result<(), BoxError> =
            settled_on(names[0].clone()).await.map_err(Into::into);
        let token = agents[0].sim.guest_token(&vm)?;
        for i in 0..count {
            if outcome.is_err() {
                break;
            }
            let target = names[(i + 1) % 2].clone();
            sets.patch(
                "demo",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"nodeName": target}})),
            )
            .await?;
            outcome = settled_on(target.clone())
                .await
                .map_err(|e| format!("migration {} of {count}: {e}", i + 1).into());
            if outcome.is_ok() {
                let here = agents[(i + 1) % 2].sim.guest_token(&vm)?;
                assert_eq!(
                    here,
                    token,
                    "migration {}: the guest's state moved with it",
                    i + 1
                );
            }
        }

        operator.stop().await;
        for mut a in agents {
            a.stop().await;
        }
        drop(nodes);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        outcome
    })
    .await;
}
