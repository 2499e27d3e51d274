//! The CocoonHibernation controller's reaction time: from the node side's final annotation
//! write (lifecycle `hibernated`; or VM id + lifecycle `ready` with the container already
//! running) to the CR reaching `Hibernated` / `Active`, over many hibernate/wake transitions.
//!
//! The node side is scripted (it writes exactly what the node agent writes, and pushes a
//! minimal snapshot artifact as `<vm>:hibernate`), so the measured interval is the controller's
//! own work: watch delivery, the pass (pod GET, registry probe), the status patch, and the
//! watch delivery of that status back to this process. The clock starts when the node-side
//! patch returns and stops when a CR watch (opened before the run) delivers the new phase.
//!
//! Runs against its own `cocoon_testenv::TestEnv` (control plane and registry).
//!
//! Run: `cargo bench -p cocoon-operator --bench hibernation_overhead`. Under `cargo test` it
//! only prints how to run it (cargo bench passes `--bench`; cargo test does not).

use std::time::{Duration, Instant};

use cocoon_api::contract::annotations as ann;
use cocoon_api::crd::hibernation::{
    CocoonHibernation, CocoonHibernationSpec, Desire, HibernationPhase, PodRef,
};
use cocoon_api::naming::vm_name_for_pod;
use cocoon_operator::hibernation::decide::Timing;
use cocoon_registry::{RegistryClient, RegistryConfig};
use cocoon_testenv::TestEnv;
use cocoon_testsupport::BoxError;
use cocoon_testsupport::scripted;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::mpsc;

type BenchResult<T = ()> = Result<T, BoxError>;

/// Transitions measured per direction.
const ROUNDS: usize = 50;
/// Budget for any single wait; a miss aborts the run (the controller is broken, not slow).
const WAIT: Duration = Duration::from_secs(60);
const POD: &str = "bench-0";
const CR: &str = "bench-0";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "hibernation_overhead: run with `cargo bench -p cocoon-operator --bench hibernation_overhead`"
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run()) {
        eprintln!("hibernation_overhead failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> BenchResult {
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env).await;
    let outcome = cocoon_testsupport::end_bench_env(env, outcome);
    let (hibernate, wake) = outcome?;
    println!();
    println!("CocoonHibernation controller overhead (node-side final write -> CR phase)");
    report("hibernate (lifecycle hibernated -> Hibernated)", &hibernate);
    report("wake      (VM id + running      -> Active)    ", &wake);
    Ok(())
}

fn registry_client(addr: &str) -> BenchResult<RegistryClient> {
    Ok(RegistryClient::new(RegistryConfig::for_registry(addr)?)?)
}

async fn measure(env: &TestEnv) -> BenchResult<(Vec<Duration>, Vec<Duration>)> {
    let client = env.client()?;
    let ns = cocoon_testenv::create_namespace(&client, "ch-bench").await?;
    let reg = registry_client(env.registry_addr())?;
    let stop = scripted::controller(&client, &ns, registry_client(env.registry_addr())?)
        .hibernation(Timing::default());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    let vm = create_running_pod(&pods, &ns).await?;
    let mut phases = watch_phases(crs.clone());

    let mut hibernate = Vec::with_capacity(ROUNDS);
    let mut wake = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        // Hibernate: the controller annotates the pod and enters Hibernating; the node then
        // pushes the snapshot, reports the container waiting, and finally `hibernated`.
        if round == 0 {
            let cr = CocoonHibernation::new(
                CR,
                CocoonHibernationSpec {
                    pod_ref: PodRef { name: POD.into() },
                    desire: Desire::Hibernate,
                },
            );
            crs.create(&PostParams::default(), &cr).await?;
        } else {
            set_desire(&crs, Desire::Hibernate).await?;
        }
        phases.wait_for(HibernationPhase::Hibernating).await?;
        push_snapshot_tag(&reg, &vm).await?;
        set_container(&pods, false).await?;
        patch_annotations(
            &pods,
            json!({
                ann::VM_ID: null,
                ann::LIFECYCLE_STATE: "hibernated",
                ann::LIFECYCLE_OBSERVED_GENERATION: "1",
                ann::LIFECYCLE_STATE_MESSAGE: null,
            }),
        )
        .await?;
        let t0 = Instant::now();
        let t1 = phases.wait_for(HibernationPhase::Hibernated).await?;
        hibernate.push(t1.saturating_duration_since(t0));

        // Wake: the controller clears the annotation and enters Waking; the node then reports
        // the container running and finally writes the fresh VM id with `ready`.
        set_desire(&crs, Desire::Wake).await?;
        phases.wait_for(HibernationPhase::Waking).await?;
        set_container(&pods, true).await?;
        patch_annotations(
            &pods,
            json!({
                ann::VM_ID: format!("vm-{round}"),
                ann::LIFECYCLE_STATE: "ready",
                ann::LIFECYCLE_OBSERVED_GENERATION: "1",
            }),
        )
        .await?;
        let t0 = Instant::now();
        let t1 = phases.wait_for(HibernationPhase::Active).await?;
        wake.push(t1.saturating_duration_since(t0));

        // Outside the measured interval: the controller drops the tag after Active; the next
        // round must not push its tag before that delete.
        cocoon_testenv::wait_until(&format!("{vm}:hibernate dropped"), WAIT, || async {
            (!reg.has_manifest(&vm, "hibernate").await.ok()?).then_some(())
        })
        .await?;
        if (round + 1) % 10 == 0 {
            println!("  {} / {ROUNDS} round trips", round + 1);
        }
    }

    drop(stop);
    cocoon_testenv::delete_namespace(&client, &ns).await?;
    Ok((hibernate, wake))
}

