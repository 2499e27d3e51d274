//! Migration time of a CocoonSet's main (step 8 of `cocoonset.md`) on the simulated runtime
//! with REAL node agents (three in-process `run_agent`s, each on its own simulator), the real
//! control plane and scheduler, the real registry, and both controllers in-process with the
//! production timing. The main's guest disk is a 256 MiB file of incompressible bytes
//! (`COCOON_BENCH_DISK_MIB`), so the snapshot transfer is real work.
//!
//! The main is moved round the three nodes `COCOON_BENCH_MIGRATIONS` times (default 20). Before
//! each move a marker is written into the guest, so every snapshot differs from the last (no
//! registry blob is reused) and the test can check the state arrived. Each migration's wall
//! time (pin patch → set Running at the new generation with the main on the target) is split
//! into:
//!
//! | part | measured as |
//! |---|---|
//! | quiesce | hibernate on the source: the old pod's `lifecycle-state` going `hibernating` → `hibernated` (watched), minus the push |
//! | transfer | push on the source + pull on the target (`cocoon_vk_snapshot_push/pull_duration_seconds`) |
//! | restore | clone on the target (`cocoon_vk_vm_boot_duration_seconds{mode="clone"}` minus the pull it includes) |
//! | controller | total − the three above: the operator's reactions and polls, scheduling, pod delete/create, the agents' status writes |
//!
//! Run: `cargo bench -p cocoon-e2e --bench cocoonset_migration`. Under `cargo test` it
//! only prints how to run it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::metrics::node as names;
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_api::naming::vm_name_for_agent;
use cocoon_node::agent::{AgentParts, run_agent};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::pods::{OrphanPolicy, PodConfig, Timing as AgentTiming};
use cocoon_runtime::sim::{DiskFill, DiskSpec, SimConfig, SimHandle, SimRuntime};
use cocoon_runtime::{Runtime, exec_capture};
use cocoon_testenv::TestEnv;
use cocoon_testsupport::{Operator, OperatorOptions, node_of, registry};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type BenchResult<T = ()> = Result<T, cocoon_testsupport::BoxError>;

const NODES: usize = 3;
const SET: &str = "mig";
const MAIN: &str = "mig-0";
const DEFAULT_MIGRATIONS: usize = 20;
const DEFAULT_DISK_MIB: u64 = 256;
/// Budget of one migration; a miss aborts the run.
const WAIT: Duration = Duration::from_secs(300);
const MARKER: &str = "/root/bench-marker";

fn env_number(key: &str, default: u64) -> u64 {
    match std::env::var(key) {
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("{key} must be a positive integer, got {v:?}");
                std::process::exit(2);
            }
        },
        Err(_) => default,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "cocoonset_migration: run with `cargo bench -p cocoon-e2e --bench \
             cocoonset_migration` (COCOON_BENCH_MIGRATIONS=<n>, default {DEFAULT_MIGRATIONS}; \
             COCOON_BENCH_DISK_MIB=<MiB>, default {DEFAULT_DISK_MIB})"
        );
        return;
    }
    let migrations = env_number("COCOON_BENCH_MIGRATIONS", DEFAULT_MIGRATIONS as u64) as usize;
    let disk_mib = env_number("COCOON_BENCH_DISK_MIB", DEFAULT_DISK_MIB);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(migrations, disk_mib)) {
        eprintln!("cocoonset_migration failed: {e}");
        std::process::exit(1);
    }
}

async fn run(migrations: usize, disk_mib: u64) -> BenchResult {
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env, migrations, disk_mib).await;
    cocoon_testsupport::end_bench_env(env, outcome)
}

/// One node agent, with the metrics and simulator controls the bench reads.
struct Node {
    name: String,
    runtime: Arc<dyn Runtime>,
    sim: SimHandle,
    metrics: Arc<NodeMetrics>,
}

