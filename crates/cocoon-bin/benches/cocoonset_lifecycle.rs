//! Create, suspend and resume of CocoonSets as a user feels them, with the operator as its
//! own process: the real `cocoon-operator run` binary (this package's, built with the bench
//! profile) under a ServiceAccount token of `cocoon-system`, whose requests the test
//! environment's API server audits. Three real node agents run in this process on the
//! simulated runtime with every latency zero; the control plane, the scheduler and the
//! registry are the test environment's own processes.
//!
//! Scenarios, each measured from watch events stamped on arrival in this process and from the
//! audit log's timestamps (never from sleeps):
//!
//! 1. **create**, `COCOON_BENCH_ROUNDS` rounds (default 10): one set of main + 2 sub-agents + 1
//!    toolbox from the POST to `phase=Running` with every agent and toolbox ready, with a
//!    breakdown per round: finalizer on the set, main pod created, main Ready (node agent
//!    bring-up), sub-agents created and Ready, toolbox created and Ready, Running seen;
//! 2. **suspend / resume** of one such set, the same number of rounds: spec edit → `Suspended`,
//!    spec edit → `Running` with every agent ready;
//! 3. **delete** of the create rounds' sets, one a round: the DELETE → the set and every pod
//!    it had gone (their deletion watch events);
//! 4. **many**: `COCOON_BENCH_SETS` sets (default 50, `agent.replicas: 0`) created at once →
//!    all Running;
//! 5. **many deleted**: those sets deleted at once → every set and pod gone.
//!
//! For each: the operator's writes, counted from the audit log (completed create/update/patch/
//! delete requests of the operator's account with User-Agent `cocoon-operator/…`, between the
//! edit and the moment its writes went quiet), and the operator process's CPU time (utime +
//! stime from `/proc/<pid>/stat`) over the same window; for the many-set create also its RSS.
//! The delete scenarios also print the writes by verb and resource and the failed ones (status
//! >= 400) by verb, resource and code.
//!
//! `COCOON_BENCH_SCALE=<n>` runs a scale scenario instead: n sets of main + 1 sub-agent + 1
//! toolbox (3n pods over three agents, here each a `cocoon-operator node` process of its own
//! in a pool of its own, every third set in each) → all Running (time, operator writes, CPU,
//! the RSS of the operator and of each agent); a settled minute (operator writes from the audit
//! log, registry requests from the registry's access log); then the operator killed and started
//! again: the time until its passes over every set went quiet, with the writes they made (goal
//! 0).
//!
//! Run: `cargo bench -p cocoon-bin --bench cocoonset_lifecycle`. The operator runs at the
//! `COCOONSET_CONCURRENCY` of the shipped Deployment unless the environment sets it. Under
//! `cargo test` it only prints how to run it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_api::contract::{annotations as ann, finalizers};
use cocoon_api::crd::set::{AgentMode, CocoonSet, CocoonSetPhase, CocoonSetSpec, ToolboxSpec};
use cocoon_runtime::sim::{Latencies, SimConfig};
use cocoon_testenv::{AuditLog, AuditRecord, TestEnv, TestNode};
use cocoon_testsupport::{Agent, AgentOptions, BoxError, watch_pods_and_sets};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type BenchResult<T = ()> = Result<T, BoxError>;

const NODES: usize = 3;
const DEFAULT_ROUNDS: usize = 10;
const DEFAULT_SETS: usize = 50;
/// Budget for one transition (or one scenario's creates); a miss aborts the run.
const WAIT: Duration = Duration::from_secs(600);
/// The operator's writes for a transition are over once none came for this long.
const QUIET: Duration = Duration::from_millis(1500);
const SA_NAMESPACE: &str = "cocoon-system";
/// POSTs of a many-set scenario in flight at once.
const CREATES_AT_ONCE: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "cocoonset_lifecycle: run with `cargo bench -p cocoon-bin --bench \
             cocoonset_lifecycle` (COCOON_BENCH_ROUNDS=<n>, default {DEFAULT_ROUNDS}; \
             COCOON_BENCH_SETS=<n>, default {DEFAULT_SETS})"
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
    let rounds = count("COCOON_BENCH_ROUNDS", DEFAULT_ROUNDS);
    let sets = count("COCOON_BENCH_SETS", DEFAULT_SETS);
    let scale = std::env::var_os("COCOON_BENCH_SCALE").map(|_| count("COCOON_BENCH_SCALE", 1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(rounds, sets, scale)) {
        eprintln!("cocoonset_lifecycle failed: {e}");
        std::process::exit(1);
    }
}

async fn run(rounds: usize, sets: usize, scale: Option<usize>) -> BenchResult {
    let env = cocoon_testsupport::bench_env().await?;
    let outcome = measure(&env, rounds, sets, scale).await;
    cocoon_testsupport::end_bench_env(env, outcome)
}

// ---------------------------------------------------------------------------------------------
// The operator process and its account
// ---------------------------------------------------------------------------------------------

