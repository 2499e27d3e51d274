//! The kubelet HTTPS API of `node.md` §13 (container logs, exec, stats, the not-implemented
//! streaming routes) and the plain-HTTP `/metrics` listener, both stopped by a cancellation
//! token.
//!
//! The pod side plugs in through [`PodBackend`]: it answers logs and exec for one pod and
//! per-pod usage figures; node-level figures come from the host (`/proc`, statfs) here. TLS
//! uses rustls with the ring provider passed explicitly; connections are served by hyper's
//! HTTP/1.1 server (with upgrades, for exec) and an axum router. Not-implemented routes answer
//! HTTP 501 with the spec's message.
//!
//! Routes (kubelet paths as the API server proxy uses them):
//! * `GET /containerLogs/{ns}/{pod}/{container}?tailLines=N` (default tail 200);
//!   `follow=true` keeps the response open and streams the lines the log gains
//!   ([`follow_from`]), until the VM is gone, the client hangs up, the stream is idle for the
//!   streaming idle timeout or the server stops. One reader per pod serves all its followers
//!   (`follow.rs`)
//! * `GET|POST /exec/{ns}/{pod}/{container}?command=..&stdin=1&stdout=1&stderr=1`: the
//!   remote-command protocol over SPDY/3.1 ([`exec`])
//! * `/attach/...`, `/portForward/...` → 501 with the message below
//! * `GET /stats/summary` (kubelet stats API v1alpha1 JSON subset)
//! * `GET /metrics/resource` (Prometheus text)
//! * `GET /metrics`: the agent's own registry ([`MetricsText`], every `cocoon_vk_*` family), the
//!   same OpenMetrics text the `VK_METRICS_ADDR` listener serves, so Prometheus can scrape
//!   node agents the way it scrapes kubelets: node discovery, the kubelet endpoint port, a
//!   bearer token allowed `get` on `nodes/metrics` (issue 36 item 3). Always on: it is behind
//!   the same authentication and authorization as every other route
//! * `GET /healthz` → `ok`
//!
//! Bounds ([`limits`], issue 26 item 8): a logs answer carries at most
//! `VK_LOG_MAX_BYTES` (lines cut at `VK_LOG_MAX_LINE_BYTES`), and the runtime's capture never
//! holds more; at most `VK_LOG_READS_PER_NODE` captures run (and wait for their client) at
//! once; followers and exec sessions beyond their per-pod / per-node limits get HTTP 429
//! naming the limit; at most `VK_KUBELET_PREAUTH_CONNECTIONS` connections wait for
//! authentication (more are closed at accept) and a TLS handshake may take
//! `VK_KUBELET_TLS_HANDSHAKE_TIMEOUT`; exec sessions and followed logs moving no data for
//! `VK_STREAMING_CONNECTION_IDLE_TIMEOUT` (4 h, the kubelet's default) are closed.
//!
//! Every route is behind [`auth`]: client certificate (verified against the client CA) or
//! bearer token (TokenReview), then a SubjectAccessReview on `nodes/<subresource>`, as the
//! kubelet does with webhook authentication and authorization (`/metrics` and `/metrics/*`:
//! `get nodes/metrics`). The spec's "client
//! certificates are not required" is kept in that a client may present none and use a token.
//! The reviews and their bounded caches are [`review`], which the operator's secure `/metrics`
//! uses too.

pub mod auth;
pub mod exec;
mod follow;
pub mod heartbeat;
pub mod limits;
pub mod review;
mod server;
pub mod spdy;
pub mod tls;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use k8s_openapi::jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::{KubeReviewer, KubeletAuth, PeerIdentity, Reviewer};
pub use limits::KubeletLimits;
pub use server::{KubeletServer, MetricsServer};
pub use tls::{TlsError, TlsMaterial, load_client_ca};

/// Body of a logs request for a pod with no live VM.
pub const NO_LIVE_VM_BODY: &str = "vk-cocoon: pod has no live VM\n";
/// Error text of the attach route.
pub const ATTACH_NOT_IMPLEMENTED: &str = "vk-cocoon: AttachToContainer is not implemented";
/// Error text of the port-forward route.
pub const PORT_FORWARD_NOT_IMPLEMENTED: &str = "vk-cocoon: PortForward is not implemented";
/// Default `tailLines` of the logs route.
pub const DEFAULT_TAIL_LINES: u32 = 200;
/// Container name reported for every pod.
pub const CONTAINER_NAME: &str = "agent";
/// Grace given to in-flight requests on shutdown (`node.md` §15).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the kubelet API needs from the node besides its pods ([`PodBackend`]): the host's own
/// usage, for `/stats/summary` and `/metrics/resource`.
pub trait NodeUsage: Send + Sync {
    /// Busy CPU seconds of the host.
    fn node_cpu_seconds(&self) -> Option<f64>;
    /// Memory in use on the host, in bytes.
    fn memory_used_bytes(&self) -> Option<u64>;
}

