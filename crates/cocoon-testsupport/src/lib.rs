//! Test scaffolding shared by the tests and benches of the workspace: the operator's
//! controllers and (feature `agents`, for the end-to-end crate) real node agents on the simulated
//! runtime, started in-process against the real control plane and registry of `cocoon-testenv`,
//! and stopped or killed (aborted mid-flight, as a crashed process would be) on demand.
//!
//! Nothing here stands in for a real part: these are the production controllers and agents,
//! wired the way the binaries wire them, with shorter timings where a test asks for them.

mod activator;
#[cfg(feature = "agents")]
mod agents;
mod audited;
pub mod binaries;
pub mod registry_token;
pub mod scripted;

pub use activator::{ActivatorOptions, ActivatorReplica};
#[cfg(feature = "agents")]
pub use agents::{Agent, AgentOptions, KubeletOptions, PoolMember, all_vms, guest_of, host_of};
pub use audited::AuditedIdentity;

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::set::CocoonSet;
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
use cocoon_operator::{admin::Readiness, cocoonset, hibernation};
use cocoon_registry::{RegistryClient, RegistryConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The error type of the helpers (test code unwraps or `?`s it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A registry client for the test registry at `addr` (plain HTTP on loopback).
pub fn registry(addr: &str) -> RegistryClient {
    RegistryClient::new(RegistryConfig::for_registry(addr).expect("registry config"))
        .expect("registry client")
}

/// How the in-process operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// CocoonSet controller timings.
    pub sets: cocoonset::Timing,
    /// CocoonHibernation controller timings.
    pub hibernation: hibernation::decide::Timing,
    /// Concurrent reconciles per controller.
    pub concurrency: u16,
}

impl Default for OperatorOptions {
    /// Production timings, concurrency 4.
    fn default() -> Self {
        OperatorOptions {
            sets: cocoonset::Timing::default(),
            hibernation: hibernation::decide::Timing::default(),
            concurrency: 4,
        }
    }
}

impl OperatorOptions {
    /// Production rules with the short requeues tests want (a write is re-read after 300 ms, a
    /// pending main re-checked every second).
    pub fn fast() -> Self {
        OperatorOptions {
            sets: cocoonset::Timing {
                requeue_after_write: Duration::from_millis(300),
                wait_for_main: Duration::from_secs(1),
                ..cocoonset::Timing::default()
            },
            ..OperatorOptions::default()
        }
    }
}

/// The controllers of `cocoon-operator run` (CocoonSet, CocoonHibernation, CocoonCheckpoint),
/// scoped to one namespace.
pub struct Operator {
    /// The metrics both controllers write.
    pub metrics: Arc<Metrics>,
    /// The CocoonSet controller's context.
    pub sets: Arc<cocoonset::Context>,
    /// The CocoonSet controller's pass and write counters.
    pub stats: Arc<cocoonset::Stats>,
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Operator {
    /// Starts both controllers watching `ns`, with their tag registry at `registry_addr`.
    pub fn start(client: &Client, ns: &str, registry_addr: &str, opts: OperatorOptions) -> Self {
        let tags: Arc<dyn TagRegistry> = Arc::new(OciTagRegistry::new(registry(registry_addr)));
        Self::start_with_tags(client, ns, tags, opts)
    }

    /// As [`Operator::start`], with the CocoonSet controller's tag registry given (a wrapper
    /// that counts calls, say) and the CocoonHibernation controller on the same one.
    pub fn start_with_tags(
        client: &Client,
        ns: &str,
        tags: Arc<dyn TagRegistry>,
        opts: OperatorOptions,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "cocoon-operator".into(),
                instance: None,
            },
        );
        let metrics = Arc::new(Metrics::new());
        let stats = Arc::new(cocoonset::Stats::default());
        let sets = Arc::new(
            cocoonset::Context::new(
                client.clone(),
                recorder.clone(),
                metrics.clone(),
                tags.clone(),
                opts.sets,
            )
            .with_stats(stats.clone()),
        );
        let chs = Arc::new(hibernation::Context::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            tags.clone(),
            opts.hibernation,
        ));
        let checkpoints = Arc::new(cocoon_operator::checkpoint::Context::new(
            client.clone(),
            recorder,
            metrics.clone(),
            tags,
        ));
        let token = CancellationToken::new();
        let readiness = Arc::new(Readiness::default());
        let mut tasks = Vec::new();
        {
            let (ns, stop, ready) = (ns.to_owned(), token.clone(), readiness.clone());
            let sets = sets.clone();
            tasks.push(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                cocoonset::run(sets, Some(&ns), opts.concurrency, until, ready).await
            }));
        }
        {
            let (ns, stop) = (ns.to_owned(), token.clone());
            tasks.push(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                hibernation::run(chs, Some(&ns), opts.concurrency, until, readiness).await
            }));
        }
        {
            let (ns, stop) = (ns.to_owned(), token.clone());
            tasks.push(tokio::spawn(async move {
                let until = async move { stop.cancelled().await };
                let ready = Arc::new(Readiness::default());
                cocoon_operator::checkpoint::run(
                    checkpoints,
                    Some(&ns),
                    opts.concurrency,
                    until,
                    ready,
                )
                .await
            }));
        }
        Operator {
            metrics,
            sets,
            stats,
            token,
            tasks,
        }
    }

    /// Kills both controllers where they stand (their futures are dropped mid-flight, as a
    /// crashed process's would be), and waits until they are gone.
    pub async fn kill(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }

    /// Stops the controllers gracefully and waits for them, as a terminating pod gets
    /// [`STOP_GRACE`]: a controller still running after it is killed where it stands (as the
    /// kubelet kills a container that outlives its grace period), with a line on stderr naming
    /// it, so a stuck reconcile shows in the test's output instead of hanging the run.
    pub async fn stop(mut self) {
        self.token.cancel();
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        for (i, mut t) in self.tasks.drain(..).enumerate() {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                eprintln!(
                    "cocoon-testsupport: controller task {i} (0 sets, 1 hibernations, 2 checkpoints) \
                     still running {STOP_GRACE:?} after the graceful stop; killed"
                );
                t.abort();
                let _ = t.await;
            }
        }
    }
}

