//! The CocoonSet controller end to end on the real control plane, the real scheduler and the
//! real registry. The node side is a scripted STAND-IN FOR THE NODE AGENT
//! (`cocoon_testsupport::scripted::node_actor`): for pods the scheduler bound (or that carry
//! spec.nodeName) it writes what the node agent writes — VM id and IP, lifecycle `ready` at the
//! stamped generation (or `failed` when told), the container running and the Ready condition —
//! and it completes pod deletions as a kubelet does.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cocoon_api::crd::set::{CocoonSet, CocoonSetPhase, ToolboxSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_operator::cocoonset::Timing;
use cocoon_testenv::Probe;
use cocoon_testsupport::scripted::{
    Script, ScriptedNode, WAIT, controller, event_reasons, node_actor, nodes, phase_is, push_tag,
    registry_client, spec, wait_event, wait_set,
};
use cocoon_testsupport::{AuditedIdentity, BoxError};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult = Result<(), BoxError>;

fn fast_timing() -> Timing {
    Timing {
        requeue_after_write: Duration::from_millis(200),
        wait_for_main: Duration::from_millis(500),
        rebuild_backoff: vec![
            Duration::ZERO,
            Duration::from_millis(200),
            Duration::from_millis(500),
            Duration::from_secs(1),
        ],
        ..Timing::default()
    }
}

