//! Cross-node migration of the main (step 8 of `cocoonset.md`) end to end across THREE real
//! node agents: in-process `run_agent` on the simulated runtime (one per TestNode, each with its
//! own state directory), the real scheduler, the real registry, and both controllers in-process
//! (`cocoon-testsupport`). Nothing here writes what a node agent writes; the only stand-ins are
//! the simulator's latency, block and failure controls used to stop a migration at a chosen
//! step.
//!
//! What the migration promises, and what each test holds it to: the main's guest state (the
//! simulator's state token, copied by snapshot and restore, new on a fresh boot) survives the
//! move; only slot 0 moves; the old pod dies only after its snapshot exists, and the snapshot
//! goes only after the new VM runs; `Migrating` is persisted before the first side effect, so a
//! killed operator or node agent resumes from the API objects and the tag.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::events::operator as reasons;
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, ToolboxSpec};
use cocoon_api::naming::{vm_name_for_agent, vm_name_for_toolbox};
use cocoon_operator::metrics::SetLabels;
use cocoon_registry::RegistryClient;
use cocoon_runtime::exec_capture;
use cocoon_runtime::sim::{Latencies, Verb};
use cocoon_testsupport::{
    Agent, AgentOptions, Operator, OperatorOptions, all_vms, node_of, registry, wait_set,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tempfile::TempDir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Deadline of every wait: the machine is shared with other builds and tests.
const WAIT: Duration = Duration::from_secs(120);
const SET: &str = "demo";
const MAIN: &str = "demo-0";
const HIBERNATE_TAG: &str = "hibernate";
/// A guest file the tests write into the main after it booted.
const MARKER: &str = "/root/marker";

/// Production rules with short requeues, including the migrate and suspend polls (the spec
/// lets tests shrink the requeue constants).
fn operator_options() -> OperatorOptions {
    let mut o = OperatorOptions::fast();
    o.sets.migrate_poll = Duration::from_millis(500);
    o.sets.suspend_poll = Duration::from_millis(500);
    o
}

/// What a watch saw while a test ran: the set's phases in order, whether the main was ever
/// flagged keep-snapshot-on-delete, and every scheduler message of an unschedulable main.
#[derive(Default)]
struct Seen {
    phases: Mutex<Vec<CocoonSetPhase>>,
    keep_flagged: Mutex<BTreeSet<String>>,
    scheduler_messages: Mutex<BTreeSet<String>>,
}

impl Seen {
    fn saw(&self, p: CocoonSetPhase) -> bool {
        self.phases.lock().map(|v| v.contains(&p)).unwrap_or(false)
    }
    fn phases(&self) -> Vec<CocoonSetPhase> {
        self.phases.lock().map(|v| v.clone()).unwrap_or_default()
    }
    fn keep_flagged(&self, uid: &str) -> bool {
        self.keep_flagged
            .lock()
            .map(|v| v.contains(uid))
            .unwrap_or(false)
    }
    fn scheduler_messages(&self) -> BTreeSet<String> {
        self.scheduler_messages
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }
}

/// Three pool nodes, each with a real agent, the operator, and the test's handles.
struct Rig {
    client: Client,
    ns: String,
    pool: String,
    registry_addr: String,
    nodes: Vec<cocoon_testenv::TestNode>,
    roots: Vec<TempDir>,
    agents: Vec<Agent>,
    operator: Option<Operator>,
    sets: Api<CocoonSet>,
    pods: Api<Pod>,
    reg: RegistryClient,
    main_vm: String,
    seen: Arc<Seen>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl Rig {
    async fn start(env: &cocoon_testenv::Shared, prefix: &str) -> Result<Rig, BoxError> {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, prefix).await?;
        let pool = cocoon_testenv::unique_name("pool");
        let mut nodes = Vec::new();
        let mut roots = Vec::new();
        let mut agents = Vec::new();
        for _ in 0..3 {
            let name = cocoon_testenv::unique_name("mig-node");
            let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
            node.wait_schedulable(WAIT).await?;
            let root = tempfile::tempdir()?;
            agents.push(
                Agent::start(
                    env.client()?,
                    &name,
                    root.path(),
                    env.registry_addr(),
                    AgentOptions::fast(),
                )
                .await?,
            );
            nodes.push(node);
            roots.push(root);
        }
        let operator = Operator::start(&client, &ns, env.registry_addr(), operator_options());
        let seen = Arc::new(Seen::default());
        let watches = observe(&client, &ns, seen.clone());
        Ok(Rig {
            sets: Api::namespaced(client.clone(), &ns),
            pods: Api::namespaced(client.clone(), &ns),
            reg: registry(env.registry_addr()),
            main_vm: vm_name_for_agent(&ns, SET, 0),
            registry_addr: env.registry_addr().to_owned(),
            client,
            ns,
            pool,
            nodes,
            roots,
            agents,
            operator: Some(operator),
            seen,
            watches,
        })
    }

    fn node(&self, i: usize) -> String {
        self.nodes[i].name().to_owned()
    }

    fn index_of(&self, node: &str) -> usize {
        self.agents
            .iter()
            .position(|a| a.node == node)
            .expect("a rig node")
    }

    /// The base spec: the test image, the rig's pool, run mode, the main pinned to `pin`.
    fn spec(&self, replicas: i32, pin: &str) -> CocoonSetSpec {
        let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
        spec.node_pool = self.pool.clone();
        spec.agent.mode = AgentMode::Run;
        spec.agent.replicas = replicas;
        spec.node_name = pin.to_owned();
        spec
    }

    async fn create(&self, name: &str, spec: CocoonSetSpec) -> Result<(), BoxError> {
        self.sets
            .create(&PostParams::default(), &CocoonSet::new(name, spec))
            .await?;
        Ok(())
    }

    async fn patch_spec(&self, spec: serde_json::Value) -> Result<(), BoxError> {
        self.sets
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await?;
        Ok(())
    }

    async fn pin(&self, node: &str) -> Result<(), BoxError> {
        self.patch_spec(json!({ "nodeName": node })).await
    }

    /// Waits until the set is Running at its generation with `agents` ready agents.
    async fn running(&self, agents: i32) -> Result<CocoonSet, BoxError> {
        Ok(wait_set(
            &self.sets,
            SET,
            &format!("Running with {agents} ready agents"),
            WAIT,
            |cs| {
                cs.status.as_ref().is_some_and(|s| {
                    s.phase == Some(CocoonSetPhase::Running)
                        && Some(s.observed_generation) == cs.metadata.generation
                        && s.ready_agents == agents
                        && s.ready_toolboxes == s.desired_toolboxes
                        && s.agents.iter().all(|a| !a.vm_id.is_empty())
                })
            },
        )
        .await?)
    }

    /// The main's state token as the simulator of `node` holds it.
    async fn token_on(&self, node: &str) -> Result<String, BoxError> {
        let sim = self.agents[self.index_of(node)].sim.clone();
        let vm = self.main_vm.clone();
        Ok(
            cocoon_testenv::wait_until(&format!("{vm} running on {node}"), WAIT, || async {
                sim.guest_token(&vm).ok()
            })
            .await?,
        )
    }

    /// Writes a unique marker file into the running main's guest on `node` (state the VM
    /// gained after it booted and forked its sub-agents) and returns it.
    async fn mark(&self, node: &str) -> Result<String, BoxError> {
        let marker = cocoon_testenv::unique_name("state");
        let script = format!("echo {marker} > {MARKER}");
        let rt = self.agents[self.index_of(node)].runtime.clone();
        let out = exec_capture(rt.as_ref(), &self.main_vm, &["sh", "-c", &script], None).await;
        out.result?;
        assert_eq!(self.marker_on(node)?, Some(marker.clone()));
        Ok(marker)
    }

    /// The marker file of the main's guest on `node`.
    fn marker_on(&self, node: &str) -> Result<Option<String>, BoxError> {
        let sim = &self.agents[self.index_of(node)].sim;
        Ok(sim
            .guest_file(&self.main_vm, MARKER)?
            .map(|m| m.trim().to_owned()))
    }

    async fn tag(&self) -> Result<bool, BoxError> {
        Ok(self.reg.has_manifest(&self.main_vm, HIBERNATE_TAG).await?)
    }

    /// The nodes whose runtime holds a VM named `vm`.
    async fn hosts_of(&self, vm: &str) -> Vec<String> {
        all_vms(&self.agents)
            .await
            .into_iter()
            .filter(|(_, name, _)| name == vm)
            .map(|(node, _, _)| node)
            .collect()
    }

    /// Waits until the migration settled on `node`: the set Running at its generation, the
    /// main bound there with a live VM, lifecycle ready and no hibernate intent, its VM on that
    /// node only, and the snapshot dropped. Returns the main pod.
    async fn settled_on(&self, node: &str, agents: i32) -> Result<Pod, BoxError> {
        let main = cocoon_testenv::wait_until(
            &format!("{MAIN} live on {node} and the set Running"),
            WAIT,
            || async {
                let cs = self.sets.get_opt(SET).await.ok().flatten()?;
                let s = cs.status.as_ref()?;
                let running = s.phase == Some(CocoonSetPhase::Running)
                    && Some(s.observed_generation) == cs.metadata.generation
                    && s.ready_agents == agents;
                let p = self.pods.get_opt(MAIN).await.ok().flatten()?;
                let live = node_of(&p) == node
                    && !vm_id(&p).is_empty()
                    && !p.annotations().contains_key(ann::HIBERNATE)
                    && lifecycle(&p) == "ready"
                    && s.agents.first().is_some_and(|a| a.vm_id == vm_id(&p));
                (running && live).then_some(p)
            },
        )
        .await?;
        let vm = self.main_vm.clone();
        cocoon_testenv::wait_until(&format!("{vm} only on {node}"), WAIT, || async {
            (self.hosts_of(&vm).await == vec![node.to_owned()]).then_some(())
        })
        .await?;
        cocoon_testenv::wait_until(&format!("{vm}:hibernate dropped"), WAIT, || async {
            matches!(self.tag().await, Ok(false)).then_some(())
        })
        .await?;
        Ok(main)
    }

    /// Kills the operator where it stands and starts a new one (a new process would start
    /// with empty caches and queues, as this one does).
    async fn kill_operator(&mut self) {
        if let Some(op) = self.operator.take() {
            op.kill().await;
        }
    }

    fn start_operator(&mut self) {
        self.operator = Some(Operator::start(
            &self.client,
            &self.ns,
            &self.registry_addr,
            operator_options(),
        ));
    }

    /// Kills the agent of `node` and starts it again on the same state directory.
    async fn restart_agent(&mut self, node: &str) -> Result<(), BoxError> {
        let i = self.index_of(node);
        self.agents[i].kill().await;
        let agent = Agent::start(
            self.client.clone(),
            node,
            self.roots[i].path(),
            &self.registry_addr,
            AgentOptions::fast(),
        )
        .await?;
        self.agents[i] = agent;
        Ok(())
    }

    async fn main(&self) -> Result<Pod, BoxError> {
        Ok(self.pods.get(MAIN).await?)
    }

    /// Waits until the main pod satisfies `check`.
    async fn main_where(&self, what: &str, check: impl Fn(&Pod) -> bool) -> Result<Pod, BoxError> {
        Ok(
            cocoon_testenv::wait_until(&format!("{MAIN}: {what}"), WAIT, || async {
                let p = self.pods.get_opt(MAIN).await.ok().flatten()?;
                check(&p).then_some(p)
            })
            .await?,
        )
    }

    async fn finish(mut self) -> Result<(), BoxError> {
        self.kill_operator().await;
        for a in &mut self.agents {
            a.stop().await;
        }
        for w in &self.watches {
            w.abort();
        }
        for n in self.nodes.drain(..) {
            n.delete().await?;
        }
        cocoon_testenv::delete_namespace(&self.client, &self.ns).await?;
        Ok(())
    }
}

/// Watches the set and the main pod for the whole test.
fn observe(client: &Client, ns: &str, seen: Arc<Seen>) -> Vec<tokio::task::JoinHandle<()>> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let s = seen.clone();
    let a = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={SET}"));
        let mut stream = watcher(sets, cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(ev) = stream.next().await {
            let Ok(cs) = ev else { continue };
            if let (Some(p), Ok(mut v)) = (cs.status.and_then(|s| s.phase), s.phases.lock())
                && v.last() != Some(&p)
            {
                v.push(p);
            }
        }
    });
    let b = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={MAIN}"));
        let mut stream = watcher(pods, cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(ev) = stream.next().await {
            let Ok(p) = ev else { continue };
            if p.annotations()
                .get(ann::KEEP_SNAPSHOT_ON_DELETE)
                .is_some_and(|v| v == "true")
                && let Ok(mut v) = seen.keep_flagged.lock()
            {
                v.insert(p.uid().unwrap_or_default());
            }
            if let Some(msg) = unschedulable_message(&p)
                && let Ok(mut v) = seen.scheduler_messages.lock()
            {
                v.insert(msg);
            }
        }
    });
    vec![a, b]
}

