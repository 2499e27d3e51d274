//! The admin endpoints: `/metrics` (OpenMetrics text) on the metrics address, behind
//! [`crate::metrics_auth`] unless that is turned off, and `/healthz`, `/livez` and `/readyz` on
//! the probe address (open: kubelet probes carry no token); ready once every controller cache
//! has synced.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::metrics_auth::{self, MetricsAuth};

/// Readiness shared between the controllers and the probe server.
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Readiness that needs several caches: each part reports its first complete list once, and the
/// whole is ready when every part has.
pub struct SyncGate {
    left: std::sync::atomic::AtomicUsize,
    readiness: Arc<Readiness>,
}

impl SyncGate {
    pub fn new(parts: usize, readiness: Arc<Readiness>) -> Arc<Self> {
        Arc::new(SyncGate {
            left: std::sync::atomic::AtomicUsize::new(parts),
            readiness,
        })
    }

    /// A marker for one part; calling it more than once counts once.
    pub fn part(self: &Arc<Self>) -> impl Fn() + Send + Sync + 'static {
        let gate = self.clone();
        let done = AtomicBool::new(false);
        move || {
            if !done.swap(true, Ordering::SeqCst) && gate.left.fetch_sub(1, Ordering::SeqCst) == 1 {
                gate.readiness.set_ready();
            }
        }
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

async fn ready(State(r): State<Arc<Readiness>>) -> impl IntoResponse {
    if r.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Binds both listeners (so a bad address fails start-up) and returns the serving future.
/// With `auth`, every request to the metrics listener must pass it (401/403 otherwise);
/// `None` serves `/metrics` to anyone who reaches the address.
pub async fn bind(
    metrics_addr: &str,
    probe_addr: &str,
    m: Arc<Metrics>,
    readiness: Arc<Readiness>,
    auth: Option<MetricsAuth>,
) -> std::io::Result<(
    SocketAddr,
    SocketAddr,
    impl Future<Output = std::io::Result<()>>,
)> {
    let metrics_listener = TcpListener::bind(metrics_addr).await?;
    let probe_listener = TcpListener::bind(probe_addr).await?;
    let (ma, pa) = (metrics_listener.local_addr()?, probe_listener.local_addr()?);
    let mut metrics_app = Router::new()
        .route("/metrics", get(metrics))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(m);
    if let Some(auth) = auth {
        // `layer` after the fallback: unknown paths are refused too, before any 404.
        metrics_app = metrics_app.layer(axum::middleware::from_fn_with_state(
            auth,
            metrics_auth::middleware,
        ));
    }
    let probe_app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(readiness);
    let serve = async move {
        tokio::try_join!(
            axum::serve(metrics_listener, metrics_app),
            axum::serve(probe_listener, probe_app)
        )?;
        Ok(())
    };
    Ok((ma, pa, serve))
}
