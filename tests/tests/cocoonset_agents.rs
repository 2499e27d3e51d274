//! The CocoonSet controller end to end with REAL node agents: two in-process agents
//! (`cocoon_node::agent::run_agent` on the simulated runtime, permissive pull), each serving a
//! TestNode in a pool of their own, the real scheduler binding the main and the toolboxes, and
//! both controllers in-process, scoped to the test namespace. Nothing here writes what the node
//! agent writes: VM ids, IPs, lifecycle states and pod readiness all come from the agents.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::cocoonset::{RebuildEntry, RebuildHistory};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy};
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_toolbox};
use cocoon_operator::cocoonset::Timing;
use cocoon_operator::metrics::SetLabels;
use cocoon_runtime::sim::{FailRule, Verb};
use cocoon_testsupport::{
    Agent, AgentOptions, BoxError, Operator, OperatorOptions, all_vms, node_of, push_tag,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";

/// Current generation observed, phase Running, every member reported with its VM id and IP
/// (a DHCP address can reach the pod a moment after Ready), and `ready` holds on the status.
fn running_with(
    cs: &CocoonSet,
    ready: impl Fn(&cocoon_api::crd::set::CocoonSetStatus) -> bool,
) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Running)
            && Some(s.observed_generation) == cs.metadata.generation
            && s.agents
                .iter()
                .all(|a| !a.vm_id.is_empty() && !a.ip.is_empty())
            && s.toolboxes
                .iter()
                .all(|t| !t.vm_id.is_empty() && !t.ip.is_empty())
            && ready(s)
    })
}

