//! Suspend and wake of a CocoonSet end to end with REAL node agents: in-process agents
//! (`cocoon_testsupport::Agent`, the production node agent on the simulated runtime) serving
//! TestNodes of a pool of their own, the real scheduler and registry, and both controllers
//! in-process (`cocoon_testsupport::Operator`), scoped to the test namespace. Nothing here
//! writes what the node agent writes: snapshots, pushes, lifecycle states, VM ids and readiness
//! all come from the agents.
//!
//! Every VM's state is checked through its guest: the simulator's state token (random at first
//! boot, carried by every snapshot, clone and restore; a sub-agent forked from the main shares
//! the main's) and a marker file this test writes into each guest with `exec`, unique per VM.

use std::collections::BTreeMap;
use std::time::Duration;

use cocoon_api::contract::{AnnotationCodec, ReclaimRecord, annotations as ann};
use cocoon_api::crd::set::{
    AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, HibernatePolicy, ToolboxSpec,
};
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_toolbox};
use cocoon_operator::metrics::{Metrics, PlacementLabels, SetLabels};
use cocoon_registry::RegistryClient;
use cocoon_runtime::exec_capture;
use cocoon_runtime::sim::{FailRule, Verb};
use cocoon_testenv::{Shared, TestNode};
use cocoon_testsupport::{
    Agent, AuditedIdentity, BoxError, Operator, OperatorOptions, PoolMember, all_vms, node_of,
    registry,
};
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type TestResult = Result<(), BoxError>;

const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";
const IMAGE: &str = "ubuntu:24.04";
/// The guest file this test writes a per-VM marker into.
const MARKER: &str = "/root/suspend-marker";
/// A suspend deadline no test reaches unless it means to.
const NO_DEADLINE: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------------------------
// The cluster: nodes with real agents, one namespace, one registry.
// ---------------------------------------------------------------------------------------------

struct Cluster {
    client: Client,
    ns: String,
    pool: String,
    registry_addr: String,
    sets: Api<CocoonSet>,
    pods: Api<Pod>,
    reg: RegistryClient,
    nodes: Vec<TestNode>,
    agents: Vec<Agent>,
    roots: Vec<tempfile::TempDir>,
}

impl Cluster {
    /// A namespace, a pool of `n` nodes each with a real agent, all on `registry_addr`.
    async fn new(
        env: &Shared,
        prefix: &str,
        registry_addr: &str,
        n: usize,
    ) -> Result<Cluster, BoxError> {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, prefix).await?;
        let mut c = Cluster {
            sets: Api::namespaced(client.clone(), &ns),
            pods: Api::namespaced(client.clone(), &ns),
            reg: registry(registry_addr),
            registry_addr: registry_addr.to_owned(),
            pool: cocoon_testenv::unique_name("pool"),
            client,
            ns,
            nodes: Vec::new(),
            agents: Vec::new(),
            roots: Vec::new(),
        };
        for _ in 0..n {
            c.add_node(env).await?;
        }
        Ok(c)
    }

    /// One more node in the pool, with its agent; returns the node name.
    async fn add_node(&mut self, env: &Shared) -> Result<String, BoxError> {
        let m = PoolMember::start(env, &self.pool, "css-node", &self.registry_addr, WAIT).await?;
        self.nodes.push(m.node);
        self.agents.push(m.agent);
        self.roots.push(m.root);
        Ok(m.name)
    }

    fn operator(&self, opts: OperatorOptions) -> Operator {
        Operator::start(&self.client, &self.ns, &self.registry_addr, opts)
    }

    fn agent(&self, node: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.node == node)
    }

    /// The node whose runtime holds `vm`, if any does.
    async fn host(&self, vm: &str) -> Option<String> {
        all_vms(&self.agents)
            .await
            .into_iter()
            .find(|(_, name, _)| name == vm)
            .map(|(node, _, _)| node)
    }

    /// Writes a fresh marker into each VM's guest, then reads every VM's state.
    async fn mark(&self, vms: &[String]) -> Result<BTreeMap<String, GuestState>, BoxError> {
        for vm in vms {
            let node = self.host(vm).await.ok_or(format!("{vm} is not live"))?;
            let agent = self.agent(&node).ok_or("no agent")?;
            let mark = cocoon_testenv::unique_name("state");
            let script = format!("echo {mark} > {MARKER}");
            let out = exec_capture(agent.runtime.as_ref(), vm, &["sh", "-c", &script], None).await;
            out.result.map_err(|e| format!("exec in {vm}: {e}"))?;
        }
        self.states(vms).await
    }

    /// Creates the retain set (`subs` sub-agents and a toolbox) and waits until it runs.
    async fn create_retain_running(&self, subs: i32) -> Result<(), BoxError> {
        self.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(SET, retain_spec(&self.pool, subs, true)),
            )
            .await?;
        let agents = subs + 1;
        watch_set(
            &self.sets,
            SET,
            &format!("Running {agents}/{agents}, toolbox 1/1"),
            |cs| settled_running(cs, agents, 1),
        )
        .await?;
        Ok(())
    }

    /// Every one of `vms` has had its `:hibernate` tag dropped.
    async fn assert_reclaimed(&self, vms: &[String]) -> Result<(), BoxError> {
        for vm in vms {
            assert!(
                !self.reg.has_manifest(vm, "hibernate").await?,
                "{vm}:hibernate reclaimed"
            );
        }
        Ok(())
    }

    /// Every VM's guest state, read on the node that runs it now.
    async fn states(&self, vms: &[String]) -> Result<BTreeMap<String, GuestState>, BoxError> {
        let mut out = BTreeMap::new();
        for vm in vms {
            let node = self.host(vm).await.ok_or(format!("{vm} is not live"))?;
            let sim = &self.agent(&node).ok_or("no agent")?.sim;
            let state = GuestState {
                token: sim.guest_token(vm)?,
                marker: sim.guest_file(vm, MARKER)?.map(|m| m.trim().to_owned()),
            };
            out.insert(vm.clone(), state);
        }
        Ok(out)
    }

    /// How many VMs named in `vms` the agents' runtimes hold.
    async fn live_count(&self, vms: &[String]) -> usize {
        all_vms(&self.agents)
            .await
            .iter()
            .filter(|(_, name, _)| vms.contains(name))
            .count()
    }

    /// Deletes the sets (the operator must still run: it holds the finalizer), waits for them
    /// and their VMs to go, and deletes the namespace.
    async fn teardown(self, names: &[&str]) -> TestResult {
        for name in names {
            self.sets.delete(name, &DeleteParams::default()).await?;
        }
        for name in names {
            cocoon_testenv::wait_until(&format!("{name} deleted"), WAIT, || async {
                matches!(self.sets.get_opt(name).await, Ok(None)).then_some(())
            })
            .await?;
        }
        cocoon_testenv::wait_until("every VM gone", WAIT, || async {
            all_vms(&self.agents).await.is_empty().then_some(())
        })
        .await?;
        let Cluster {
            client,
            ns,
            nodes,
            agents,
            roots,
            ..
        } = self;
        drop(agents);
        drop(nodes);
        drop(roots);
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok(())
    }
}

