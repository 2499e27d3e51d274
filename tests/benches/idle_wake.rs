//! Idle suspend and wake on connect (issue 39) with REAL node agents, repeated: a set with
//! `idle: {suspendAfter: 10s, ports: [7000]}` on two in-process node agents (the production
//! agent on the simulated runtime, its VMs echoing TCP on 7000 at their addresses in
//! 198.19.0.0/16, local on `lo`, each snapshot's memory image `VK_SIM_MEMORY_SIZE`, default
//! `1Gi`, filled as `VK_SIM_MEMORY_FILL`, default `realistic`), the operator's controllers, its
//! Service/EndpointSlice controller and one activator, against the real control plane and
//! registry of a test environment this bench starts.
//!
//! Each cycle: the set idles until the operator suspends it (no traffic, no session), then one
//! client connects to the EndpointSlice's address (the activator), sends a few bytes and
//! reads them back from the woken VM. It prints:
//!
//! * the connect-to-first-byte time of each wake (p50, p95, max): a warm wake, from the
//!   node's own copy of the snapshot when the VM comes back on the node it left;
//! * the API writes per idle suspend and per wake, from the API server's audit log: the
//!   operator's controllers, the activator and the node agents each run under an audited
//!   ServiceAccount of their own; a suspend is counted from the set Running to the set
//!   `Suspended`, a wake from there to the set Running again;
//! * lost connections: a connection that is closed or does not echo fails the bench;
//! * the RSS (VmRSS) of this process at the start and at the end: the operator's
//!   controllers, the activator and both node agents run in it (with the bench's own client),
//!   so the figure is all of them together, not one component's.
//!
//! Run: `cargo bench -p cocoon-e2e --bench idle_wake` (`IDLE_BENCH_CYCLES`, default 100;
//! `VK_SIM_MEMORY_SIZE=64Mi` to shrink the image). Under `cargo test` it only prints how to
//! run it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, IdleSpec};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_runtime::sim::{IpPool, SimConfig};
use cocoon_testenv::{AuditLog, Shared, wait_until};
use cocoon_testsupport::{
    ActivatorOptions, ActivatorReplica, Agent, AgentOptions, AuditedIdentity, BoxError,
    KubeletOptions, Operator, OperatorOptions, guest_of, host_of,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEFAULT_CYCLES: usize = 100;
const WAIT: Duration = Duration::from_secs(180);
const SET: &str = "idle";
const MAIN_POD: &str = "idle-0";
const PORT: u16 = 7000;
const ACTIVATOR_IP: &str = "198.18.0.71";
const ACTIVATOR_FIRST_PORT: u16 = 41980;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "idle_wake: run with `cargo bench -p cocoon-e2e --bench idle_wake` \
             (IDLE_BENCH_CYCLES=<n>, default {DEFAULT_CYCLES}; VK_SIM_MEMORY_SIZE, default 1Gi; \
             VK_SIM_MEMORY_FILL, default realistic)"
        );
        return;
    }
    let cycles = match std::env::var("IDLE_BENCH_CYCLES") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("IDLE_BENCH_CYCLES must be a positive integer, got {v:?}");
                std::process::exit(2);
            }
        },
        Err(_) => DEFAULT_CYCLES,
    };
    // The simulated runtime's memory settings, checked once here (the agents read them again).
    if let Err(e) = SimConfig::from_env(std::env::temp_dir(), sim_env) {
        eprintln!("idle_wake: {e}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(cycles)) {
        eprintln!("idle_wake failed: {e}");
        std::process::exit(1);
    }
}

/// The environment with this bench's defaults: a 1 GiB realistic memory image.
fn sim_env(k: &str) -> Option<String> {
    std::env::var(k).ok().or_else(|| match k {
        "VK_SIM_MEMORY_SIZE" => Some("1Gi".into()),
        "VK_SIM_MEMORY_FILL" => Some("realistic".into()),
        _ => None,
    })
}

/// Each agent's VMs: a /24 of 198.19.0.0/16 of its own, echo on [`PORT`], the memory image.
fn sim_tweak(cfg: &mut SimConfig) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let third = (std::process::id() * 7 + 100 + NEXT.fetch_add(1, Ordering::Relaxed)) % 250 + 2;
    cfg.ip_pool = IpPool::parse(&format!("198.19.{third}.0/24")).expect("pool");
    cfg.echo_ports = vec![PORT];
    let from_env = SimConfig::from_env(cfg.root.clone(), sim_env).expect("checked in main");
    cfg.memory_file_size = from_env.memory_file_size;
    cfg.memory_fill = from_env.memory_fill;
}