fn vm_id(p: &Pod) -> String {
    p.annotations().get(ann::VM_ID).cloned().unwrap_or_default()
}

fn lifecycle(p: &Pod) -> String {
    p.annotations()
        .get(ann::LIFECYCLE_STATE)
        .cloned()
        .unwrap_or_default()
}

fn hibernate_annotated(p: &Pod) -> bool {
    p.annotations()
        .get(ann::HIBERNATE)
        .is_some_and(|v| v == "true")
}

fn unschedulable_message(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .and_then(|c| c.message.clone())
}

/// The values of the pod's required `kubernetes.io/hostname` affinity term.
fn required_hostnames(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == "kubernetes.io/hostname")
                .flat_map(|e| e.values.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

fn cpu_request(cpu: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some([("cpu".to_string(), Quantity(cpu.to_string()))].into()),
        ..ResourceRequirements::default()
    }
}

async fn events(client: &Client, ns: &str, reason: &str) -> Result<Vec<Event>, BoxError> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

/// A migration with sub-agents and a toolbox: the main moves with its state token, the old
/// pod was flagged keep-snapshot-on-delete and the set went through Migrating; only slot 0
/// moves, so the sub-agent keeps its pod, node, VM and state, and the toolbox is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migration_moves_the_main_with_its_state_and_only_slot_0() {
    cocoon_testenv::run_test(|env| async move {
        let rig = Rig::start(env, "mig-state").await?;
        let (a, b) = (rig.node(0), rig.node(1));
        let mut spec = rig.spec(1, &a);
        spec.toolboxes = vec![ToolboxSpec {
            name: "tb".into(),
            image: "ubuntu:24.04".into(),
            ..ToolboxSpec::default()
        }];
        rig.create(SET, spec).await?;
        rig.running(2).await?;
        let token = rig.token_on(&a).await?;
        let old = rig.main().await?;
        let sub_vm = vm_name_for_agent(&rig.ns, SET, 1);
        let tb_vm = vm_name_for_toolbox(&rig.ns, SET, "tb");
        let sub = rig.pods.get("demo-1").await?;
        let tb = rig.pods.get("demo-tb").await?;
        let tb_node = node_of(&tb);
        assert_eq!(
            node_of(&sub),
            a,
            "the sub-agent is bound to the main's node"
        );
        let sub_token = rig.agents[0].sim.guest_token(&sub_vm)?;
        let tb_token = rig.agents[rig.index_of(&tb_node)].sim.guest_token(&tb_vm)?;
        // State the main gained after its sub-agent forked: the token alone is shared by the
        // fork, this marker is the main's own.
        let marker = rig.mark(&a).await?;

        rig.pin(&b).await?;
        let main = rig.settled_on(&b, 2).await?;

        assert_eq!(
            rig.agents[1].sim.guest_token(&rig.main_vm)?,
            token,
            "the main runs on the target with the state it had on the source"
        );
        assert_eq!(
            rig.marker_on(&b)?,
            Some(marker),
            "the main's latest state moved"
        );
        assert_ne!(
            main.uid(),
            old.uid(),
            "the main was recreated on the target"
        );
        assert_eq!(
            main.annotations()
                .get(ann::RESTORE_FROM_HIBERNATE)
                .map(String::as_str),
            Some("true"),
            "recreated from the migration's snapshot"
        );
        assert_eq!(required_hostnames(&main), vec![b.clone()]);
        assert!(
            rig.seen.saw(CocoonSetPhase::Migrating),
            "phases {:?}",
            rig.seen.phases()
        );
        assert!(
            rig.seen.keep_flagged(&old.uid().unwrap_or_default()),
            "the old main was flagged keep-snapshot-on-delete before its delete"
        );
        // Only slot 0 moves: the sub-agent and the toolbox keep pod, node, VM and state.
        let sub_now = rig.pods.get("demo-1").await?;
        assert_eq!(sub_now.uid(), sub.uid());
        assert_eq!(node_of(&sub_now), a, "the sub-agent keeps its bind");
        assert_eq!(vm_id(&sub_now), vm_id(&sub));
        assert_eq!(rig.agents[0].sim.guest_token(&sub_vm)?, sub_token);
        assert_eq!(
            rig.agents[0].sim.guest_file(&sub_vm, MARKER)?,
            None,
            "the sub-agent keeps its own state"
        );
        let tb_now = rig.pods.get("demo-tb").await?;
        assert_eq!(
            (tb_now.uid(), node_of(&tb_now), vm_id(&tb_now)),
            (tb.uid(), tb_node.clone(), vm_id(&tb))
        );
        assert_eq!(
            rig.agents[rig.index_of(&tb_node)].sim.guest_token(&tb_vm)?,
            tb_token
        );
        let cs = rig.running(2).await?;
        let st = cs.status.unwrap_or_default();
        assert_eq!(st.agents[0].vm_id, vm_id(&main));
        assert_eq!(st.agents[1].vm_id, vm_id(&sub));

        // A sub-agent created after the move is bound to the main's new node and forks the
        // main's current state there.
        rig.patch_spec(json!({"agent": {"replicas": 2}})).await?;
        rig.running(3).await?;
        let added = rig.pods.get("demo-2").await?;
        assert_eq!(node_of(&added), b, "a new sub-agent joins the main's node");
        let added_vm = vm_name_for_agent(&rig.ns, SET, 2);
        let sim_b = &rig.agents[1].sim;
        assert_eq!(sim_b.guest_token(&added_vm)?, token);
        assert_eq!(
            sim_b
                .guest_file(&added_vm, MARKER)?
                .map(|m| m.trim().to_owned()),
            rig.marker_on(&b)?,
            "forked from the migrated main"
        );
        assert_eq!(node_of(&rig.pods.get("demo-1").await?), a);
        rig.finish().await
    })
    .await;
}