async fn start_agent(
    client: Client,
    node: &str,
    root: &Path,
    registry_addr: &str,
    disk_mib: u64,
    stop: &CancellationToken,
) -> BenchResult<Node> {
    let mut cfg = SimConfig::new(root);
    cfg.permissive_pull = true;
    cfg.lease_delay = Duration::from_millis(50);
    cfg.disk = DiskSpec {
        size: disk_mib << 20,
        fill: DiskFill::Filled,
    };
    let leases = cfg.lease_path.clone();
    let sim_rt = SimRuntime::open(cfg)?;
    let sim = sim_rt.handle();
    let runtime: Arc<dyn Runtime> = Arc::new(sim_rt);
    let metrics = Arc::new(NodeMetrics::new(root.to_owned()));
    let parts = AgentParts {
        pods: PodConfig {
            node_name: node.to_owned(),
            orphan_policy: OrphanPolicy::Destroy,
            leases_path: leases,
            restore_mode: "ondemand".into(),
            cocoon_root_dir: root.to_owned(),
            clone_from_dir_roots: Vec::new(),
            tenant: Default::default(),
            timing: AgentTiming::default(),
            host_reach: Default::default(),
        },
        client,
        runtime: runtime.clone(),
        registry: Some(registry(registry_addr)),
        metrics: metrics.clone(),
        registration: None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (token, name) = (stop.clone(), node.to_owned());
    tokio::spawn(async move {
        if let Err(e) = run_agent(parts, token, Some(tx)).await {
            eprintln!("agent {name} failed: {e}");
        }
    });
    tokio::time::timeout(Duration::from_secs(60), rx).await??;
    Ok(Node {
        name: node.to_owned(),
        runtime,
        sim,
        metrics,
    })
}

/// The `_sum` of a histogram in the agent's metrics text, over the series whose labels
/// contain `label` (every series when empty).
fn histogram_sum(metrics: &NodeMetrics, name: &str, label: &str) -> f64 {
    let prefix = format!("{name}_sum");
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The agents' cumulative timings the split uses, in seconds.
#[derive(Clone, Copy, Default)]
struct Counters {
    push: f64,
    pull: f64,
    clone: f64,
}

fn counters(node: &Node) -> Counters {
    Counters {
        push: histogram_sum(&node.metrics, names::SNAPSHOT_PUSH_DURATION_SECONDS, ""),
        pull: histogram_sum(&node.metrics, names::SNAPSHOT_PULL_DURATION_SECONDS, ""),
        clone: histogram_sum(
            &node.metrics,
            names::VM_BOOT_DURATION_SECONDS,
            "mode=\"clone\"",
        ),
    }
}

/// A change of the main pod as a watch saw it.
#[derive(Clone)]
struct Seen {
    at: Instant,
    uid: String,
    lifecycle: String,
}

/// A named part of the split and how to read it.
type Part = (&'static str, fn(&Split) -> f64);

/// One migration's split, in seconds.
#[derive(Clone, Copy, Default)]
struct Split {
    total: f64,
    quiesce: f64,
    transfer: f64,
    restore: f64,
    controller: f64,
}

async fn measure(env: &TestEnv, migrations: usize, disk_mib: u64) -> BenchResult {
    let client = env.client()?;
    let ns = format!("bench-mig-{}", std::process::id());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let pool = "bench-mig";
    let stop = CancellationToken::new();
    let mut test_nodes = Vec::new();
    let mut nodes = Vec::new();
    let mut roots = Vec::new();
    for i in 0..NODES {
        let name = format!("bench-mig-{i}");
        let tn = cocoon_testenv::TestNode::in_pool(&client, &name, pool).await?;
        tn.wait_schedulable(Duration::from_secs(60)).await?;
        test_nodes.push(tn);
        let root = tempfile::tempdir()?;
        nodes.push(
            start_agent(
                env.client()?,
                &name,
                root.path(),
                env.registry_addr(),
                disk_mib,
                &stop,
            )
            .await?,
        );
        roots.push(root);
    }
    let _operator = Operator::start(
        &client,
        &ns,
        env.registry_addr(),
        OperatorOptions::default(),
    );
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let vm = vm_name_for_agent(&ns, SET, 0);

    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    {
        let seen = seen.clone();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={MAIN}"));
        let stream = watcher(pods.clone(), cfg)
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            while let Some(ev) = stream.next().await {
                let Ok(p) = ev else { continue };
                let lifecycle = p
                    .annotations()
                    .get(ann::LIFECYCLE_STATE)
                    .cloned()
                    .unwrap_or_default();
                let uid = p.uid().unwrap_or_default();
                if let Ok(mut v) = seen.lock()
                    && v.last()
                        .is_none_or(|s| s.uid != uid || s.lifecycle != lifecycle)
                {
                    v.push(Seen {
                        at: Instant::now(),
                        uid,
                        lifecycle,
                    });
                }
            }
        });
    }

    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = pool.into();
    spec.agent.mode = AgentMode::Run;
    spec.node_name = nodes[0].name.clone();
    sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
        .await?;
    let generation = sets.get(SET).await?.metadata.generation.unwrap_or_default();
    running_at(&sets, generation).await?;
    let token = nodes[0].sim.guest_token(&vm)?;
    println!(
        "main up on {} with a {disk_mib} MiB filled disk; {migrations} migrations round {NODES} nodes",
        nodes[0].name
    );

    let mut splits = Vec::new();
    for i in 0..migrations {
        let (s, t) = (i % NODES, (i + 1) % NODES);
        let marker = format!("m{i}");
        let out = exec_capture(
            nodes[s].runtime.as_ref(),
            &vm,
            &["sh", "-c", &format!("echo {marker} > {MARKER}")],
            None,
        )
        .await;
        out.result?;
        let old_uid = pods.get(MAIN).await?.uid().unwrap_or_default();
        let (before_s, before_t) = (counters(&nodes[s]), counters(&nodes[t]));
        let t0 = Instant::now();
        let patched = sets
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"nodeName": nodes[t].name}})),
            )
            .await?;
        let generation = patched.metadata.generation.unwrap_or_default();
        running_at(&sets, generation).await?;
        let total = t0.elapsed().as_secs_f64();
        let main = pods.get(MAIN).await?;
        if node_of(&main) != nodes[t].name || main.uid().unwrap_or_default() == old_uid {
            return Err(format!(
                "migration {i}: the main is not the new pod on {}",
                nodes[t].name
            )
            .into());
        }
        if nodes[t].sim.guest_token(&vm)? != token
            || nodes[t]
                .sim
                .guest_file(&vm, MARKER)?
                .as_deref()
                .map(str::trim)
                != Some(&marker)
        {
            return Err(format!("migration {i}: the main's state did not arrive").into());
        }
        let (after_s, after_t) = (counters(&nodes[s]), counters(&nodes[t]));
        let push = after_s.push - before_s.push;
        let pull = after_t.pull - before_t.pull;
        let clone = after_t.clone - before_t.clone;
        let log = seen.lock().map(|v| v.clone()).unwrap_or_default();
        let at = |uid_is_old: bool, state: &str| {
            log.iter()
                .filter(|e| e.at >= t0 && (e.uid == old_uid) == uid_is_old && e.lifecycle == state)
                .map(|e| e.at)
                .next()
        };
        let (Some(h0), Some(h1)) = (at(true, "hibernating"), at(true, "hibernated")) else {
            return Err(format!("migration {i}: the hibernate was not observed").into());
        };
        let hibernate = h1.duration_since(h0).as_secs_f64();
        let quiesce = (hibernate - push).max(0.0);
        let transfer = push + pull;
        let restore = (clone - pull).max(0.0);
        let split = Split {
            total,
            quiesce,
            transfer,
            restore,
            controller: (total - quiesce - transfer - restore).max(0.0),
        };
        println!(
            "migration {:>2} {} -> {}: total {:>6.3} s  quiesce {:.3}  transfer {:.3} (push {:.3} + pull {:.3})  restore {:.3}  controller {:.3}",
            i + 1,
            nodes[s].name,
            nodes[t].name,
            split.total,
            split.quiesce,
            split.transfer,
            push,
            pull,
            split.restore,
            split.controller
        );
        splits.push(split);
    }

    let parts: [Part; 5] = [
        ("total", |s| s.total),
        ("quiesce", |s| s.quiesce),
        ("transfer", |s| s.transfer),
        ("restore", |s| s.restore),
        ("controller", |s| s.controller),
    ];
    println!(
        "\n{} migrations, {disk_mib} MiB snapshot disk, production controller timing",
        splits.len()
    );
    println!(
        "{:<12} {:>9} {:>9} {:>9}",
        "part", "p50 (s)", "p95 (s)", "max (s)"
    );
    for (name, get) in parts {
        let mut v: Vec<f64> = splits.iter().map(get).collect();
        v.sort_by(f64::total_cmp);
        let (p50, p95, max) = (
            percentile(&v, 0.50),
            percentile(&v, 0.95),
            v.last().copied().unwrap_or_default(),
        );
        println!("{name:<12} {p50:>9.3} {p95:>9.3} {max:>9.3}");
    }

    stop.cancel();
    for tn in test_nodes {
        tn.delete().await?;
    }
    Ok(())
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Waits (watch-based) until the set reports Running at `generation`.
async fn running_at(sets: &Api<CocoonSet>, generation: i64) -> BenchResult {
    let cond = move |cs: Option<&CocoonSet>| {
        cs.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.phase == Some(CocoonSetPhase::Running) && s.observed_generation >= generation
        })
    };
    tokio::time::timeout(WAIT, await_condition(sets.clone(), SET, cond))
        .await
        .map_err(|_| format!("{SET}: not Running at generation {generation} within {WAIT:?}"))??;
    Ok(())
}