async fn wait_set(
    sets: &Api<CocoonSet>,
    what: &str,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{SET}: {what}"), WAIT, || async {
        let cs = sets.get_opt(SET).await.ok().flatten()?;
        check(&cs).then_some(cs)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_lifecycle_with_real_agents() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-agents").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let stop = CancellationToken::new();
        let roots = [tempfile::tempdir()?, tempfile::tempdir()?];
        let mut nodes = Vec::new();
        let mut agents = Vec::new();
        for root in &roots {
            let name = cocoon_testenv::unique_name("csa-node");
            let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
            node.wait_schedulable(WAIT).await?;
            nodes.push(node);
            agents.push(
                Agent::start(
                    env.client()?,
                    &name,
                    root.path(),
                    env.registry_addr(),
                    AgentOptions::default(),
                )
                .await?,
            );
        }
        let _operator = Operator::start(&client, &ns, env.registry_addr(), OperatorOptions::fast());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = cocoon_testsupport::registry(env.registry_addr());

        // (a) main + 2 sub-agents + a run toolbox + a static toolbox reach Running.
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 2;
        spec.snapshot_policy = SnapshotPolicy::MainOnly;
        spec.toolboxes = cocoon_testsupport::scripted::two_toolboxes("ubuntu:24.04");
        sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
            .await?;
        let cs = wait_set(&sets, "Running 3/3, toolboxes 2/2", |cs| {
            running_with(cs, |s| s.ready_agents == 3 && s.ready_toolboxes == 2)
        })
        .await?;
        let st = cs.status.clone().unwrap_or_default();
        assert_eq!(
            (
                st.ready_agents,
                st.desired_agents,
                st.ready_toolboxes,
                st.desired_toolboxes
            ),
            (3, 3, 2, 2)
        );
        let main_vm = vm_name_for_agent(&ns, SET, 0);
        assert_eq!(
            st.agents.iter().map(|a| a.slot).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            (
                st.agents[0].role.as_str(),
                st.agents[0].forked_from.as_str()
            ),
            ("main", "")
        );
        for a in &st.agents {
            assert!(!a.vm_id.is_empty(), "slot {} has a VM id: {a:?}", a.slot);
            assert!(!a.ip.is_empty(), "slot {} has an IP: {a:?}", a.slot);
            assert_eq!(a.phase, "Running", "slot {}", a.slot);
            assert_eq!(a.vm_name, vm_name_for_agent(&ns, SET, a.slot));
        }
        for a in &st.agents[1..] {
            assert_eq!(
                (a.role.as_str(), a.forked_from.as_str()),
                ("sub-agent", main_vm.as_str())
            );
        }
        // The reported ids are the agents' real VMs, each on the node its pod is bound to.
        let vms = all_vms(&agents).await;
        let main_node = node_of(&pods.get(&format!("{SET}-0")).await?);
        assert!(
            agents.iter().any(|a| a.node == main_node),
            "main bound to a pool node"
        );
        for a in &st.agents {
            let pod = pods.get(&a.pod_name).await?;
            assert_eq!(
                node_of(&pod),
                main_node,
                "{} on the main's node",
                a.pod_name
            );
            assert!(
                vms.contains(&(main_node.clone(), a.vm_name.clone(), a.vm_id.clone())),
                "{} ({}) is a VM on {main_node}: {vms:?}",
                a.vm_name,
                a.vm_id
            );
            if a.slot > 0 {
                assert_eq!(
                    pod.annotations().get(ann::FORK_FROM).map(String::as_str),
                    Some(main_vm.as_str())
                );
            }
        }
        let tb = st
            .toolboxes
            .iter()
            .find(|t| t.name == "tb")
            .cloned()
            .unwrap_or_default();
        assert!(!tb.vm_id.is_empty() && !tb.ip.is_empty(), "{tb:?}");
        assert!(
            vms.iter().any(
                |(_, name, id)| *name == vm_name_for_toolbox(&ns, SET, "tb") && *id == tb.vm_id
            ),
            "the run toolbox is a real VM: {vms:?}"
        );
        let stb = st
            .toolboxes
            .iter()
            .find(|t| t.name == "st")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (
                stb.vm_id.as_str(),
                stb.ip.as_str(),
                stb.vnc_port,
                stb.phase.as_str()
            ),
            ("ext-1", "10.9.9.9", 5901, "Running")
        );
        assert!(
            !vms.iter().any(|(_, _, id)| id == "ext-1"),
            "the static toolbox is never created in a runtime"
        );

        // (b) replicas 2 -> 1: slot 2's pod and VM go away.
        sets.patch(
            SET,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"replicas": 1}}})),
        )
        .await?;
        let cs = wait_set(&sets, "Running 2/2", |cs| {
            running_with(cs, |s| {
                s.ready_agents == 2 && s.desired_agents == 2 && s.agents.len() == 2
            })
        })
        .await?;
        let gone_vm = vm_name_for_agent(&ns, SET, 2);
        cocoon_testenv::wait_until("slot 2's pod and VM gone", WAIT, || async {
            let pod_gone = matches!(pods.get_opt(&format!("{SET}-2")).await, Ok(None));
            let vm_gone = !all_vms(&agents)
                .await
                .iter()
                .any(|(_, name, _)| *name == gone_vm);
            (pod_gone && vm_gone).then_some(())
        })
        .await?;
        let st = cs.status.clone().unwrap_or_default();
        assert_eq!(
            st.agents.iter().map(|a| a.slot).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!((st.ready_toolboxes, st.desired_toolboxes), (2, 2));

        // (c) an image edit rebuilds both agents as new VMs.
        let old_ids: BTreeSet<String> = st.agents.iter().map(|a| a.vm_id.clone()).collect();
        sets.patch(
            SET,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"image": "ubuntu:24.10"}}})),
        )
        .await?;
        let cs = wait_set(&sets, "Running on fresh VMs", |cs| {
            running_with(cs, |s| {
                s.ready_agents == 2
                    && s.agents.len() == 2
                    && s.agents
                        .iter()
                        .all(|a| !a.vm_id.is_empty() && !old_ids.contains(&a.vm_id))
            })
        })
        .await?;
        let st = cs.status.clone().unwrap_or_default();
        let vms = all_vms(&agents).await;
        for a in &st.agents {
            assert!(
                !a.ip.is_empty(),
                "slot {} has an IP after the rebuild",
                a.slot
            );
            let pod = pods.get(&a.pod_name).await?;
            assert_eq!(
                pod.annotations().get(ann::IMAGE).map(String::as_str),
                Some("ubuntu:24.10")
            );
            assert!(
                vms.iter()
                    .any(|(_, name, id)| *name == a.vm_name && *id == a.vm_id),
                "{} ({}) is a live VM: {vms:?}",
                a.vm_name,
                a.vm_id
            );
        }
        assert!(
            !vms.iter().any(|(_, _, id)| old_ids.contains(id)),
            "the old VMs were removed: {vms:?}"
        );
        assert_eq!(st.agents[1].forked_from, main_vm);

        // (d) deletion removes every pod and VM and the tags; main-only keeps the main's :latest.
        let sub_vm = vm_name_for_agent(&ns, SET, 1);
        for vm in [&main_vm, &sub_vm, &gone_vm] {
            push_tag(&reg, vm, "hibernate").await?;
        }
        push_tag(&reg, &sub_vm, "latest").await?;
        sets.delete(SET, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("set gone", WAIT, || async {
            matches!(sets.get_opt(SET).await, Ok(None)).then_some(())
        })
        .await?;
        assert!(
            pods.list(&ListParams::default()).await?.items.is_empty(),
            "no pod left"
        );
        for vm in [&main_vm, &sub_vm, &gone_vm] {
            assert!(
                !reg.has_manifest(vm, "hibernate").await?,
                "{vm}:hibernate deleted"
            );
        }
        assert!(
            !reg.has_manifest(&sub_vm, "latest").await?,
            "the sub-agent's :latest deleted"
        );
        assert!(
            reg.has_manifest(&main_vm, "latest").await?,
            "main-only keeps the main's :latest (the agent pushed it when the main was deleted)"
        );
        cocoon_testenv::wait_until("no VM left on the nodes", WAIT, || async {
            all_vms(&agents).await.is_empty().then_some(())
        })
        .await?;

        stop.cancel();
        drop(nodes);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}