/// VmRSS of this process, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The `q` quantile (nearest rank) of sorted `v`.
fn quantile(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn phase(cs: &CocoonSet) -> Option<CocoonSetPhase> {
    cs.status.as_ref().and_then(|s| s.phase)
}

fn running(cs: &CocoonSet) -> bool {
    !cs.spec.suspend
        && phase(cs) == Some(CocoonSetPhase::Running)
        && cs.status.as_ref().is_some_and(|s| s.ready_agents == 1)
}

/// The slice's one address, once it lists exactly one at `ip`.
async fn slice_at(slices: &Api<EndpointSlice>, ip: &str) -> Option<SocketAddr> {
    let s = slices.get_opt(&format!("{SET}-cocoon")).await.ok()??;
    let addrs: Vec<&String> = s.endpoints.iter().flat_map(|e| &e.addresses).collect();
    let ports: Vec<i32> = s.ports.iter().flatten().filter_map(|p| p.port).collect();
    match (addrs.as_slice(), ports.as_slice()) {
        ([a], [p]) if a.as_str() == ip => format!("{a}:{p}").parse().ok(),
        _ => None,
    }
}

/// Connects, sends `msg`, reads it back; the time from connect to the first byte back.
async fn echo_once(addr: SocketAddr, msg: &str) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(msg.as_bytes()).await?;
    let mut buf = vec![0u8; msg.len()];
    let mut got = 0;
    let mut first = None;
    while got < buf.len() {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf[got..])).await??;
        if n == 0 {
            return Err(format!("closed after {got} of {} bytes", msg.len()).into());
        }
        first.get_or_insert_with(|| start.elapsed());
        got += n;
    }
    if buf != msg.as_bytes() {
        return Err(format!("echoed {:?}", String::from_utf8_lossy(&buf)).into());
    }
    Ok(first.unwrap_or_default())
}

/// The three audited identities and their write counts in the bench namespace.
struct Writers {
    operator: AuditedIdentity,
    activator: AuditedIdentity,
    node: AuditedIdentity,
}

impl Writers {
    async fn counts(&self, audit: &AuditLog, ns: &str) -> Result<[usize; 3], BoxError> {
        Ok([
            self.operator.writes_in(audit, ns).await?,
            self.activator.writes_in(audit, ns).await?,
            self.node.writes_in(audit, ns).await?,
        ])
    }
}