/// A target without room: the restored main stays Pending, the set reports MigrateNoCapacity
/// with the scheduler's message (never naming the target) and keeps the snapshot; once the
/// capacity frees, the migration completes with the state intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_target_reports_no_capacity_then_completes_once_it_frees() {
    cocoon_testenv::run_test(|env| async move {
        let rig = Rig::start(env, "mig-full").await?;
        let (a, b) = (rig.node(0), rig.node(1));
        // Each node offers 8 CPUs: the hog takes 6 on the target, the main wants 3.
        let mut hog = rig.spec(0, &b);
        hog.agent.vm.resources = Some(cpu_request("6"));
        rig.create("hog", hog).await?;
        let mut spec = rig.spec(0, &a);
        spec.agent.vm.resources = Some(cpu_request("3"));
        rig.create(SET, spec).await?;
        rig.running(1).await?;
        wait_set(&rig.sets, "hog", "Running", WAIT, |cs| {
            cs.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(CocoonSetPhase::Running))
        })
        .await?;
        let token = rig.token_on(&a).await?;

        rig.pin(&b).await?;
        let notes = cocoon_testenv::wait_until("a MigrateNoCapacity event", WAIT, || async {
            let evs = events(&rig.client, &rig.ns, reasons::MIGRATE_NO_CAPACITY)
                .await
                .ok()?;
            let notes: Vec<(String, String)> = evs
                .into_iter()
                .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
                .collect();
            (!notes.is_empty()).then_some(notes)
        })
        .await?;
        let pending = rig.main().await?;
        assert_eq!(node_of(&pending), "", "the restored main waits unscheduled");
        assert_eq!(required_hostnames(&pending), vec![b.clone()]);
        let messages = rig.seen.scheduler_messages();
        for (kind, note) in &notes {
            assert_eq!(kind, "Warning");
            let msg = note
                .strip_prefix(&format!("main pod {MAIN} unschedulable: "))
                .unwrap_or_else(|| panic!("MigrateNoCapacity note: {note}"));
            assert!(
                messages.contains(msg),
                "the note carries the scheduler's message: {msg:?} not in {messages:?}"
            );
            assert!(msg.contains("Insufficient cpu"), "{msg}");
            assert!(!note.contains(&b), "the note names the target: {note}");
        }
        let cs = rig.sets.get(SET).await?;
        assert_eq!(
            cs.status.and_then(|s| s.phase),
            Some(CocoonSetPhase::Migrating)
        );
        assert!(
            rig.tag().await?,
            "the snapshot is kept while the main waits"
        );
        assert!(
            rig.hosts_of(&rig.main_vm).await.is_empty(),
            "the old VM is gone, the new one not yet created"
        );
        let count = rig
            .operator
            .as_ref()
            .map(|o| {
                o.metrics
                    .migrate_unschedulable
                    .get_or_create(&SetLabels {
                        namespace: rig.ns.clone(),
                        cocoonset: SET.into(),
                    })
                    .get()
            })
            .unwrap_or_default();
        assert!(count >= 1, "migrate-unschedulable counted: {count}");

        // Capacity frees: the hog leaves the target.
        rig.sets.delete("hog", &DeleteParams::default()).await?;
        let main = rig.settled_on(&b, 1).await?;
        assert_eq!(main.uid(), pending.uid(), "the waiting main itself landed");
        assert_eq!(rig.agents[1].sim.guest_token(&rig.main_vm)?, token);
        rig.finish().await
    })
    .await;
}