/// The real controller scoped to `ns`, with the production timing; stops when the sender drops.
/// A VM pod as the node agent leaves it after bring-up: VM id, `ready`, container running.
/// It names a scheduler that does not exist, so nothing but this bench writes its status.
async fn create_running_pod(pods: &Api<Pod>, ns: &str) -> BenchResult<String> {
    let vm = vm_name_for_pod(ns, POD);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": POD, "annotations": {
            ann::VM_NAME: vm,
            ann::GENERATION: "1",
            ann::VM_ID: "vm-initial",
            ann::LIFECYCLE_STATE: "ready",
            ann::LIFECYCLE_OBSERVED_GENERATION: "1",
        }},
        "spec": {"containers": [{"name": "agent", "image": "cocoon/placeholder"}],
                 "schedulerName": "cocoon-bench-unscheduled",
                 "restartPolicy": "Never"}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    set_container(pods, true).await?;
    Ok(vm)
}

/// The container status the node agent reports: running, or waiting (`Hibernated`).
async fn set_container(pods: &Api<Pod>, running: bool) -> BenchResult {
    let state = if running {
        json!({"running": {"startedAt": "2026-11-29T10:00:00Z"}})
    } else {
        json!({"waiting": {"reason": "Hibernated"}})
    };
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "agent", "ready": running, "restartCount": 0, "image": "cocoon/placeholder",
        "imageID": "", "state": state
    }]}});
    pods.patch_status(POD, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn patch_annotations(pods: &Api<Pod>, annotations: serde_json::Value) -> BenchResult {
    let patch = json!({"metadata": {"annotations": annotations}});
    pods.patch(POD, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn set_desire(crs: &Api<CocoonHibernation>, desire: Desire) -> BenchResult {
    let patch = json!({"spec": {"desire": desire.as_str()}});
    crs.patch(CR, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A minimal v1 snapshot artifact (config blob with a fresh snapshot id, no layers).
async fn push_snapshot_tag(reg: &RegistryClient, vm: &str) -> BenchResult {
    let created = [("org.opencontainers.image.created", "2026-11-29T10:00:00Z")];
    scripted::push_snapshot_tag(reg, vm, "hibernate", "cocoon/placeholder", &created).await
}

/// Phase changes of the CR as a watch delivers them, each stamped on arrival.
struct Phases {
    rx: mpsc::UnboundedReceiver<(HibernationPhase, Instant)>,
    _task: tokio::task::JoinHandle<()>,
}

fn watch_phases(crs: Api<CocoonHibernation>) -> Phases {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={CR}"));
        let mut stream = std::pin::pin!(watcher(crs, cfg).default_backoff().applied_objects());
        let mut last = None;
        while let Some(ev) = stream.next().await {
            let Ok(cr) = ev else { continue };
            let at = Instant::now();
            let phase = cr.status.as_ref().and_then(|s| s.phase);
            if phase != last {
                last = phase;
                if let Some(p) = phase
                    && tx.send((p, at)).is_err()
                {
                    return;
                }
            }
        }
    });
    Phases { rx, _task: task }
}

impl Phases {
    /// Consumes phase changes until `want` arrives; returns when it arrived.
    async fn wait_for(&mut self, want: HibernationPhase) -> BenchResult<Instant> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some((p, at))) if p == want => return Ok(at),
                Ok(Some((HibernationPhase::Failed, _))) => {
                    return Err(format!("CR went Failed while waiting for {want}").into());
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err("the CR watch ended".into()),
                Err(_) => return Err(format!("no {want} within {WAIT:?}").into()),
            }
        }
    }
}

fn report(label: &str, samples: &[Duration]) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        println!("  {label}: no samples");
        return;
    }
    // Nearest-rank percentiles.
    let pct = |p: f64| {
        let rank = ((p / 100.0) * ms.len() as f64).ceil() as usize;
        ms[rank.clamp(1, ms.len()) - 1]
    };
    println!(
        "  {label}: n={:<3} p50={:>7.1} ms  p95={:>7.1} ms  max={:>7.1} ms  (min {:.1} ms)",
        ms.len(),
        pct(50.0),
        pct(95.0),
        ms[ms.len() - 1],
        ms[0],
    );
}
