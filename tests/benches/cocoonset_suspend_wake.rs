//! Suspend and wake latency of CocoonSets (retain policy, main + 1 sub-agent each) with REAL
//! in-process node agents (`cocoon_testsupport::Agent` on the simulated runtime, every sim
//! latency zero, so transfers take no time) against the real control plane and registry this
//! bench starts, and both controllers in-process with the production timing.
//!
//! Two scenarios: one set, suspended and woken several times; then 50 sets, each suspended (and
//! then woken) all at once. For every transition of every set it measures, from watch events
//! timestamped in this process:
//!
//! * **total**: from the spec edit (just before the PATCH) to the first watch event that shows
//!   the new phase (`Suspended`, or `Running` with every agent ready) at the new generation;
//! * **agents**: the node agents' own time, the union over the set's pods of the span from the
//!   first event that shows the agent the request (suspend: `vm.cocoonstack.io/hibernate=true`;
//!   wake: the annotation gone) to the first event that shows the agent done (lifecycle-state
//!   `hibernated`; or `ready` with a VM id and the pod's Ready condition, which the agent
//!   publishes after its readiness probe; at the new generation or later);
//! * **controller overhead** = total − agents: the controller's passes, its writes, and the
//!   watch hops between it and the agents.
//!
//! Run: `cargo bench -p cocoon-e2e --bench cocoonset_suspend_wake`
//! (`COCOON_BENCH_SETS` sets the size of the second scenario, default 50;
//! `COCOON_BENCH_ROUNDS` the rounds of the first, default 5). The controller runs at the
//! `COCOONSET_CONCURRENCY` the shipped Deployment (`manifests/operator/deployment.yaml`) sets,
//! read from that file; the environment variable of that name overrides it. Under
//! `cargo test` it only prints how to run it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec};
use cocoon_runtime::sim::{Latencies, SimConfig};
use cocoon_testenv::{TestEnv, TestNode};
use cocoon_testsupport::{Agent, AgentOptions, Operator, OperatorOptions, watch_pods_and_sets};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NODES: usize = 3;
const DEFAULT_SETS: usize = 50;
const DEFAULT_ROUNDS: usize = 5;
/// Budget for one transition of every set in a scenario; a miss aborts the run.
const WAIT: Duration = Duration::from_secs(600);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "cocoonset_suspend_wake: run with `cargo bench -p cocoon-e2e --bench \
             cocoonset_suspend_wake` (COCOON_BENCH_SETS=<n>, default {DEFAULT_SETS}; \
             COCOON_BENCH_ROUNDS=<n>, default {DEFAULT_ROUNDS})"
        );
        return;
    }
    let count = |var: &str, default: usize| match std::env::var(var) {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("{var} must be a positive integer, got {v:?}");
                std::process::exit(2);
            }
        },
        Err(_) => default,
    };
    // RUST_LOG=cocoon_operator=debug traces each pass (off by default).
    if std::env::var_os("RUST_LOG").is_some() {
        cocoon_testenv::init_tracing();
    }
    let sets = count("COCOON_BENCH_SETS", DEFAULT_SETS);
    let rounds = count("COCOON_BENCH_ROUNDS", DEFAULT_ROUNDS);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(sets, rounds)) {
        eprintln!("cocoonset_suspend_wake failed: {e}");
        std::process::exit(1);
    }
}

async fn run(sets: usize, rounds: usize) -> BenchResult {
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env, sets, rounds).await;
    cocoon_testsupport::end_bench_env(env, outcome)
}

/// Every sim latency zero: no transfer or runtime time.
fn zero_latency(cfg: &mut SimConfig) {
    cfg.latencies = Latencies::default().scaled(0.0);
}

fn set_spec(pool: &str) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image("ubuntu:24.04");
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.replicas = 1;
    s
}

// ---------------------------------------------------------------------------------------------
// The timeline: every watch event of the sets and pods, stamped on arrival.
// ---------------------------------------------------------------------------------------------

/// What a pod event shows.
#[derive(Debug, Clone)]
struct PodSeen {
    at: Instant,
    hibernate: bool,
    lifecycle: String,
    observed: i64,
    vm_id: bool,
    ready: bool,
}

/// What a set event shows.
#[derive(Debug, Clone)]
struct SetSeen {
    at: Instant,
    phase: Option<CocoonSetPhase>,
    observed: i64,
    ready: bool,
}

#[derive(Default)]
struct Timeline {
    pods: BTreeMap<String, Vec<PodSeen>>,
    sets: BTreeMap<String, Vec<SetSeen>>,
}

