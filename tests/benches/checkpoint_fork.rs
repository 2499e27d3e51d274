//! Checkpoints and forks (issue 38) with a real-sized VM: REAL in-process node agents
//! (`cocoon_testsupport::Agent` on the simulated runtime, every sim latency zero, snapshots
//! carrying a realistic memory image: `MemoryFill::Realistic`, the generator of the v2 bench,
//! 2 GiB by default), the operator's controllers in-process with the production timing, and the
//! real control plane and registry this bench starts.
//!
//! Five nodes in three pools: `src-v1` and `src-v2` hold one source set each, their node agents
//! configured for v1 and for v2 (`SNAPSHOT_ZSTD_LEVEL=1 SNAPSHOT_CHUNK_SIZE_MIB=64`); `fork`
//! holds the three nodes the forks run on (v2 agents). It prints:
//!
//! * per checkpoint (one of each source): the source VM's pause (`status.sourcePauseMillis`,
//!   the runtime's save; the simulator writes the whole image, as a real save does), the push
//!   (the `SnapshotPushed` Event of the source pod, and `Pushing` → `Ready` as watched), bytes
//!   on the wire and of data, and create → `Ready`;
//! * the pull time of the v2 artifact (`RegistryClient::pull_snapshot_to_dir`), alone and three
//!   at once (as the cold round's three nodes pull side by side): the reference for a fork that
//!   has to pull;
//! * forks of the v2 checkpoint (`spec.agent.fromCheckpoint`, main only), each from its set's
//!   create to the first watch event that shows it `Running` with its agent ready: (0) one set
//!   alone on a cold node (which then drops its copy again); (a) N sets created at once on the
//!   three cold nodes (no local copy: each node pulls the artifact), p50/p95; then, those sets
//!   deleted, (b) N new sets on the same nodes, which reuse their cached copy; with the node
//!   agents' snapshot imports (pulls of the artifact) counted per round;
//! * the registry's blobs (count and bytes of its filesystem storage) before and after each
//!   round, and how many repositories link the checkpoint's layers. These are correctness
//!   claims, not timings: the registry must hold one copy of the checkpoint's data however many
//!   forks run, and the forks must leave the artifact in place; a difference fails the bench.
//!
//! Nothing about time is asserted: the goals (pause under 1 s; a fork from a cached copy p50
//! under 1 s; a fork that pulls within the pull time + 1 s) are printed next to the figures.
//!
//! Run: `cargo bench -p cocoon-e2e --bench checkpoint_fork` (`CHECKPOINT_BENCH_MIB` sets the
//! memory image size, default 2048; `CHECKPOINT_BENCH_FORKS` the forks per round, default 10).
//! It needs about 8 times the image size of free disk at its peak (the registry holds both
//! artifacts, three reference pulls, a copy on each fork node) and refuses to start with less;
//! everything it writes is removed at the end. Under `cargo test` it only prints how to run it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cocoon_api::contract::events::node::SNAPSHOT_PUSHED;
use cocoon_api::crd::checkpoint::{
    CheckpointPhase, CheckpointSource, CocoonCheckpoint, CocoonCheckpointSpec,
    CocoonCheckpointStatus, NameRef,
};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy};
use cocoon_registry::{Manifest, PullReport, Reference, RegistryClient, RegistryConfig};
use cocoon_runtime::sim::{Latencies, MemoryFill, SimConfig, Verb};
use cocoon_testenv::{TestEnv, TestNode, wait_until};
use cocoon_testsupport::{Agent, AgentOptions, BoxError, Operator, OperatorOptions};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

type BenchResult<T = ()> = Result<T, BoxError>;