#[tokio::test]
async fn set_runs_scales_rebuilds_and_tears_down() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-life").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 2).await?;
        let _actor = node_actor(&client, &ns, Script::default());
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        // The controller runs as an identity of its own: the audit log counts its writes.
        let operator = AuditedIdentity::new(env, &client, "cs-life-operator").await?;
        let running = controller(&operator.client, &ns, registry_client(env.registry_addr()))
            .sets(fast_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let reg = registry_client(env.registry_addr());

        let mut s = spec(&pool, 2);
        s.toolboxes = cocoon_testsupport::scripted::two_toolboxes("tb:1");
        sets.create(&PostParams::default(), &CocoonSet::new("demo", s))
            .await?;

        // Main + 2 sub-agents + 2 toolboxes reach Running with the right status.
        let cs = wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
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
        assert_eq!(st.replicas, 2, "status.replicas: the sub-agent pods");
        let main_vm = vm_name_for_agent(&ns, "demo", 0);
        assert_eq!(
            st.agents.iter().map(|a| a.slot).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(
            st.agents[1..]
                .iter()
                .all(|a| a.forked_from == main_vm && a.role == "sub-agent")
        );
        assert!(
            st.agents
                .iter()
                .all(|a| !a.vm_id.is_empty() && a.phase == "Running")
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
                stb.conn_type.as_str(),
                stb.vnc_port
            ),
            ("ext-1", "10.9.9.9", "vnc", 5901)
        );
        assert!(cs.conditions_ready());
        let main_node = pods
            .get("demo-0")
            .await?
            .spec
            .and_then(|s| s.node_name)
            .unwrap_or_default();
        for p in ["demo-1", "demo-2"] {
            let sub = pods.get(p).await?;
            assert_eq!(
                sub.spec.and_then(|s| s.node_name).as_deref(),
                Some(main_node.as_str()),
                "{p} bound to the main's node"
            );
        }

        // A settled set: passes make no write and no registry call. Passes of one set run
        // one at a time, so once a pass that began after a nudge is running, every earlier
        // pass has finished: two nudges first let a status write still in flight when the
        // set first showed Running land before the baseline is taken.
        let nudge = |i: u64| {
            let (pods, running) = (&pods, &running);
            async move {
                let passes = running.stats.passes.load(Ordering::SeqCst);
                let poke = json!({"metadata": {"annotations": {
                    "test.cocoonstack.io/poke": i.to_string()}}});
                pods.patch("demo-1", &PatchParams::default(), &Patch::Merge(&poke))
                    .await?;
                cocoon_testenv::wait_until("one more pass", WAIT, || async {
                    (running.stats.passes.load(Ordering::SeqCst) > passes).then_some(())
                })
                .await?;
                TestResult::Ok(())
            }
        };
        nudge(0).await?;
        nudge(1).await?;
        let rv = sets.get("demo").await?.resource_version();
        let (writes, calls) = (
            operator.writes_in(&audit, &ns).await?,
            running.registry.calls(),
        );
        assert!(
            writes > 0,
            "the audit log shows the controller's writes (its pods, status and finalizer)"
        );
        // One nudge at a time: the controller coalesces triggers for one object that arrive
        // while a pass is queued, so three quick nudges need not make three passes.
        for i in 2..5u64 {
            nudge(i).await?;
        }
        assert_eq!(
            operator.writes_in(&audit, &ns).await?,
            writes,
            "a settled pass wrote (the API server's audit log of the controller's identity)"
        );
        assert_eq!(
            running.registry.calls(),
            calls,
            "a settled pass called the registry"
        );
        assert_eq!(
            sets.get("demo").await?.resource_version(),
            rv,
            "the set changed on settled passes"
        );

        // Scale up through the /scale subresource (what `kubectl scale` writes, issue 36
        // item 6), then down: extras deleted, their VMs stashed for teardown GC.
        sets.patch_scale(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await?;
        wait_set(&sets, "demo", "4 agents ready", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
                && cs.status.as_ref().is_some_and(|s| s.ready_agents == 4)
        })
        .await?;
        let scale = sets.get_scale("demo").await?;
        assert_eq!(
            (
                scale.spec.and_then(|s| s.replicas),
                scale.status.map(|s| s.replicas)
            ),
            (Some(3), Some(3)),
            "the scale reads spec.agent.replicas and status.replicas"
        );
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"replicas": 1}}})),
        )
        .await?;
        let cs = wait_set(&sets, "demo", "scaled down to 2", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
                && cs.status.as_ref().is_some_and(|s| s.agents.len() == 2)
        })
        .await?;
        let stash = cs
            .annotations()
            .get("cocoonset.cocoonstack.io/delete-vm-names")
            .cloned()
            .unwrap_or_default();
        assert!(
            stash.contains(&vm_name_for_agent(&ns, "demo", 3))
                && stash.contains(&vm_name_for_agent(&ns, "demo", 2)),
            "{stash}"
        );

        // An image edit rebuilds the agents under the budget.
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"image": "img:2"}}})),
        )
        .await?;
        wait_set(&sets, "demo", "Running on img:2", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        cocoon_testenv::wait_until("agents on img:2", WAIT, || async {
            let l = pods
                .list(
                    &ListParams::default()
                        .labels("cocoonset.cocoonstack.io/role in (main,sub-agent)"),
                )
                .await
                .ok()?;
            (l.items.len() == 2
                && l.items.iter().all(|p| {
                    p.annotations()
                        .get("cocoonset.cocoonstack.io/image")
                        .map(String::as_str)
                        == Some("img:2")
                }))
            .then_some(())
        })
        .await?;
        wait_event(&client, &ns, "SubAgentRebuilding").await?;
        let cs = wait_set(&sets, "demo", "Running after rebuild", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        assert!(
            cs.annotations()
                .contains_key("cocoonset.cocoonstack.io/rebuild-history")
        );

        // Deletion removes the pods and the registry tags (main-only keeps the main's :latest).
        let sub_vm = vm_name_for_agent(&ns, "demo", 1);
        let gone_vm = vm_name_for_agent(&ns, "demo", 3);
        push_tag(&reg, &main_vm, "hibernate", "img:2").await?;
        push_tag(&reg, &sub_vm, "hibernate", "img:2").await?;
        push_tag(&reg, &gone_vm, "hibernate", "img:2").await?;
        push_tag(&reg, &main_vm, "latest", "img:2").await?;
        push_tag(&reg, &sub_vm, "latest", "img:2").await?;
        sets.delete("demo", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("set gone", WAIT, || async {
            matches!(sets.get_opt("demo").await, Ok(None)).then_some(())
        })
        .await?;
        assert!(pods.list(&ListParams::default()).await?.items.is_empty());
        assert!(!reg.has_manifest(&main_vm, "hibernate").await?);
        assert!(!reg.has_manifest(&sub_vm, "hibernate").await?);
        assert!(
            !reg.has_manifest(&gone_vm, "hibernate").await?,
            "a slot that left the spec keeps no tag"
        );
        assert!(!reg.has_manifest(&sub_vm, "latest").await?);
        assert!(
            reg.has_manifest(&main_vm, "latest").await?,
            "main-only keeps slot 0's :latest"
        );
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        operator.delete(&client).await?;
        TestResult::Ok(())
    })
    .await;
}

/// A pod's progress in one line: uid, node, phase, deletion, lifecycle and scheduling.
fn describe(p: &Pod) -> String {
    let a = p.annotations();
    let get = |k: &str| a.get(k).map(String::as_str).unwrap_or("-");
    let status = p.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| format!("{} {}", c.status, c.message.as_deref().unwrap_or("")))
        .unwrap_or_else(|| "-".into());
    format!(
        "uid {} node {:?} phase {:?} deleting {} lifecycle {} scheduled {scheduled}",
        p.uid().unwrap_or_default(),
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        status.and_then(|s| s.phase.as_deref()),
        p.metadata.deletion_timestamp.is_some(),
        get("vm.cocoonstack.io/lifecycle-state"),
    )
}