/// What a guest holds: its state token and this test's marker.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GuestState {
    token: String,
    marker: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Specs, options and observations
// ---------------------------------------------------------------------------------------------

/// Both controllers with short requeues and polls, and the given suspend deadline.
fn options(deadline: Duration) -> OperatorOptions {
    let mut o = OperatorOptions::fast();
    o.sets.suspend_poll = Duration::from_millis(500);
    o.sets.migrate_poll = Duration::from_millis(500);
    o.sets.suspend_deadline = deadline;
    o
}

/// Main + `replicas` sub-agents (+ the `tb` toolbox when asked), retain policy.
fn retain_spec(pool: &str, replicas: i32, toolbox: bool) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image(IMAGE);
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.replicas = replicas;
    if toolbox {
        s.toolboxes = vec![ToolboxSpec {
            name: "tb".into(),
            image: IMAGE.into(),
            ..ToolboxSpec::default()
        }];
    }
    s
}

/// A main-only set under the release policy.
fn release_spec(pool: &str) -> CocoonSetSpec {
    let mut s = retain_spec(pool, 0, false);
    s.hibernate_policy = HibernatePolicy::Release;
    s
}

/// `cpu` requested by the main's pod (a TestNode has 8).
fn with_cpu(mut s: CocoonSetSpec, cpu: &str) -> CocoonSetSpec {
    s.agent.vm.resources = Some(ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity(cpu.into()))])),
        ..ResourceRequirements::default()
    });
    s
}

fn main_vm(ns: &str) -> String {
    vm_name_for_agent(ns, SET, 0)
}

/// The VMs of `retain_spec(_, replicas, toolbox)`: main, sub-agents, toolbox.
fn set_vms(ns: &str, replicas: i32, toolbox: bool) -> Vec<String> {
    let mut v: Vec<String> = (0..=replicas)
        .map(|slot| vm_name_for_agent(ns, SET, slot))
        .collect();
    if toolbox {
        v.push(vm_name_for_toolbox(ns, SET, "tb"));
    }
    v
}

/// Waits through a watch (a brief phase such as Failed is seen) until `check` holds.
async fn watch_set(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testsupport::scripted::wait_set_watched_within(sets, name, what, WAIT, check).await
}

/// Phase `p` reported at the set's current generation.
fn at(cs: &CocoonSet, p: CocoonSetPhase) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(p) && Some(s.observed_generation) == cs.metadata.generation
    })
}

/// Running at the current generation with `agents` and `toolboxes` ready, each reported with
/// its VM id and IP.
fn settled_running(cs: &CocoonSet, agents: i32, toolboxes: i32) -> bool {
    at(cs, CocoonSetPhase::Running)
        && cs.status.as_ref().is_some_and(|s| {
            (s.ready_agents, s.desired_agents) == (agents, agents)
                && (s.ready_toolboxes, s.desired_toolboxes) == (toolboxes, toolboxes)
                && s.agents
                    .iter()
                    .all(|a| !a.vm_id.is_empty() && !a.ip.is_empty())
                && s.toolboxes
                    .iter()
                    .all(|t| !t.vm_id.is_empty() && !t.ip.is_empty())
        })
}

fn annotation(cs: &CocoonSet, key: &str) -> Option<String> {
    cs.annotations().get(key).cloned()
}

fn record(cs: &CocoonSet) -> ReclaimRecord {
    ReclaimRecord::from_meta(&cs.metadata)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn pod_ann<'a>(p: &'a Pod, key: &str) -> &'a str {
    p.annotations().get(key).map(String::as_str).unwrap_or("")
}

/// The agent reports `state` at generation `generation` or later.
fn lifecycle_at(p: &Pod, state: &str, generation: i64) -> bool {
    pod_ann(p, ann::LIFECYCLE_STATE) == state
        && pod_ann(p, ann::LIFECYCLE_OBSERVED_GENERATION)
            .parse::<i64>()
            .is_ok_and(|g| g >= generation)
}