type Shared = Arc<Mutex<Timeline>>;

fn record_pod(t: &Shared, p: &Pod) {
    let a = p.annotations();
    let get = |k: &str| a.get(k).cloned().unwrap_or_default();
    let seen = PodSeen {
        at: Instant::now(),
        hibernate: get(ann::HIBERNATE) == "true",
        lifecycle: get(ann::LIFECYCLE_STATE),
        observed: get(ann::LIFECYCLE_OBSERVED_GENERATION).parse().unwrap_or(0),
        vm_id: !get(ann::VM_ID).is_empty(),
        ready: p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
    };
    if let Ok(mut t) = t.lock() {
        t.pods.entry(p.name_any()).or_default().push(seen);
    }
}

fn record_set(t: &Shared, cs: &CocoonSet) {
    let st = cs.status.clone().unwrap_or_default();
    let seen = SetSeen {
        at: Instant::now(),
        phase: st.phase,
        observed: st.observed_generation,
        ready: st.ready_agents == st.desired_agents && st.desired_agents > 0,
    };
    if let Ok(mut t) = t.lock() {
        t.sets.entry(cs.name_any()).or_default().push(seen);
    }
}

/// Watches the namespace's pods and sets into the timeline; returns once both have listed.
async fn start_timeline(client: &Client, ns: &str) -> BenchResult<Shared> {
    let t: Shared = Arc::default();
    let (tp, ts) = (t.clone(), t.clone());
    let on_pod = move |p: &Pod| record_pod(&tp, p);
    let on_set = move |cs: &CocoonSet| record_set(&ts, cs);
    watch_pods_and_sets(client, ns, on_pod, on_set).await?;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// Transitions
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Suspend,
    Wake,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Suspend => "suspend",
            Kind::Wake => "wake",
        }
    }

    /// The set shows this transition done at generation `g`.
    fn set_done(self, s: &SetSeen, g: i64) -> bool {
        s.observed >= g
            && match self {
                Kind::Suspend => s.phase == Some(CocoonSetPhase::Suspended),
                Kind::Wake => s.phase == Some(CocoonSetPhase::Running) && s.ready,
            }
    }

    /// The pod shows the agent the request.
    fn pod_asked(self, p: &PodSeen) -> bool {
        match self {
            Kind::Suspend => p.hibernate,
            Kind::Wake => !p.hibernate,
        }
    }

    /// The pod shows the agent done at generation `g`.
    fn pod_done(self, p: &PodSeen, g: i64) -> bool {
        p.observed >= g
            && match self {
                Kind::Suspend => p.lifecycle == "hibernated",
                Kind::Wake => p.lifecycle == "ready" && p.vm_id && p.ready,
            }
    }
}

/// One set's measured transition.
#[derive(Debug, Clone, Copy)]
struct Sample {
    total: Duration,
    agents: Duration,
    /// From the edit to the first pod that shows an agent the request.
    lead: Duration,
    /// From the last agent done to the set's phase.
    tail: Duration,
}

impl Sample {
    fn overhead(&self) -> Duration {
        self.total.saturating_sub(self.agents)
    }
}

/// The measure of the union of the intervals.
fn union_len(mut v: Vec<(Instant, Instant)>) -> Duration {
    v.sort();
    let mut total = Duration::ZERO;
    let mut cur: Option<(Instant, Instant)> = None;
    for (s, e) in v {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// The sample of set `name` for a transition edited at `t0` to generation `g`, once complete.
fn sample(t: &Timeline, name: &str, kind: Kind, t0: Instant, g: i64) -> Option<Sample> {
    let done = t
        .sets
        .get(name)?
        .iter()
        .find(|s| s.at >= t0 && kind.set_done(s, g))?
        .at;
    let prefix = format!("{name}-");
    let mut spans = Vec::new();
    for (pod, seen) in t.pods.range(prefix.clone()..) {
        if !pod.starts_with(&prefix) {
            break;
        }
        let after: Vec<&PodSeen> = seen.iter().filter(|p| p.at >= t0).collect();
        let Some(asked) = after.iter().find(|p| kind.pod_asked(p)) else {
            continue;
        };
        let Some(finished) = after
            .iter()
            .find(|p| p.at >= asked.at && kind.pod_done(p, g))
        else {
            continue;
        };
        spans.push((asked.at, finished.at.min(done)));
    }
    let first_asked = spans.iter().map(|s| s.0).min().unwrap_or(done);
    let last_done = spans.iter().map(|s| s.1).max().unwrap_or(t0);
    Some(Sample {
        total: done - t0,
        agents: union_len(spans),
        lead: first_asked.saturating_duration_since(t0),
        tail: done.saturating_duration_since(last_done),
    })
}

/// Edits every named set (`spec.suspend`), then waits for all to finish; one sample each.
async fn transition(
    sets: &Api<CocoonSet>,
    t: &Shared,
    op: &Operator,
    names: &[String],
    kind: Kind,
    work: &mut Work,
) -> BenchResult<Vec<Sample>> {
    let before = Work::of(op);
    let suspend = kind == Kind::Suspend;
    let mut edits = Vec::new();
    for name in names {
        let t0 = Instant::now();
        let cs = sets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"suspend": suspend}})),
            )
            .await?;
        edits.push((name.clone(), t0, cs.metadata.generation.unwrap_or_default()));
    }
    let what = format!("{} sets: {}", names.len(), kind.name());
    let samples = cocoon_testenv::wait_until(&what, WAIT, || async {
        let t = t.lock().ok()?;
        edits
            .iter()
            .map(|(name, t0, g)| sample(&t, name, kind, *t0, *g))
            .collect::<Option<Vec<Sample>>>()
    })
    .await?;
    work.add(&Work::of(op).minus(&before), names.len() as u64);
    Ok(samples)
}

