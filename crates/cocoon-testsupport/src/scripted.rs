//! Scaffolding of the operator tests whose node side is SCRIPTED rather than the real node
//! agent: a stand-in that writes what the node agent writes (VM id and IP, lifecycle at the
//! stamped generation, a running container and the Ready condition), optionally hibernating
//! pods into a real `<vm>:hibernate` artifact, and that completes pod deletions as a kubelet
//! does; plus the controller start-up ([`controller`]), registry artifacts and the waits those tests share.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cocoon_api::crd::set::{
    CocoonSet, CocoonSetPhase, CocoonSetSpec, SnapshotPolicy, ToolboxMode, ToolboxSpec,
};
use cocoon_operator::admin::Readiness;
use cocoon_operator::leader::Leadership;
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{BoxFuture, OciTagRegistry, RegistryError, TagRegistry};
use cocoon_operator::{cocoonset, hibernation};
use cocoon_registry::{RegistryClient, RegistryConfig, RetryPolicy};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::BoxError;

/// Default deadline of the waits of the CocoonSet tests.
pub const WAIT: Duration = Duration::from_secs(90);
/// The pod annotation that asks the node to hibernate the VM.
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";

/// A registry client for the test registry at `addr` that fails fast: a 10 s request timeout
/// and a single attempt.
pub fn registry_client(addr: &str) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(addr).expect("registry config");
    cfg.request_timeout = Duration::from_secs(10);
    cfg.retry = RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    };
    RegistryClient::new(cfg).expect("registry client")
}

/// The event recorder of the in-process controllers (reporting as `cocoon-operator`).
pub fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-operator".into(),
            instance: None,
        },
    )
}

/// The CocoonSet controller timings of the suspend and migrate tests: short requeues, 300 ms
/// suspend and migrate polls, one quick rebuild.
pub fn suspend_timing() -> cocoonset::Timing {
    cocoonset::Timing {
        requeue_after_write: Duration::from_millis(200),
        wait_for_main: Duration::from_millis(500),
        suspend_poll: Duration::from_millis(300),
        migrate_poll: Duration::from_millis(300),
        rebuild_backoff: vec![Duration::ZERO, Duration::from_millis(200)],
        ..cocoonset::Timing::default()
    }
}

/// The tag registry of the controllers [`controller`] starts: the real registry client with
/// every call counted, and a switch that makes every call fail as an unreachable registry does.
pub struct ProbedRegistry {
    inner: OciTagRegistry,
    calls: AtomicU64,
    down: AtomicBool,
}

impl ProbedRegistry {
    /// The calls made so far (a call is counted when it is made, failed or not).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Takes the registry down (every later call fails with a transport error) or up again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), RegistryError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RegistryError::Transport {
                message: "connection refused (test: registry down)".into(),
                timeout: false,
            });
        }
        Ok(())
    }
}

impl TagRegistry for ProbedRegistry {
    fn has_manifest<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<bool, RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check()?;
            self.inner.has_manifest(vm, tag).await
        })
    }
    fn delete_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check()?;
            self.inner.delete_tag(vm, tag).await
        })
    }
    fn manifest_annotations<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check()?;
            self.inner.manifest_annotations(vm, tag).await
        })
    }
    fn delete_owned_tag<'a>(
        &'a self,
        vm: &'a str,
        tag: &'a str,
        actor: cocoon_api::contract::owner::Actor<'a>,
    ) -> BoxFuture<'a, Result<cocoon_operator::registry::TagDelete, RegistryError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.check()?;
            self.inner.delete_owned_tag(vm, tag, actor).await
        })
    }
}

/// What the scripted tests vary when they start a controller: [`controller`] takes the
/// cluster, the namespace and the registry client; [`Start::leadership`] overrides the
/// always-elected default; [`Start::sets`] or [`Start::hibernation`] picks the controller and
/// its timings and starts it.
pub struct Start<'a> {
    client: &'a Client,
    ns: &'a str,
    registry: RegistryClient,
    leadership: Option<Leadership>,
}