/// `cocoon-operator run` under a cluster-admin ServiceAccount of `cocoon-system`.
struct OperatorProcess {
    child: Child,
    /// The audited user name of its account.
    user: String,
    /// A client with the same account: its reads mark how far the audit log has come.
    client: Client,
    /// Its `/metrics` listener.
    metrics_port: u16,
    /// When it was spawned.
    started: Timestamp,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    async fn start(env: &TestEnv, admin: &Client, ns: &str) -> BenchResult<OperatorProcess> {
        let name = cocoon_testenv::unique_name("bench-operator");
        cocoon_testenv::ensure_namespace(admin, SA_NAMESPACE).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), SA_NAMESPACE);
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some(name.clone());
        sas.create(&PostParams::default(), &sa).await?;
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "cluster-admin".into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some(SA_NAMESPACE.into()),
                ..Default::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await?;
        let token = sas
            .create_token_request(
                &name,
                &PostParams::default(),
                &TokenRequest {
                    spec: TokenRequestSpec {
                        expiration_seconds: Some(3 * 3600),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await?
            .status
            .map(|s| s.token)
            .ok_or("the token request returned no token")?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = token_kubeconfig(&env.kubeconfig_path(), &token, dir.path())?;
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        // A port that was free a moment ago, so `/metrics` can be read.
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cocoon-operator"));
        cmd.arg("run")
            .env("KUBECONFIG", &kubeconfig)
            .env("OCI_REGISTRY", env.registry_addr())
            .env("POD_NAMESPACE", ns)
            .env("WATCH_NAMESPACE", ns)
            .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env("METRICS_SECURE", "false")
            .env("PROBE_ADDR", "127.0.0.1:0")
            .env("LEADER_ELECT", "false")
            .env("COCOONSET_CONCURRENCY", concurrency()?.to_string())
            .stdin(Stdio::null());
        // COCOON_BENCH_OPERATOR_LOG=<file>: the operator's debug log (every write it sends)
        // goes there, to tell what a write was for; the default is warnings only.
        let (level, log) = match std::env::var_os("COCOON_BENCH_OPERATOR_LOG") {
            Some(path) => ("warn,cocoon_operator=debug", path.into()),
            None => ("warn", dir.path().join("operator.log")),
        };
        let log = std::fs::File::create(log)?;
        cmd.env("OPERATOR_LOG_LEVEL", level)
            .stdout(log.try_clone()?)
            .stderr(log);
        let started = Timestamp::now();
        let child = cmd.spawn()?;
        Ok(OperatorProcess {
            child,
            metrics_port,
            started,
            user: format!("system:serviceaccount:{SA_NAMESPACE}:{name}"),
            client: Client::try_from(config)?,
            _dir: dir,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CocoonSet passes so far (`cocoon_operator_reconcile_duration_seconds_count`), from
    /// its `/metrics`; `None` while it does not answer.
    async fn passes(&self) -> Option<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .ok()?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        conn.read_to_string(&mut body).await.ok()?;
        body.lines()
            .find(|l| {
                l.starts_with("cocoon_operator_reconcile_duration_seconds_count")
                    && l.contains("controller=\"cocoonset\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.trim().parse().ok())
            .or(Some(0))
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self._dir.path().join("operator.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The operator's writes in `ns` the audit log holds, once it holds a read this account
    /// made now (the log is appended as requests complete: every earlier write is in it).
    async fn writes(&self, audit: &AuditLog, ns: &str) -> BenchResult<Vec<AuditRecord>> {
        let marker = cocoon_testenv::unique_name("audit-marker");
        let probe: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let _ = probe.get_opt(&marker).await?;
        let records = cocoon_testenv::wait_until("the marker read in the audit log", WAIT, || {
            let records = audit.records_of(&self.user);
            let marker = marker.clone();
            async move {
                let records = records.ok()?;
                records.iter().any(|r| r.name == marker).then_some(records)
            }
        })
        .await?;
        Ok(records
            .into_iter()
            .filter(|r| {
                r.is_write() && r.namespace == ns && r.user_agent.starts_with("cocoon-operator/")
            })
            .collect())
    }

    /// Waits until the operator's last write in `ns` is `QUIET` old; returns every write so far.
    async fn quiet(&self, audit: &AuditLog, ns: &str) -> BenchResult<Vec<AuditRecord>> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let writes = self.writes(audit, ns).await?;
            let last = writes.iter().filter_map(|w| w.completed).max();
            let idle = last.map_or(QUIET, |t| unsigned(Timestamp::now().duration_since(t)));
            if idle >= QUIET {
                return Ok(writes);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err("the operator's writes never went quiet".into());
            }
            // Polling the audit log until the quiet period has passed.
            tokio::time::sleep(QUIET - idle).await;
        }
    }
}

impl OperatorProcess {
    /// Kills the process and reaps it.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `cocoon-operator node` on the simulated runtime at zero latency, as its own process (the
/// scale scenario: its RSS is then the agent's alone). It registers its own Node in the pool.
struct AgentProcess {
    child: Child,
    node: String,
    log: PathBuf,
}

impl AgentProcess {
    fn start(
        env: &TestEnv,
        node: &str,
        pool: &str,
        root: &Path,
        pods: usize,
    ) -> BenchResult<AgentProcess> {
        let log = root.join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_cocoon-operator"))
            .arg("node")
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("OCI_REGISTRY", env.registry_addr())
            .env("VK_NODE_NAME", node)
            .env("VK_NODE_POOL", pool)
            .env("VK_NODE_IP", "127.0.0.1")
            .env("VK_NODE_PODS", pods.to_string())
            .env("VK_KUBELET_PORT", "0")
            .env("VK_METRICS_ADDR", "127.0.0.1:0")
            .env("VK_CLIENT_CA_FILE", env.pki_dir().join("ca.crt"))
            .env("VK_RUNTIME", "sim")
            .env("VK_SIM_ROOT", root)
            .env("VK_SIM_LATENCY_SCALE", "0")
            .env("VK_SIM_IMAGES", "ubuntu:24.04")
            .env("COCOON_ROOT_DIR", root)
            .env("VK_LEASES_PATH", root.join("leases.json"))
            .env("VK_LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(AgentProcess {
            child,
            node: node.to_owned(),
            log,
        })
    }

    /// Until its Node is Ready without a taint that keeps pods off.
    async fn wait_schedulable(&self, admin: &Client) -> BenchResult {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
        cocoon_testenv::wait_until(
            &format!("node {} schedulable", self.node),
            Duration::from_secs(60),
            || async {
                let node = nodes.get_opt(&self.node).await.ok()??;
                (cocoon_testenv::node::is_ready(&node)
                    && cocoon_testenv::node::blocking_taints(&node).is_empty())
                .then_some(())
            },
        )
        .await?;
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy of the admin kubeconfig whose user authenticates with `token` instead.
fn token_kubeconfig(admin: &Path, token: &str, dir: &Path) -> BenchResult<PathBuf> {
    let mut kc = kube::config::Kubeconfig::read_from(admin)?;
    let token_file = dir.join("token");
    std::fs::write(&token_file, token)?;
    for named in &mut kc.auth_infos {
        named.auth_info = Some(kube::config::AuthInfo {
            token_file: Some(token_file.to_string_lossy().into_owned()),
            ..Default::default()
        });
    }
    let path = dir.join("operator.kubeconfig");
    std::fs::write(&path, serde_json::to_vec(&kc)?)?;
    Ok(path)
}

/// `COCOONSET_CONCURRENCY` from the environment, else the shipped Deployment's value.
fn concurrency() -> BenchResult<u16> {
    if let Some(n) = std::env::var("COCOONSET_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse::<u16>().ok())
        .filter(|n| *n > 0)
    {
        return Ok(n);
    }
    cocoon_testsupport::shipped_cocoonset_concurrency()
}

/// utime + stime of process `pid`.
fn cpu_of(pid: u32) -> Duration {
    let ticks_per_s = cocoon_testsupport::clock_ticks_per_second();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime and stime are fields 14 and 15.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_micros((tick(11) + tick(12)) * 1_000_000 / ticks_per_s)
}

/// VmRSS and VmHWM of process `pid`, in MiB.
fn rss_of(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn unsigned(d: SignedDuration) -> Duration {
    d.try_into().unwrap_or(Duration::ZERO)
}

// ---------------------------------------------------------------------------------------------
// The timeline: every watch event of the namespace's sets and pods, stamped on arrival.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct PodSeen {
    at: Timestamp,
    ready: bool,
    /// `vm.cocoonstack.io/hibernate` is "true".
    hibernate: bool,
    /// `vm.cocoonstack.io/lifecycle-state` (empty when absent).
    lifecycle: String,
    /// `vm.cocoonstack.io/id` is set (the agent brought a VM up and wrote its runtime).
    vm_id: bool,
    /// `spec.nodeName` is set (the scheduler bound it).
    bound: bool,
}

#[derive(Debug, Clone)]
struct SetSeen {
    at: Timestamp,
    finalizer: bool,
    phase: Option<CocoonSetPhase>,
    observed: i64,
    generation: i64,
    all_ready: bool,
}

#[derive(Default)]
struct Timeline {
    pods: BTreeMap<String, Vec<PodSeen>>,
    sets: BTreeMap<String, Vec<SetSeen>>,
    /// When each pod's last deletion event arrived (it left the API server).
    pods_gone: BTreeMap<String, Timestamp>,
    /// When each set's deletion event arrived.
    sets_gone: BTreeMap<String, Timestamp>,
}

type Shared = Arc<Mutex<Timeline>>;

fn record_pod(t: &Shared, p: &Pod) {
    let a = p.annotations();
    let seen = PodSeen {
        at: Timestamp::now(),
        hibernate: a.get(ann::HIBERNATE).is_some_and(|v| v == ann::TRUE),
        lifecycle: a.get(ann::LIFECYCLE_STATE).cloned().unwrap_or_default(),
        vm_id: a.get(ann::VM_ID).is_some_and(|v| !v.is_empty()),
        bound: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
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
        at: Timestamp::now(),
        finalizer: cs.finalizers().iter().any(|f| f == finalizers::COCOONSET),
        phase: st.phase,
        observed: st.observed_generation,
        generation: cs.metadata.generation.unwrap_or(0),
        all_ready: st.desired_agents > 0
            && st.ready_agents == st.desired_agents
            && st.ready_toolboxes == st.desired_toolboxes,
    };
    if let Ok(mut t) = t.lock() {
        t.sets.entry(cs.name_any()).or_default().push(seen);
    }
}

/// Watches the namespace's pods and sets into the timeline, their deletions included; returns
/// once every watch has listed.
async fn start_timeline(client: &Client, ns: &str) -> BenchResult<Shared> {
    let t: Shared = Arc::default();
    let (tp, ts) = (t.clone(), t.clone());
    let on_pod = move |p: &Pod| record_pod(&tp, p);
    let on_set = move |cs: &CocoonSet| record_set(&ts, cs);
    watch_pods_and_sets(client, ns, on_pod, on_set).await?;
    let pods = watch_deletes(Api::<Pod>::namespaced(client.clone(), ns), t.clone(), |t| {
        &mut t.pods_gone
    });
    let sets = watch_deletes(
        Api::<CocoonSet>::namespaced(client.clone(), ns),
        t.clone(),
        |t| &mut t.sets_gone,
    );
    tokio::time::timeout(Duration::from_secs(60), pods).await??;
    tokio::time::timeout(Duration::from_secs(60), sets).await??;
    Ok(t)
}

/// Watches `api` for deletions (re-listing after an error) and stamps each into the map of the
/// timeline `gone` picks; the receiver fires once the initial list is done.
fn watch_deletes<K>(
    api: Api<K>,
    t: Shared,
    gone: fn(&mut Timeline) -> &mut BTreeMap<String, Timestamp>,
) -> tokio::sync::oneshot::Receiver<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::{WatchStreamExt, watcher};
    let (listed, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut ready = Some(listed);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Delete(o)) => {
                    let at = Timestamp::now();
                    if let Ok(mut t) = t.lock() {
                        gone(&mut t).insert(o.name_any(), at);
                    }
                }
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

impl Timeline {
    fn first_pod(&self, pod: &str, since: Timestamp, ready: bool) -> Option<Timestamp> {
        self.pod_when(pod, since, |p| !ready || p.ready)
    }

    /// The first event of `pod` at or after `since` that satisfies `f`.
    fn pod_when(
        &self,
        pod: &str,
        since: Timestamp,
        f: impl Fn(&PodSeen) -> bool,
    ) -> Option<Timestamp> {
        self.pods
            .get(pod)?
            .iter()
            .find(|p| p.at >= since && f(p))
            .map(|p| p.at)
    }

    fn first_set(
        &self,
        set: &str,
        since: Timestamp,
        f: impl Fn(&SetSeen) -> bool,
    ) -> Option<Timestamp> {
        self.sets
            .get(set)?
            .iter()
            .find(|s| s.at >= since && f(s))
            .map(|s| s.at)
    }

    /// The pods of set `set` (named `<set>-…`) seen since they last left, if they did.
    fn live_pods(&self, set: &str) -> Vec<String> {
        let prefix = format!("{set}-");
        self.pods
            .iter()
            .filter(|(name, seen)| {
                name.starts_with(&prefix)
                    && seen.last().is_some_and(|last| {
                        self.pods_gone.get(*name).is_none_or(|gone| last.at > *gone)
                    })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// When set `set` and every pod of `pods` had left, at or after `since`: the last of
    /// their deletion events.
    fn all_gone(&self, set: &str, pods: &[String], since: Timestamp) -> Option<Timestamp> {
        let gone = |map: &BTreeMap<String, Timestamp>, name: &str| {
            map.get(name).copied().filter(|at| *at >= since)
        };
        let mut last = gone(&self.sets_gone, set)?;
        for pod in pods {
            last = last.max(gone(&self.pods_gone, pod)?);
        }
        Some(last)
    }
}

/// The set shows `phase` at its current generation (and, for Running, every pod ready).
fn settled_in(s: &SetSeen, phase: CocoonSetPhase, min_generation: i64) -> bool {
    s.phase == Some(phase)
        && s.generation >= min_generation
        && s.observed == s.generation
        && (phase != CocoonSetPhase::Running || s.all_ready)
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------

fn since_ms(t0: Timestamp, t: Option<Timestamp>) -> Option<f64> {
    t.map(|t| t.duration_since(t0).as_secs_f64() * 1000.0)
}

fn p50(v: &[f64]) -> f64 {
    pct(v, 50)
}

fn pct(v: &[f64], p: usize) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = (p * v.len()).div_ceil(100).clamp(1, v.len());
    v[rank - 1]
}

/// The operator's writes in `[from, to)` (by completion time).
fn writes_between(writes: &[AuditRecord], from: Timestamp, to: Timestamp) -> Vec<&AuditRecord> {
    writes
        .iter()
        .filter(|w| w.completed.is_some_and(|c| c >= from && c < to))
        .collect()
}

fn describe(w: &AuditRecord, t0: Timestamp) -> String {
    format!(
        "+{:>6.0} ms {} {} {}{}",
        since_ms(t0, w.completed).unwrap_or(f64::NAN),
        w.verb,
        w.resource,
        w.name,
        if w.code >= 300 {
            format!(" ({})", w.code)
        } else {
            String::new()
        }
    )
}

/// One figure of every create round.
type Column = fn(&CreateRound) -> f64;

/// One create round's points, ms after the POST.
#[derive(Debug, Default, Clone)]
struct CreateRound {
    finalizer: f64,
    main_created: f64,
    main_vm: f64,
    main_ready: f64,
    subs_created: f64,
    subs_ready: f64,
    toolbox_created: f64,
    toolbox_ready: f64,
    running: f64,
    writes: usize,
    cpu_ms: f64,
}

/// The simulated DHCP lease lands this long after a boot (cocoon-testsupport's default, kept
/// explicit: it is not one of the runtime's verb latencies).
const LEASE_DELAY: Duration = Duration::from_millis(50);

fn zero_latency(cfg: &mut SimConfig) {
    cfg.latencies = Latencies::default().scaled(0.0);
    cfg.lease_delay = LEASE_DELAY;
}

fn full_spec(pool: &str) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image("ubuntu:24.04");
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.replicas = 2;
    s.toolboxes = vec![ToolboxSpec {
        name: "tb".into(),
        image: "ubuntu:24.04".into(),
        ..ToolboxSpec::default()
    }];
    s
}

fn main_only_spec(pool: &str) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image("ubuntu:24.04");
    s.node_pool = pool.to_owned();
    s.agent.mode = AgentMode::Run;
    s.agent.replicas = 0;
    s
}

struct Bench<'a> {
    ns: String,
    sets: Api<CocoonSet>,
    timeline: Shared,
    audit: AuditLog,
    op: &'a OperatorProcess,
    /// The test environment's registry access log.
    registry_log: PathBuf,
}

impl Bench<'_> {
    async fn wait_set(
        &self,
        name: &str,
        since: Timestamp,
        what: &str,
        f: impl Fn(&SetSeen) -> bool,
    ) -> BenchResult<Timestamp> {
        let t = &self.timeline;
        let f = &f;
        Ok(cocoon_testenv::wait_until(what, WAIT, || async move {
            t.lock().ok()?.first_set(name, since, f)
        })
        .await?)
    }

    async fn create_round(&self, name: &str, pool: &str, print: bool) -> BenchResult<CreateRound> {
        let cpu0 = cpu_of(self.op.pid());
        let t0 = Timestamp::now();
        self.sets
            .create(
                &PostParams::default(),
                &CocoonSet::new(name, full_spec(pool)),
            )
            .await?;
        let running = self
            .wait_set(name, t0, &format!("{name} Running"), |s| {
                settled_in(s, CocoonSetPhase::Running, 1)
            })
            .await?;
        let writes = self.op.quiet(&self.audit, &self.ns).await?;
        let cpu = cpu_of(self.op.pid()).saturating_sub(cpu0);
        let mine: Vec<&AuditRecord> = writes_between(&writes, t0, Timestamp::now())
            .into_iter()
            .filter(|w| w.name.starts_with(name))
            .collect();
        let tl = self.timeline.lock().map_err(|_| "timeline poisoned")?;
        let pod = |suffix: &str, ready: bool| tl.first_pod(&format!("{name}-{suffix}"), t0, ready);
        let latest = |a: Option<Timestamp>, b: Option<Timestamp>| a.zip(b).map(|(a, b)| a.max(b));
        let ms = |t| since_ms(t0, t).unwrap_or(f64::NAN);
        let round = CreateRound {
            finalizer: ms(tl.first_set(name, t0, |s| s.finalizer)),
            main_created: ms(pod("0", false)),
            main_vm: ms(tl.pod_when(&format!("{name}-0"), t0, |p| p.vm_id)),
            main_ready: ms(pod("0", true)),
            subs_created: ms(latest(pod("1", false), pod("2", false))),
            subs_ready: ms(latest(pod("1", true), pod("2", true))),
            toolbox_created: ms(pod("tb", false)),
            toolbox_ready: ms(pod("tb", true)),
            running: ms(Some(running)),
            writes: mine.len(),
            cpu_ms: cpu.as_secs_f64() * 1000.0,
        };
        if print {
            println!("  operator writes of {name} (audit log, completion time after the POST):");
            for w in &mine {
                println!("    {}", describe(w, t0));
            }
        }
        Ok(round)
    }

    /// DELETEs the set `name` and waits until it and its pods are gone; returns its figures.
    async fn delete_round(&self, name: &str, print: bool) -> BenchResult<Teardown> {
        let cpu0 = cpu_of(self.op.pid());
        let t0 = Timestamp::now();
        let (_, gone) = delete_all(self, &[name.to_owned()]).await?;
        let writes = self.op.quiet(&self.audit, &self.ns).await?;
        let cpu = cpu_of(self.op.pid()).saturating_sub(cpu0);
        let mine = writes_between(&writes, t0, Timestamp::now());
        if print {
            println!(
                "  operator writes of one delete (audit log, completion time after the DELETE):"
            );
            for w in &mine {
                println!("    {}", describe(w, t0));
            }
        }
        let ms = since_ms(t0, Some(gone)).unwrap_or(f64::NAN);
        Ok(Teardown::of(&mine, ms, cpu))
    }

    /// Edits `spec.suspend` of `name`; returns its figures with the per-pod breakdown.
    async fn transition(&self, name: &str, suspend: bool, print: bool) -> BenchResult<Transition> {
        let cpu0 = cpu_of(self.op.pid());
        let reg0 = registry_requests_by_kind(&self.registry_log);
        let t0 = Timestamp::now();
        let cs = self
            .sets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"suspend": suspend}})),
            )
            .await?;
        let generation = cs.metadata.generation.unwrap_or(0);
        let phase = if suspend {
            CocoonSetPhase::Suspended
        } else {
            CocoonSetPhase::Running
        };
        let done = self
            .wait_set(name, t0, &format!("{name} {phase:?}"), |s| {
                settled_in(s, phase, generation)
            })
            .await?;
        let writes = self.op.quiet(&self.audit, &self.ns).await?;
        let cpu = cpu_of(self.op.pid()).saturating_sub(cpu0);
        let mine = writes_between(&writes, t0, Timestamp::now());
        let mut registry = registry_requests_by_kind(&self.registry_log);
        for (k, n) in reg0 {
            if let Some(now) = registry.get_mut(&k) {
                *now = now.saturating_sub(n);
            }
        }
        registry.retain(|_, n| *n > 0);
        let steps = if suspend { SUSPEND_STEPS } else { RESUME_STEPS };
        let tl = self.timeline.lock().map_err(|_| "timeline poisoned")?;
        let prefix = format!("{name}-");
        let pods: Vec<String> = tl
            .pods
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .cloned()
            .collect();
        let ms = |t| since_ms(t0, t).unwrap_or(f64::NAN);
        let mut spans = Vec::new();
        let mut per_pod = Vec::new();
        for (_, f) in steps {
            let seen: Vec<Option<f64>> = pods
                .iter()
                .map(|p| since_ms(t0, tl.pod_when(p, t0, f)))
                .collect();
            let got: Vec<f64> = seen.iter().flatten().copied().collect();
            spans.push((pct(&got, 0), pct(&got, 100)));
            per_pod.push(seen);
        }
        drop(tl);
        if print {
            let what = if suspend { "suspend" } else { "resume" };
            println!(
                "  operator writes of one {what} (audit log, completion time after the edit):"
            );
            for w in &mine {
                println!("    {}", describe(w, t0));
            }
            println!("  pods of one {what}, ms after the edit (watch events):");
            for (i, p) in pods.iter().enumerate() {
                let cells: Vec<String> = per_pod
                    .iter()
                    .map(|v| v[i].map_or("-".to_owned(), |x| format!("{x:.0}")))
                    .collect();
                println!("    {p:<14} {}", cells.join(" / "));
            }
            println!(
                "    (columns: {})",
                steps
                    .iter()
                    .map(|(l, _)| *l)
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
            println!("  registry requests of one {what} (access log): {registry:?}");
        }
        Ok(Transition {
            ms: ms(Some(done)),
            writes: mine.len(),
            cpu_ms: cpu.as_secs_f64() * 1000.0,
            spans,
            registry: registry.values().sum(),
        })
    }
}

/// The DELETE of one set's or many sets' figures.
struct Teardown {
    ms: f64,
    writes: usize,
    /// The writes by `verb resource` (with `/subresource`).
    by_kind: BTreeMap<String, usize>,
    /// The failed writes (status >= 400) by `verb resource code`.
    failed: BTreeMap<String, usize>,
    cpu_ms: f64,
}

impl Teardown {
    fn of(writes: &[&AuditRecord], ms: f64, cpu: Duration) -> Teardown {
        let mut by_kind = BTreeMap::new();
        let mut failed = BTreeMap::new();
        for w in writes {
            *by_kind
                .entry(format!("{} {}", w.verb, w.resource))
                .or_insert(0) += 1;
            if w.code >= 400 {
                *failed
                    .entry(format!("{} {} {}", w.verb, w.resource, w.code))
                    .or_insert(0) += 1;
            }
        }
        Teardown {
            ms,
            writes: writes.len(),
            by_kind,
            failed,
            cpu_ms: cpu.as_secs_f64() * 1000.0,
        }
    }

    fn failed_count(&self) -> usize {
        self.failed.values().sum()
    }
}

/// Adds `from`'s counts into `into`.
fn add_counts(into: &mut BTreeMap<String, usize>, from: &BTreeMap<String, usize>) {
    for (k, n) in from {
        *into.entry(k.clone()).or_insert(0) += n;
    }
}

/// DELETEs the sets `names` (at most `CREATES_AT_ONCE` in flight, as a user's tooling would),
/// waits until each set and every pod it had is gone; returns when the DELETEs were all
/// issued and when the last of them was gone.
async fn delete_all(b: &Bench<'_>, names: &[String]) -> BenchResult<(Timestamp, Timestamp)> {
    let t0 = Timestamp::now();
    let pods: Vec<Vec<String>> = {
        let tl = b.timeline.lock().map_err(|_| "timeline poisoned")?;
        names.iter().map(|n| tl.live_pods(n)).collect()
    };
    let deletes: Vec<_> = names
        .iter()
        .map(|name| async move { b.sets.delete(name, &DeleteParams::default()).await })
        .collect();
    let results: Vec<_> = futures::stream::iter(deletes)
        .buffer_unordered(CREATES_AT_ONCE)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let issued = Timestamp::now();
    let t = &b.timeline;
    let what = format!("{} set(s) and their pods gone", names.len());
    let (names, pods) = (&names, &pods);
    let gone = cocoon_testenv::wait_until(&what, WAIT, || async move {
        let tl = t.lock().ok()?;
        names
            .iter()
            .zip(pods)
            .map(|(n, p)| tl.all_gone(n, p, t0))
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().max())
    })
    .await?;
    Ok((issued, gone))
}

/// One suspend or resume: edit → phase, the operator's writes and CPU, and for each of the
/// pod steps the (first, last) pod's time, ms after the edit.
struct Transition {
    ms: f64,
    writes: usize,
    cpu_ms: f64,
    spans: Vec<(f64, f64)>,
    registry: usize,
}

type PodStep = (&'static str, fn(&PodSeen) -> bool);

/// A suspend's pod steps, in order: the operator's patch, then the node agent's hibernate.
const SUSPEND_STEPS: &[PodStep] = &[
    ("hibernate flag (operator)", |p| p.hibernate),
    ("agent: hibernating", |p| {
        p.hibernate && p.lifecycle == "hibernating"
    }),
    ("agent: pushed, VM id cleared", |p| p.hibernate && !p.vm_id),
    ("agent: hibernated", |p| {
        p.hibernate && p.lifecycle == "hibernated"
    }),
];

/// A resume's pod steps, in order: the operator's patch, then the node agent's wake.
const RESUME_STEPS: &[PodStep] = &[
    ("hibernate flag removed (operator)", |p| !p.hibernate),
    ("agent: creating", |p| {
        !p.hibernate && p.lifecycle == "creating"
    }),
    ("agent: VM up, VM id written", |p| !p.hibernate && p.vm_id),
    ("agent: Ready condition", |p| !p.hibernate && p.ready),
    ("agent: ready lifecycle", |p| {
        !p.hibernate && p.lifecycle == "ready"
    }),
];

async fn measure(env: &TestEnv, rounds: usize, n_sets: usize, scale: Option<usize>) -> BenchResult {
    let admin = env.client()?;
    let ns = cocoon_testenv::create_namespace(&admin, "cs-life").await?;
    let pool = cocoon_testenv::unique_name("pool");
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    let mut agent_procs = Vec::new();
    let mut roots = Vec::new();
    for _ in 0..NODES {
        let root = tempfile::tempdir()?;
        let name = cocoon_testenv::unique_name("life-node");
        if let Some(n) = scale {
            // Each agent its own `cocoon-operator node` process, so its RSS is its own; it
            // registers its Node with room for every pod of the scenario.
            // Each agent its own pool and every third set in it: 3000 pods spread evenly (in
            // one pool the scheduler's ties put two thirds of them on one node).
            let pool = scale_pool(&pool, agent_procs.len());
            agent_procs.push(AgentProcess::start(
                env,
                &name,
                &pool,
                root.path(),
                3 * n + 110,
            )?);
        } else {
            let node = TestNode::in_pool(&admin, &name, &pool).await?;
            node.wait_schedulable(Duration::from_secs(60)).await?;
            let opts = AgentOptions {
                tweak: zero_latency,
                ..AgentOptions::default()
            };
            agents.push(
                Agent::start(env.client()?, &name, root.path(), env.registry_addr(), opts).await?,
            );
            nodes.push(node);
        }
        roots.push(root);
    }
    for agent in &agent_procs {
        agent.wait_schedulable(&admin).await?;
    }
    let timeline = start_timeline(&admin, &ns).await?;
    let mut op = OperatorProcess::start(env, &admin, &ns).await?;
    let outcome = match scale {
        Some(n) => {
            let outcome =
                scale_scenario(env, &ns, &pool, &timeline, &mut op, &agent_procs, n).await;
            if outcome.is_err() {
                eprintln!("---- operator log ----\n{}", op.log_tail());
                for agent in &agent_procs {
                    eprintln!(
                        "---- node agent {} log ----\n{}",
                        agent.node,
                        agent.log_tail()
                    );
                }
            }
            outcome
        }
        None => {
            let bench = Bench {
                ns: ns.clone(),
                sets: Api::namespaced(admin.clone(), &ns),
                timeline,
                audit: env.audit_log(),
                op: &op,
                registry_log: env.run_dir().join("logs").join("registry.log"),
            };
            let outcome = scenarios(&bench, &pool, rounds, n_sets).await;
            if outcome.is_err() {
                eprintln!("---- operator log ----\n{}", op.log_tail());
            }
            outcome
        }
    };
    drop(op);
    drop(agent_procs);
    for mut a in agents {
        a.stop().await;
    }
    drop(nodes);
    cocoon_testenv::delete_namespace(&admin, &ns).await?;
    drop(roots);
    outcome
}

async fn scenarios(b: &Bench<'_>, pool: &str, rounds: usize, n_sets: usize) -> BenchResult {
    // The operator is up once its first pass of a set is seen: a warm-up set, not measured.
    let warm = Timestamp::now();
    b.sets
        .create(
            &PostParams::default(),
            &CocoonSet::new("warmup", main_only_spec(pool)),
        )
        .await?;
    b.wait_set("warmup", warm, "warmup Running", |s| {
        settled_in(s, CocoonSetPhase::Running, 1)
    })
    .await?;
    b.op.quiet(&b.audit, &b.ns).await?;
    let (idle_rss, _) = rss_of(b.op.pid());

    println!();
    println!(
        "CocoonSet lifecycle: `cocoon-operator run` as its own process (release build, \
         COCOONSET_CONCURRENCY={}), {NODES} real in-process node agents (simulated runtime, \
         every sim latency zero; the simulated DHCP lease still lands {} ms after a boot)",
        concurrency()?,
        LEASE_DELAY.as_millis(),
    );

    // (1) create → Running, one set at a time.
    let mut created = Vec::new();
    for r in 0..rounds {
        created.push(b.create_round(&format!("one-{r}"), pool, r == 0).await?);
    }
    let col = |f: fn(&CreateRound) -> f64| created.iter().map(f).collect::<Vec<_>>();
    println!(
        "create -> Running, 1 set (main + 2 sub-agents + 1 toolbox), {rounds} rounds, ms after \
         the POST (p50 / max):"
    );
    let rows: [(&str, Column); 9] = [
        ("finalizer on the set", |r| r.finalizer),
        ("main pod created", |r| r.main_created),
        ("main VM up (agent wrote its id)", |r| r.main_vm),
        ("main Ready (agent bring-up)", |r| r.main_ready),
        ("sub-agents created", |r| r.subs_created),
        ("sub-agents Ready", |r| r.subs_ready),
        ("toolbox created", |r| r.toolbox_created),
        ("toolbox Ready", |r| r.toolbox_ready),
        ("status Running seen", |r| r.running),
    ];
    for (label, f) in rows {
        let v = col(f);
        println!("  {label:<30} {:>7.0} / {:>7.0}", p50(&v), pct(&v, 100));
    }
    println!(
        "  operator writes per create p50 {:.0}, operator CPU per create p50 {:.0} ms",
        p50(&created.iter().map(|r| r.writes as f64).collect::<Vec<_>>()),
        p50(&col(|r| r.cpu_ms)),
    );
    println!(
        "  per round (finalizer/main/mainVM/mainReady/subs/subsReady/tb/tbReady/Running ms, \
         writes):"
    );
    for (i, r) in created.iter().enumerate() {
        println!(
            "    {i:>2}: {:>5.0} {:>5.0} {:>5.0} {:>5.0} {:>5.0} {:>5.0} {:>5.0} {:>5.0} {:>5.0}  \
             {}",
            r.finalizer,
            r.main_created,
            r.main_vm,
            r.main_ready,
            r.subs_created,
            r.subs_ready,
            r.toolbox_created,
            r.toolbox_ready,
            r.running,
            r.writes
        );
    }

    // (2) suspend / resume of one of them.
    // COCOON_BENCH_EVERY_ROUND=1 prints each round's writes, not only the first round's.
    let every = std::env::var_os("COCOON_BENCH_EVERY_ROUND").is_some_and(|v| v == "1");
    let (mut sus, mut res) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        sus.push(b.transition("one-0", true, every || r == 0).await?);
        res.push(b.transition("one-0", false, every || r == 0).await?);
    }
    for (label, v, steps) in [
        ("suspend -> Suspended", &sus, SUSPEND_STEPS),
        ("resume -> Running", &res, RESUME_STEPS),
    ] {
        let t: Vec<f64> = v.iter().map(|x| x.ms).collect();
        let w: Vec<f64> = v.iter().map(|x| x.writes as f64).collect();
        let c: Vec<f64> = v.iter().map(|x| x.cpu_ms).collect();
        let reg: Vec<f64> = v.iter().map(|x| x.registry as f64).collect();
        println!(
            "{label:<22} {rounds} rounds: edit -> phase p50 {:>5.0} ms max {:>5.0} ms | operator \
             writes p50 {:.0} (min {:.0}, max {:.0}) | operator CPU p50 {:.0} ms, mean {:.1} ms \
             | registry requests p50 {:.0}",
            p50(&t),
            pct(&t, 100),
            p50(&w),
            pct(&w, 0),
            pct(&w, 100),
            p50(&c),
            c.iter().sum::<f64>() / c.len().max(1) as f64,
            p50(&reg),
        );
        println!("  breakdown, ms after the edit, p50 over rounds of the first / last pod:");
        for (i, (step, _)) in steps.iter().enumerate() {
            let first: Vec<f64> = v.iter().map(|x| x.spans[i].0).collect();
            let last: Vec<f64> = v.iter().map(|x| x.spans[i].1).collect();
            println!("    {step:<36} {:>6.0} / {:>6.0}", p50(&first), p50(&last));
        }
        println!("    {:<36} {:>6.0}", "phase seen", p50(&t));
    }

    // (3) delete of one set at a time: the create rounds' sets, each Running (main + 2
    // sub-agents + 1 toolbox).
    let mut dels = Vec::new();
    for r in 0..rounds {
        dels.push(b.delete_round(&format!("one-{r}"), every || r == 0).await?);
    }
    {
        let t: Vec<f64> = dels.iter().map(|x| x.ms).collect();
        let w: Vec<f64> = dels.iter().map(|x| x.writes as f64).collect();
        let c: Vec<f64> = dels.iter().map(|x| x.cpu_ms).collect();
        let (mut kinds, mut failed) = (BTreeMap::new(), BTreeMap::new());
        for d in &dels {
            add_counts(&mut kinds, &d.by_kind);
            add_counts(&mut failed, &d.failed);
        }
        println!(
            "delete -> gone, 1 set (main + 2 sub-agents + 1 toolbox), {rounds} rounds: DELETE -> \
             set and pods gone p50 {:>5.0} ms max {:>5.0} ms | operator writes p50 {:.0} (min \
             {:.0}, max {:.0}) | failed writes {} | operator CPU p50 {:.0} ms",
            p50(&t),
            pct(&t, 100),
            p50(&w),
            pct(&w, 0),
            pct(&w, 100),
            failed.values().sum::<usize>(),
            p50(&c),
        );
        println!("  writes over the rounds by kind: {kinds:?}");
        println!("  failed writes over the rounds: {failed:?}");
        println!(
            "  per round (ms, writes, failed): {}",
            dels.iter()
                .map(|d| format!("{:.0}/{}/{}", d.ms, d.writes, d.failed_count()))
                .collect::<Vec<_>>()
                .join("  ")
        );
    }

    // (4) many sets at once.
    let cpu0 = cpu_of(b.op.pid());
    let t0 = Timestamp::now();
    let names: Vec<String> = (0..n_sets).map(|i| format!("many-{i}")).collect();
    create_all(&b.sets, &names, |_| main_only_spec(pool)).await?;
    let issued = Timestamp::now();
    let t = &b.timeline;
    let last = cocoon_testenv::wait_until(&format!("{n_sets} sets Running"), WAIT, || async {
        let tl = t.lock().ok()?;
        names
            .iter()
            .map(|n| tl.first_set(n, t0, |s| settled_in(s, CocoonSetPhase::Running, 1)))
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().max())
    })
    .await?;
    let (_, hwm_ramp) = rss_of(b.op.pid());
    let writes = b.op.quiet(&b.audit, &b.ns).await?;
    let cpu = cpu_of(b.op.pid()).saturating_sub(cpu0);
    let many_writes = writes_between(&writes, t0, Timestamp::now())
        .into_iter()
        .filter(|w| w.name.starts_with("many-"))
        .count();
    let (rss, hwm) = rss_of(b.op.pid());
    println!(
        "{n_sets} sets (replicas 0) created at once: creates issued in {:.2} s, all Running after \
         {:.2} s | operator writes {many_writes} | operator CPU {:.2} s | operator RSS idle \
         {idle_rss:.1} MiB, {rss:.1} MiB after (peak {:.1} MiB)",
        issued.duration_since(t0).as_secs_f64(),
        last.duration_since(t0).as_secs_f64(),
        cpu.as_secs_f64(),
        hwm.max(hwm_ramp),
    );
    // Where the many-set time goes: the operator (POST → main created), the scheduler
    // (created → bound), the node agent (bound → VM up → Ready), the operator again (Ready →
    // Running seen); per set, s after the first POST.
    {
        let tl = b.timeline.lock().map_err(|_| "timeline poisoned")?;
        let s = |t: Option<Timestamp>| t.map_or(f64::NAN, |t| t.duration_since(t0).as_secs_f64());
        let mut cols: [Vec<f64>; 5] = Default::default();
        for n in &names {
            let main = format!("{n}-0");
            cols[0].push(s(tl.pod_when(&main, t0, |_| true)));
            cols[1].push(s(tl.pod_when(&main, t0, |p| p.bound)));
            cols[2].push(s(tl.pod_when(&main, t0, |p| p.vm_id)));
            cols[3].push(s(tl.pod_when(&main, t0, |p| p.ready)));
            cols[4].push(s(
                tl.first_set(n, t0, |x| settled_in(x, CocoonSetPhase::Running, 1))
            ));
        }
        println!("  {n_sets} sets, s after the first POST (p50 / max over the sets):");
        for (label, v) in [
            "main pod created (operator)",
            "main bound (scheduler)",
            "main VM up (node agent)",
            "main Ready (node agent)",
            "Running seen (operator)",
        ]
        .iter()
        .zip(&cols)
        {
            println!("    {label:<30} {:>6.2} / {:>6.2}", p50(v), pct(v, 100));
        }
    }
    // (5) the many sets deleted at once.
    let cpu0 = cpu_of(b.op.pid());
    let t0 = Timestamp::now();
    let (issued, gone) = delete_all(b, &names).await?;
    let writes = b.op.quiet(&b.audit, &b.ns).await?;
    let cpu = cpu_of(b.op.pid()).saturating_sub(cpu0);
    let mine: Vec<&AuditRecord> = writes_between(&writes, t0, Timestamp::now())
        .into_iter()
        .filter(|w| w.name.starts_with("many-"))
        .collect();
    let many = Teardown::of(&mine, since_ms(t0, Some(gone)).unwrap_or(f64::NAN), cpu);
    println!(
        "{n_sets} sets (replicas 0) deleted at once: deletes issued in {:.2} s, all gone (sets \
         and pods) after {:.2} s | operator writes {} | failed writes {} | operator CPU {:.2} s",
        issued.duration_since(t0).as_secs_f64(),
        many.ms / 1000.0,
        many.writes,
        many.failed_count(),
        many.cpu_ms / 1000.0,
    );
    println!("  writes by kind: {:?}", many.by_kind);
    println!("  failed writes: {:?}", many.failed);
    println!(
        "goals (issue #20): create p50 < 1000 ms, {DEFAULT_SETS} sets < 4 s, suspend/resume p50 \
         < 350 ms, <= 8 / <= 12 operator writes; (issue #36) teardown under Go v0.3.3's writes: \
         < 15 for one set, < 221 for {DEFAULT_SETS} sets, no failed write"
    );
    Ok(())
}

/// Requests in the registry's access log so far, by method and kind (`GET manifests`,
/// `HEAD blobs`, `POST uploads`, …).
fn registry_requests_by_kind(log: &Path) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        if !line.contains(" - - [") {
            continue;
        }
        let Some(req) = line.split('"').nth(1) else {
            continue;
        };
        let mut words = req.split_whitespace();
        let (Some(method), Some(path)) = (words.next(), words.next()) else {
            continue;
        };
        if !path.starts_with("/v2/") {
            continue;
        }
        let kind = if path.contains("/blobs/uploads") {
            "uploads"
        } else if path.contains("/blobs/") {
            "blobs"
        } else if path.contains("/manifests/") {
            "manifests"
        } else if path.contains("/tags/") {
            "tags"
        } else {
            "other"
        };
        *by.entry(format!("{method} {kind}")).or_insert(0) += 1;
    }
    by
}