/// Re-pins while a migration is in flight end on the latest pin with the state intact:
/// (1) re-pinned to the third node while the restore on the first target is in progress,
/// (2) re-pinned while the quiesce on the source is in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repin_mid_migration_ends_on_the_latest_pin_with_the_state() {
    cocoon_testenv::run_test(|env| async move {
        let rig = Rig::start(env, "mig-repin").await?;
        let (a, b, c) = (rig.node(0), rig.node(1), rig.node(2));
        rig.create(SET, rig.spec(0, &a)).await?;
        rig.running(1).await?;
        let token = rig.token_on(&a).await?;

        // (1) A -> B, the clone on B held; re-pinned to C meanwhile.
        let sim_b = rig.agents[1].sim.clone();
        sim_b.block(Verb::Clone, None);
        rig.pin(&b).await?;
        assert!(
            sim_b.wait_blocked(Verb::Clone, 1, WAIT).await,
            "the restore on {b} started"
        );
        assert!(
            rig.tag().await?,
            "the snapshot exists while the restore runs"
        );
        rig.pin(&c).await?;
        // The controller quiesces the main where it now is, before B's restore has finished.
        rig.main_where("quiesced again on the first target", |p| {
            node_of(p) == b && hibernate_annotated(p)
        })
        .await?;
        sim_b.unblock(Verb::Clone);
        rig.settled_on(&c, 1).await?;
        assert_eq!(
            rig.agents[2].sim.guest_token(&rig.main_vm)?,
            token,
            "the main reached the latest pin with its state"
        );

        // (2) C -> A, the snapshot save on C held; re-pinned to B meanwhile.
        let sim_c = rig.agents[2].sim.clone();
        sim_c.block(Verb::SnapshotSave, Some(&rig.main_vm));
        rig.pin(&a).await?;
        assert!(
            sim_c.wait_blocked(Verb::SnapshotSave, 1, WAIT).await,
            "the quiesce on {c} started"
        );
        rig.pin(&b).await?;
        sim_c.unblock(Verb::SnapshotSave);
        let main = rig.settled_on(&b, 1).await?;
        assert_eq!(required_hostnames(&main), vec![b.clone()]);
        assert_eq!(rig.agents[1].sim.guest_token(&rig.main_vm)?, token);
        rig.finish().await
    })
    .await;
}