/// The agent's metrics registry, which `/metrics` serves (on the kubelet API and on the plain
/// listener of [`MetricsServer`]).
pub trait MetricsText: Send + Sync {
    /// The registry in the OpenMetrics text format.
    fn render(&self) -> String;
}

/// An error of the pod side, reported to the client as HTTP 500 with its text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// Per-pod usage for `/stats/summary` and `/metrics/resource`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodStats {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Cumulative hypervisor CPU time.
    pub cpu_usage_ns: u64,
    /// Hypervisor RSS (reported as working set).
    pub memory_rss_bytes: u64,
    /// TAP counters summed over NICs.
    pub network_rx_bytes: u64,
    pub network_tx_bytes: u64,
}

/// The standard streams of one exec, as the kubelet API hands them to the pod side.
pub struct ExecIo {
    /// argv (the request's `command` parameters).
    pub command: Vec<String>,
    /// A TTY was requested (stderr is then merged into stdout by the client's choice).
    pub tty: bool,
    /// The client's stdin, when requested; EOF when the client closes it.
    pub stdin: Option<cocoon_runtime::ByteReader>,
    /// The client's stdout, when requested.
    pub stdout: Option<cocoon_runtime::ByteWriter>,
    /// The client's stderr, when requested.
    pub stderr: Option<cocoon_runtime::ByteWriter>,
}

impl std::fmt::Debug for ExecIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecIo")
            .field("command", &self.command)
            .field("tty", &self.tty)
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .finish()
    }
}

/// How an exec ended, if not with exit code 0.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The pod has no live VM (untracked, hibernated, or unmanaged).
    #[error("vk-cocoon: pod {namespace}/{pod} has no live VM")]
    NoLiveVm { namespace: String, pod: String },
    /// The guest command exited non-zero; the code reaches the client (`kubectl exec` exits
    /// with it).
    #[error("command terminated with non-zero exit code: exit {0}")]
    ExitCode(i32),
    /// The runtime failed to run the command.
    #[error("{0}")]
    Failed(String),
}

/// What the kubelet API needs from the pod side.
#[async_trait]
pub trait PodBackend: Send + Sync + 'static {
    /// The last `tail` log lines of the pod's VM (`cocoon vm logs --tail`), at most the newest
    /// `max_bytes` of them (the capture itself must stay within that); `Ok(None)` when the
    /// pod has no live VM (the route then answers [`NO_LIVE_VM_BODY`]).
    async fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail: u32,
        max_bytes: usize,
    ) -> Result<Option<Vec<u8>>, BackendError>;

    /// Runs `io.command` in the pod's VM (`cocoon vm exec`) with the given streams. A pod with
    /// no live VM is [`ExecError::NoLiveVm`]; a non-zero guest exit is [`ExecError::ExitCode`].
    /// The streams are dropped (closed) when the call returns.
    async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        io: ExecIo,
    ) -> Result<(), ExecError>;

    /// Usage of every pod with a live VM.
    async fn stats(&self) -> Result<Vec<PodStats>, BackendError>;

    /// A stream into the pod opened (an exec session, a followed log); the answer is held
    /// until the stream ends, so the pod side can count open streams as the VM's activity
    /// (issue 39). Default: nothing is counted.
    fn stream_opened(&self, _namespace: &str, _pod: &str) -> Option<StreamToken> {
        None
    }
}

/// What [`PodBackend::stream_opened`] hands back: dropped when the stream ends.
pub type StreamToken = Box<dyn std::any::Any + Send + Sync>;

/// Errors starting a listener.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

struct ApiState {
    backend: Arc<dyn PodBackend>,
    host: Arc<dyn NodeUsage>,
    /// The agent's registry, served on `/metrics`.
    metrics: Arc<dyn MetricsText>,
    node_name: String,
    started: Timestamp,
    /// Exec sessions running on upgraded connections.
    sessions: TaskTracker,
    /// Cancelled when the server stops for good (after the shutdown grace).
    cancel: CancellationToken,
    /// Cancelled when the server starts stopping (followed logs end there).
    stopping: CancellationToken,
    limits: KubeletLimits,
    /// Followed-log slots per pod and per node.
    followers: limits::Slots,
    /// Exec session slots per pod and per node.
    exec_slots: limits::Slots,
    /// The shared readers of followed logs.
    feeds: follow::Feeds,
    /// Log captures in progress (each up to `log_max_bytes` until sent).
    log_reads: Arc<tokio::sync::Semaphore>,
}