#[tokio::test]
async fn failing_sub_agent_is_rebuilt_then_dead_lettered_until_a_spec_edit() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-fail").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let ScriptedNode { fail, .. } = node_actor(&client, &ns, Script::default());
        let running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(fast_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if let Ok(mut f) = fail.lock() {
            f.insert("demo-1".into());
        }
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, 1)),
        )
        .await?;
        // On a timeout the error says where demo-1 was stuck.
        let dead = cocoon_testenv::poll("demo-1 dead-lettered", WAIT, || async {
            let p = match pods.get_opt("demo-1").await {
                Ok(Some(p)) => p,
                Ok(None) => return Probe::NotYet("demo-1 absent".into()),
                Err(e) => return Probe::NotYet(format!("get demo-1: {e}")),
            };
            match p.annotations().get("cocoonset.cocoonstack.io/dead-letter") {
                Some(d) => Probe::Ready(d.clone()),
                None => Probe::NotYet(describe(&p)),
            }
        })
        .await?;
        let cs = sets.get("demo").await?;
        assert_eq!(
            Some(dead.as_str()),
            cs.metadata.generation.map(|g| g.to_string()).as_deref()
        );
        let reasons = event_reasons(&client, &ns).await;
        assert!(
            reasons
                .iter()
                .filter(|r| *r == "SubAgentRebuilding")
                .count()
                >= 1,
            "{reasons:?}"
        );
        wait_event(&client, &ns, "SubAgentDeadLetter").await?;
        let history = cs
            .annotations()
            .get("cocoonset.cocoonstack.io/rebuild-history")
            .cloned()
            .unwrap_or_default();
        assert!(history.contains("\"count\":4"), "{history}");

        // A spec edit lifts the dead-letter: the pod is rebuilt with a fresh budget.
        if let Ok(mut f) = fail.lock() {
            f.clear();
        }
        sets.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"agent": {"network": "cocoon"}}})),
        )
        .await?;
        wait_set(&sets, "demo", "Running after the edit", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        let p = pods.get("demo-1").await?;
        assert!(
            !p.annotations()
                .contains_key("cocoonset.cocoonstack.io/dead-letter")
        );

        // Deleted, the set leaves nothing behind: its rebuild and dead-letter series go from
        // /metrics, its status memory from the controller.
        let series = "cocoonset=\"demo\"";
        let text = running.ctx.metrics.render();
        assert!(
            text.contains(&format!(
                "cocoon_operator_subagent_rebuild_total{{namespace=\"{ns}\",{series}}}"
            )),
            "{text}"
        );
        let uid = cs.uid().ok_or("uid")?;
        assert!(running.ctx.remembers(&uid));
        sets.delete("demo", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("demo gone", WAIT, || async {
            matches!(sets.get_opt("demo").await, Ok(None)).then_some(())
        })
        .await?;
        cocoon_testenv::wait_until("demo's series and memory gone", WAIT, || async {
            let text = running.ctx.metrics.render();
            (!text.contains(series) && !running.ctx.remembers(&uid)).then_some(())
        })
        .await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}

#[tokio::test]
async fn failed_main_reports_failed_then_recovers() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-main").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 1).await?;
        let ScriptedNode { fail, .. } = node_actor(&client, &ns, Script::default());
        let _running =
            controller(&client, &ns, registry_client(env.registry_addr())).sets(fast_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("demo", spec(&pool, 0)),
        )
        .await?;
        wait_set(&sets, "demo", "Running", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        if let Ok(mut f) = fail.lock() {
            f.insert("demo-0".into());
        }
        // Nudge the actor with a no-op annotation so it re-reads the fail set.
        let poke = json!({"metadata": {"annotations": {"test.cocoonstack.io/poke": "1"}}});
        pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&poke))
            .await?;
        wait_set(&sets, "demo", "Failed", |cs| {
            phase_is(cs, CocoonSetPhase::Failed)
        })
        .await?;
        wait_event(&client, &ns, "PodLifecycleFailed").await?;
        if let Ok(mut f) = fail.lock() {
            f.clear();
        }
        let poke = json!({"metadata": {"annotations": {"test.cocoonstack.io/poke": "2"}}});
        pods.patch("demo-0", &PatchParams::default(), &Patch::Merge(&poke))
            .await?;
        wait_set(&sets, "demo", "Running again", |cs| {
            phase_is(cs, CocoonSetPhase::Running)
        })
        .await?;
        wait_event(&client, &ns, "RecoveredFromFailure").await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}

trait ReadyCondition {
    fn conditions_ready(&self) -> bool;
}

impl ReadyCondition for CocoonSet {
    fn conditions_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }
}