/// A migration re-targeted back to the source before the main left it: (1) while the source
/// is still saving the snapshot, (2) once the main is hibernated there (the operator was down
/// when it finished). Both end with the main awake on the source, its state intact, the set
/// Running and the snapshot dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retarget_back_mid_migration_wakes_the_main_on_the_source() {
    cocoon_testenv::run_test(|env| async move {
        let mut rig = Rig::start(env, "mig-back").await?;
        let (a, b) = (rig.node(0), rig.node(1));
        rig.create(SET, rig.spec(0, &a)).await?;
        rig.running(1).await?;
        let token = rig.token_on(&a).await?;
        let marker = rig.mark(&a).await?;
        let sim_a = rig.agents[0].sim.clone();
        let orig = rig.main().await?;

        // (1) Back while the source saves.
        sim_a.block(Verb::SnapshotSave, Some(&rig.main_vm));
        rig.pin(&b).await?;
        assert!(sim_a.wait_blocked(Verb::SnapshotSave, 1, WAIT).await);
        rig.pin(&a).await?;
        sim_a.unblock(Verb::SnapshotSave);
        let woken = rig.settled_on(&a, 1).await?;
        assert_eq!(woken.uid(), orig.uid(), "woken in place, not recreated");
        assert_eq!(sim_a.guest_token(&rig.main_vm)?, token);
        assert_eq!(rig.marker_on(&a)?, Some(marker.clone()));

        // (2) Back once the main is hibernated on the source.
        let first = rig.main().await?;
        sim_a.block(Verb::SnapshotSave, Some(&rig.main_vm));
        rig.pin(&b).await?;
        assert!(sim_a.wait_blocked(Verb::SnapshotSave, 1, WAIT).await);
        rig.kill_operator().await;
        sim_a.unblock(Verb::SnapshotSave);
        rig.main_where("hibernated on the source", |p| {
            lifecycle(p) == "hibernated" && vm_id(p).is_empty()
        })
        .await?;
        assert!(rig.tag().await?);
        rig.pin(&a).await?;
        rig.start_operator();
        let main = rig.settled_on(&a, 1).await?;
        assert_eq!(main.uid(), first.uid(), "woken in place, not recreated");
        assert_eq!(sim_a.guest_token(&rig.main_vm)?, token);
        assert_eq!(rig.marker_on(&a)?, Some(marker));
        rig.finish().await
    })
    .await;
}