/// A controller scoped to `ns` with 4 concurrent reconciles, its tag registry `registry`
/// ([`registry_client`] for the fail-fast one) behind a [`ProbedRegistry`], reporting through
/// [`recorder`] into fresh metrics.
pub fn controller<'a>(client: &'a Client, ns: &'a str, registry: RegistryClient) -> Start<'a> {
    Start {
        client,
        ns,
        registry,
        leadership: None,
    }
}

impl<'a> Start<'a> {
    /// Runs the controller under `leadership` (a test that makes it stand by).
    pub fn leadership(mut self, leadership: Leadership) -> Self {
        self.leadership = Some(leadership);
        self
    }

    /// The cluster, the namespace, the probed registry and the leadership of the start.
    fn parts(self) -> (&'a Client, &'a str, Arc<ProbedRegistry>, Option<Leadership>) {
        let registry = Arc::new(ProbedRegistry {
            inner: OciTagRegistry::new(self.registry),
            calls: AtomicU64::new(0),
            down: AtomicBool::new(false),
        });
        (self.client, self.ns, registry, self.leadership)
    }

    /// Starts the CocoonSet controller with `timing`, counting its passes in
    /// [`Controller::stats`].
    pub fn sets(self, timing: cocoonset::Timing) -> Controller<cocoonset::Context> {
        let (client, ns, registry, leadership) = self.parts();
        let stats = Arc::new(cocoonset::Stats::default());
        let mut ctx = cocoonset::Context::new(
            client.clone(),
            recorder(client),
            Arc::new(Metrics::new()),
            registry.clone(),
            timing,
        )
        .with_stats(stats.clone());
        if let Some(l) = leadership {
            ctx = ctx.with_leadership(l);
        }
        let metrics = ctx.metrics.clone();
        launch(
            Arc::new(ctx),
            metrics,
            stats,
            registry,
            ns,
            |ctx, ns, stop| async move {
                cocoonset::run(ctx, Some(&ns), 4, stop, Arc::new(Readiness::default())).await
            },
        )
    }

    /// Starts the CocoonHibernation controller with `timing` ([`Controller::stats`] stays
    /// zero: only the CocoonSet controller counts passes).
    pub fn hibernation(
        self,
        timing: hibernation::decide::Timing,
    ) -> Controller<hibernation::Context> {
        let (client, ns, registry, leadership) = self.parts();
        let mut ctx = hibernation::Context::new(
            client.clone(),
            recorder(client),
            Arc::new(Metrics::new()),
            registry.clone(),
            timing,
        );
        if let Some(l) = leadership {
            ctx = ctx.with_leadership(l);
        }
        let metrics = ctx.metrics.clone();
        launch(
            Arc::new(ctx),
            metrics,
            Arc::default(),
            registry,
            ns,
            |ctx, ns, stop| async move {
                hibernation::run(ctx, Some(&ns), 4, stop, Arc::new(Readiness::default())).await
            },
        )
    }
}

/// What stops a controller [`Start`] started: it resolves once its [`Controller`] is stopped
/// or dropped.
type Shutdown = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// Spawns `run` (the controller's loop on `ctx`, scoped to `ns`, until its [`Shutdown`]).
fn launch<C, F>(
    ctx: Arc<C>,
    metrics: Arc<Metrics>,
    stats: Arc<cocoonset::Stats>,
    registry: Arc<ProbedRegistry>,
    ns: &str,
    run: impl FnOnce(Arc<C>, String, Shutdown) -> F,
) -> Controller<C>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (stop, rx) = oneshot::channel::<()>();
    let shutdown: Shutdown = Box::pin(async move {
        let _ = rx.await;
    });
    let task = tokio::spawn(run(ctx.clone(), ns.to_owned(), shutdown));
    Controller {
        ctx,
        metrics,
        stats,
        registry,
        stop: Some(stop),
        task: Some(task),
    }
}