/// A new set's pods are each posted once: a pass woken by one create reads a cache that may
/// not hold the pods created beside it yet, and must not post them again (a 409 each, and
/// for the toolbox a GET past the cache to rule out a name collision). Counted from the API
/// server's audit log of the controller's own identity.
#[tokio::test]
async fn a_new_set_posts_each_of_its_pods_once() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-once").await?;
        let pool = cocoon_testenv::unique_name("pool");
        let _nodes = nodes(&client, &pool, 2).await?;
        let _actor = node_actor(&client, &ns, Script::default());
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        let operator = AuditedIdentity::new(env, &client, "cs-once-operator").await?;
        let running = controller(&operator.client, &ns, registry_client(env.registry_addr()))
            .sets(fast_timing());
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        // Sets of 1 main + 2 sub-agents + 1 toolbox. Whether a pass reads the cache before
        // it shows a create is up to the watch's timing: several sets give the race room.
        let names: Vec<String> = (0..SETS).map(|i| format!("once-{i}")).collect();
        for name in &names {
            let mut s = spec(&pool, 2);
            s.toolboxes = vec![ToolboxSpec {
                name: "tb".into(),
                image: "tb:1".into(),
                ..ToolboxSpec::default()
            }];
            sets.create(&PostParams::default(), &CocoonSet::new(name, s))
                .await?;
        }
        for name in &names {
            wait_set(&sets, name, "Running", |cs| {
                phase_is(cs, CocoonSetPhase::Running)
            })
            .await?;
        }
        // Every write made so far is in the log once its marker read is.
        operator.writes_in(&audit, &ns).await?;
        let records = audit.records_of(&operator.user)?;
        let mut posts: Vec<(String, u16)> = records
            .iter()
            .filter(|r| r.namespace == ns && r.verb == "create" && r.resource == "pods")
            .map(|r| (r.name.clone(), r.code))
            .collect();
        posts.sort();
        let mut want: Vec<(String, u16)> = names
            .iter()
            .flat_map(|n| ["0", "1", "2", "tb"].map(|p| (format!("{n}-{p}"), 201)))
            .collect();
        want.sort();
        assert_eq!(posts, want, "one POST per pod, each Created");
        let toolbox_reads = records
            .iter()
            .filter(|r| r.namespace == ns && r.verb == "get" && r.name.ends_with("-tb"))
            .count();
        assert_eq!(toolbox_reads, 0, "no toolbox read past the cache");
        // What the controller expected, the cache has shown since.
        cocoon_testenv::wait_until("no create still expected", WAIT, || async {
            (running.ctx.expected_creates() == 0).then_some(())
        })
        .await?;
        for name in &names {
            sets.delete(name, &DeleteParams::default()).await?;
        }
        cocoon_testenv::wait_until("the sets torn down", WAIT, || async {
            let left = sets.list(&ListParams::default()).await.ok()?;
            left.items.is_empty().then_some(())
        })
        .await?;
        operator.delete(&client).await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}

/// How many sets [`a_new_set_posts_each_of_its_pods_once`] creates at once.
const SETS: usize = 8;

/// A set that vanishes without a teardown pass (its finalizer stripped by hand, then deleted,
/// while this replica stands by and runs no pass) is forgotten as well: the controller's
/// memory of its last status goes with the watch's delete.
#[tokio::test]
async fn a_set_deleted_behind_the_controllers_back_is_forgotten() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "cs-forget").await?;
        let leadership = cocoon_operator::leader::Leadership::elected();
        leadership.set_renew_deadline(Duration::from_secs(3600));
        leadership.renewed(std::time::Instant::now());
        let running = controller(&client, &ns, registry_client(env.registry_addr()))
            .leadership(leadership.clone())
            .sets(fast_timing());
        let ctx = &running.ctx;
        let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
        // No node serves this pool: the main stays Pending, the set reports Pending.
        let pool = cocoon_testenv::unique_name("nowhere");
        sets.create(
            &PostParams::default(),
            &CocoonSet::new("gone", spec(&pool, 0)),
        )
        .await?;
        let cs = wait_set(&sets, "gone", "Pending", |cs| {
            phase_is(cs, CocoonSetPhase::Pending)
        })
        .await?;
        let uid = cs.uid().ok_or("uid")?;
        cocoon_testenv::wait_until("the status remembered", WAIT, || async {
            ctx.remembers(&uid).then_some(())
        })
        .await?;
        // Standing by from here: no pass, so no teardown pass either.
        leadership.lost();
        sets.patch(
            "gone",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await?;
        sets.delete("gone", &DeleteParams::default()).await?;
        cocoon_testenv::wait_until("gone is gone", WAIT, || async {
            matches!(sets.get_opt("gone").await, Ok(None)).then_some(())
        })
        .await?;
        cocoon_testenv::wait_until("its memory gone", WAIT, || async {
            (!ctx.remembers(&uid)).then_some(())
        })
        .await?;
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        TestResult::Ok(())
    })
    .await;
}