/// The operator killed twice in one migration — while the source hibernates, and while the
/// target restores — and each time a new one started: `Migrating` was already persisted when
/// the quiesce began, the old pod outlives nothing it needs, the snapshot stays until the new
/// VM runs, and the migration completes with the state intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_killed_mid_migration_resumes_on_a_new_one() {
    cocoon_testenv::run_test(|env| async move {
        let mut rig = Rig::start(env, "mig-opkill").await?;
        let (a, b) = (rig.node(0), rig.node(1));
        rig.create(SET, rig.spec(0, &a)).await?;
        rig.running(1).await?;
        let token = rig.token_on(&a).await?;
        let old = rig.main().await?;
        let marker = rig.mark(&a).await?;
        let (sim_a, sim_b) = (rig.agents[0].sim.clone(), rig.agents[1].sim.clone());

        // Kill 1: the source is saving the snapshot.
        sim_a.block(Verb::SnapshotSave, Some(&rig.main_vm));
        sim_b.block(Verb::Clone, None);
        rig.pin(&b).await?;
        assert!(sim_a.wait_blocked(Verb::SnapshotSave, 1, WAIT).await);
        rig.kill_operator().await;
        let cs = rig.sets.get(SET).await?;
        assert_eq!(
            cs.status.and_then(|s| s.phase),
            Some(CocoonSetPhase::Migrating),
            "Migrating was persisted before the quiesce"
        );
        sim_a.unblock(Verb::SnapshotSave);
        // With no operator, the source finishes the hibernate and nothing else happens.
        let hibernated = rig
            .main_where("hibernated on the source", |p| {
                lifecycle(p) == "hibernated" && vm_id(p).is_empty()
            })
            .await?;
        assert_eq!(hibernated.uid(), old.uid(), "nobody deleted the old main");
        assert!(rig.tag().await?);

        // Kill 2: the target is restoring.
        rig.start_operator();
        assert!(sim_b.wait_blocked(Verb::Clone, 1, WAIT).await);
        rig.kill_operator().await;
        let restoring = rig.main().await?;
        assert_ne!(restoring.uid(), old.uid());
        assert_eq!(node_of(&restoring), b);
        assert!(
            rig.tag().await?,
            "the snapshot is kept while the new VM is not running"
        );
        assert!(rig.hosts_of(&rig.main_vm).await.is_empty());
        sim_b.unblock(Verb::Clone);
        rig.main_where("restored and ready on the target", |p| {
            lifecycle(p) == "ready" && !vm_id(p).is_empty()
        })
        .await?;
        assert!(
            rig.tag().await?,
            "without an operator the snapshot stays after the restore"
        );

        rig.start_operator();
        let main = rig.settled_on(&b, 1).await?;
        assert_eq!(main.uid(), restoring.uid());
        assert_eq!(sim_b.guest_token(&rig.main_vm)?, token);
        assert_eq!(rig.marker_on(&b)?, Some(marker));
        assert!(
            rig.seen.keep_flagged(&old.uid().unwrap_or_default()),
            "the old main was flagged keep-snapshot-on-delete"
        );
        rig.finish().await
    })
    .await;
}