/// Requests in the registry's access log so far (one line each).
fn registry_requests(env: &TestEnv) -> usize {
    let log = env.run_dir().join("logs").join("registry.log");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\" ") && l.contains(" /v2/") && l.contains(" - - ["))
        .count()
}

/// The pool of the scale scenario's agent `i`.
fn scale_pool(pool: &str, i: usize) -> String {
    format!("{pool}-{i}")
}

fn scale_spec(pool: &str) -> CocoonSetSpec {
    let mut s = full_spec(pool);
    s.agent.replicas = 1;
    s
}

/// The scale scenario of `COCOON_BENCH_SCALE` (see the file's docs).
async fn scale_scenario(
    env: &TestEnv,
    ns: &str,
    pool: &str,
    timeline: &Shared,
    op: &mut OperatorProcess,
    agents: &[AgentProcess],
    n: usize,
) -> BenchResult {
    let admin = &env.client()?;
    let audit = env.audit_log();
    let sets: Api<CocoonSet> = Api::namespaced(admin.clone(), ns);
    cocoon_testenv::wait_until("the operator's /metrics", WAIT, || op.passes()).await?;
    let (idle_rss, _) = rss_of(op.pid());
    let agent_rss = || -> Vec<(f64, f64)> { agents.iter().map(|a| rss_of(a.pid())).collect() };
    let agents_idle = agent_rss();
    println!();
    println!(
        "CocoonSet scale: {n} sets x (main + 1 sub-agent + 1 toolbox), `cocoon-operator run` as \
         its own process (COCOONSET_CONCURRENCY={}), {NODES} `cocoon-operator node` agents, \
         each its own process (simulated runtime, every sim latency zero)",
        concurrency()?
    );
    let cpu0 = cpu_of(op.pid());
    let t0 = Timestamp::now();
    let names: Vec<String> = (0..n).map(|i| format!("scale-{i}")).collect();
    let last_report = std::cell::Cell::new(t0);
    create_all(&sets, &names, |i| scale_spec(&scale_pool(pool, i % NODES))).await?;
    let issued = Timestamp::now();
    let running_at = cocoon_testenv::wait_until(
        &format!("{n} sets Running"),
        Duration::from_secs(1800),
        || async {
            let tl = timeline.lock().ok()?;
            let seen: Vec<Option<Timestamp>> = names
                .iter()
                .map(|n| tl.first_set(n, t0, |s| settled_in(s, CocoonSetPhase::Running, 1)))
                .collect();
            let done = seen.iter().filter(|s| s.is_some()).count();
            drop(tl);
            if Timestamp::now().duration_since(last_report.get()).as_secs() >= 10 {
                println!(
                    "  {done} / {n} Running after {:.0} s",
                    Timestamp::now().duration_since(t0).as_secs_f64()
                );
                last_report.set(Timestamp::now());
            }
            seen.into_iter()
                .collect::<Option<Vec<_>>>()
                .and_then(|v| v.into_iter().max())
        },
    )
    .await?;
    let writes = op.quiet(&audit, ns).await?;
    let cpu = cpu_of(op.pid()).saturating_sub(cpu0);
    let ramp_writes = writes_between(&writes, t0, Timestamp::now()).len();
    let (op_rss, op_hwm) = rss_of(op.pid());
    let agents_settled = agent_rss();
    println!(
        "  creates issued in {:.1} s, all Running after {:.1} s | operator writes {ramp_writes} \
         ({:.1} a set) | operator CPU {:.2} s",
        issued.duration_since(t0).as_secs_f64(),
        running_at.duration_since(t0).as_secs_f64(),
        ramp_writes as f64 / n as f64,
        cpu.as_secs_f64(),
    );
    println!(
        "  operator RSS idle {idle_rss:.1} MiB, settled {op_rss:.1} MiB, peak {op_hwm:.1} MiB \
         (goal < 100)"
    );
    for (i, (idle, (rss, hwm))) in agents_idle.iter().zip(&agents_settled).enumerate() {
        println!(
            "  node agent {i} RSS idle {:.1} MiB, settled {rss:.1} MiB, peak {hwm:.1} MiB (goal \
             < 150)",
            idle.0
        );
    }

    // A settled minute. The window is the measurement itself.
    let w0 = op.writes(&audit, ns).await?.len();
    let r0 = registry_requests(env);
    let p0 = op.passes().await.unwrap_or(0);
    let cpu_w0 = cpu_of(op.pid());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let minute = op.writes(&audit, ns).await?;
    let w1 = minute.len();
    let r1 = registry_requests(env);
    let p1 = op.passes().await.unwrap_or(0);
    println!(
        "  settled minute: operator writes {} (goal 0), registry requests {} (goal 0; every \
         client), operator passes {}, operator CPU {:.2} s",
        w1 - w0,
        r1.saturating_sub(r0),
        p1.saturating_sub(p0),
        cpu_of(op.pid()).saturating_sub(cpu_w0).as_secs_f64(),
    );
    // Which writes, if any: a settled set should make none.
    for r in minute.iter().skip(w0).take(20) {
        println!("    {} {} {} -> {}", r.verb, r.resource, r.name, r.code);
    }

    // Restart: the operator killed, then a fresh process resyncs every set.
    op.stop();
    let r0 = registry_requests(env);
    *op = OperatorProcess::start(env, admin, ns).await?;
    let fresh = &*op;
    // Its passes have gone quiet once the counter stood still for a QUIET span and covered
    // every set.
    let last = std::cell::Cell::new((0u64, Timestamp::now()));
    let settled = cocoon_testenv::wait_until(
        "the restarted operator's passes quiet",
        Duration::from_secs(600),
        || {
            let (prev, last) = (last.get(), &last);
            async move {
                let passes = fresh.passes().await?;
                let now = Timestamp::now();
                if passes != prev.0 {
                    last.set((passes, now));
                    return None;
                }
                (passes >= n as u64 && unsigned(now.duration_since(prev.1)) >= QUIET)
                    .then_some(prev)
            }
        },
    )
    .await?;
    let writes = fresh.writes(&audit, ns).await?;
    println!(
        "  restart: {} passes, the last {:.1} s after the spawn (goal: every set settled in < \
         30 s) | writes {} (goal 0) | registry requests {} | operator RSS {:.1} MiB",
        settled.0,
        settled.1.duration_since(fresh.started).as_secs_f64(),
        writes.len(),
        registry_requests(env).saturating_sub(r0),
        rss_of(fresh.pid()).0,
    );
    let still = {
        let list = sets.list(&Default::default()).await?;
        list.items
            .iter()
            .filter(|cs| {
                cs.status.as_ref().is_some_and(|s| {
                    s.phase == Some(CocoonSetPhase::Running)
                        && s.ready_agents == s.desired_agents
                        && s.ready_toolboxes == s.desired_toolboxes
                })
            })
            .count()
    };
    println!("  sets Running at the end: {still} / {n}");
    Ok(())
}

/// Creates the sets (set `i` with `spec(i)`), at most `CREATES_AT_ONCE` POSTs in flight, as a
/// user's tooling would: one POST after another took this bench 130 ms a set, which is not the
/// operator's time.
async fn create_all(
    sets: &Api<CocoonSet>,
    names: &[String],
    spec: impl Fn(usize) -> CocoonSetSpec,
) -> BenchResult {
    let posts: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let cs = CocoonSet::new(name, spec(i));
            async move { sets.create(&PostParams::default(), &cs).await }
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(posts)
        .buffer_unordered(CREATES_AT_ONCE)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(())
}