type Shared = Arc<ApiState>;

/// The router of the kubelet API behind `auth` (exposed for in-process tests without TLS:
/// a request carries its client identity as a [`PeerIdentity`] extension).
pub fn router(
    backend: Arc<dyn PodBackend>,
    host: impl NodeUsage + 'static,
    metrics: Arc<dyn MetricsText>,
    node_name: &str,
    auth: KubeletAuth,
) -> Router {
    router_with(
        backend,
        Arc::new(host),
        metrics,
        node_name,
        auth,
        TaskTracker::new(),
        CancellationToken::new(),
        CancellationToken::new(),
        KubeletLimits::default(),
    )
}

#[allow(clippy::too_many_arguments)]
fn router_with(
    backend: Arc<dyn PodBackend>,
    host: Arc<dyn NodeUsage>,
    metrics: Arc<dyn MetricsText>,
    node_name: &str,
    auth: KubeletAuth,
    sessions: TaskTracker,
    cancel: CancellationToken,
    stopping: CancellationToken,
    limits: KubeletLimits,
) -> Router {
    let state: Shared = Arc::new(ApiState {
        backend,
        host,
        metrics,
        node_name: node_name.to_string(),
        started: Timestamp::now(),
        sessions,
        cancel,
        stopping,
        limits,
        followers: limits::Slots::new(limits.log_followers_per_pod, limits.log_followers_per_node),
        exec_slots: limits::Slots::new(limits.exec_sessions_per_pod, limits.exec_sessions_per_node),
        feeds: follow::Feeds::default(),
        log_reads: Arc::new(tokio::sync::Semaphore::new(limits.log_reads_per_node)),
    });
    Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route(
            "/exec/{ns}/{pod}/{container}",
            get(exec_route).post(exec_route),
        )
        .route(
            "/attach/{*rest}",
            any(|| not_implemented(ATTACH_NOT_IMPLEMENTED)),
        )
        .route(
            "/portForward/{*rest}",
            any(|| not_implemented(PORT_FORWARD_NOT_IMPLEMENTED)),
        )
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/metrics", get(node_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
        // Every route, also the unknown ones, is behind authentication and authorization.
        .layer(axum::middleware::from_fn_with_state(auth, auth::middleware))
}

/// How the kubelet API authenticates and authorizes its clients.
#[derive(Debug, Clone)]
pub struct ApiSecurity {
    /// Client certificates are verified against these CAs (`VK_CLIENT_CA_FILE`); empty: no
    /// client certificate is accepted, every request needs a bearer token.
    pub client_ca: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// Token review, access review and their caches.
    pub auth: KubeletAuth,
}

async fn not_implemented(msg: &'static str) -> Response {
    (StatusCode::NOT_IMPLEMENTED, msg).into_response()
}

fn backend_failure(e: &BackendError) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
}

async fn exec_route(
    State(st): State<Shared>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    req: axum::extract::Request,
) -> Response {
    exec::handle(
        st.backend.clone(),
        &st.sessions,
        &st.cancel,
        &st.exec_slots,
        st.limits.streaming_idle_timeout,
        exec::Target {
            namespace,
            pod,
            container,
        },
        req,
    )
}

#[derive(Debug, serde::Deserialize)]
struct LogQuery {
    #[serde(rename = "tailLines")]
    tail_lines: Option<String>,
    /// `true` (or `1`) streams the log as it grows, as `kubectl logs -f` asks.
    follow: Option<String>,
}

/// How often a followed log is read again.
pub const FOLLOW_POLL: Duration = Duration::from_millis(500);
/// How many lines from the end a followed log is read with each time: more lines than this
/// arriving within one [`FOLLOW_POLL`] leave a gap (the newest ones are streamed).
pub const FOLLOW_WINDOW: u32 = 2000;

/// Where the new lines start in `fetched` (a tail of the log read now), given `seen` (the
/// tail read before): the end of the longest stretch at which `fetched` continues `seen`
/// (the smallest such position when several overlap equally, so a repeated line is not
/// dropped); 0, everything new, when they do not overlap. The runtime answers tails only,
/// so identical lines around the seam are ambiguous; the console's timestamps make that rare.
pub fn follow_from<T: PartialEq>(seen: &[T], fetched: &[T]) -> usize {
    let mut best: Option<(usize, usize)> = None;
    for end in 1..=fetched.len() {
        let overlap = end.min(seen.len());
        if overlap == 0 {
            break;
        }
        if fetched[end - overlap..end] == seen[seen.len() - overlap..]
            && best.is_none_or(|(o, _)| overlap > o)
        {
            best = Some((overlap, end));
        }
    }
    best.map_or(0, |(_, end)| end)
}