const FORK_NODES: usize = 3;
const DEFAULT_FORKS: usize = 10;
const DEFAULT_MIB: u64 = 2048;
/// Budget for one step (a checkpoint, a round of forks); a miss aborts the run.
const WAIT: Duration = Duration::from_secs(900);
const IMAGE: &str = "ubuntu:24.04";
/// The snapshot knobs `[SNAPSHOT_ZSTD_LEVEL, SNAPSHOT_CHUNK_SIZE_MIB,
/// SNAPSHOT_MEMORY_BUDGET_MIB, SNAPSHOT_PULL_BUDGET_MIB]` of a v1 node and of a v2 node (the
/// README's starting point).
const V1_KNOBS: [u64; 4] = [0, 0, 0, 0];
const V2_KNOBS: [u64; 4] = [1, 64, 0, 0];
/// Free disk needed, in image sizes: both artifacts in the registry, a save on each source
/// node while it pushes, the reference pulls (three at once), a copy on each fork node.
const DISK_IMAGES: u64 = 8;

/// The memory image size every simulated save writes (set once from the environment before any
/// agent starts; [`sim_tweak`] is a plain `fn`).
static IMAGE_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MIB << 20);

fn main() {
    cocoon_testenv::bench::bench_main(
        "checkpoint_fork",
        "usage: cargo bench -p cocoon-e2e --bench checkpoint_fork  (starts a local control \
         plane and registry; CHECKPOINT_BENCH_MIB=2048, CHECKPOINT_BENCH_FORKS=10)",
        bench,
    );
}

/// A positive integer from `var`, or `default` when unset.
fn env_count(var: &str, default: u64) -> BenchResult<u64> {
    match std::env::var(var) {
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{var} must be a positive integer, got {v:?}").into()),
        },
        Err(_) => Ok(default),
    }
}

/// Every sim latency zero; snapshots carry the realistic memory image.
fn sim_tweak(cfg: &mut SimConfig) {
    cfg.latencies = Latencies::default().scaled(0.0);
    cfg.memory_file_size = IMAGE_BYTES.load(Ordering::SeqCst);
    cfg.memory_fill = MemoryFill::Realistic;
}

