//! What a user waits for when a real-sized VM hibernates and wakes: the node agent on the
//! simulated runtime, whose snapshots carry a realistic memory image (`MemoryFill::Realistic`:
//! half zero pages, a quarter text, a quarter random; 2 GiB by default), through the real
//! registry, as v1 and as v2 (issue 27 item 4, the end-to-end figure).
//!
//! Starts its own control plane and registry (`cocoon_testenv::TestEnv`) and, per case, two
//! in-process agents with the case's snapshot knobs on two nodes, every simulated latency zero:
//!
//! * **hibernate**: from the patch of `vm.cocoonstack.io/hibernate` on node a's pod to its
//!   lifecycle `hibernated`, which the agent reports only after the runtime saved the VM, the
//!   push finished and the `:hibernate` tag was verified in the registry (so it includes the
//!   simulated save, which writes the image like a real one);
//! * **wake**: node a deletes the hibernated pod; a pod of the same name on node b (no local
//!   copy there) with `restore-from-hibernate`, from create to Running/Ready with its VM up:
//!   the pull, the import and the clone.
//!
//! Printed per case: both times, the wire bytes and data bytes the agent's `SnapshotPushed` /
//! `SnapshotPulled` Events report, the process CPU (agents, harness and simulator together;
//! the registry and the API server are separate processes), and the ratios against v1.
//! Loopback only: on a slower link the wire bytes decide (see the registry bench
//! `snapshot_v2` for the 1 Gbit/s figures).
//!
//! Run: `cargo bench -p cocoon-node --bench hibernate_transfer`
//! (`HIBERNATE_BENCH_MIB` sets the image size, default 2048).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{AgentOptions, BoxError, is_running_ready, sim_config, start_agent_with, vm_pod};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_node::pods::Timing;
use cocoon_runtime::sim::{Latencies, MemoryFill};
use cocoon_testenv::{Options, TestEnv, TestNode, create_namespace, wait_until};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(900);

/// One configuration: name and the knobs `[SNAPSHOT_ZSTD_LEVEL, SNAPSHOT_CHUNK_SIZE_MIB,
/// SNAPSHOT_MEMORY_BUDGET_MIB, SNAPSHOT_PULL_BUDGET_MIB]`.
const CASES: [(&str, [u64; 4]); 4] = [
    ("v1", [0, 0, 0, 0]),
    ("v2 zstd1", [1, 0, 0, 0]),
    ("v2 zstd1 64M", [1, 64, 0, 0]),
    ("v2 zstd3 64M", [3, 64, 0, 0]),
];

fn main() {
    cocoon_testenv::bench::bench_main(
        "hibernate_transfer",
        "usage: cargo bench -p cocoon-node --bench hibernate_transfer  \
         (starts a local control plane and registry; HIBERNATE_BENCH_MIB=2048)",
        bench,
    );
}

struct Row {
    case: &'static str,
    hibernate: Duration,
    wake: Duration,
    pushed: String,
    pulled: String,
    cpu: Duration,
}

/// The message of the newest Event `reason` on pod `name`.
async fn transfer_message(
    events: &Api<Event>,
    name: &str,
    reason: &str,
) -> Result<String, BoxError> {
    Ok(
        wait_until(&format!("{reason} on {name}"), DEADLINE, || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.involved_object.name.as_deref() == Some(name)
                })
                .filter_map(|e| e.message)
                .next_back()
        })
        .await?,
    )
}