/// The CocoonSet controller's work over some transitions.
#[derive(Debug, Default, Clone, Copy)]
struct Work {
    passes: u64,
    writes: u64,
    registry_calls: u64,
    busy_micros: u64,
    transitions: u64,
}

impl Work {
    fn of(op: &Operator) -> Work {
        let s = &op.stats;
        Work {
            passes: s.passes.load(Ordering::SeqCst),
            writes: s.writes.load(Ordering::SeqCst),
            registry_calls: s.registry_calls.load(Ordering::SeqCst),
            busy_micros: s.busy_micros.load(Ordering::SeqCst),
            transitions: 0,
        }
    }

    fn minus(&self, o: &Work) -> Work {
        Work {
            passes: self.passes - o.passes,
            writes: self.writes - o.writes,
            registry_calls: self.registry_calls - o.registry_calls,
            busy_micros: self.busy_micros - o.busy_micros,
            transitions: 0,
        }
    }

    fn add(&mut self, o: &Work, transitions: u64) {
        self.passes += o.passes;
        self.writes += o.writes;
        self.registry_calls += o.registry_calls;
        self.busy_micros += o.busy_micros;
        self.transitions += transitions;
    }

    fn per(&self, x: u64) -> f64 {
        x as f64 / self.transitions.max(1) as f64
    }
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

fn ms(d: Duration) -> String {
    format!("{:>7.0} ms", d.as_secs_f64() * 1000.0)
}

fn report(scenario: &str, kind: Kind, samples: &[Sample], work: &Work) {
    let col = |f: fn(&Sample) -> Duration| samples.iter().map(f).collect::<Vec<_>>();
    let total = col(|s| s.total);
    let agents = col(|s| s.agents);
    let overhead = col(Sample::overhead);
    println!(
        "  {scenario:<10} {:<8} n={:<4} total p50 {} p95 {} | agents p50 {} p95 {} | controller \
         overhead p50 {} p95 {}",
        kind.name(),
        samples.len(),
        ms(pct(&total, 50)),
        ms(pct(&total, 95)),
        ms(pct(&agents, 50)),
        ms(pct(&agents, 95)),
        ms(pct(&overhead, 50)),
        ms(pct(&overhead, 95)),
    );
    println!(
        "  {:<19} of the overhead: edit -> first agent asked p50 {} p95 {} | last agent done \
         -> phase p50 {} p95 {}",
        "",
        ms(pct(&col(|s| s.lead), 50)),
        ms(pct(&col(|s| s.lead), 95)),
        ms(pct(&col(|s| s.tail), 50)),
        ms(pct(&col(|s| s.tail), 95)),
    );
    println!(
        "  {:<19} controller work per set transition: {:.1} passes, {:.1} writes, {:.1} \
         registry calls, {:.0} ms in passes ({:.1} ms a pass)",
        "",
        work.per(work.passes),
        work.per(work.writes),
        work.per(work.registry_calls),
        work.per(work.busy_micros) / 1000.0,
        work.busy_micros as f64 / 1000.0 / work.passes.max(1) as f64,
    );
}

async fn create_running(
    sets: &Api<CocoonSet>,
    t: &Shared,
    names: &[String],
    pool: &str,
) -> BenchResult {
    let t0 = Instant::now();
    for name in names {
        sets.create(
            &PostParams::default(),
            &CocoonSet::new(name, set_spec(pool)),
        )
        .await?;
    }
    cocoon_testenv::wait_until(&format!("{} sets Running", names.len()), WAIT, || async {
        let t = t.lock().ok()?;
        names
            .iter()
            .all(|n| {
                t.sets.get(n).is_some_and(|v| {
                    v.last()
                        .is_some_and(|s| Kind::Wake.set_done(s, 1) && s.at >= t0)
                })
            })
            .then_some(())
    })
    .await?;
    println!(
        "  {} set(s) Running after {:.1} s",
        names.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn measure(env: &TestEnv, n_sets: usize, rounds: usize) -> BenchResult {
    let client = env.client()?;
    let ns = cocoon_testenv::create_namespace(&client, "cs-swbench").await?;
    let pool = cocoon_testenv::unique_name("pool");
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    let mut roots = Vec::new();
    for _ in 0..NODES {
        let root = tempfile::tempdir()?;
        let name = cocoon_testenv::unique_name("swbench-node");
        let node = TestNode::in_pool(&client, &name, &pool).await?;
        node.wait_schedulable(Duration::from_secs(60)).await?;
        let opts = AgentOptions {
            tweak: zero_latency,
            ..AgentOptions::default()
        };
        agents.push(
            Agent::start(env.client()?, &name, root.path(), env.registry_addr(), opts).await?,
        );
        nodes.push(node);
        roots.push(root);
    }
    let timeline = start_timeline(&client, &ns).await?;
    let (concurrency, source) = match std::env::var("COCOONSET_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|n| *n > 0)
    {
        Some(n) => (n, "from the environment"),
        None => (
            cocoon_testsupport::shipped_cocoonset_concurrency()?,
            "as the shipped Deployment sets it",
        ),
    };
    let op = Operator::start(
        &client,
        &ns,
        env.registry_addr(),
        OperatorOptions {
            concurrency,
            ..OperatorOptions::default()
        },
    );
    let sets: Api<CocoonSet> = Api::namespaced(client.clone(), &ns);

    println!();
    println!(
        "CocoonSet suspend/wake: retain policy, main + 1 sub-agent per set, {NODES} real \
         in-process node agents (simulated runtime, every sim latency zero), production timing, \
         COCOONSET_CONCURRENCY={concurrency} ({source})"
    );
    // One set, several rounds.
    let one = vec!["solo".to_owned()];
    create_running(&sets, &timeline, &one, &pool).await?;
    let (mut s1, mut w1) = (Vec::new(), Vec::new());
    let (mut ks1, mut kw1) = (Work::default(), Work::default());
    for _ in 0..rounds {
        s1.extend(transition(&sets, &timeline, &op, &one, Kind::Suspend, &mut ks1).await?);
        w1.extend(transition(&sets, &timeline, &op, &one, Kind::Wake, &mut kw1).await?);
    }
    // Many sets at once.
    let many: Vec<String> = (0..n_sets).map(|i| format!("bench-{i}")).collect();
    create_running(&sets, &timeline, &many, &pool).await?;
    let (mut ksm, mut kwm) = (Work::default(), Work::default());
    let sm = transition(&sets, &timeline, &op, &many, Kind::Suspend, &mut ksm).await?;
    let wm = transition(&sets, &timeline, &op, &many, Kind::Wake, &mut kwm).await?;

    println!("per transition (total = spec edit -> phase; agents = node agents' own time):");
    report("1 set", Kind::Suspend, &s1, &ks1);
    report("1 set", Kind::Wake, &w1, &kw1);
    let label = format!("{n_sets} sets");
    report(&label, Kind::Suspend, &sm, &ksm);
    report(&label, Kind::Wake, &wm, &kwm);
    let errors: u64 = ["kube", "registry", "invalid", "cache"]
        .iter()
        .map(|kind| {
            op.metrics
                .reconcile_errors
                .get_or_create(&cocoon_operator::metrics::ErrorLabels {
                    controller: "cocoonset".into(),
                    kind: (*kind).into(),
                })
                .get()
        })
        .sum();
    println!("  CocoonSet reconcile errors over the run: {errors}");
    println!("  goal: controller overhead under 1 s per transition at p50");

    op.stop().await;
    for mut a in agents {
        a.stop().await;
    }
    drop(nodes);
    cocoon_testenv::delete_namespace(&client, &ns).await?;
    drop(roots);
    Ok(())
}