/// A controller [`Start`] started; dropping it stops the controller (without waiting).
pub struct Controller<C> {
    /// The controller's context (what it remembers, its metrics).
    pub ctx: Arc<C>,
    /// The metrics the controller writes.
    pub metrics: Arc<Metrics>,
    /// The CocoonSet controller's pass and write counters.
    pub stats: Arc<cocoonset::Stats>,
    /// The controller's tag registry: its call count and its down switch.
    pub registry: Arc<ProbedRegistry>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl<C> Controller<C> {
    /// Stops the controller (as an operator restart does) and waits for it to end.
    pub async fn stop(mut self) {
        drop(self.stop.take());
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Pushes a minimal snapshot artifact (config blob with a fresh snapshot id and `image`, no
/// layers) as `<vm>:<tag>`; its manifest annotations are the base image and `extra`.
pub async fn push_snapshot_tag(
    reg: &RegistryClient,
    vm: &str,
    tag: &str,
    image: &str,
    extra: &[(&str, &str)],
) -> Result<(), BoxError> {
    let config = Bytes::from(format!(
        r#"{{"snapshotId":"{}","image":"{image}"}}"#,
        cocoon_testenv::unique_name("snap")
    ));
    let size = config.len();
    let digest = reg.put_blob_bytes(vm, config).await?;
    let mut annotations: BTreeMap<&str, &str> = extra.iter().copied().collect();
    annotations.insert("cocoonstack.snapshot.baseimage", image);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.cocoonstack.snapshot.v1+json",
        "config": {"mediaType": "application/vnd.cocoonstack.snapshot.config.v1+json",
                   "digest": digest.to_string(), "size": size},
        "layers": [],
        "annotations": annotations
    });
    reg.put_manifest(
        vm,
        tag,
        Bytes::from(serde_json::to_vec(&manifest)?),
        "application/vnd.oci.image.manifest.v1+json",
    )
    .await?;
    Ok(())
}

/// [`push_snapshot_tag`] with no extra annotations.
pub async fn push_tag(
    reg: &RegistryClient,
    vm: &str,
    tag: &str,
    image: &str,
) -> Result<(), BoxError> {
    push_snapshot_tag(reg, vm, tag, image, &[]).await
}

/// Pod names the stand-in treats specially (see [`ScriptedNode`]).
pub type PodSet = Arc<Mutex<HashSet<String>>>;

/// How the stand-in for the node agent behaves.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// Hibernate pods carrying `vm.cocoonstack.io/hibernate=true`: push a real
    /// `<vm>:hibernate` artifact to this registry (recording the pod's image), then, in one
    /// patch, clear the VM id and write lifecycle `hibernated` at the stamp. Without it such
    /// pods are brought up like any other.
    pub hibernate_to: Option<RegistryClient>,
    /// Number the VM ids of fresh boots (`id-<pod>-<n>`) so that a re-created VM is told
    /// apart; otherwise a fresh VM is `id-<pod>`.
    pub numbered_boots: bool,
}

/// The running stand-in for the node agent.
pub struct ScriptedNode {
    /// The watch loop.
    pub task: JoinHandle<()>,
    /// Pods reported as lifecycle `failed` with the Ready condition `False`.
    pub fail: PodSet,
    /// Pods whose hibernate is refused (left alone, as a macOS agent would).
    pub refuse: PodSet,
    /// Pods the stand-in leaves alone entirely while listed: the test writes their node-side
    /// state itself, for example to hold a hibernate between two of the agent's writes.
    pub hold: PodSet,
}

/// Starts the stand-in for the node agent on the pods of `ns`: for pods the scheduler bound (or
/// that carry spec.nodeName) it writes what the node agent writes — VM id and IP, lifecycle
/// `ready` at the stamped generation (or `failed` for pods in [`ScriptedNode::fail`]), the
/// container running and the Ready condition; it never touches a static toolbox's runtime
/// identity; it hibernates as [`Script::hibernate_to`] says; and it completes pod deletions
/// as a kubelet does.
pub fn node_actor(client: &Client, ns: &str, script: Script) -> ScriptedNode {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let fail: PodSet = Arc::default();
    let refuse: PodSet = Arc::default();
    let hold: PodSet = Arc::default();
    let (f, r, h) = (fail.clone(), refuse.clone(), hold.clone());
    let task = tokio::spawn(async move {
        let mut boots = 0u64;
        let mut stream = watcher(pods.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        // A watch error (an expired resource version, a dropped connection) is followed by
        // the backoff's re-list: skip it rather than end the loop.
        while let Some(ev) = stream.next().await {
            let Ok(pod) = ev else { continue };
            let name = pod.name_any();
            if h.lock().map(|s| s.contains(&name)).unwrap_or(false) {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                // The kubelet's part of a delete: confirm it, for this incarnation only (an old
                // event must not delete a pod recreated under the same name).
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: pod.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                // No later event may come for a pod that is only waiting for this, so a
                // failed attempt is retried at once, a few times.
                for _ in 0..3 {
                    let done = pods.delete(&name, &params).await.map(|_| ());
                    let failed = match &done {
                        Ok(()) => false,
                        Err(kube::Error::Api(s)) => s.code != 404 && s.code != 409,
                        Err(_) => true,
                    };
                    note(&name, "confirm delete", done);
                    if !failed {
                        break;
                    }
                }
                continue;
            }
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                continue;
            }
            let a = pod.annotations();
            let get = |k: &str| a.get(k).cloned().unwrap_or_default();
            let stamp = get("cocoonset.cocoonstack.io/generation");
            if let Some(reg) = &script.hibernate_to
                && get(HIBERNATE) == "true"
            {
                let refused = r.lock().map(|s| s.contains(&name)).unwrap_or(false);
                if refused {
                    continue;
                }
                let done = get("vm.cocoonstack.io/lifecycle-state") == "hibernated"
                    && get("vm.cocoonstack.io/lifecycle-observed-generation") == stamp
                    && get("vm.cocoonstack.io/id").is_empty();
                if done {
                    continue;
                }
                // Snapshot first, then report: the operator's gate needs both.
                let vm = get("vm.cocoonstack.io/name");
                let image = get("cocoonset.cocoonstack.io/image");
                if push_tag(reg, &vm, "hibernate", &image).await.is_err() {
                    continue;
                }
                let patch = json!({"metadata": {"annotations": {
                    "vm.cocoonstack.io/id": null,
                    "vm.cocoonstack.io/lifecycle-state": "hibernated",
                    "vm.cocoonstack.io/lifecycle-observed-generation": stamp}}});
                let done = pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                note(&name, "patch annotations", done.map(|_| ()));
                continue;
            }
            let failing = f.lock().map(|s| s.contains(&name)).unwrap_or(false);
            let state = if failing { "failed" } else { "ready" };
            let id = match a.get("vm.cocoonstack.io/id").cloned() {
                Some(id) if !id.is_empty() || !script.numbered_boots => id,
                _ if script.numbered_boots => {
                    boots += 1;
                    format!("id-{name}-{boots}")
                }
                _ => format!("id-{name}"),
            };
            let want = [
                ("vm.cocoonstack.io/id", id.as_str()),
                ("vm.cocoonstack.io/ip", "10.1.0.7"),
                ("vm.cocoonstack.io/lifecycle-state", state),
                (
                    "vm.cocoonstack.io/lifecycle-observed-generation",
                    stamp.as_str(),
                ),
            ];
            // The node agent never touches a static toolbox's runtime identity.
            let is_static =
                a.get("cocoonset.cocoonstack.io/mode").map(String::as_str) == Some("static");
            if !is_static
                && want
                    .iter()
                    .any(|(k, v)| a.get(*k).map(String::as_str) != Some(*v))
            {
                let patch = json!({"metadata": {"annotations": want.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()}});
                let done = pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                note(&name, "patch annotations", done.map(|_| ()));
            }
            let ready = if failing { "False" } else { "True" };
            let st = pod.status.as_ref();
            let phase_ok = st.and_then(|s| s.phase.as_deref()) == Some("Running");
            let ready_ok = st
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == ready));
            if !(phase_ok && ready_ok) {
                let status = json!({"status": {"phase": "Running",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": ready}],
                    "containerStatuses": [{"name": "agent", "ready": !failing, "restartCount": 0,
                        "image": "ghcr.io/cocoonstack/placeholder:latest", "imageID": "",
                        "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}]}});
                let done = pods
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
                note(&name, "patch status", done.map(|_| ()));
            }
        }
    });
    ScriptedNode {
        task,
        fail,
        refuse,
        hold,
    }
}

/// Logs a failed write of the stand-in (the next watch event of the pod retries it), so that a
/// test stuck behind one says why.
fn note(pod: &str, what: &str, result: Result<(), kube::Error>) {
    match result {
        Ok(()) => {}
        // Gone already, or the incarnation changed: nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!(pod, what, error = %e, "scripted node: write failed"),
    }
}

/// The stand-in of the suspend and migrate tests: it hibernates into the registry at
/// `registry_addr` ([`registry_client`]) and numbers fresh boots.
pub fn hibernating_node_actor(client: &Client, ns: &str, registry_addr: &str) -> ScriptedNode {
    let script = Script {
        hibernate_to: Some(registry_client(registry_addr)),
        numbered_boots: true,
    };
    node_actor(client, ns, script)
}

/// Releases a refused hibernate: clears the refusals and touches the pod so the stand-in,
/// which acts on watch events only, looks at it again.
pub async fn stop_refusing(refuse: &PodSet, pods: &Api<Pod>, name: &str) -> Result<(), BoxError> {
    if let Ok(mut s) = refuse.lock() {
        s.clear();
    }
    let poke = json!({"metadata": {"annotations": {"test.cocoonstack.io/poke": cocoon_testenv::unique_name("p")}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&poke))
        .await?;
    Ok(())
}

/// Polls (every [`WAIT`] at the most) until the CocoonSet `name` exists and satisfies `check`.
pub async fn wait_set(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name}: {what}"), WAIT, || async {
        let cs = sets.get_opt(name).await.ok().flatten()?;
        check(&cs).then_some(cs)
    })
    .await
}

/// [`wait_set`] through a watch, which sees every status version: a state left again within
/// moments (Failed, when the status change brings the retry) would be missed by polling.
pub async fn wait_set_watched(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    wait_set_watched_within(sets, name, what, WAIT, check).await
}

/// [`wait_set_watched`] with its own deadline; a timeout reports the last status seen.
pub async fn wait_set_watched_within(
    sets: &Api<CocoonSet>,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&CocoonSet) -> bool,
) -> Result<CocoonSet, cocoon_testenv::Error> {
    let timeout = |last: String| cocoon_testenv::Error::Timeout {
        what: format!("{name}: {what}"),
        after: within,
        last,
    };
    let cond = |cs: Option<&CocoonSet>| cs.is_some_and(&check);
    match tokio::time::timeout(
        within,
        kube::runtime::wait::await_condition(sets.clone(), name, cond),
    )
    .await
    {
        Ok(Ok(Some(cs))) => Ok(cs),
        Ok(Ok(None)) => Err(timeout("the set is gone".into())),
        Ok(Err(e)) => Err(timeout(format!("watch failed: {e}"))),
        Err(_) => Err(timeout(
            sets.get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|cs| cs.status)
                .map(|s| format!("status {s:?}"))
                .unwrap_or_else(|| "no status".into()),
        )),
    }
}