/// The free bytes of the file system holding `path` (`df -Pk`).
fn free_bytes(path: &Path) -> BenchResult<u64> {
    let out = std::process::Command::new("df")
        .arg("-Pk")
        .arg(path)
        .output()
        .map_err(|e| format!("df -Pk {}: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kib = text
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| format!("df -Pk {}: unexpected output {text:?}", path.display()))?;
    Ok(kib << 10)
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn pct(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * v.len()).div_ceil(100).clamp(1, v.len());
    v[rank - 1]
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

// ---------------------------------------------------------------------------------------------
// The cluster: three pools of real node agents.
// ---------------------------------------------------------------------------------------------

struct Member {
    node: TestNode,
    agent: Agent,
    root: tempfile::TempDir,
}

/// A node in `pool` with a real agent whose registry client pushes with `knobs`.
async fn member(env: &TestEnv, pool: &str, prefix: &str, knobs: [u64; 4]) -> BenchResult<Member> {
    let client = env.client()?;
    let name = cocoon_testenv::unique_name(prefix);
    let node = TestNode::in_pool(&client, &name, pool).await?;
    node.wait_schedulable(Duration::from_secs(60)).await?;
    let root = tempfile::tempdir()?;
    let mut cfg = RegistryConfig::for_registry(env.registry_addr())?;
    let [zstd, chunk, budget, pull] = knobs;
    cfg.apply_snapshot_knobs(zstd, chunk, budget, pull)?;
    let opts = AgentOptions {
        tweak: sim_tweak,
        registry: Some(RegistryClient::new(cfg)?),
        ..AgentOptions::default()
    };
    let agent = Agent::start(client, &name, root.path(), env.registry_addr(), opts).await?;
    Ok(Member { node, agent, root })
}

fn set_spec(pool: &str, from: Option<&str>) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image(IMAGE);
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.from_checkpoint = from.map(str::to_owned);
    // No routine `:latest` on delete: deleting the cold round's forks pushes nothing, so the
    // registry's figures show what forks running add (nothing), not the forks' own snapshots.
    s.snapshot_policy = SnapshotPolicy::Never;
    s
}

/// The set shows its main up: `Running` at its generation with every agent ready.
fn running(cs: &CocoonSet) -> bool {
    cs.status.as_ref().is_some_and(|s| {
        s.phase == Some(CocoonSetPhase::Running)
            && Some(s.observed_generation) == cs.metadata.generation
            && s.desired_agents > 0
            && s.ready_agents == s.desired_agents
    })
}

// ---------------------------------------------------------------------------------------------
// The timeline: when each set was first seen Running, each checkpoint first seen in a phase.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Timeline {
    running: BTreeMap<String, Instant>,
    phases: BTreeMap<(String, &'static str), Instant>,
}

type Shared = Arc<Mutex<Timeline>>;

async fn start_timeline(client: &Client, ns: &str) -> BenchResult<Shared> {
    let t: Shared = Arc::default();
    let (ts, tc) = (t.clone(), t.clone());
    let on_set = move |cs: &CocoonSet| {
        if running(cs)
            && let Ok(mut t) = ts.lock()
        {
            t.running.entry(cs.name_any()).or_insert_with(Instant::now);
        }
    };
    let on_ckpt = move |c: &CocoonCheckpoint| {
        let phase = c.status.as_ref().and_then(|s| s.phase);
        if let (Some(p), Ok(mut t)) = (phase, tc.lock()) {
            t.phases
                .entry((c.name_any(), p.as_str()))
                .or_insert_with(Instant::now);
        }
    };
    let sets = cocoon_testsupport::watch_applied(Api::namespaced(client.clone(), ns), on_set);
    let ckpts = cocoon_testsupport::watch_applied(Api::namespaced(client.clone(), ns), on_ckpt);
    tokio::time::timeout(Duration::from_secs(60), sets).await??;
    tokio::time::timeout(Duration::from_secs(60), ckpts).await??;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// Checkpoints
// ---------------------------------------------------------------------------------------------

struct Taken {
    status: CocoonCheckpointStatus,
    /// Create → first seen `Ready`.
    total: Duration,
    /// First seen `Pushing` → first seen `Ready`.
    pushing: Option<Duration>,
    /// The `SnapshotPushed` Event's message on the source pod.
    pushed: String,
}

/// Checkpoints the main of set `source` as `name` and waits for `Ready`.
async fn checkpoint(
    client: &Client,
    ns: &str,
    t: &Shared,
    name: &str,
    source: &str,
) -> BenchResult<Taken> {
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), ns);
    let spec = CocoonCheckpointSpec {
        source: CheckpointSource {
            cocoon_set_ref: Some(NameRef {
                name: source.into(),
            }),
            pod_ref: None,
        },
    };
    let t0 = Instant::now();
    ckpts
        .create(&PostParams::default(), &CocoonCheckpoint::new(name, spec))
        .await?;
    let status = wait_until(&format!("checkpoint {name} settled"), WAIT, || async {
        let s = ckpts.get(name).await.ok()?.status?;
        matches!(
            s.phase,
            Some(CheckpointPhase::Ready | CheckpointPhase::Failed)
        )
        .then_some(s)
    })
    .await?;
    if status.phase != Some(CheckpointPhase::Ready) {
        return Err(format!("checkpoint {name} failed: {status:?}").into());
    }
    let seen = |phase: CheckpointPhase| {
        t.lock()
            .ok()
            .and_then(|t| t.phases.get(&(name.to_owned(), phase.as_str())).copied())
    };
    let ready = wait_until(
        &format!("checkpoint {name} Ready watched"),
        WAIT,
        || async { seen(CheckpointPhase::Ready) },
    )
    .await?;
    let pushing = seen(CheckpointPhase::Pushing).map(|p| ready.saturating_duration_since(p));
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let pod = status.pod_name.clone();
    let pushed = wait_until(&format!("SnapshotPushed on {pod}"), WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(SNAPSHOT_PUSHED))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&pod))
            .filter_map(|e| e.note)
            .next_back()
    })
    .await?;
    Ok(Taken {
        status,
        total: ready - t0,
        pushing,
        pushed,
    })
}

