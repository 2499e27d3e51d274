//! Stale-create reconciliation (`node.md` §14) on the real control plane and the real
//! registry, with in-process agents on the simulator: an agent killed while a create sits in
//! the runtime's `creating` state leaves that record behind under the VM's name; the agent
//! restarted on the same state directory has the runtime collect it, so the pod's create
//! takes the name again and the pod ends Running.
//!
//! * A wake clone cut in `creating`: collected at startup, the pod comes back with the
//!   guest's state token (the same as before the hibernate).
//! * A `busy` answer, and a failing verb: the background watcher asks again and the record is
//!   collected; the pod's retried create then succeeds.
//!
//! Every case counts `cocoon_vk_stale_create_reconcile_total{outcome}`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    AgentOptions, BoxError, TestAgent, TestResult, WAIT, ann_of, hibernate_pod, patch_ann,
    registry, sim_config, start_agent, start_agent_with, vm_pod, wait_running,
};

use cocoon_api::contract::annotations as ann;
use cocoon_api::naming::vm_name_for_pod;
use cocoon_node::pods::Timing;
use cocoon_runtime::Runtime;
use cocoon_runtime::StaleCreateOutcome;
use cocoon_runtime::sim::{Latencies, SimHandle, SimRuntime, Verb};
use cocoon_testenv::{
    Shared, TestNode, create_namespace, delete_namespace, run_test, unique_name, wait_until,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A create that stays in the runtime's `creating` state until the caller is killed.
const STUCK: Duration = Duration::from_secs(3600);

/// The rendered series of `cocoon_vk_stale_create_reconcile_total{outcome}`.
fn stale_series(outcome: &str) -> String {
    format!("cocoon_vk_stale_create_reconcile_total{{outcome=\"{outcome}\"}}")
}

/// Waits until `vm` exists in the simulator (its create wrote the `creating` record).
async fn wait_record(sim: &SimHandle, vm: &str) -> TestResult {
    wait_until(&format!("{vm}: creating record written"), WAIT, || async {
        sim.vm_info(vm).is_ok().then_some(())
    })
    .await?;
    Ok(())
}

/// The state of `vm` on the simulator root `dir`, read through a fresh simulator on that root
/// (the killed agent's runtime is gone, as after a real crash).
async fn state_on_disk(dir: &Path, vm: &str) -> TestResult<String> {
    let rt = SimRuntime::open(sim_config(dir))?;
    Ok(rt.inspect(vm).await?.state)
}

/// Restarts an agent on `dir` with a short stale-create watcher backoff; `prepare` runs on the
/// simulator before the startup reconcile. With `retry` set, a failed pod operation waits that
/// long before it is retried.
async fn restart_agent(
    env: &Shared,
    node: &str,
    dir: &Path,
    retry: Option<Duration>,
    prepare: impl FnOnce(&SimHandle) -> TestResult,
) -> TestResult<TestAgent> {
    let mut opts = AgentOptions::new(dir);
    opts.timing = Timing {
        stale_create_start: Duration::from_millis(100),
        stale_create_max: Duration::from_millis(500),
        ..opts.timing
    };
    if let Some(retry) = retry {
        opts.timing.retry_start = retry;
        opts.timing.retry_max = retry;
    }
    start_agent_with(env.client()?, env.registry_addr(), node, dir, opts, prepare).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_clone_killed_in_creating_is_collected_after_restart() {
    run_test(|env| async move {
        let client = env.client()?;
        let ns = create_namespace(&client, "node-stale").await?;
        let tmp = tempfile::tempdir()?;
        let node = unique_name("node");
        let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
        let dir = tmp.path().join(&node);
        let agent = start_agent(env, &node, &dir).await?;
        let reg = registry(env.registry_addr());
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &vm_pod(&ns, "w", &node, &[]))
            .await?;
        wait_running(&client, &ns, "w").await?;
        let vm = vm_name_for_pod(&ns, "w");
        let token = agent.sim.guest_token(&vm)?;

        hibernate_pod(&client, &ns, "w", 2).await?;
        assert!(reg.has_manifest(&vm, "hibernate").await?);
        assert!(agent.sim.vm_info(&vm).is_err(), "hibernated: no VM");

        // Wake, and kill the agent while the wake's clone sits in `creating`.
        agent.sim.set_latencies(Latencies {
            clone: STUCK,
            ..Latencies::default()
        });
        patch_ann(
            &client,
            &ns,
            "w",
            json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
        )
        .await?;
        wait_record(&agent.sim, &vm).await?;
        agent.kill().await;
        assert_eq!(
            state_on_disk(&dir, &vm).await?,
            "creating",
            "the killed clone left its record under the VM name"
        );

        let again = restart_agent(env, &node, &dir, None, |_| Ok(())).await?;
        assert_eq!(again.metric(&stale_series("collected")), 1.0);
        let p = wait_running(&client, &ns, "w").await?;
        assert_eq!(
            again.sim.guest_token(&vm)?,
            token,
            "the wake finished with the guest's state"
        );
        assert_eq!(
            ann_of(&p, ann::VM_ID).as_deref(),
            Some(again.sim.vm_info(&vm)?.id.as_str()),
            "the annotated VM is the running one"
        );
        assert!(
            again
                .sim
                .calls_of(Verb::Remove)
                .iter()
                .all(|c| !c.targets.contains(&vm)),
            "the agent never removes the creating record itself"
        );
        assert_eq!(again.metric(&stale_series("busy")), 0.0);
        assert_eq!(again.metric(&stale_series("error")), 0.0);

        again.kill().await;
        delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// How the first `reconcile_stale_create` after the restart answers.
#[derive(Clone, Copy)]
enum FirstAnswer {
    Busy,
    VerbError,
}

/// A retry backoff far beyond [`WAIT`]: a pod that still becomes Running was retried because
/// the watcher freed its VM name, not because its backoff ran out.
const NO_RETRY_IN_TIME: Duration = Duration::from_secs(3600);

/// A run cut in `creating`; after the restart the first answer is `first` (so a watcher
/// starts), the watcher's next ask collects the record, and the pod's create, which failed on
/// the taken name, is retried at once and succeeds.
async fn watcher_collects_after(env: &Shared, first: FirstAnswer) -> TestResult {
    let client = env.client()?;
    let ns = create_namespace(&client, "node-stale-watch").await?;
    let tmp = tempfile::tempdir()?;
    let node = unique_name("node");
    let _node_obj = TestNode::in_pool(&client, &node, "default").await?;
    let dir = tmp.path().join(&node);
    let agent = start_agent(env, &node, &dir).await?;
    agent.sim.set_latencies(Latencies {
        run: STUCK,
        ..Latencies::default()
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &vm_pod(&ns, "r", &node, &[]))
        .await?;
    let vm = vm_name_for_pod(&ns, "r");
    wait_record(&agent.sim, &vm).await?;
    agent.kill().await;
    assert_eq!(state_on_disk(&dir, &vm).await?, "creating");

    let (label, again) = match first {
        FirstAnswer::Busy => (
            "busy",
            restart_agent(env, &node, &dir, Some(NO_RETRY_IN_TIME), |sim| {
                sim.script_stale_create(StaleCreateOutcome::Busy);
                Ok(())
            })
            .await?,
        ),
        FirstAnswer::VerbError => (
            "error",
            restart_agent(env, &node, &dir, Some(NO_RETRY_IN_TIME), |sim| {
                sim.fail_next(
                    Verb::ReconcileStaleCreate,
                    1,
                    "simulated: reconcile-stale-create: connection reset by peer",
                );
                Ok(())
            })
            .await?,
        ),
    };
    assert_eq!(again.metric(&stale_series(label)), 1.0, "{label} counted");
    wait_running(&client, &ns, "r").await?;
    assert_eq!(
        again.metric(&stale_series("collected")),
        1.0,
        "the watcher's second ask collected the record"
    );
    assert!(
        again.sim.call_count(Verb::ReconcileStaleCreate) >= 2,
        "asked at startup and again by the watcher"
    );
    assert_eq!(
        again.sim.vm_info(&vm)?.id,
        ann_of(&api.get("r").await?, ann::VM_ID).unwrap_or_default(),
        "the pod runs the recreated VM"
    );

    again.kill().await;
    delete_namespace(&client, &ns).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_stale_create_is_watched_until_collected() {
    run_test(|env| async move { watcher_collects_after(env, FirstAnswer::Busy).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_stale_create_verb_is_retried_by_the_watcher() {
    run_test(|env| async move { watcher_collects_after(env, FirstAnswer::VerbError).await }).await;
}
