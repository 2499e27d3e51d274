//! The CocoonSet controller's create path waits on nothing but watch events: with every
//! requeue interval it has (`requeue_after_write`, `wait_for_main`, the suspend and migrate
//! polls) set to an hour, a set of main + 2 sub-agents + 1 toolbox still goes from its POST to
//! `Running` with REAL node agents (in-process, simulated runtime): each pass that changed
//! something is followed by the watch event of its own change, or goes on in the same pass
//! where no event would come (the finalizer, an annotation-only change of the set, wakes no
//! watch). A pass that ended on a requeue where no event follows would hold the set for the
//! hour and the wait below would run out.

use std::time::Duration;

use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, ToolboxSpec};
use cocoon_operator::cocoonset::Timing;
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions};
use kube::api::{Api, PostParams};

const WAIT: Duration = Duration::from_secs(90);
const HOUR: Duration = Duration::from_secs(3600);

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
        let opts = OperatorOptions {
            sets: Timing {
                requeue_after_write: HOUR,
                wait_for_main: HOUR,
                suspend_poll: HOUR,
                migrate_poll: HOUR,
                ..Timing::default()
            },
            ..OperatorOptions::default()
        };
        let operator = Operator::start(&client, &ns, env.registry_addr(), opts);
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