/// Whether the set's status is phase `p` at the set's current generation.
pub fn phase_is(cs: &CocoonSet, p: CocoonSetPhase) -> bool {
    let s = cs.status.as_ref();
    s.and_then(|s| s.phase) == Some(p) && s.map(|s| s.observed_generation) == cs.metadata.generation
}

/// The reasons of every Event in `ns` (none if the list fails).
pub async fn event_reasons(client: &Client, ns: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items.into_iter().filter_map(|e| e.reason).collect())
        .unwrap_or_default()
}

/// Waits until an Event with `reason` exists in `ns`.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    reason: &str,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("event {reason}"), WAIT, || async {
        event_reasons(client, ns)
            .await
            .iter()
            .any(|r| r == reason)
            .then_some(())
    })
    .await
}

/// Waits until `<vm>:hibernate` is `present` in the registry (or absent).
pub async fn wait_tag(
    reg: &RegistryClient,
    vm: &str,
    present: bool,
) -> Result<(), cocoon_testenv::Error> {
    cocoon_testenv::wait_until(
        &format!("{vm}:hibernate present={present}"),
        WAIT,
        || async { (reg.has_manifest(vm, "hibernate").await.ok()? == present).then_some(()) },
    )
    .await
}

/// `n` fresh schedulable Nodes in `pool`.
pub async fn nodes(
    client: &Client,
    pool: &str,
    n: usize,
) -> Result<Vec<cocoon_testenv::TestNode>, BoxError> {
    let mut out = Vec::new();
    for _ in 0..n {
        let node = cocoon_testenv::TestNode::in_pool(
            client,
            &cocoon_testenv::unique_name("cs-node"),
            pool,
        )
        .await?;
        node.wait_schedulable(WAIT).await?;
        out.push(node);
    }
    Ok(out)
}