/// Patches the set's spec; returns the generation the patch produced.
async fn patch_spec(
    sets: &Api<CocoonSet>,
    name: &str,
    spec: serde_json::Value,
) -> Result<i64, BoxError> {
    let cs = sets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await?;
    Ok(cs.metadata.generation.unwrap_or_default())
}

async fn set_suspend(sets: &Api<CocoonSet>, name: &str, on: bool) -> Result<i64, BoxError> {
    patch_spec(sets, name, json!({ "suspend": on })).await
}

/// Waits until pod `name` exists and satisfies `check`.
async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Result<Pod, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name}: {what}"), WAIT, || async {
        let p = pods.get_opt(name).await.ok().flatten()?;
        check(&p).then_some(p)
    })
    .await
}

/// The main once its lifecycle reads `ready` at `generation` or later. A set can show Running
/// a moment before that: the node agent publishes the Ready status first and the lifecycle
/// annotation after it (node.md §5.3).
async fn main_ready_at(pods: &Api<Pod>, generation: i64) -> Result<Pod, cocoon_testenv::Error> {
    wait_pod(pods, "demo-0", "ready at the unsuspend's generation", |p| {
        lifecycle_at(p, "ready", generation)
    })
    .await
}

async fn wait_pod_gone(pods: &Api<Pod>, name: &str) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name} gone"), WAIT, || async {
        matches!(pods.get_opt(name).await, Ok(None)).then_some(())
    })
    .await
}

async fn wait_tag(
    reg: &RegistryClient,
    vm: &str,
    present: bool,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(
        &format!("{vm}:hibernate present={present}"),
        WAIT,
        || async { (reg.has_manifest(vm, "hibernate").await.ok()? == present).then_some(()) },
    )
    .await
}

/// Waits until `sim` has at least `n` calls of `verb` held by a block.
async fn wait_blocked(agent: &Agent, verb: Verb, n: usize) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{n} {verb:?} call(s) blocked"), WAIT, || async {
        (agent.sim.blocked(verb) >= n).then_some(())
    })
    .await
}

/// The Events with `reason` in `ns`, once there is one.
async fn wait_events(
    client: &Client,
    ns: &str,
    reason: &str,
) -> Result<Vec<Event>, cocoon_testenv::Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    cocoon_testenv::wait_until(&format!("event {reason}"), WAIT, || async {
        let found: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await
}

fn note(e: &Event) -> &str {
    e.note.as_deref().unwrap_or_default()
}

fn wakes(m: &Metrics, ns: &str, placement: &str) -> u64 {
    m.slot_release_wake
        .get_or_create(&PlacementLabels {
            namespace: ns.into(),
            cocoonset: SET.into(),
            placement: placement.into(),
        })
        .get()
}

fn set_labels(ns: &str) -> SetLabels {
    SetLabels {
        namespace: ns.into(),
        cocoonset: SET.into(),
    }
}

/// Suspends the release-policy set `demo` and waits until its seat is freed: Suspended with
/// the node hint, the main's pod and VM gone, its snapshot in the registry.
async fn release(c: &Cluster, node: &str) -> TestResult {
    let vm = main_vm(&c.ns);
    set_suspend(&c.sets, SET, true).await?;
    let cs = watch_set(&c.sets, SET, "Suspended with the node hint", |cs| {
        at(cs, CocoonSetPhase::Suspended) && annotation(cs, ann::HIBERNATED_ON_NODE).is_some()
    })
    .await?;
    assert_eq!(
        annotation(&cs, ann::HIBERNATED_ON_NODE).as_deref(),
        Some(node),
        "the hint names the node the main ran on"
    );
    wait_pod_gone(&c.pods, "demo-0").await?;
    assert_eq!(
        c.live_count(std::slice::from_ref(&vm)).await,
        0,
        "no VM left"
    );
    assert!(c.reg.has_manifest(&vm, "hibernate").await?, "snapshot kept");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Retain: suspend hibernates every managed VM (main, sub-agents, toolbox) with its snapshot
/// in the registry while every pod keeps its seat; unsuspend wakes each in place with its
/// guest state, and the tags are reclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retain_round_trip_keeps_every_vms_state() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-retain", env.registry_addr(), 2).await?;
        let _op = c.operator(options(NO_DEADLINE));
        c.create_retain_running(2).await?;
        let vms = set_vms(&c.ns, 2, true);
        let before = c.mark(&vms).await?;
        let main_token = before[&vms[0]].token.clone();
        assert_eq!(
            before[&vms[1]].token, main_token,
            "a sub-agent is a fork of the main"
        );
        assert_ne!(
            before[&vms[3]].token, main_token,
            "the toolbox booted on its own"
        );
        let seats: BTreeMap<String, String> = c
            .pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| (p.name_any(), node_of(p)))
            .collect();
        assert_eq!(seats.len(), 4);

        let generation = set_suspend(&c.sets, SET, true).await?;
        let cs = watch_set(&c.sets, SET, "Suspended", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        let rec = record(&cs);
        assert_eq!(sorted(rec.vms.clone()), sorted(vms.clone()), "{rec:?}");
        assert_eq!(
            sorted(rec.suspended.clone()),
            sorted(vms.clone()),
            "{rec:?}"
        );
        assert!(annotation(&cs, ann::SUSPENDING_SINCE).is_none());
        let listed = c.pods.list(&ListParams::default()).await?.items;
        assert_eq!(listed.len(), seats.len(), "every pod is still there");
        for p in listed {
            assert!(
                lifecycle_at(&p, "hibernated", generation),
                "{} hibernated at generation {generation}: {:?}",
                p.name_any(),
                p.annotations()
            );
            assert_eq!(pod_ann(&p, ann::VM_ID), "", "{} has no VM", p.name_any());
            assert_eq!(
                seats.get(&p.name_any()),
                Some(&node_of(&p)),
                "{} kept its seat",
                p.name_any()
            );
        }
        assert_eq!(c.live_count(&vms).await, 0, "every VM hibernated");
        for vm in &vms {
            assert!(c.reg.has_manifest(vm, "hibernate").await?, "{vm}:hibernate");
        }

        let generation = set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Running again, record reclaimed", |cs| {
            settled_running(cs, 3, 1) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        let after = c.states(&vms).await?;
        assert_eq!(after, before, "every VM woke with its own state");
        let listed = c.pods.list(&ListParams::default()).await?.items;
        assert_eq!(listed.len(), seats.len(), "every pod is still there");
        for p in listed {
            let vm = pod_ann(&p, ann::VM_NAME).to_owned();
            assert!(lifecycle_at(&p, "ready", generation), "{}", p.name_any());
            assert!(!pod_ann(&p, ann::VM_ID).is_empty());
            assert!(!p.annotations().contains_key(ann::HIBERNATE));
            assert_eq!(
                c.host(&vm).await,
                Some(node_of(&p)),
                "{vm} woke on its seat"
            );
            assert_eq!(seats.get(&p.name_any()), Some(&node_of(&p)));
        }
        c.assert_reclaimed(&vms).await?;
        c.teardown(&[SET]).await
    })
    .await;
}