fn log_lines(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A refusal of a stream beyond its limit: HTTP 429 with the limit named.
fn too_many(msg: String) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

/// A response body of `bytes` (sent with its `Content-Length`) that keeps `permit` until
/// hyper is done with it, so the log-read limit also bounds answers waiting for a slow client.
fn body_holding(bytes: Vec<u8>, permit: tokio::sync::OwnedSemaphorePermit) -> axum::body::Body {
    struct Held {
        bytes: Option<axum::body::Bytes>,
        _permit: tokio::sync::OwnedSemaphorePermit,
    }
    impl axum::body::HttpBody for Held {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
            std::task::Poll::Ready(self.bytes.take().map(|b| Ok(hyper::body::Frame::data(b))))
        }

        fn is_end_stream(&self) -> bool {
            self.bytes.is_none()
        }

        fn size_hint(&self) -> hyper::body::SizeHint {
            hyper::body::SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
        }
    }
    axum::body::Body::new(Held {
        bytes: Some(bytes.into()),
        _permit: permit,
    })
}

async fn container_logs(
    State(st): State<Shared>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    // An unparsable or negative tailLines falls back to the default rather than failing.
    let tail = q
        .tail_lines
        .and_then(|t| t.parse::<u32>().ok())
        .unwrap_or(DEFAULT_TAIL_LINES);
    let follow = matches!(q.follow.as_deref(), Some("true" | "1"));
    let who = format!("{ns}/{pod}");
    // A follower's slot is taken before any work is done for it.
    let slot = if follow {
        match st.followers.try_acquire(&who) {
            Ok(slot) => Some(slot),
            Err(refusal) => {
                let msg = limits::refusal_message("log followers", &who, &refusal);
                tracing::info!(namespace = %ns, pod = %pod, "{msg}");
                return too_many(msg);
            }
        }
    } else {
        None
    };
    let lim = st.limits;
    let Ok(read_permit) = st.log_reads.clone().try_acquire_owned() else {
        let msg = format!(
            "vk-cocoon: too many concurrent log reads on this node (limit {}, VK_LOG_READS_PER_NODE)",
            lim.log_reads_per_node
        );
        tracing::info!(namespace = %ns, pod = %pod, "{msg}");
        return too_many(msg);
    };
    match st
        .backend
        .logs(&ns, &pod, &container, tail, lim.log_max_bytes)
        .await
    {
        Ok(Some(body)) => {
            let body = limits::bound_log(&body, lim.log_max_bytes, lim.log_max_line_bytes);
            match slot {
                Some(slot) => {
                    let feed = st.feeds.join(
                        st.backend.clone(),
                        &ns,
                        &pod,
                        &container,
                        lim,
                        &log_lines(&body),
                        &st.stopping,
                        st.log_reads.clone(),
                    );
                    drop(read_permit);
                    let open = st.backend.stream_opened(&ns, &pod);
                    let stream = follow::body(
                        feed,
                        body,
                        (slot, open),
                        lim.streaming_idle_timeout,
                        st.stopping.clone(),
                        who,
                    );
                    ([(header::CONTENT_TYPE, "text/plain")], stream).into_response()
                }
                None => (
                    [(header::CONTENT_TYPE, "text/plain")],
                    body_holding(body, read_permit),
                )
                    .into_response(),
            }
        }
        Ok(None) => ([(header::CONTENT_TYPE, "text/plain")], NO_LIVE_VM_BODY).into_response(),
        Err(e) => {
            tracing::warn!(namespace = %ns, pod = %pod, error = %e, "container logs failed");
            backend_failure(&e)
        }
    }
}

/// Node figures at request time: busy CPU ns and memory in use.
fn node_usage(host: &dyn NodeUsage) -> (u64, u64) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cpu_ns = host
        .node_cpu_seconds()
        .map_or(0, |s| (s * 1_000_000_000.0) as u64);
    (cpu_ns, host.memory_used_bytes().unwrap_or(0))
}