/// Cordons (`on`) or uncordons a Node.
pub async fn cordon(client: &Client, node: &str, on: bool) -> Result<(), BoxError> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"unschedulable": on}})),
    )
    .await?;
    Ok(())
}

/// A CocoonSet spec in `pool` with `replicas` sub-agents and the main-only snapshot policy.
pub fn spec(pool: &str, replicas: i32) -> CocoonSetSpec {
    let mut s = CocoonSetSpec::with_image("ghcr.io/cocoonstack/cocoon/ubuntu:24.04");
    s.node_pool = pool.into();
    s.agent.replicas = replicas;
    s.snapshot_policy = SnapshotPolicy::MainOnly;
    s
}

/// The two toolboxes of the lifecycle tests: `tb`, a run toolbox on `image`, and `st`, a
/// static one (IP 10.9.9.9, VM id `ext-1`, VNC port 5901).
pub fn two_toolboxes(image: &str) -> Vec<ToolboxSpec> {
    vec![
        ToolboxSpec {
            name: "tb".into(),
            image: image.into(),
            ..ToolboxSpec::default()
        },
        ToolboxSpec {
            name: "st".into(),
            mode: ToolboxMode::Static,
            static_ip: "10.9.9.9".into(),
            static_vm_id: "ext-1".into(),
            vnc_port: 5901,
            ..ToolboxSpec::default()
        },
    ]
}

/// Sets or clears `spec.suspend` of the set.
pub async fn set_suspend(sets: &Api<CocoonSet>, name: &str, on: bool) -> Result<(), BoxError> {
    sets.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": on}})),
    )
    .await?;
    Ok(())
}

/// Waits until the pod is bound and returns its node.
pub async fn node_of(pods: &Api<Pod>, name: &str) -> Result<String, cocoon_testenv::Error> {
    cocoon_testenv::wait_until(&format!("{name} bound"), WAIT, || async {
        let p = pods.get_opt(name).await.ok().flatten()?;
        p.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty())
    })
    .await
}
