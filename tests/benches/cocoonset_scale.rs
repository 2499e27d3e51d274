//! CocoonSet at scale with REAL node agents: N sets (main + 1 sub-agent + 1 toolbox each, so
//! 3 pods a set) on 3 in-process node agents (`run_agent` on the simulated runtime), the real
//! scheduler, and both controllers in-process with the production timing.
//!
//! Reports (1) the time from creating the sets until every one is Running with 2/2 agents and
//! 1/1 toolboxes, with this process's CPU time and peak RSS (the controllers AND the three
//! agents share this process; the control plane and the registry are separate processes and
//! not included); (2) a settled window (~5 s, each set nudged once through a pod annotation):
//! controller passes, registry calls (counted by a `TagRegistry` adapter), controller writes and
//! CocoonSet objects changed. The goal for the settled window is zero of the last three.
//!
//! Run: `cargo bench -p cocoon-e2e --bench cocoonset_scale` (`COCOON_BENCH_SETS` sets the
//! number of sets, default 30). Under `cargo test` it only prints how to run it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cocoon_api::crd::set::{
    AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy, ToolboxSpec,
};
use cocoon_operator::registry::{BoxFuture, OciTagRegistry, RegistryError, TagRegistry};
use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_testenv::TestEnv;
use cocoon_testsupport::{Agent, AgentOptions, Operator, OperatorOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

type BenchResult<T = ()> = Result<T, cocoon_testsupport::BoxError>;

const NODES: usize = 3;
const DEFAULT_SETS: usize = 30;
/// Budget for every set to reach Running; a miss aborts the run.
const WAIT_RUNNING: Duration = Duration::from_secs(600);
/// The settled measurement window.
const SETTLED_WINDOW: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "cocoonset_scale: run with `cargo bench -p cocoon-e2e --bench cocoonset_scale` \
             (COCOON_BENCH_SETS=<n>, default {DEFAULT_SETS})"
        );
        return;
    }
    let sets = match std::env::var("COCOON_BENCH_SETS") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("COCOON_BENCH_SETS must be a positive integer, got {v:?}");
                std::process::exit(2);
            }
        },
        Err(_) => DEFAULT_SETS,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(sets)) {
        eprintln!("cocoonset_scale failed: {e}");
        std::process::exit(1);
    }
}

/// Counts every registry call of the CocoonSet controller, around the real client.
struct Counting {
    inner: OciTagRegistry,
    calls: Arc<AtomicU64>,
}

impl TagRegistry for Counting {
    fn has_manifest<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<bool, RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.has_manifest(vm, tag)
    }
    fn delete_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.delete_tag(vm, tag)
    }
    fn manifest_annotations<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.manifest_annotations(vm, tag)
    }
}

fn registry(addr: &str) -> BenchResult<RegistryClient> {
    Ok(RegistryClient::new(RegistryConfig::for_registry(addr)?)?)
}

/// This process's CPU time (user + system) and peak RSS in KiB.
fn process_usage() -> (Duration, u64) {
    let ticks_per_s = cocoon_testsupport::clock_ticks_per_second();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name start at field 3 (state); utime and stime
    // are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = tick(11) + tick(12);
    let cpu = Duration::from_millis(ticks * 1000 / ticks_per_s);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    (cpu, hwm)
}

async fn run(n_sets: usize) -> BenchResult {
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env, n_sets).await;
    cocoon_testsupport::end_bench_env(env, outcome)
}

fn set_spec(pool: &str) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image("ubuntu:24.04");
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.replicas = 1;
    s.snapshot_policy = SnapshotPolicy::MainOnly;
    s.toolboxes = vec![ToolboxSpec {
        name: "tb".into(),
        image: "ubuntu:24.04".into(),
        ..ToolboxSpec::default()
    }];
    s
}

fn is_running(cs: &CocoonSet) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Running)
            && Some(s.observed_generation) == cs.metadata.generation
            && (s.ready_agents, s.desired_agents) == (2, 2)
            && (s.ready_toolboxes, s.desired_toolboxes) == (1, 1)
    })
}