async fn stats_summary(State(st): State<Shared>) -> Response {
    let pods = match st.backend.stats().await {
        Ok(p) => p,
        Err(e) => return backend_failure(&e),
    };
    let now = Timestamp::now().to_string();
    let started = st.started.to_string();
    let (node_cpu, node_mem) = node_usage(st.host.as_ref());
    let pods: Vec<_> = pods
        .iter()
        .map(|p| {
            let cpu = serde_json::json!({ "time": now, "usageCoreNanoSeconds": p.cpu_usage_ns });
            let mem = serde_json::json!({
                "time": now,
                "workingSetBytes": p.memory_rss_bytes,
                "rssBytes": p.memory_rss_bytes,
                "usageBytes": p.memory_rss_bytes,
            });
            serde_json::json!({
                "podRef": { "name": p.name, "namespace": p.namespace, "uid": p.uid },
                "startTime": started,
                "containers": [{
                    "name": CONTAINER_NAME, "startTime": started, "cpu": cpu, "memory": mem,
                }],
                "cpu": cpu,
                "memory": mem,
                "network": {
                    "time": now, "name": "eth0",
                    "rxBytes": p.network_rx_bytes, "txBytes": p.network_tx_bytes,
                    "interfaces": [{
                        "name": "eth0",
                        "rxBytes": p.network_rx_bytes, "txBytes": p.network_tx_bytes,
                    }],
                },
            })
        })
        .collect();
    let body = serde_json::json!({
        "node": {
            "nodeName": st.node_name,
            "startTime": started,
            "cpu": { "time": now, "usageCoreNanoSeconds": node_cpu },
            "memory": { "time": now, "workingSetBytes": node_mem, "usageBytes": node_mem },
        },
        "pods": pods,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Escapes a Prometheus label value.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The `/metrics/resource` text for `pods` and the node figures.
pub fn render_resource_metrics(pods: &[PodStats], node_cpu_ns: u64, node_mem: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let secs = |ns: u64| ns as f64 / 1e9;
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), secs(node_cpu_ns).to_string())],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), node_mem.to_string())],
    );
    let container_labels = |p: &PodStats| {
        format!(
            "{{container=\"{CONTAINER_NAME}\",namespace=\"{}\",pod=\"{}\"}}",
            esc(&p.namespace),
            esc(&p.name)
        )
    };
    let pod_labels = |p: &PodStats| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            esc(&p.namespace),
            esc(&p.name)
        )
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        pods.iter()
            .map(|p| (container_labels(p), secs(p.cpu_usage_ns).to_string()))
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        pods.iter()
            .map(|p| (container_labels(p), p.memory_rss_bytes.to_string()))
            .collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods.iter()
            .map(|p| (pod_labels(p), secs(p.cpu_usage_ns).to_string()))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods.iter()
            .map(|p| (pod_labels(p), p.memory_rss_bytes.to_string()))
            .collect(),
    );
    out
}

async fn metrics_resource(State(st): State<Shared>) -> Response {
    let pods = match st.backend.stats().await {
        Ok(p) => p,
        Err(e) => return backend_failure(&e),
    };
    let (cpu, mem) = node_usage(st.host.as_ref());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render_resource_metrics(&pods, cpu, mem),
    )
        .into_response()
}

/// The agent's registry in the OpenMetrics text format: the answer of `/metrics` on both the
/// kubelet API and the `VK_METRICS_ADDR` listener.
fn openmetrics(metrics: &dyn MetricsText) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
        .into_response()
}

async fn node_metrics(State(st): State<Shared>) -> Response {
    openmetrics(st.metrics.as_ref())
}

#[cfg(test)]
mod tests {
    use super::follow_from;

    #[test]
    fn new_lines_start_where_the_fetched_tail_continues_the_seen_one() {
        let cases: &[(&[&str], &[&str], usize, &str)] = &[
            (&[], &["a", "b"], 0, "nothing seen yet: all new"),
            (&["a", "b"], &["a", "b"], 2, "unchanged"),
            (
                &["a", "b"],
                &["a", "b", "c"],
                2,
                "the log grew, whole tail kept",
            ),
            (
                &["a", "b", "c"],
                &["b", "c", "d"],
                2,
                "the window slid by one",
            ),
            (
                &["a", "b", "c"],
                &["c", "d", "e"],
                1,
                "the window slid by two",
            ),
            (&["a", "b"], &["x", "y"], 0, "no overlap: a gap, all new"),
            (
                &["x", "x"],
                &["x", "x", "x"],
                2,
                "a repeated line is not dropped",
            ),
            (&["a", "b"], &[], 0, "the log is empty now"),
        ];
        for (seen, fetched, want, what) in cases {
            assert_eq!(follow_from(seen, fetched), *want, "{what}");
        }
    }
}