/// Node agents killed mid-migration and restarted on the same state directory: (1) the source
/// while it saves the snapshot, then the target while it fetches the snapshot; (2) the source
/// after the push but before the VM's removal. Each migration ends with the main on its target,
/// its state intact, and the snapshot kept until the new VM runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_agent_killed_mid_migration_resumes_after_restart() {
    cocoon_testenv::run_test(|env| async move {
        let mut rig = Rig::start(env, "mig-agkill").await?;
        let (a, b, c) = (rig.node(0), rig.node(1), rig.node(2));
        rig.create(SET, rig.spec(0, &a)).await?;
        rig.running(1).await?;
        let token = rig.token_on(&a).await?;
        let old = rig.main().await?;
        let marker = rig.mark(&a).await?;

        // (1) A -> B: the source dies while saving (a save that takes minutes), the target
        // while it fetches the snapshot.
        rig.agents[0].sim.set_latencies(Latencies {
            save: Duration::from_secs(600),
            ..Latencies::default()
        });
        rig.agents[1].sim.block(Verb::SnapshotImport, None);
        rig.pin(&b).await?;
        assert!(
            rig.agents[0]
                .sim
                .wait_calls(Verb::SnapshotSave, 1, WAIT)
                .await
        );
        rig.restart_agent(&a).await?;
        assert_eq!(
            rig.main().await?.uid(),
            old.uid(),
            "the old main lives until its snapshot exists"
        );
        assert!(
            rig.agents[1]
                .sim
                .wait_blocked(Verb::SnapshotImport, 1, WAIT)
                .await
        );
        assert!(
            rig.tag().await?,
            "the snapshot exists while the target restores"
        );
        assert!(rig.hosts_of(&rig.main_vm).await.is_empty());
        rig.restart_agent(&b).await?;
        let main = rig.settled_on(&b, 1).await?;
        assert_ne!(main.uid(), old.uid());
        assert_eq!(rig.agents[1].sim.guest_token(&rig.main_vm)?, token);
        assert_eq!(rig.marker_on(&b)?, Some(marker.clone()));

        // (2) B -> C: the source dies after the push, before the VM's removal.
        rig.agents[1].sim.block(Verb::Remove, Some(&vm_id(&main)));
        rig.pin(&c).await?;
        assert!(rig.agents[1].sim.wait_blocked(Verb::Remove, 1, WAIT).await);
        assert!(rig.tag().await?, "pushed before the removal");
        assert_eq!(rig.main().await?.uid(), main.uid());
        rig.restart_agent(&b).await?;
        let moved = rig.settled_on(&c, 1).await?;
        assert_ne!(moved.uid(), main.uid());
        assert_eq!(rig.agents[2].sim.guest_token(&rig.main_vm)?, token);
        assert_eq!(rig.marker_on(&c)?, Some(marker));
        rig.finish().await
    })
    .await;
}