fn print_checkpoint(label: &str, k: &Taken) {
    let s = &k.status;
    println!(
        "  {label:<3} pause {:>6} ms | push: {} (Pushing -> Ready {}) | wire {} of data {} | \
         create -> Ready {}",
        s.source_pause_millis,
        k.pushed,
        k.pushing.map_or("-".to_owned(), secs),
        gib(s.bytes_on_wire.max(0) as u64),
        gib(s.data_bytes.max(0) as u64),
        secs(k.total),
    );
}

// ---------------------------------------------------------------------------------------------
// The registry's storage
// ---------------------------------------------------------------------------------------------

/// Blob files and their bytes under the registry's filesystem storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blobs {
    count: u64,
    bytes: u64,
}

fn registry_root(env: &TestEnv) -> PathBuf {
    env.run_dir().join("registry/data/docker/registry/v2")
}

/// Every `blobs/sha256/<2>/<hex>/data` file.
fn count_blobs(root: &Path) -> BenchResult<Blobs> {
    let mut b = Blobs { count: 0, bytes: 0 };
    let dir = root.join("blobs/sha256");
    for prefix in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        for blob in std::fs::read_dir(prefix?.path())? {
            let data = blob?.path().join("data");
            if let Ok(m) = std::fs::metadata(&data) {
                b.count += 1;
                b.bytes += m.len();
            }
        }
    }
    Ok(b)
}