/// Every event in `ns` (events.k8s.io/v1, as both Recorders write them).
async fn events(client: &Client, ns: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// How many occurrences an event stands for: the Recorder folds a repeat with the same key
/// (type, reason, action, regarding object) into the first event's `series`, keeping its note.
fn occurrences(e: &Event) -> i32 {
    e.series.as_ref().map_or(1, |s| s.count)
}

/// The events with `reason` in `ns`, once they stand for at least `n` occurrences.
async fn wait_events(
    client: &Client,
    ns: &str,
    reason: &str,
    n: i32,
) -> Result<Vec<Event>, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{n} event(s) {reason}"), WAIT, || async {
        let found: Vec<Event> = events(client, ns)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect();
        (found.iter().map(occurrences).sum::<i32>() >= n).then_some(found)
    })
    .await
}

fn note(e: &Event) -> &str {
    e.note.as_deref().unwrap_or_default()
}

/// Every distinct `rebuild-history` entry of `pod` on the set, in order, as a watch sees them
/// (a new entry whenever its count changes), until `stop`. Returns once the watch has listed,
/// so a set created afterwards has every write seen.
async fn record_history(
    sets: Api<CocoonSet>,
    pod: String,
    stop: CancellationToken,
) -> Result<Arc<Mutex<Vec<RebuildEntry>>>, BoxError> {
    let seen = Arc::new(Mutex::new(Vec::<RebuildEntry>::new()));
    let out = seen.clone();
    let (listed, listed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={SET}"));
        let mut stream = watcher(sets, cfg).default_backoff().boxed();
        let mut listed = Some(listed);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => break,
                next = stream.next() => next,
            };
            let cs = match next {
                None => break,
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Some(Ok(watcher::Event::Apply(cs) | watcher::Event::InitApply(cs))) => cs,
                Some(_) => continue,
            };
            let history = RebuildHistory::decode(
                cs.annotations()
                    .get(ann::REBUILD_HISTORY)
                    .map(String::as_str)
                    .unwrap_or_default(),
            );
            if let (Some(e), Ok(mut v)) = (history.get(&pod), out.lock())
                && v.last().map(|l| l.count) != Some(e.count)
            {
                v.push(e.clone());
            }
        }
    });
    tokio::time::timeout(WAIT, listed_rx).await??;
    Ok(seen)
}