/// How long [`Operator::stop`] waits for the controllers' graceful stop.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

impl Drop for Operator {
    fn drop(&mut self) {
        self.token.cancel();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Pushes a minimal snapshot artifact (config blob only, no layers) as `<vm>:<tag>`, recorded
/// against the image `ubuntu:24.10`.
pub async fn push_tag(reg: &RegistryClient, vm: &str, tag: &str) -> Result<(), BoxError> {
    scripted::push_snapshot_tag(reg, vm, tag, "ubuntu:24.10", &[]).await
}

/// Waits (up to `within`) until the CocoonSet `name` exists and satisfies `check`.
pub async fn wait_set(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name}: {what}"), within, || async {
        let cs = sets.get_opt(name).await.ok().flatten()?;
        check(&cs).then_some(cs)
    })
    .await
}

/// The node a pod is bound to ("" when unscheduled).
pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// A managed VM pod bound to `node` as the CocoonSet controller would create it (mode `run`,
/// image `ubuntu-test:1`, generation 1), with `extra` annotations added or overriding.
pub fn vm_pod(ns: &str, name: &str, node: &str, extra: &[(&str, &str)]) -> Pod {
    use cocoon_api::contract::annotations as ann;
    let mut annotations: std::collections::BTreeMap<String, String> = [
        (ann::VM_NAME, cocoon_api::naming::vm_name_for_pod(ns, name)),
        (ann::IMAGE, "ubuntu-test:1".to_owned()),
        (ann::MODE, "run".to_owned()),
        (ann::MANAGED, "true".to_owned()),
        (ann::GENERATION, "1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        annotations.insert((*k).to_owned(), (*v).to_owned());
    }
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(node.into()),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "agent".into(),
                image: Some("cocoon/vm".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Watches `api` (re-listing after an error, as the default backoff does) and hands every
/// object listed or applied to `on`, for as long as the runtime runs; the receiver fires once
/// the initial list is done, so a caller that awaits it has seen everything already there.
pub fn watch_applied<K>(
    api: Api<K>,
    mut on: impl FnMut(&K) + Send + 'static,
) -> tokio::sync::oneshot::Receiver<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let (listed, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut s = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut ready = Some(listed);
        while let Some(ev) = s.next().await {
            match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => on(&o),
                Ok(watcher::Event::InitDone) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                _ => {}
            }
        }
    });
    rx
}

/// Watches the pods and the CocoonSets of `ns` ([`watch_applied`]), handing them to `on_pod`
/// and `on_set`; returns once both have listed (a minute at the most).
pub async fn watch_pods_and_sets(
    client: &Client,
    ns: &str,
    on_pod: impl FnMut(&Pod) + Send + 'static,
    on_set: impl FnMut(&CocoonSet) + Send + 'static,
) -> Result<(), BoxError> {
    let pods = watch_applied(Api::<Pod>::namespaced(client.clone(), ns), on_pod);
    let sets = watch_applied(Api::<CocoonSet>::namespaced(client.clone(), ns), on_set);
    tokio::time::timeout(Duration::from_secs(60), pods).await??;
    tokio::time::timeout(Duration::from_secs(60), sets).await??;
    Ok(())
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 when it cannot say), the unit
/// of the CPU times in `/proc/<pid>/stat` that the benches read.
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The operator container's `COCOONSET_CONCURRENCY` in the shipped Deployment
/// (`manifests/operator/deployment.yaml`), or the binary's own default, 4, when it sets none:
/// the concurrency the benches run the CocoonSet controller at.
pub fn shipped_cocoonset_concurrency() -> Result<u16, BoxError> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests/operator/deployment.yaml");
    let shown = path.display();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {shown}: {e}"))?;
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_saphyr::from_str(&text).map_err(|e| format!("parse {shown}: {e}"))?;
    let value = deployment
        .spec
        .and_then(|s| s.template.spec)
        .into_iter()
        .flat_map(|s| s.containers)
        .flat_map(|c| c.env.unwrap_or_default())
        .find(|e| e.name == "COCOONSET_CONCURRENCY")
        .and_then(|e| e.value);
    match value {
        None => Ok(4),
        Some(v) => Ok(v
            .parse::<u16>()
            .map_err(|e| format!("{shown}: COCOONSET_CONCURRENCY {v:?}: {e}"))?),
    }
}

/// Starts a test environment of its own for a bench and says how long it took.
pub async fn bench_env() -> Result<cocoon_testenv::TestEnv, BoxError> {
    let started = std::time::Instant::now();
    let env = cocoon_testenv::TestEnv::start(cocoon_testenv::Options::default()).await?;
    println!(
        "test environment up in {:.1} s (registry {})",
        started.elapsed().as_secs_f64(),
        env.registry_addr()
    );
    Ok(env)
}

/// Ends a bench's environment: the components' log tails when the bench failed, then shutdown.
pub fn end_bench_env<T, E>(env: cocoon_testenv::TestEnv, outcome: Result<T, E>) -> Result<T, E> {
    if outcome.is_err() {
        eprintln!("---- component logs ----\n{}", env.log_tails(30));
    }
    env.shutdown();
    outcome
}