/// The repositories (paths under `repositories/`) that link layer `hex` (`_layers/sha256/<hex>`).
fn repositories_linking(root: &Path, hex: &str) -> BenchResult<Vec<String>> {
    let repos = root.join("repositories");
    let mut out = Vec::new();
    let mut stack = vec![repos.clone()];
    while let Some(dir) = stack.pop() {
        let layers = dir.join("_layers/sha256").join(hex);
        if layers.join("link").exists() {
            let rel = dir.strip_prefix(&repos).unwrap_or(&dir);
            out.push(rel.display().to_string());
        }
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name();
            if e.file_type()?.is_dir() && !name.to_string_lossy().starts_with('_') {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What the registry holds of the checkpoint: every blob of its storage, and the repositories
/// linking each of the artifact's layers (one each: the checkpoint's own).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holding {
    blobs: Blobs,
    linked_by: Vec<Vec<String>>,
}

async fn holding(
    root: &Path,
    reg: &RegistryClient,
    repo: &str,
    digest: &str,
) -> BenchResult<Holding> {
    let fetched = reg.get_manifest(repo, &Reference::parse(digest)?).await?;
    let m = Manifest::parse(&fetched.bytes)?;
    let mut linked_by = Vec::new();
    for l in &m.layers {
        linked_by.push(repositories_linking(
            root,
            l.digest.trim_start_matches("sha256:"),
        )?);
    }
    Ok(Holding {
        blobs: count_blobs(root)?,
        linked_by,
    })
}

fn print_holding(when: &str, h: &Holding) {
    let links = h.linked_by.iter().map(Vec::len);
    let (min, max) = (links.clone().min().unwrap_or(0), links.max().unwrap_or(0));
    println!(
        "  registry {when:<24} {} blobs, {} | the artifact's {} layers each linked by {} \
         repositor{}",
        h.blobs.count,
        gib(h.blobs.bytes),
        h.linked_by.len(),
        if min == max {
            min.to_string()
        } else {
            format!("{min}-{max}")
        },
        if max == 1 { "y" } else { "ies" },
    );
}

// ---------------------------------------------------------------------------------------------
// Forks
// ---------------------------------------------------------------------------------------------

struct Round {
    /// (set, node, create -> Running)
    forks: Vec<(String, String, Duration)>,
    /// Snapshot imports of the fork nodes' runtimes during the round (pulls of the artifact).
    imports: usize,
    wall: Duration,
}

fn imports(agents: &[&Agent]) -> usize {
    agents
        .iter()
        .map(|a| a.sim.call_count(Verb::SnapshotImport))
        .sum()
}

/// Creates the sets `names` at once, each from checkpoint `ckpt` in `pool`, and waits until
/// every one is Running.
async fn fork_round(
    client: &Client,
    ns: &str,
    t: &Shared,
    pool: &str,
    ckpt: &str,
    names: &[String],
    agents: &[&Agent],
) -> BenchResult<Round> {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let imports0 = imports(agents);
    let start = Instant::now();
    let mut created = Vec::new();
    for name in names {
        let t0 = Instant::now();
        sets.create(
            &PostParams::default(),
            &CocoonSet::new(name, set_spec(pool, Some(ckpt))),
        )
        .await?;
        created.push((name.clone(), t0));
    }
    let took = wait_until(&format!("{} forks Running", names.len()), WAIT, || async {
        let t = t.lock().ok()?;
        created
            .iter()
            .map(|(n, t0)| t.running.get(n).map(|at| at.saturating_duration_since(*t0)))
            .collect::<Option<Vec<Duration>>>()
    })
    .await?;
    let wall = start.elapsed();
    let mut forks = Vec::new();
    for ((name, _), d) in created.iter().zip(took) {
        let pod = pods.get(&format!("{name}-0")).await?;
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        forks.push((name.clone(), node, d));
    }
    Ok(Round {
        forks,
        imports: imports(agents) - imports0,
        wall,
    })
}

fn print_round(label: &str, r: &Round) {
    let d: Vec<Duration> = r.forks.iter().map(|f| f.2).collect();
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &r.forks {
        *per_node.entry(f.1.as_str()).or_default() += 1;
    }
    println!(
        "  {label:<7} n={} p50 {} p95 {} max {} (all Running after {}) | artifact pulls by the \
         nodes: {} | forks per node: {:?}",
        d.len(),
        secs(pct(&d, 50)),
        secs(pct(&d, 95)),
        secs(d.iter().copied().max().unwrap_or_default()),
        secs(r.wall),
        r.imports,
        per_node.values().collect::<Vec<_>>(),
    );
    let nodes: Vec<&&str> = per_node.keys().collect();
    let each: Vec<String> = r
        .forks
        .iter()
        .map(|(n, node, d)| {
            let i = nodes.iter().position(|x| **x == node.as_str()).unwrap_or(0);
            format!("{n}@{} {:.2}", i + 1, d.as_secs_f64())
        })
        .collect();
    println!("          each (set@node s): {}", each.join(", "));
}

/// Deletes the sets `names` and waits until their VMs are gone from every agent.
async fn delete_sets(
    client: &Client,
    ns: &str,
    names: &[String],
    agents: &[&Agent],
) -> BenchResult {
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), ns);
    for name in names {
        sets.delete(name, &DeleteParams::default()).await?;
    }
    let vms: Vec<String> = names
        .iter()
        .map(|n| cocoon_api::naming::vm_name_for_agent(ns, n, 0))
        .collect();
    wait_until("the sets' VMs gone", WAIT, || async {
        for a in agents {
            if a.vms().await.iter().any(|(vm, _)| vms.contains(vm)) {
                return None;
            }
        }
        Some(())
    })
    .await?;
    Ok(())
}