/// The target agent killed in the middle of the clone (the simulator leaves the `creating`
/// record behind, as a killed `cocoon` does). The restarted agent never collects that record
/// (stale-create reconciliation, `node.md` "beyond", is not implemented), so every create of
/// the restored main fails with `VM name ... already exists` and the migration never
/// completes. Ignored until the node agent collects stale `creating` records; see the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_agent_killed_mid_clone_resumes_after_restart() {
    cocoon_testenv::run_test(|env| async move {
        let mut rig = Rig::start(env, "mig-clkill").await?;
        let (a, b) = (rig.node(0), rig.node(1));
        rig.create(SET, rig.spec(0, &a)).await?;
        rig.running(1).await?;
        let token = rig.token_on(&a).await?;
        rig.agents[1].sim.set_latencies(Latencies {
            clone: Duration::from_secs(600),
            ..Latencies::default()
        });
        rig.pin(&b).await?;
        assert!(rig.agents[1].sim.wait_calls(Verb::Clone, 1, WAIT).await);
        // Killed only once the runtime holds the clone's `creating` record (the clone first
        // materialises its base), so the restarted agent must collect that record.
        cocoon_testenv::wait_until("the clone's creating record", WAIT, || async {
            rig.agents[1].sim.vm_info(&rig.main_vm).ok().map(|_| ())
        })
        .await?;
        rig.restart_agent(&b).await?;
        rig.settled_on(&b, 1).await?;
        assert_eq!(rig.agents[1].sim.guest_token(&rig.main_vm)?, token);
        rig.finish().await
    })
    .await;
}

/// A suspended set migrates on its suspend snapshot: (1) the pin edited while suspended
/// moves nothing until the unsuspend, which then brings the main up on the new node and the
/// sub-agent back where it was, each with its state; (2) an unsuspend that also edits the pin
/// (one patch) does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspended_set_migrates_on_its_suspend_snapshot() {
    cocoon_testenv::run_test(|env| async move {
        let rig = Rig::start(env, "mig-susp").await?;
        let (a, b, c) = (rig.node(0), rig.node(1), rig.node(2));
        rig.create(SET, rig.spec(1, &a)).await?;
        rig.running(2).await?;
        let sub_vm = vm_name_for_agent(&rig.ns, SET, 1);
        let token = rig.token_on(&a).await?;
        let sub_token = rig.agents[0].sim.guest_token(&sub_vm)?;
        let suspended = |cs: &CocoonSet| {
            cs.status.as_ref().is_some_and(|s| {
                s.phase == Some(CocoonSetPhase::Suspended)
                    && Some(s.observed_generation) == cs.metadata.generation
            })
        };

        // (1) Pin edited while suspended, then unsuspended.
        rig.patch_spec(json!({"suspend": true})).await?;
        wait_set(&rig.sets, SET, "Suspended", WAIT, suspended).await?;
        rig.pin(&b).await?;
        wait_set(
            &rig.sets,
            SET,
            "still Suspended after the pin edit",
            WAIT,
            suspended,
        )
        .await?;
        let held = rig.main().await?;
        assert_eq!(node_of(&held), a, "nothing moves while suspended");
        assert!(hibernate_annotated(&held) && lifecycle(&held) == "hibernated");
        assert!(rig.hosts_of(&rig.main_vm).await.is_empty());
        rig.patch_spec(json!({"suspend": false})).await?;
        let main = rig.settled_on(&b, 2).await?;
        assert_ne!(main.uid(), held.uid(), "recreated on the new node");
        assert_eq!(rig.agents[1].sim.guest_token(&rig.main_vm)?, token);
        let sub = rig.pods.get("demo-1").await?;
        assert_eq!(node_of(&sub), a, "the sub-agent keeps its bind");
        assert_eq!(rig.agents[0].sim.guest_token(&sub_vm)?, sub_token);
        cocoon_testenv::wait_until("the sub-agent's snapshot dropped", WAIT, || async {
            matches!(
                rig.reg.has_manifest(&sub_vm, HIBERNATE_TAG).await,
                Ok(false)
            )
            .then_some(())
        })
        .await?;

        // (2) Suspended again; one patch unsuspends and re-pins.
        rig.patch_spec(json!({"suspend": true})).await?;
        wait_set(&rig.sets, SET, "Suspended again", WAIT, suspended).await?;
        rig.patch_spec(json!({"suspend": false, "nodeName": c}))
            .await?;
        let moved = rig.settled_on(&c, 2).await?;
        assert_ne!(moved.uid(), main.uid());
        assert_eq!(rig.agents[2].sim.guest_token(&rig.main_vm)?, token);
        assert_eq!(node_of(&rig.pods.get("demo-1").await?), a);
        assert_eq!(rig.agents[0].sim.guest_token(&sub_vm)?, sub_token);
        rig.finish().await
    })
    .await;
}