/// Release: the seat is freed once the snapshot is in the registry; the wake lands back on
/// the hinted node from the node-local snapshot. Then, with that node taken by another set,
/// the wake reports WakeNoCapacity while nothing fits and restores cold, pulled from the
/// registry, on a node that joins the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_wakes_warm_on_the_hint_then_cold_elsewhere_when_it_is_full() {
    cocoon_testenv::run_test(|env| async move {
        let mut c = Cluster::new(env, "css-release", env.registry_addr(), 1).await?;
        let node_a = c.agents[0].node.clone();
        let op = c.operator(options(NO_DEADLINE));
        // Each main asks for 5 of a node's 8 CPUs: two never fit on one node.
        c.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(SET, with_cpu(release_spec(&c.pool), "5")),
            )
            .await?;
        watch_set(&c.sets, SET, "Running", |cs| settled_running(cs, 1, 0)).await?;
        let vm = main_vm(&c.ns);
        let vms = vec![vm.clone()];
        assert_eq!(node_of(&c.pods.get("demo-0").await?), node_a);
        let first = c.mark(&vms).await?;

        // Warm wake.
        release(&c, &node_a).await?;
        assert_eq!(
            op.metrics
                .slot_release_pods_deleted
                .get_or_create(&set_labels(&c.ns))
                .get(),
            1
        );
        let imports_a = c.agents[0].sim.call_count(Verb::SnapshotImport);
        let generation = set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Running, hint cleared", |cs| {
            settled_running(cs, 1, 0) && annotation(cs, ann::HIBERNATED_ON_NODE).is_none()
        })
        .await?;
        let main = main_ready_at(&c.pods, generation).await?;
        assert_eq!(pod_ann(&main, ann::RESTORE_FROM_HIBERNATE), "true");
        assert_eq!(node_of(&main), node_a, "woke on the hinted node");
        let preferred = main
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .clone()
            })
            .unwrap_or_default();
        assert_eq!(preferred.len(), 1, "{preferred:?}");
        assert_eq!(preferred[0].weight, 100);
        let terms = preferred[0]
            .preference
            .match_expressions
            .clone()
            .unwrap_or_default();
        assert_eq!(terms[0].key, "kubernetes.io/hostname");
        assert_eq!(
            terms[0].values.clone().unwrap_or_default(),
            vec![node_a.clone()]
        );
        assert_eq!(
            c.states(&vms).await?,
            first,
            "state intact after the warm wake"
        );
        assert_eq!(
            c.agents[0].sim.call_count(Verb::SnapshotImport),
            imports_a,
            "warm: restored from the node-local snapshot, nothing pulled"
        );
        assert_eq!(wakes(&op.metrics, &c.ns, "hint-node"), 1);
        assert_eq!(wakes(&op.metrics, &c.ns, "pool"), 0);
        wait_tag(&c.reg, &vm, false).await?;

        // Cold wake: another set takes the freed seat.
        let second = c.mark(&vms).await?;
        assert_ne!(second, first, "a new marker");
        release(&c, &node_a).await?;
        let mut filler = with_cpu(retain_spec(&c.pool, 0, false), "5");
        filler.agent.image = IMAGE.into();
        c.sets
            .create(&PostParams::default(), &CocoonSet::new("filler", filler))
            .await?;
        watch_set(&c.sets, "filler", "Running", |cs| settled_running(cs, 1, 0)).await?;
        assert_eq!(node_of(&c.pods.get("filler-0").await?), node_a);

        let generation = set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Waking", |cs| at(cs, CocoonSetPhase::Waking)).await?;
        let events = wait_events(&c.client, &c.ns, "WakeNoCapacity").await?;
        for e in &events {
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            assert!(
                note(e).starts_with("main pod demo-0 unschedulable: "),
                "{}",
                note(e)
            );
        }
        assert!(
            op.metrics
                .slot_release_wake_unschedulable
                .get_or_create(&set_labels(&c.ns))
                .get()
                >= 1
        );
        let pending = c.pods.get("demo-0").await?;
        assert_eq!(node_of(&pending), "", "nothing fits");
        assert_eq!(pod_ann(&pending, ann::RESTORE_FROM_HIBERNATE), "true");
        assert!(at(&c.sets.get(SET).await?, CocoonSetPhase::Waking));
        assert!(
            c.reg.has_manifest(&vm, "hibernate").await?,
            "snapshot kept meanwhile"
        );

        // Capacity appears on another node.
        let node_b = c.add_node(env).await?;
        watch_set(&c.sets, SET, "Running after the cold wake", |cs| {
            settled_running(cs, 1, 0) && annotation(cs, ann::HIBERNATED_ON_NODE).is_none()
        })
        .await?;
        let main = main_ready_at(&c.pods, generation).await?;
        assert_eq!(node_of(&main), node_b, "woke elsewhere in the pool");
        assert_eq!(
            c.states(&vms).await?,
            second,
            "state intact after the cold wake"
        );
        let agent_b = c.agent(&node_b).ok_or("agent b")?;
        assert!(
            agent_b.sim.call_count(Verb::SnapshotImport) >= 1,
            "cold: the snapshot was pulled from the registry"
        );
        assert_eq!(wakes(&op.metrics, &c.ns, "pool"), 1);
        assert_eq!(wakes(&op.metrics, &c.ns, "hint-node"), 1);
        wait_tag(&c.reg, &vm, false).await?;
        c.teardown(&[SET, "filler"]).await
    })
    .await;
}