/// `n` pulls of `<repo>@<digest>` at once into fresh directories (removed after); the time
/// of the slowest and the report of the first.
async fn reference_pulls(
    reg: &RegistryClient,
    repo: &str,
    digest: &str,
    n: usize,
) -> BenchResult<(Duration, PullReport)> {
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let pulls = (0..n).map(|i| {
        let dest = dir.path().join(format!("pulled-{i}"));
        async move {
            let r = reg
                .pull_snapshot_to_dir(repo, digest, &dest, "bench-pull")
                .await;
            (r, started.elapsed())
        }
    });
    let mut slowest = Duration::ZERO;
    let mut first = None;
    for (r, took) in futures::future::join_all(pulls).await {
        slowest = slowest.max(took);
        let r = r?;
        first.get_or_insert(r);
    }
    drop(dir);
    Ok((slowest, first.ok_or("no pull")?))
}

/// Removes `agent`'s local copies of checkpoint repository `repo` (its clone bases): the node
/// is cold again.
async fn drop_local_copies(agent: &Agent, repo: &str) -> BenchResult {
    for snap in agent.runtime.snapshot_list().await? {
        if snap.name.contains(repo) {
            agent.runtime.snapshot_remove_if_exists(&snap.name).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

async fn bench() -> BenchResult {
    let mib = env_count("CHECKPOINT_BENCH_MIB", DEFAULT_MIB)?;
    let forks = usize::try_from(env_count("CHECKPOINT_BENCH_FORKS", DEFAULT_FORKS as u64)?)?;
    let image = mib << 20;
    IMAGE_BYTES.store(image, Ordering::SeqCst);
    // RUST_LOG=cocoon_node=info traces the node agents (off by default).
    if std::env::var_os("RUST_LOG").is_some() {
        cocoon_testenv::init_tracing();
    }
    let tmp = std::env::temp_dir();
    let free = free_bytes(&tmp)?;
    println!(
        "free disk at {}: {} (this run needs about {})",
        tmp.display(),
        gib(free),
        gib(DISK_IMAGES * image)
    );
    if free < DISK_IMAGES * image {
        return Err(format!(
            "not enough free disk for a {mib} MiB image at {}: {} free, about {} needed \
             (set CHECKPOINT_BENCH_MIB lower)",
            tmp.display(),
            gib(free),
            gib(DISK_IMAGES * image)
        )
        .into());
    }
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env, image, forks).await;
    let outcome = cocoon_testsupport::end_bench_env(env, outcome);
    println!("free disk after the run: {}", gib(free_bytes(&tmp)?));
    outcome
}

async fn measure(env: &TestEnv, image: u64, n_forks: usize) -> BenchResult {
    let client = env.client()?;
    let ns = cocoon_testenv::create_namespace(&client, "ckpt-bench").await?;
    let pool_v1 = cocoon_testenv::unique_name("src-v1");
    let pool_v2 = cocoon_testenv::unique_name("src-v2");
    let pool_fork = cocoon_testenv::unique_name("fork");
    let src_v1 = member(env, &pool_v1, "ckb-src-v1", V1_KNOBS).await?;
    let src_v2 = member(env, &pool_v2, "ckb-src-v2", V2_KNOBS).await?;
    let mut fork_nodes = Vec::new();
    for _ in 0..FORK_NODES {
        fork_nodes.push(member(env, &pool_fork, "ckb-fork", V2_KNOBS).await?);
    }
    let timeline = start_timeline(&client, &ns).await?;
    let op = Operator::start(
        &client,
        &ns,
        env.registry_addr(),
        OperatorOptions::default(),
    );
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);
    let ckpts: Api<CocoonCheckpoint> = Api::namespaced(client.clone(), &ns);
    let mut v2_cfg = RegistryConfig::for_registry(env.registry_addr())?;
    let [zstd, chunk, budget, pull] = V2_KNOBS;
    v2_cfg.apply_snapshot_knobs(zstd, chunk, budget, pull)?;
    let reg = RegistryClient::new(v2_cfg)?;

    println!();
    println!(
        "Checkpoints and forks: a {} realistic memory image (simulated runtime, every sim \
         latency zero), real node agents, production operator timing, loopback registry, {} CPUs",
        gib(image),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // The sources.
    for (name, pool) in [("src-v1", &pool_v1), ("src-v2", &pool_v2)] {
        sets.create(
            &PostParams::default(),
            &CocoonSet::new(name, set_spec(pool, None)),
        )
        .await?;
    }
    wait_until("both sources Running", WAIT, || async {
        let t = timeline.lock().ok()?;
        (t.running.contains_key("src-v1") && t.running.contains_key("src-v2")).then_some(())
    })
    .await?;

    // The checkpoints, one after the other (each source node's own push).
    println!("checkpoint of a running set's main (the source keeps running):");
    let v1 = checkpoint(&client, &ns, &timeline, "ck-v1", "src-v1").await?;
    print_checkpoint("v1", &v1);
    let v2 = checkpoint(&client, &ns, &timeline, "ck-v2", "src-v2").await?;
    print_checkpoint("v2", &v2);
    for (src, member) in [("src-v1", &src_v1), ("src-v2", &src_v2)] {
        let vm = cocoon_api::naming::vm_name_for_agent(&ns, src, 0);
        if !member.agent.vms().await.iter().any(|(n, _)| *n == vm) {
            return Err(
                format!("the source {src}'s VM {vm} is not running after its checkpoint").into(),
            );
        }
    }
    let repo = v2.status.repository.clone();
    let digest = v2.status.digest.clone();

    // The references: one pull of the v2 artifact with nothing else running, then one per fork
    // node at once (what the cold round's nodes do side by side).
    let (pull_alone, report) = reference_pulls(&reg, &repo, &digest, 1).await?;
    println!(
        "artifact pull (v2, to a directory, nothing else running): {} ({} on the wire, {} of \
         data, {})",
        secs(pull_alone),
        gib(report.bytes_downloaded),
        gib(report.data_bytes),
        report.format
    );
    let (pull_side_by_side, _) = reference_pulls(&reg, &repo, &digest, FORK_NODES).await?;
    println!(
        "artifact pull, {FORK_NODES} at once (as the cold round's nodes pull): {} (the slowest)",
        secs(pull_side_by_side)
    );

    // The forks.
    let root = registry_root(env);
    let before = holding(&root, &reg, &repo, &digest).await?;
    let agents: Vec<&Agent> = fork_nodes.iter().map(|m| &m.agent).collect();
    println!("fork of the v2 checkpoint, create -> Running (main only):");
    // One fork alone, on a cold node; then its node drops its copy again.
    let solo_names = vec!["solo".to_owned()];
    let solo = fork_round(
        &client,
        &ns,
        &timeline,
        &pool_fork,
        "ck-v2",
        &solo_names,
        &agents,
    )
    .await?;
    print_round("(0) one fork, cold node", &solo);
    delete_sets(&client, &ns, &solo_names, &agents).await?;
    for a in &agents {
        drop_local_copies(a, &repo).await?;
    }
    println!("  {n_forks} sets created at once on {FORK_NODES} nodes:");
    let cold_names: Vec<String> = (1..=n_forks).map(|i| format!("cold-{i}")).collect();
    let cold = fork_round(
        &client,
        &ns,
        &timeline,
        &pool_fork,
        "ck-v2",
        &cold_names,
        &agents,
    )
    .await?;
    print_round("(a) cold", &cold);
    let after_cold = holding(&root, &reg, &repo, &digest).await?;
    delete_sets(&client, &ns, &cold_names, &agents).await?;
    if !reg.has_manifest(&repo, &digest).await? {
        return Err("the checkpoint's artifact is gone after its forks were deleted".into());
    }
    let cached_names: Vec<String> = (1..=n_forks).map(|i| format!("warm-{i}")).collect();
    let cached = fork_round(
        &client,
        &ns,
        &timeline,
        &pool_fork,
        "ck-v2",
        &cached_names,
        &agents,
    )
    .await?;
    print_round("(b) cached", &cached);
    let after_cached = holding(&root, &reg, &repo, &digest).await?;

    print_holding("before the forks:", &before);
    print_holding("after the cold round:", &after_cold);
    print_holding("after the cached round:", &after_cached);
    let one_copy = before.linked_by.iter().all(|r| r.len() == 1);
    let same = before == after_cold && before == after_cached;
    println!(
        "  one copy of the checkpoint's data however many forks run: {}",
        if one_copy && same { "yes" } else { "NO" }
    );

    // The goals, next to the figures.
    let cold_d: Vec<Duration> = cold.forks.iter().map(|f| f.2).collect();
    let cached_d: Vec<Duration> = cached.forks.iter().map(|f| f.2).collect();
    let pause = Duration::from_millis(v2.status.source_pause_millis.max(0) as u64).max(
        Duration::from_millis(v1.status.source_pause_millis.max(0) as u64),
    );
    let solo_d: Vec<Duration> = solo.forks.iter().map(|f| f.2).collect();
    let budget = pull_alone + Duration::from_secs(1);
    let budget_n = pull_side_by_side + Duration::from_secs(1);
    println!("goals:");
    println!(
        "  source pause under 1 s: {} (v1 {} ms, v2 {} ms)",
        verdict(pause < Duration::from_secs(1)),
        v1.status.source_pause_millis,
        v2.status.source_pause_millis
    );
    println!(
        "  fork from a cached copy p50 under 1 s: {} ({})",
        verdict(pct(&cached_d, 50) < Duration::from_secs(1)),
        secs(pct(&cached_d, 50))
    );
    println!(
        "  fork from the registry within the pull time + 1 s: one fork {} ({} against {}); \
         {n_forks} forks p50 {} ({} against {}, the pull {FORK_NODES} at once + 1 s)",
        verdict(pct(&solo_d, 50) <= budget),
        secs(pct(&solo_d, 50)),
        secs(budget),
        verdict(pct(&cold_d, 50) <= budget_n),
        secs(pct(&cold_d, 50)),
        secs(budget_n),
    );

    // Correctness, not timing: a failure of the run.
    if !one_copy {
        return Err(format!(
            "the checkpoint's layers are linked by more than one repository: {:?}",
            before.linked_by
        )
        .into());
    }
    if !same {
        return Err(format!(
            "the registry changed while forks ran: before {before:?}, after the cold round \
             {after_cold:?}, after the cached round {after_cached:?}"
        )
        .into());
    }
    if solo.imports != 1 || cold.imports != FORK_NODES {
        println!(
            "  note: the nodes pulled {} time(s) for the one fork and {} for the cold round \
             (one per node expected)",
            solo.imports, cold.imports
        );
    }
    if cached.imports != 0 {
        println!(
            "  note: {} node(s) pulled in the cached round (a node that got no fork in the \
             cold round)",
            cached.imports
        );
    }

    // Teardown: the sets, the checkpoints (their artifacts), the agents, the namespace.
    let all_agents: Vec<&Agent> = [&src_v1, &src_v2]
        .into_iter()
        .chain(fork_nodes.iter())
        .map(|m| &m.agent)
        .collect();
    let mut names = cached_names.clone();
    names.extend(["src-v1".to_owned(), "src-v2".to_owned()]);
    delete_sets(&client, &ns, &names, &all_agents).await?;
    for c in ["ck-v1", "ck-v2"] {
        ckpts.delete(c, &DeleteParams::default()).await?;
    }
    wait_until("checkpoints gone", WAIT, || async {
        let list = ckpts.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await?;
    op.stop().await;
    let mut members = vec![src_v1, src_v2];
    members.extend(fork_nodes);
    for m in &mut members {
        m.agent.stop().await;
    }
    for m in members {
        drop(m.node);
        drop(m.root);
    }
    cocoon_testenv::delete_namespace(&client, &ns).await?;
    Ok(())
}