async fn run(cycles: usize) -> Result<(), BoxError> {
    let env = cocoon_testenv::try_shared().await?;
    cocoon_testenv::ensure_sim_vm_range()?;
    let audit = env
        .audit_log()
        .ok_or("the test environment's audit log is unknown")?;
    let admin = env.client()?;
    let ns = cocoon_testenv::create_namespace(&admin, "idle-bench").await?;
    let pool = cocoon_testenv::unique_name("pool");
    let w = Writers {
        operator: AuditedIdentity::new(env, &admin, "idle-bench-operator").await?,
        activator: AuditedIdentity::new(env, &admin, "idle-bench-activator").await?,
        node: AuditedIdentity::new(env, &admin, "idle-bench-node").await?,
    };
    let rss_start = rss_mib();
    let mut agents = Vec::new();
    let mut roots = Vec::new();
    for _ in 0..2 {
        let root = tempfile::tempdir()?;
        agents.push(start_agent(env, &w.node, &pool, root.path()).await?);
        roots.push(root);
    }
    let _operator = Operator::start(
        &w.operator.client,
        &ns,
        env.registry_addr(),
        OperatorOptions::default(),
    );
    let _act = ActivatorReplica::start(
        &w.operator.client,
        &w.activator.client,
        &ns,
        ActivatorOptions {
            addr: ACTIVATOR_IP.parse()?,
            first_port: ACTIVATOR_FIRST_PORT,
            wake_wait: WAIT,
            vm_networks: vec!["198.19.0.0/16".into()],
        },
    )
    .await?;

    let mut spec = CocoonSetSpec::with_image("ubuntu:24.04");
    spec.node_pool = pool.clone();
    spec.agent.mode = AgentMode::Run;
    spec.agent.replicas = 0;
    spec.idle = Some(IdleSpec {
        suspend_after: Some("10s".into()),
        ports: vec![i32::from(PORT)],
        ..IdleSpec::default()
    });
    let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), &ns);
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), &ns);
    sets.create(&PostParams::default(), &CocoonSet::new(SET, spec))
        .await?;
    let vm = vm_name_for_pod(&ns, MAIN_POD);
    wait_until("the set Running", WAIT, || async {
        sets.get(SET).await.ok().filter(running)
    })
    .await?;
    let (host, _) = host_of(&agents, &vm).await?;
    let guest = guest_of(host, &vm, "/nonexistent")?.0;
    let rss_running = rss_mib();
    println!(
        "idle_wake: {cycles} cycles, suspendAfter 10s, memory image {} {}, RSS of this process \
         {rss_start:.1} MiB before the agents, {rss_running:.1} MiB with the set running",
        sim_env("VK_SIM_MEMORY_SIZE").unwrap_or_default(),
        sim_env("VK_SIM_MEMORY_FILL").unwrap_or_default(),
    );

    let mut first_bytes = Vec::new();
    let (mut suspend_writes, mut wake_writes) = ([0usize; 3], [0usize; 3]);
    let (mut lost, mut moved) = (0usize, 0usize);
    let mut last = w.counts(&audit, &ns).await?;
    for cycle in 1..=cycles {
        let node_before = host_of(&agents, &vm).await?.0.node.clone();
        let target = wait_until("the set idle-suspended", WAIT, || async {
            let cs = sets.get(SET).await.ok()?;
            if phase(&cs) != Some(CocoonSetPhase::Suspended) {
                return None;
            }
            slice_at(&slices, ACTIVATOR_IP).await
        })
        .await?;
        let suspended = w.counts(&audit, &ns).await?;
        let result = echo_once(target, &format!("hello-{cycle}")).await;
        match result {
            Ok(d) => first_bytes.push(d),
            Err(e) => {
                eprintln!("cycle {cycle}: connection lost: {e}");
                lost += 1;
            }
        }
        wait_until("the set Running again", WAIT, || async {
            sets.get(SET).await.ok().filter(running)
        })
        .await?;
        let woken = w.counts(&audit, &ns).await?;
        for i in 0..3 {
            suspend_writes[i] += suspended[i] - last[i];
            wake_writes[i] += woken[i] - suspended[i];
        }
        last = woken;
        let (now_host, _) = host_of(&agents, &vm).await?;
        if now_host.node != node_before {
            moved += 1;
        }
        if guest_of(now_host, &vm, "/nonexistent")?.0 != guest {
            return Err(format!("cycle {cycle}: the guest's state token changed").into());
        }
        if let Some(d) = first_bytes.last().filter(|_| cycle % 10 == 0 || cycle == 1) {
            println!(
                "  cycle {cycle}: first byte after {:.3}s, RSS {:.1} MiB",
                d.as_secs_f64(),
                rss_mib()
            );
        }
        if lost > 0 {
            break;
        }
    }
    let rss_end = rss_mib();
    first_bytes.sort();
    let per = |total: usize| total as f64 / cycles as f64;
    println!("idle_wake results ({cycles} cycles, {moved} woken on another node):");
    println!(
        "  connect to first byte (warm wake): p50 {:.3}s p95 {:.3}s max {:.3}s",
        quantile(&first_bytes, 0.5).as_secs_f64(),
        quantile(&first_bytes, 0.95).as_secs_f64(),
        first_bytes
            .last()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    println!(
        "  API writes per idle suspend (audit log): operator {:.2}, activator {:.2}, node agents {:.2}",
        per(suspend_writes[0]),
        per(suspend_writes[1]),
        per(suspend_writes[2])
    );
    println!(
        "  API writes per wake (audit log): operator {:.2}, activator {:.2}, node agents {:.2}",
        per(wake_writes[0]),
        per(wake_writes[1]),
        per(wake_writes[2])
    );
    println!("  lost connections: {lost}");
    println!(
        "  RSS of this process (operator controllers + activator + 2 node agents + bench): \
         start {rss_running:.1} MiB, end {rss_end:.1} MiB, growth {:+.1} MiB",
        rss_end - rss_running
    );
    if lost > 0 {
        return Err(format!("{lost} connection(s) lost").into());
    }
    for mut a in agents {
        a.stop().await;
    }
    drop(roots);
    Ok(())
}

async fn start_agent(
    env: &Shared,
    identity: &AuditedIdentity,
    pool: &str,
    root: &std::path::Path,
) -> Result<Agent, BoxError> {
    Agent::start(
        identity.client.clone(),
        &cocoon_testenv::unique_name("idle-bench-node"),
        root,
        env.registry_addr(),
        AgentOptions {
            kubelet: Some(KubeletOptions::for_env(env, pool)?),
            tweak: sim_tweak,
            ..AgentOptions::default()
        },
    )
    .await
}
