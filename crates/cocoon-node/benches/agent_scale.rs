//! Node agent scale and per-operation overhead on the simulated runtime.
//!
//! Starts its own control plane and registry (`cocoon_testenv::TestEnv`), one in-process
//! agent on the simulator with every simulated latency set to zero, and a `TestNode`:
//!
//! 1. creates 200 pods bound to the node (mode `run`, any image pullable) and measures the
//!    time until all are Running/Ready with lifecycle `ready`, the process CPU time spent and
//!    the peak RSS (`VmHWM`). The process also holds the harness (kube clients, watches,
//!    the simulator), so those figures are an upper bound for the agent alone; the
//!    apiserver, etcd and registry are separate processes and are not included;
//! 2. hibernates and wakes 20 of them one at a time and measures, per operation, the time
//!    from the annotation patch to lifecycle `hibernated` / `ready` as seen through a watch.
//!    With zero simulated latencies that is the agent's own overhead including the registry
//!    transfer of a small (16 MiB sparse) disk.
//!
//! Run: `cargo bench -p cocoon-node --bench agent_scale`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{AgentOptions, BoxError, is_running_ready, sim_config, start_agent_with, vm_pod};

use cocoon_api::contract::annotations as ann;
use cocoon_api::contract::{AnnotationCodec, Lifecycle, LifecycleState};
use cocoon_node::pods::Timing;
use cocoon_runtime::sim::Latencies;
use cocoon_testenv::{Options, TestEnv, TestNode, create_namespace};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const PODS: usize = 200;
const CYCLED: usize = 20;
const CREATE_PARALLELISM: usize = 16;
const DEADLINE: Duration = Duration::from_secs(600);
const OP_DEADLINE: Duration = Duration::from_secs(120);

fn main() {
    cocoon_testenv::bench::bench_main(
        "agent_scale",
        &format!(
            "usage: cargo bench -p cocoon-node --bench agent_scale  \
             (starts a local control plane and registry; {PODS} pods, {CYCLED} hibernate/wake cycles)"
        ),
        bench,
    );
}

/// `VmHWM` / `VmRSS` of this process in MiB.
fn memory_mib(field: &str) -> f64 {
    cocoon_testenv::bench::proc_status_kib(field).map_or(f64::NAN, |kib| kib as f64 / 1024.0)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what:<10} n={:<3} p50 {:>8.1} ms  p95 {:>8.1} ms  min {:>8.1} ms  max {:>8.1} ms",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 95.0)),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
}

/// Patches the annotations and returns the time until `done` holds for the pod, observed
/// through a watch that starts at the patch's resourceVersion.
async fn timed_patch(
    api: &Api<Pod>,
    name: &str,
    annotations: serde_json::Value,
    done: impl Fn(&Pod) -> bool,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": annotations}})),
        )
        .await?;
    let rv = patched
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(OP_DEADLINE.as_secs() as u32);
    let mut stream = api.watch(&wp, &rv).await?.boxed();
    let wait = async {
        while let Some(ev) = stream.try_next().await? {
            match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) if done(&p) => {
                    return Ok(started.elapsed());
                }
                WatchEvent::Error(e) => return Err(format!("watch {name}: {e:?}").into()),
                _ => {}
            }
        }
        Err(format!("watch on {name} ended before the state was reached").into())
    };
    tokio::time::timeout(OP_DEADLINE, wait)
        .await
        .map_err(|_| format!("{name}: no result within {OP_DEADLINE:?}"))?
}