async fn measure(env: &TestEnv, n_sets: usize) -> BenchResult {
    let client = env.client()?;
    let ns = cocoon_testenv::create_namespace(&client, "cs-bench").await?;
    let pool = cocoon_testenv::unique_name("pool");
    let mut roots = Vec::new();
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    for _ in 0..NODES {
        let root = tempfile::tempdir()?;
        let name = cocoon_testenv::unique_name("bench-node");
        let node = cocoon_testenv::TestNode::in_pool(&client, &name, &pool).await?;
        node.wait_schedulable(Duration::from_secs(60)).await?;
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
        nodes.push(node);
        roots.push(root);
    }
    let registry_calls = Arc::new(AtomicU64::new(0));
    let counted: Arc<dyn TagRegistry> = Arc::new(Counting {
        inner: OciTagRegistry::new(registry(env.registry_addr())?),
        calls: registry_calls.clone(),
    });
    let op = Operator::start_with_tags(&client, &ns, counted, OperatorOptions::default());
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // (1) N sets from nothing to Running.
    let (cpu0, _) = process_usage();
    let t0 = Instant::now();
    for i in 0..n_sets {
        let cs = CocoonSet::new(&format!("bench-{i}"), set_spec(&pool));
        sets.create(&PostParams::default(), &cs).await?;
    }
    let created = t0.elapsed();
    let last_report = std::cell::Cell::new(Instant::now());
    cocoon_testenv::wait_until(&format!("{n_sets} sets Running"), WAIT_RUNNING, || async {
        let list = sets.list(&ListParams::default()).await.ok()?;
        let running = list.items.iter().filter(|cs| is_running(cs)).count();
        if last_report.get().elapsed() >= Duration::from_secs(10) {
            println!(
                "  {running} / {n_sets} Running after {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            last_report.set(Instant::now());
        }
        (list.items.len() == n_sets && running == n_sets).then_some(())
    })
    .await?;
    let to_running = t0.elapsed();
    let (cpu1, hwm) = process_usage();
    let n_pods = pods.list(&ListParams::default()).await?.items.len();

    // (2) The settled system: nudge every set once (a no-op pod annotation wakes its pass) and
    // count what the controller does over the window.
    let before_rv: BTreeMap<String, String> = sets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|cs| (cs.name_any(), cs.resource_version().unwrap_or_default()))
        .collect();
    let passes0 = op.stats.passes.load(Ordering::SeqCst);
    let writes0 = op.stats.writes.load(Ordering::SeqCst);
    let calls0 = registry_calls.load(Ordering::SeqCst);
    let (cpu_s0, _) = process_usage();
    let window = Instant::now();
    for i in 0..n_sets {
        let poke = json!({"metadata": {"annotations": {"bench.cocoonstack.io/poke": "1"}}});
        pods.patch(
            &format!("bench-{i}-1"),
            &PatchParams::default(),
            &Patch::Merge(&poke),
        )
        .await?;
    }
    // The window is the measurement itself, not a synchronisation point.
    tokio::time::sleep(SETTLED_WINDOW.saturating_sub(window.elapsed())).await;
    let window_len = window.elapsed();
    let passes = op.stats.passes.load(Ordering::SeqCst) - passes0;
    let writes = op.stats.writes.load(Ordering::SeqCst) - writes0;
    let calls = registry_calls.load(Ordering::SeqCst) - calls0;
    let (cpu_s1, _) = process_usage();
    let after = sets.list(&ListParams::default()).await?.items;
    let changed = after
        .iter()
        .filter(|cs| before_rv.get(&cs.name_any()) != cs.resource_version().as_ref())
        .count();
    let still_running = after.iter().filter(|cs| is_running(cs)).count();

    println!();
    println!(
        "CocoonSet scale: {n_sets} sets x (main + 1 sub-agent + 1 toolbox) = {n_pods} pods, \
         {NODES} real in-process node agents (simulated runtime), production timing"
    );
    println!(
        "  creates issued in        {:>8.2} s",
        created.as_secs_f64()
    );
    println!(
        "  all sets Running after   {:>8.2} s",
        to_running.as_secs_f64()
    );
    println!(
        "  process CPU (user+sys)   {:>8.2} s during the ramp, {:.2} s since start",
        (cpu1.saturating_sub(cpu0)).as_secs_f64(),
        cpu1.as_secs_f64()
    );
    println!(
        "  process peak RSS (VmHWM) {:>8.1} MiB",
        hwm as f64 / 1024.0
    );
    println!(
        "  NOTE: CPU and RSS are this bench process: both controllers AND the {NODES} node agents \
         with their simulated runtimes; etcd, kube-apiserver, kube-scheduler and the registry \
         are separate processes and not counted"
    );
    println!(
        "settled window ({:.1} s, each set nudged once):",
        window_len.as_secs_f64()
    );
    println!("  controller passes        {passes:>8}");
    println!("  registry calls           {calls:>8}   (goal 0)");
    println!("  controller writes        {writes:>8}   (goal 0; pod + CocoonSet metadata/status)");
    println!("  CocoonSet objects changed{changed:>8}   (goal 0; status writes seen at the API)");
    println!(
        "  process CPU in window    {:>8.2} s",
        (cpu_s1.saturating_sub(cpu_s0)).as_secs_f64()
    );
    println!("  sets still Running       {still_running:>8} / {n_sets}");

    drop(op);
    drop(agents);
    drop(nodes);
    cocoon_testenv::delete_namespace(&client, &ns).await?;
    drop(roots);
    Ok(())
}