/// The pod incarnations (UIDs) the node agent reported CreateBringUpFailed for with `error`.
async fn bring_up_failures(client: &Client, ns: &str, error: &str) -> BTreeSet<String> {
    events(client, ns)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CreateBringUpFailed"))
        .filter(|e| note(e).contains(error))
        .filter_map(|e| e.regarding.as_ref().and_then(|r| r.uid.clone()))
        .collect()
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_sub_agent_is_dead_lettered_then_lifted_with_a_real_agent() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-dead").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let stop = CancellationToken::new();
        let root = tempfile::tempdir()?;
        let name = cocoon_testenv::unique_name("csd-node");
        let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
        node.wait_schedulable(WAIT).await?;
        let agent = Agent::start(
            env.client()?,
            &name,
            root.path(),
            env.registry_addr(),
            AgentOptions::default(),
        )
        .await?;
        // The §6 backoff (0/1/5/30 s) shrunk so the four rebuilds take about two seconds.
        let timing = Timing {
            requeue_after_write: Duration::from_millis(300),
            wait_for_main: Duration::from_secs(1),
            rebuild_backoff: vec![
                Duration::ZERO,
                Duration::from_millis(200),
                Duration::from_millis(500),
                Duration::from_secs(1),
            ],
            ..Timing::default()
        };
        assert_eq!(timing.rebuild_budget, 4, "the default budget");
        let timing_backoff = timing.rebuild_backoff.clone();
        let operator = Operator::start(
            &client,
            &ns,
            env.registry_addr(),
            OperatorOptions {
                sets: timing,
                ..OperatorOptions::default()
            },
        );
        let metrics = operator.metrics.clone();
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let main_pod = format!("{SET}-0");
        let sub_pod = format!("{SET}-1");
        let watched = record_history(sets.clone(), sub_pod.clone(), stop.child_token()).await?;
        let main_vm = vm_name_for_agent(&ns, SET, 0);
        let sub_vm = vm_name_for_agent(&ns, SET, 1);

        // The sub-agent's fork-from clone always fails on the node: the real agent reports
        // lifecycle `failed` (CreateBringUpFailed) for every incarnation of demo-1.
        const INJECTED: &str = "simulated: fork clone refused";
        agent
            .sim
            .fail(FailRule::new(Verb::Clone, INJECTED).target(sub_vm.as_str()));
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = 1;
        sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
            .await?;

        // Four budgeted rebuilds, then the dead-letter at the current generation.
        let dead =
            cocoon_testenv::wait_until(&format!("{sub_pod} dead-lettered"), WAIT, || async {
                let p = pods.get_opt(&sub_pod).await.ok().flatten()?;
                p.annotations().get(ann::DEAD_LETTER).cloned()
            })
            .await?;
        let cs = sets.get(SET).await?;
        let generation = cs.metadata.generation.unwrap_or_default();
        assert_eq!(
            dead,
            generation.to_string(),
            "dead-lettered at this generation"
        );
        let terminal =
            |note: &str| note.contains("(terminal (phase=") && note.contains(" lifecycle=failed)");
        let dead_letters = wait_events(&client, &ns, "SubAgentDeadLetter", 1).await?;
        assert_eq!(
            dead_letters.iter().map(occurrences).sum::<i32>(),
            1,
            "one dead-letter: {dead_letters:?}"
        );
        let n = note(&dead_letters[0]);
        assert_eq!(dead_letters[0].type_.as_deref(), Some("Warning"));
        assert!(
            n.starts_with(&format!("pod {sub_pod} exhausted 4 rebuilds ("))
                && n.ends_with("); left in dead-letter")
                && terminal(n),
            "{n}"
        );
        // Attempts 1..4, each persisted to the history before its delete (a watch sees every
        // write), each after its backoff: 0, then 200 ms, 500 ms and 1 s after the previous one.
        let seen = watched.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(
            seen.iter().map(|e| e.count).collect::<Vec<_>>(),
            vec![1, 2, 3, 4],
            "{seen:?}"
        );
        for (k, pair) in seen.windows(2).enumerate() {
            let (Some(prev), Some(next)) = (pair[0].last_deleted, pair[1].last_deleted) else {
                panic!("lastDeleted recorded: {seen:?}");
            };
            let gap = (next - prev).to_std().unwrap_or_default();
            let owed = timing_backoff[k + 1];
            assert!(
                gap >= owed,
                "attempt {} came {gap:?} after the previous one, owed {owed:?}",
                k + 2
            );
        }
        // The events: kube's Recorder folds repeats of one (type, reason, action, regarding)
        // into the first event's series and keeps its note, so the four SubAgentRebuilding
        // occurrences show as attempt 1/4 with series.count 4 (see the report).
        let rebuilding = wait_events(&client, &ns, "SubAgentRebuilding", 4).await?;
        assert_eq!(
            rebuilding.iter().map(occurrences).sum::<i32>(),
            4,
            "exactly four rebuilds: {rebuilding:?}"
        );
        let mut attempts = BTreeSet::new();
        for e in &rebuilding {
            let n = note(e);
            // `pod demo-1 attempt <k>/4 (terminal (phase=<phase> lifecycle=failed))`
            let k = n
                .strip_prefix(&format!("pod {sub_pod} attempt "))
                .and_then(|rest| rest.split_once("/4 ("))
                .and_then(|(k, _)| k.parse::<u32>().ok())
                .filter(|_| terminal(n));
            assert!(k.is_some(), "a SubAgentRebuilding note: {n}");
            attempts.extend(k);
        }
        assert!(
            attempts.contains(&1) && attempts.iter().all(|k| (1..=4).contains(k)),
            "{attempts:?}"
        );
        let labels = SetLabels {
            namespace: ns.clone(),
            cocoonset: SET.into(),
        };
        assert_eq!(metrics.subagent_rebuild.get_or_create(&labels).get(), 4);
        assert_eq!(metrics.subagent_dead_letter.get_or_create(&labels).get(), 1);
        // The real agent failed every incarnation: the first pod and its four rebuilds.
        cocoon_testenv::wait_until("CreateBringUpFailed for 5 incarnations", WAIT, || async {
            (bring_up_failures(&client, &ns, INJECTED).await.len() >= 5).then_some(())
        })
        .await?;
        let history = RebuildHistory::decode(
            cs.annotations()
                .get(ann::REBUILD_HISTORY)
                .map(String::as_str)
                .unwrap_or_default(),
        );
        assert_eq!(history.get(&sub_pod).map(|e| e.count), Some(4));
        assert!(
            history.get(&main_pod).is_none(),
            "the main was never rebuilt"
        );
        let sub = pods.get(&sub_pod).await?;
        assert_eq!(
            sub.annotations()
                .get(ann::LIFECYCLE_STATE)
                .map(String::as_str),
            Some("failed"),
            "the dead-lettered pod is left as it failed"
        );
        assert!(
            !all_vms(std::slice::from_ref(&agent))
                .await
                .iter()
                .any(|(_, vm, _)| *vm == sub_vm),
            "no sub-agent VM was ever created"
        );

        // The main stays up: Running and Ready on its first VM; the set is short of one agent.
        let main_id = pods
            .get(&main_pod)
            .await?
            .annotations()
            .get(ann::VM_ID)
            .cloned()
            .unwrap_or_default();
        let cs = wait_set(&sets, "Scaling 1/2 with the main Running", |cs| {
            cs.status.as_ref().is_some_and(|s| {
                s.phase == Some(CocoonSetPhase::Scaling)
                    && s.observed_generation == generation
                    && (s.ready_agents, s.desired_agents) == (1, 2)
                    && s.agents
                        .first()
                        .is_some_and(|a| a.slot == 0 && a.phase == "Running" && !a.ip.is_empty())
            })
        })
        .await?;
        let st = cs.status.clone().unwrap_or_default();
        assert_eq!(st.agents[0].vm_id, main_id);
        assert!(!main_id.is_empty());
        assert!(pod_ready(&pods.get(&main_pod).await?), "the main is Ready");
        assert!(
            all_vms(std::slice::from_ref(&agent)).await.contains(&(
                agent.node.clone(),
                main_vm.clone(),
                main_id.clone()
            )),
            "the main's VM is live"
        );

        assert_eq!(
            bring_up_failures(&client, &ns, INJECTED).await.len(),
            5,
            "no sixth incarnation while dead-lettered"
        );

        // Clear the injection and edit the spec: the dead-letter is lifted, the budget reset,
        // and the set returns to Running with the sub-agent up.
        agent.sim.clear_failures();
        sets.patch(
            SET,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"image": "ubuntu:24.10"}}})),
        )
        .await?;
        let cs = wait_set(&sets, "Running 2/2 after the edit", |cs| {
            cs.metadata.generation > Some(generation)
                && running_with(cs, |s| s.ready_agents == 2 && s.agents.len() == 2)
        })
        .await?;
        let st = cs.status.clone().unwrap_or_default();
        let sub = pods.get(&sub_pod).await?;
        assert!(
            !sub.annotations().contains_key(ann::DEAD_LETTER),
            "the dead-letter is lifted"
        );
        assert!(pod_ready(&sub), "the sub-agent is Ready");
        assert_eq!(
            sub.annotations().get(ann::IMAGE).map(String::as_str),
            Some("ubuntu:24.10")
        );
        let sub_st = &st.agents[1];
        assert_eq!(
            (sub_st.slot, sub_st.forked_from.as_str()),
            (1, main_vm.as_str())
        );
        assert!(
            all_vms(std::slice::from_ref(&agent)).await.contains(&(
                agent.node.clone(),
                sub_vm.clone(),
                sub_st.vm_id.clone()
            )),
            "the sub-agent is a live VM"
        );
        let history = RebuildHistory::decode(
            cs.annotations()
                .get(ann::REBUILD_HISTORY)
                .map(String::as_str)
                .unwrap_or_default(),
        );
        assert!(
            history.get(&sub_pod).is_none_or(|e| e.count < 4),
            "the sub-agent's budget was reset"
        );
        assert_eq!(
            metrics.subagent_dead_letter.get_or_create(&labels).get(),
            1,
            "no new dead-letter after the edit"
        );

        sets.delete(SET, &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("set gone", WAIT, || async {
            matches!(sets.get_opt(SET).await, Ok(None)).then_some(())
        })
        .await?;
        cocoon_testenv::wait_until("no VM left on the node", WAIT, || async {
            all_vms(std::slice::from_ref(&agent))
                .await
                .is_empty()
                .then_some(())
        })
        .await?;
        stop.cancel();
        drop(node);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, BoxError>(())
    })
    .await;
}