async fn run_case(
    env: &TestEnv,
    case: &'static str,
    knobs: [u64; 4],
    image_bytes: u64,
    i: usize,
) -> Result<Row, BoxError> {
    let client = env.client()?;
    let ns = create_namespace(&client, "bench-hib").await?;
    let tmp = tempfile::tempdir()?;
    let nodes = [format!("bench-a-{i}"), format!("bench-b-{i}")];
    let mut node_objs = Vec::new();
    let mut agents = Vec::new();
    for node in &nodes {
        node_objs.push(TestNode::in_pool(&client, node, "default").await?);
        let root = tmp.path().join(node);
        let mut sim = sim_config(&root);
        sim.latencies = Latencies::default().scaled(0.0);
        sim.lease_delay = Duration::ZERO;
        sim.memory_file_size = image_bytes;
        sim.memory_fill = MemoryFill::Realistic;
        let opts = AgentOptions {
            sim,
            timing: Timing::default(),
            ready_within: DEADLINE,
            snapshot_knobs: knobs,
            ..AgentOptions::new(&root)
        };
        agents.push(
            start_agent_with(
                client.clone(),
                env.registry_addr(),
                node,
                &root,
                opts,
                |_| Ok(()),
            )
            .await?,
        );
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let name = "agent";
    api.create(&PostParams::default(), &vm_pod(&ns, name, &nodes[0], &[]))
        .await?;
    wait_until("the pod on node a Ready", DEADLINE, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(is_running_ready)
    })
    .await?;

    let cpu0 = cocoon_testenv::bench::cpu_time();
    let started = Instant::now();
    let patch =
        json!({"metadata": {"annotations": {ann::HIBERNATE: "true", ann::GENERATION: "2"}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_until("hibernated", DEADLINE, || async {
        let p = api.get_opt(name).await.ok().flatten()?;
        let l = Lifecycle::from_meta(&p.metadata);
        (l.state == Some(LifecycleState::Hibernated) && l.observed_generation == 2).then_some(())
    })
    .await?;
    let hibernate = started.elapsed();
    let pushed = transfer_message(&events, name, "SnapshotPushed").await?;

    api.delete(name, &DeleteParams::default()).await?;
    wait_until("the hibernated pod gone", DEADLINE, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await?;
    let started = Instant::now();
    api.create(
        &PostParams::default(),
        &vm_pod(
            &ns,
            name,
            &nodes[1],
            &[(ann::RESTORE_FROM_HIBERNATE, "true")],
        ),
    )
    .await?;
    wait_until("woken on node b", DEADLINE, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(is_running_ready)
    })
    .await?;
    let wake = started.elapsed();
    let cpu = cocoon_testenv::bench::cpu_time() - cpu0;
    let pulled = transfer_message(&events, name, "SnapshotPulled").await?;

    for a in agents {
        a.kill().await;
    }
    cocoon_testenv::delete_namespace(&client, &ns).await?;
    drop(node_objs);
    Ok(Row {
        case,
        hibernate,
        wake,
        pushed,
        pulled,
        cpu,
    })
}

async fn bench() -> Result<(), BoxError> {
    let mib: u64 = std::env::var("HIBERNATE_BENCH_MIB")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .map_err(|e| format!("HIBERNATE_BENCH_MIB: {e}"))?
        .unwrap_or(2048);
    let env = TestEnv::start(Options::default()).await?;
    println!(
        "hibernate → :hibernate verified, and wake on another node → VM up, of a pod whose \
         simulated VM carries a {mib} MiB realistic memory image (loopback registry; {} CPUs)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut rows = Vec::new();
    for (i, (case, knobs)) in CASES.iter().enumerate() {
        let row = run_case(&env, case, *knobs, mib << 20, i).await?;
        println!(
            "{:<14} hibernate {:>7.2} s   wake {:>7.2} s   cpu {:>6.1} s   {} | {}",
            row.case,
            row.hibernate.as_secs_f64(),
            row.wake.as_secs_f64(),
            row.cpu.as_secs_f64(),
            row.pushed,
            row.pulled
        );
        rows.push(row);
    }
    let v1 = &rows[0];
    println!("\nratios against v1 (> 1: faster than v1)");
    for r in &rows[1..] {
        println!(
            "{:<14} hibernate {:>5.2}x   wake {:>5.2}x",
            r.case,
            v1.hibernate.as_secs_f64() / r.hibernate.as_secs_f64(),
            v1.wake.as_secs_f64() / r.wake.as_secs_f64()
        );
    }
    Ok(())
}