/// Release, then the image is edited while suspended: the snapshot was taken from the old
/// image, so the wake drops the `:hibernate` tag and the main boots fresh on the new image.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn image_edited_while_released_boots_fresh_and_drops_the_tag() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-image", env.registry_addr(), 1).await?;
        let node = c.agents[0].node.clone();
        let _op = c.operator(options(NO_DEADLINE));
        c.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(SET, release_spec(&c.pool)),
            )
            .await?;
        watch_set(&c.sets, SET, "Running", |cs| settled_running(cs, 1, 0)).await?;
        let vm = main_vm(&c.ns);
        let vms = vec![vm.clone()];
        let before = c.mark(&vms).await?;
        release(&c, &node).await?;
        let recorded = c
            .reg
            .manifest_annotations(&vm, "hibernate")
            .await?
            .get("cocoonstack.snapshot.baseimage")
            .cloned();
        assert_eq!(
            recorded.as_deref(),
            Some(IMAGE),
            "the agent recorded the image"
        );

        let new_image = "ubuntu:24.10";
        let generation = patch_spec(
            &c.sets,
            SET,
            json!({"suspend": false, "agent": {"image": new_image}}),
        )
        .await?;
        watch_set(&c.sets, SET, "Running on the new image", |cs| {
            settled_running(cs, 1, 0)
                && annotation(cs, ann::HIBERNATED_ON_NODE).is_none()
                && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        assert!(!c.reg.has_manifest(&vm, "hibernate").await?, "tag dropped");
        let main = main_ready_at(&c.pods, generation).await?;
        assert_eq!(pod_ann(&main, ann::IMAGE), new_image);
        assert!(
            !main.annotations().contains_key(ann::RESTORE_FROM_HIBERNATE),
            "not restore-marked"
        );
        let after = c.states(&vms).await?;
        assert_ne!(
            after[&vm].token, before[&vm].token,
            "a fresh boot: new state token"
        );
        assert_eq!(after[&vm].marker, None, "nothing of the old guest");
        c.teardown(&[SET]).await
    })
    .await;
}

/// A hibernate the node agent cannot finish (its `snapshot save` of the sub-agent fails) makes
/// the set Failed with SuspendTimedOut after the deadline, then Suspending again with a fresh
/// deadline, and Failed again; once the save works the suspend completes and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspend_timeout_surfaces_and_recovers() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-timeout", env.registry_addr(), 1).await?;
        let _op = c.operator(options(Duration::from_secs(6)));
        c.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(SET, retain_spec(&c.pool, 1, false)),
            )
            .await?;
        watch_set(&c.sets, SET, "Running 2/2", |cs| settled_running(cs, 2, 0)).await?;
        let vms = set_vms(&c.ns, 1, false);
        let before = c.mark(&vms).await?;
        const INJECTED: &str = "simulated: snapshot save refused";
        c.agents[0]
            .sim
            .fail(FailRule::new(Verb::SnapshotSave, INJECTED).target(vms[1].as_str()));

        let generation = set_suspend(&c.sets, SET, true).await?;
        let failed = watch_set(&c.sets, SET, "Failed", |cs| at(cs, CocoonSetPhase::Failed)).await?;
        let events = wait_events(&c.client, &c.ns, "SuspendTimedOut").await?;
        assert_eq!(events[0].type_.as_deref(), Some("Warning"));
        assert_eq!(
            note(&events[0]),
            "not every managed VM was hibernated with its snapshot in the registry within 6s"
        );
        let main = c.pods.get("demo-0").await?;
        assert!(
            lifecycle_at(&main, "hibernated", generation),
            "the main hibernated"
        );
        let sub = c.pods.get("demo-1").await?;
        assert_eq!(pod_ann(&sub, ann::LIFECYCLE_STATE), "failed");
        assert!(pod_ann(&sub, ann::LIFECYCLE_STATE_MESSAGE).contains(INJECTED));
        assert_eq!(
            c.live_count(&vms[1..]).await,
            1,
            "the sub-agent's VM stays live while its hibernate fails"
        );
        let since = annotation(&failed, ann::SUSPENDING_SINCE);

        // The next pass re-enters Suspending with a fresh deadline, which also runs out.
        let again = watch_set(&c.sets, SET, "Suspending with a fresh deadline", |cs| {
            at(cs, CocoonSetPhase::Suspending)
                && annotation(cs, ann::SUSPENDING_SINCE).is_some()
                && annotation(cs, ann::SUSPENDING_SINCE) != since
        })
        .await?;
        assert_eq!(again.metadata.generation, Some(generation));
        watch_set(&c.sets, SET, "Failed again", |cs| {
            at(cs, CocoonSetPhase::Failed)
        })
        .await?;

        // The save works again: the agent's retry completes the hibernate, and the suspend.
        c.agents[0].sim.clear_failures();
        let cs = watch_set(&c.sets, SET, "Suspended", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        assert!(annotation(&cs, ann::SUSPENDING_SINCE).is_none());
        assert_eq!(c.live_count(&vms).await, 0);
        for vm in &vms {
            assert!(c.reg.has_manifest(vm, "hibernate").await?, "{vm}:hibernate");
        }
        set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Running, reclaimed", |cs| {
            settled_running(cs, 2, 0) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        assert_eq!(c.states(&vms).await?, before, "every VM kept its state");
        c.teardown(&[SET]).await
    })
    .await;
}