async fn bench() -> Result<(), BoxError> {
    let env_started = Instant::now();
    let env = TestEnv::start(Options::default()).await?;
    println!("test env up in {:.1}s", env_started.elapsed().as_secs_f64());
    let client = env.client()?;
    let ns = create_namespace(&client, "bench-scale").await?;
    let node = "bench-node".to_owned();
    let _node_obj = TestNode::in_pool(&client, &node, "default").await?;

    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_owned();
    let mut sim = sim_config(&root);
    sim.latencies = Latencies::default().scaled(0.0);
    sim.lease_delay = Duration::ZERO;
    let opts = AgentOptions {
        sim,
        timing: Timing::default(),
        ready_within: DEADLINE,
        ..AgentOptions::new(&root)
    };
    let agent = start_agent_with(
        client.clone(),
        env.registry_addr(),
        &node,
        &root,
        opts,
        |_| Ok(()),
    )
    .await?;

    // ---- 1. 200 pods to Running/Ready --------------------------------------------------
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let rv = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events = api.watch(&WatchParams::default(), &rv).await?.boxed();
    let names: Vec<String> = (0..PODS).map(|i| format!("p-{i:03}")).collect();
    let cpu0 = cocoon_testenv::bench::cpu_time();
    let started = Instant::now();
    let creating = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            let p = vm_pod(&ns, &name, &node, &[(ann::IMAGE, "bench-image:1")]);
            async move { api.create(&PostParams::default(), &p).await }
        })
        .buffer_unordered(CREATE_PARALLELISM)
        .try_collect::<Vec<_>>();
    let mut ready: BTreeSet<String> = BTreeSet::new();
    let mut created_in = Duration::ZERO;
    let all_ready = async {
        let mut creating = std::pin::pin!(creating);
        let mut create_done = false;
        loop {
            tokio::select! {
                res = &mut creating, if !create_done => {
                    res?;
                    create_done = true;
                    created_in = started.elapsed();
                }
                ev = events.try_next() => {
                    match ev? {
                        Some(WatchEvent::Added(p)) | Some(WatchEvent::Modified(p)) => {
                            if is_running_ready(&p) {
                                ready.insert(p.metadata.name.unwrap_or_default());
                            }
                        }
                        Some(WatchEvent::Error(e)) => {
                            return Err::<(), BoxError>(format!("pod watch: {e:?}").into());
                        }
                        Some(_) => {}
                        None => return Err("pod watch ended early".into()),
                    }
                    if create_done && ready.len() == PODS {
                        return Ok(());
                    }
                }
            }
        }
    };
    tokio::time::timeout(DEADLINE, all_ready)
        .await
        .map_err(|_| format!("not all pods ready within {DEADLINE:?}"))??;
    let elapsed = started.elapsed();
    let cpu = cocoon_testenv::bench::cpu_time() - cpu0;
    drop(events);
    println!(
        "{PODS} pods: all created in {:.2}s, all Running/Ready in {:.2}s ({:.1} pods/s)",
        created_in.as_secs_f64(),
        elapsed.as_secs_f64(),
        PODS as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  process CPU during the ramp {:.2}s ({:.0}% of one core); VmHWM {:.1} MiB, VmRSS {:.1} MiB \
         (agent + harness in one process; apiserver/etcd/registry excluded)",
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / elapsed.as_secs_f64(),
        memory_mib("VmHWM"),
        memory_mib("VmRSS")
    );

    // ---- 2. hibernate and wake, one pod at a time ---------------------------------------
    let mut hib = Vec::with_capacity(CYCLED);
    let mut wake = Vec::with_capacity(CYCLED);
    for name in names.iter().take(CYCLED) {
        hib.push(
            timed_patch(
                &api,
                name,
                json!({ann::HIBERNATE: "true", ann::GENERATION: "2"}),
                |p| {
                    let lc = Lifecycle::from_meta(&p.metadata);
                    lc.state == Some(LifecycleState::Hibernated) && lc.observed_generation >= 2
                },
            )
            .await?,
        );
        wake.push(
            timed_patch(
                &api,
                name,
                json!({ann::HIBERNATE: null, ann::GENERATION: "3"}),
                |p| {
                    let lc = Lifecycle::from_meta(&p.metadata);
                    lc.state == Some(LifecycleState::Ready) && lc.observed_generation >= 3
                },
            )
            .await?,
        );
    }
    println!(
        "agent overhead incl. registry transfer of a small disk (sim latencies 0, {PODS} pods running):"
    );
    report("hibernate", hib);
    report("wake", wake);
    println!(
        "  VmHWM at end {:.1} MiB; total process CPU {:.2}s",
        memory_mib("VmHWM"),
        cocoon_testenv::bench::cpu_time().as_secs_f64()
    );

    agent.kill().await;
    env.shutdown();
    Ok(())
}