/// Retain: the operator is killed mid-suspend (one toolbox snapshot held by the runtime) and
/// again mid-wake (the toolbox's restore held); each time a new operator, with nothing but the
/// API objects and the registry, finishes the transition and every VM keeps its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_killed_mid_suspend_and_mid_wake_loses_nothing() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-kill", env.registry_addr(), 1).await?;
        let agent = &c.agents[0];
        let op = c.operator(options(NO_DEADLINE));
        c.create_retain_running(1).await?;
        let vms = set_vms(&c.ns, 1, true);
        let tb_vm = vms[2].clone();
        let before = c.mark(&vms).await?;

        // Mid-suspend: the toolbox's snapshot save hangs; the others hibernate.
        agent.sim.block(Verb::SnapshotSave, Some(&tb_vm));
        let generation = set_suspend(&c.sets, SET, true).await?;
        watch_set(&c.sets, SET, "Suspending", |cs| {
            at(cs, CocoonSetPhase::Suspending)
        })
        .await?;
        for name in ["demo-0", "demo-1"] {
            wait_pod(&c.pods, name, "hibernated", |p| {
                lifecycle_at(p, "hibernated", generation)
            })
            .await?;
        }
        wait_blocked(agent, Verb::SnapshotSave, 1).await?;
        op.kill().await;
        let cs = c.sets.get(SET).await?;
        assert_eq!(
            sorted(record(&cs).vms),
            sorted(vms.clone()),
            "record written first"
        );
        // With no operator, the toolbox finishes hibernating.
        agent.sim.unblock(Verb::SnapshotSave);
        wait_pod(&c.pods, "demo-tb", "hibernated", |p| {
            lifecycle_at(p, "hibernated", generation)
        })
        .await?;
        assert!(at(&c.sets.get(SET).await?, CocoonSetPhase::Suspending));
        let op = c.operator(options(NO_DEADLINE));
        watch_set(&c.sets, SET, "Suspended", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        assert_eq!(c.live_count(&vms).await, 0);
        for vm in &vms {
            assert!(c.reg.has_manifest(vm, "hibernate").await?, "{vm}:hibernate");
        }

        // Mid-wake: the toolbox's restore hangs; the agents wake.
        agent.sim.block(Verb::Clone, Some(&tb_vm));
        let generation = set_suspend(&c.sets, SET, false).await?;
        for name in ["demo-0", "demo-1"] {
            wait_pod(&c.pods, name, "woken", |p| {
                lifecycle_at(p, "ready", generation) && !pod_ann(p, ann::VM_ID).is_empty()
            })
            .await?;
        }
        wait_blocked(agent, Verb::Clone, 1).await?;
        op.kill().await;
        assert!(
            c.reg.has_manifest(&tb_vm, "hibernate").await?,
            "the toolbox's snapshot is kept while it has not woken"
        );
        let cs = c.sets.get(SET).await?;
        assert!(
            record(&cs).vms.contains(&tb_vm),
            "the toolbox stays recorded: {:?}",
            record(&cs)
        );
        agent.sim.unblock(Verb::Clone);
        let _op = c.operator(options(NO_DEADLINE));
        watch_set(&c.sets, SET, "Running, reclaimed", |cs| {
            settled_running(cs, 2, 1) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        assert_eq!(c.states(&vms).await?, before, "every VM kept its state");
        c.assert_reclaimed(&vms).await?;
        c.teardown(&[SET]).await
    })
    .await;
}

/// Release: the operator is killed mid-suspend (the snapshot save held) and mid-wake (the
/// restore held, the set Waking); the new operator frees the seat, then finishes the wake from
/// the snapshot (never a fresh boot) and scores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_killed_mid_release_and_mid_wake_wakes_from_the_snapshot() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-killrel", env.registry_addr(), 1).await?;
        let agent = &c.agents[0];
        let node = agent.node.clone();
        let op = c.operator(options(NO_DEADLINE));
        c.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(SET, release_spec(&c.pool)),
            )
            .await?;
        watch_set(&c.sets, SET, "Running", |cs| settled_running(cs, 1, 0)).await?;
        let vm = main_vm(&c.ns);
        let vms = vec![vm.clone()];
        let before = c.mark(&vms).await?;

        agent.sim.block(Verb::SnapshotSave, Some(&vm));
        let generation = set_suspend(&c.sets, SET, true).await?;
        watch_set(&c.sets, SET, "Suspending", |cs| {
            at(cs, CocoonSetPhase::Suspending)
        })
        .await?;
        wait_blocked(agent, Verb::SnapshotSave, 1).await?;
        op.kill().await;
        agent.sim.unblock(Verb::SnapshotSave);
        wait_pod(&c.pods, "demo-0", "hibernated", |p| {
            lifecycle_at(p, "hibernated", generation)
        })
        .await?;
        let op = c.operator(options(NO_DEADLINE));
        let cs = watch_set(&c.sets, SET, "Suspended with the hint", |cs| {
            at(cs, CocoonSetPhase::Suspended) && annotation(cs, ann::HIBERNATED_ON_NODE).is_some()
        })
        .await?;
        assert_eq!(
            annotation(&cs, ann::HIBERNATED_ON_NODE).as_deref(),
            Some(node.as_str())
        );
        wait_pod_gone(&c.pods, "demo-0").await?;
        assert!(c.reg.has_manifest(&vm, "hibernate").await?);

        agent.sim.block(Verb::Clone, Some(&vm));
        let generation = set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Waking", |cs| at(cs, CocoonSetPhase::Waking)).await?;
        let waking = wait_pod(&c.pods, "demo-0", "restore-marked on the node", |p| {
            pod_ann(p, ann::RESTORE_FROM_HIBERNATE) == "true" && node_of(p) == node
        })
        .await?;
        wait_blocked(agent, Verb::Clone, 1).await?;
        op.kill().await;
        let op = c.operator(options(NO_DEADLINE));
        agent.sim.unblock(Verb::Clone);
        watch_set(&c.sets, SET, "Running, hint cleared", |cs| {
            settled_running(cs, 1, 0) && annotation(cs, ann::HIBERNATED_ON_NODE).is_none()
        })
        .await?;
        let main = main_ready_at(&c.pods, generation).await?;
        assert_eq!(main.uid(), waking.uid(), "the wake's pod, not a fresh one");
        assert_eq!(c.states(&vms).await?, before, "state intact");
        assert_eq!(
            wakes(&op.metrics, &c.ns, "hint-node"),
            1,
            "scored by the new operator"
        );
        wait_tag(&c.reg, &vm, false).await?;
        c.teardown(&[SET]).await
    })
    .await;
}

/// The registry stops answering (SIGSTOP) mid-suspend, after the main's snapshot landed and
/// while the sub-agent's and the toolbox's pushes are under way: no VM is lost while it is
/// down, and the suspend completes once it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registry_down_during_suspend_loses_no_vm_and_completes_when_back() {
    cocoon_testenv::run_test(|env| async move {
        let registry = cocoon_testenv::Registry::start_temp(None).await?;
        let c = Cluster::new(env, "css-regdown", registry.addr(), 1).await?;
        let agent = &c.agents[0];
        let _op = c.operator(options(NO_DEADLINE));
        c.create_retain_running(1).await?;
        let vms = set_vms(&c.ns, 1, true);
        let before = c.mark(&vms).await?;

        // Only the main hibernates while the registry is up.
        for vm in &vms[1..] {
            agent.sim.block(Verb::SnapshotSave, Some(vm));
        }
        let generation = set_suspend(&c.sets, SET, true).await?;
        wait_pod(&c.pods, "demo-0", "hibernated", |p| {
            lifecycle_at(p, "hibernated", generation)
        })
        .await?;
        wait_tag(&c.reg, &vms[0], true).await?;
        wait_blocked(agent, Verb::SnapshotSave, 2).await?;

        registry.pause()?;
        agent.sim.unblock(Verb::SnapshotSave);
        let outcome = async {
            // Both snapshots are saved on the node; their pushes now wait on the registry.
            for vm in &vms[1..] {
                cocoon_testenv::wait_until(&format!("{vm} saved locally"), WAIT, || async {
                    agent.runtime.snapshot_inspect(vm).await.ok().map(|_| ())
                })
                .await?;
            }
            for name in ["demo-1", "demo-tb"] {
                let p = c.pods.get(name).await?;
                assert_eq!(pod_ann(&p, ann::LIFECYCLE_STATE), "hibernating", "{name}");
                assert!(
                    !pod_ann(&p, ann::VM_ID).is_empty(),
                    "{name} still has its VM"
                );
            }
            let cs = c.sets.get(SET).await?;
            assert!(
                at(&cs, CocoonSetPhase::Suspending),
                "not Suspended while snapshots are missing: {:?}",
                cs.status
            );
            assert_eq!(
                c.live_count(&vms[1..]).await,
                2,
                "the VMs whose snapshot has not landed stay live"
            );
            TestResult::Ok(())
        }
        .await;
        registry.resume()?;
        outcome?;

        let cs = watch_set(&c.sets, SET, "Suspended once the registry is back", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        assert_eq!(sorted(record(&cs).vms), sorted(vms.clone()));
        assert_eq!(c.live_count(&vms).await, 0);
        for vm in &vms {
            assert!(c.reg.has_manifest(vm, "hibernate").await?, "{vm}:hibernate");
        }
        set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Running, reclaimed", |cs| {
            settled_running(cs, 2, 1) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        assert_eq!(c.states(&vms).await?, before, "every VM kept its state");
        c.teardown(&[SET]).await?;
        registry.shutdown();
        TestResult::Ok(())
    })
    .await;
}

/// Retain: every pod is deleted while the set is Suspended. The main comes back at once from
/// its snapshot (and hibernates again); the sub-agent and the toolbox are owed a restore and
/// come back from theirs on unsuspend, so every VM keeps its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_deleted_while_suspended_come_back_with_their_state() {
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-deleted", env.registry_addr(), 1).await?;
        let _op = c.operator(options(NO_DEADLINE));
        c.create_retain_running(1).await?;
        let vms = set_vms(&c.ns, 1, true);
        let before = c.mark(&vms).await?;
        let generation = set_suspend(&c.sets, SET, true).await?;
        watch_set(&c.sets, SET, "Suspended", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        let old_main = c.pods.get("demo-0").await?.uid();
        for name in ["demo-0", "demo-1", "demo-tb"] {
            c.pods.delete(name, &DeleteParams::default()).await?;
        }
        for name in ["demo-1", "demo-tb"] {
            wait_pod_gone(&c.pods, name).await?;
        }
        // The main is recreated from its snapshot and hibernated again; the others stay gone.
        let main = wait_pod(&c.pods, "demo-0", "recreated and hibernated", |p| {
            p.uid() != old_main && lifecycle_at(p, "hibernated", generation)
        })
        .await?;
        assert_eq!(pod_ann(&main, ann::RESTORE_FROM_HIBERNATE), "true");
        watch_set(&c.sets, SET, "Suspended again", |cs| {
            at(cs, CocoonSetPhase::Suspended)
        })
        .await?;
        assert!(c.pods.get_opt("demo-1").await?.is_none());
        assert!(c.pods.get_opt("demo-tb").await?.is_none());
        assert_eq!(c.live_count(&vms).await, 0);

        set_suspend(&c.sets, SET, false).await?;
        watch_set(&c.sets, SET, "Running, reclaimed", |cs| {
            settled_running(cs, 2, 1) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
        })
        .await?;
        for name in ["demo-1", "demo-tb"] {
            let p = c.pods.get(name).await?;
            assert_eq!(
                pod_ann(&p, ann::RESTORE_FROM_HIBERNATE),
                "true",
                "{name} restored"
            );
        }
        assert_eq!(c.states(&vms).await?, before, "every VM kept its state");
        c.assert_reclaimed(&vms).await?;
        c.teardown(&[SET]).await
    })
    .await;
}

/// A suspend and a resume patch each pod once (a pass reading a cache that does not show the
/// controller's own hibernate write yet must not write it again), and the resume reclaims
/// every woken VM's `:hibernate` tag in one record write when the pods became Ready within
/// the reclaim hold: three record writes in all (the bookkeeping's two and the reclaim).
/// Counted from the API server's audit log of the controller's own identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspend_and_resume_patch_each_pod_once_and_reclaim_in_one_record_write() {
    use cocoon_operator::cocoonset::steps::unsuspend::rules::RECLAIM_HOLD;
    cocoon_testenv::run_test(|env| async move {
        let c = Cluster::new(env, "css-writes", env.registry_addr(), 1).await?;
        let Some(audit) = env.audit_log() else {
            return Err::<(), BoxError>(
                "the test environment's run directory is unknown (set TESTENV_RUN_DIR)".into(),
            );
        };
        let identity = AuditedIdentity::new(env, &c.client, "css-writes-operator").await?;
        let _op = Operator::start(
            &identity.client,
            &c.ns,
            &c.registry_addr,
            options(NO_DEADLINE),
        );
        c.create_retain_running(2).await?;
        let pod_names = ["demo-0", "demo-1", "demo-2", "demo-tb"];
        let vms = set_vms(&c.ns, 2, true);
        let mut seen = identity.writes_in(&audit, &c.ns).await?;
        for suspend in [true, false] {
            let generation = set_suspend(&c.sets, SET, suspend).await?;
            if suspend {
                watch_set(&c.sets, SET, "Suspended", |cs| {
                    at(cs, CocoonSetPhase::Suspended)
                })
                .await?;
            } else {
                // The resume is over once the last woken VM left the record.
                watch_set(&c.sets, SET, "Running, the record gone", |cs| {
                    settled_running(cs, 3, 1) && annotation(cs, ann::HIBERNATE_RECLAIM).is_none()
                })
                .await?;
                c.assert_reclaimed(&vms).await?;
            }
            let total = identity.writes_in(&audit, &c.ns).await?;
            let writes = audit.writes_of(&identity.user, &c.ns)?;
            let mine = &writes[seen..total.min(writes.len())];
            seen = total;
            let mut patched: Vec<&str> = mine
                .iter()
                .filter(|w| w.resource == "pods" && w.verb == "patch")
                .map(|w| w.name.as_str())
                .collect();
            patched.sort();
            assert_eq!(
                patched, pod_names,
                "suspend={suspend}: each pod patched once"
            );
            if suspend {
                continue;
            }
            let records = mine
                .iter()
                .filter(|w| w.resource == "cocoonsets" && w.verb == "patch")
                .count();
            // When the pods became Ready again (whole seconds): within the hold, the reclaim
            // waits for the last of them and writes the record once.
            let mut ready_at = Vec::new();
            for name in pod_names {
                let p = c.pods.get(name).await?;
                assert!(lifecycle_at(&p, "ready", generation), "{name} woke");
                let since = p
                    .status
                    .and_then(|s| s.conditions)
                    .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
                    .and_then(|c| c.last_transition_time)
                    .map(|t| t.0.as_second());
                ready_at.push(since.ok_or("a woken pod without a Ready transition time")?);
            }
            let spread = ready_at.iter().max().copied().unwrap_or_default()
                - ready_at.iter().min().copied().unwrap_or_default();
            if spread + 1 < RECLAIM_HOLD.as_secs() as i64 {
                assert_eq!(
                    records, 3,
                    "the record written on the unsuspend, its list cleared, one reclaim"
                );
            } else {
                assert!(records <= 2 + pod_names.len(), "{records} record writes");
            }
        }
        // The controller tears the set down under its identity: that goes last.
        let admin = c.client.clone();
        c.teardown(&[SET]).await?;
        identity.delete(&admin).await
    })
    .await;
}
