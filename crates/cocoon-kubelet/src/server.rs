//! The listeners: the kubelet HTTPS server (TLS, the pre-authentication bound, the accept loop
//! and its heartbeat, graceful shutdown) and the plain-HTTP `/metrics` listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::heartbeat::{BEAT_EVERY, Heartbeat};
use super::{
    ApiSecurity, KubeletLimits, MetricsText, NodeUsage, PeerIdentity, PodBackend, SHUTDOWN_GRACE,
    ServeError, TlsMaterial, limits, openmetrics, router_with,
};

/// A running kubelet HTTPS server.
#[derive(Debug)]
pub struct KubeletServer {
    local_addr: SocketAddr,
    certificate: Vec<u8>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    heartbeat: Heartbeat,
}

impl KubeletServer {
    /// Binds `addr` (port 0 picks a free port) and serves the API until `parent` is cancelled
    /// or [`KubeletServer::shutdown`] is called, with the default [`KubeletLimits`]; `/metrics`
    /// serves `metrics`.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        addr: SocketAddr,
        tls: &TlsMaterial,
        security: ApiSecurity,
        backend: Arc<dyn PodBackend>,
        host: impl NodeUsage + 'static,
        metrics: Arc<dyn MetricsText>,
        node_name: &str,
        parent: &CancellationToken,
    ) -> Result<Self, ServeError> {
        Self::start_with_limits(
            addr,
            tls,
            security,
            backend,
            host,
            metrics,
            node_name,
            parent,
            KubeletLimits::default(),
        )
        .await
    }

    /// [`KubeletServer::start`] with the given limits.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_with_limits(
        addr: SocketAddr,
        tls: &TlsMaterial,
        security: ApiSecurity,
        backend: Arc<dyn PodBackend>,
        host: impl NodeUsage + 'static,
        metrics: Arc<dyn MetricsText>,
        node_name: &str,
        parent: &CancellationToken,
        limits: KubeletLimits,
    ) -> Result<Self, ServeError> {
        let acceptor = TlsAcceptor::from(tls.server_config(&security.client_ca)?);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        let cancel = parent.child_token();
        let tasks = TaskTracker::new();
        // Exec sessions outlive their HTTP request; they stop once the grace is over.
        let sessions_stop = CancellationToken::new();
        let app = router_with(
            backend,
            Arc::new(host),
            metrics,
            node_name,
            security.auth,
            tasks.clone(),
            sessions_stop.clone(),
            cancel.clone(),
            limits,
        );
        let heartbeat = Heartbeat::new("kubelet API accept", BEAT_EVERY);
        let task = tokio::spawn(accept_loop(
            listener,
            acceptor,
            app,
            cancel.clone(),
            tasks,
            sessions_stop,
            limits,
            heartbeat.clone(),
        ));
        tracing::info!(
            addr = %local_addr,
            self_signed = tls.self_signed,
            client_ca = !security.client_ca.is_empty(),
            "kubelet API listening"
        );
        Ok(KubeletServer {
            local_addr,
            certificate: tls.chain.first().map(|c| c.to_vec()).unwrap_or_default(),
            cancel,
            task,
            heartbeat,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The accept loop's heartbeat, for the systemd watchdog.
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat.clone()
    }

    /// The bound port, for `status.daemonEndpoints.kubeletEndpoint.port`.
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// DER of the serving certificate (tests pin it).
    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate
    }

    /// Stops accepting, gives in-flight requests [`SHUTDOWN_GRACE`], then returns.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Err(e) = self.task.await
            && e.is_panic()
        {
            tracing::error!(error = %e, "kubelet API task panicked");
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    cancel: CancellationToken,
    tasks: TaskTracker,
    sessions_stop: CancellationToken,
    limits: KubeletLimits,
    heartbeat: Heartbeat,
) {
    // Connections not yet authenticated: a client that opens connections and never finishes
    // a handshake or a request holds one of these, never more than the limit.
    let preauth = Arc::new(tokio::sync::Semaphore::new(limits.preauth_connections));
    let mut refused_logged = false;
    let mut idle = tokio::time::interval(BEAT_EVERY);
    loop {
        heartbeat.beat();
        let (tcp, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            _ = idle.tick() => continue,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Accept errors (EMFILE and the like) are transient; back off briefly so
                    // the loop does not spin.
                    tracing::warn!(error = %e, "kubelet API accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = preauth.clone().try_acquire_owned() else {
            // Dropping the socket closes it at once; one warning per burst.
            if !refused_logged {
                tracing::warn!(
                    %peer,
                    limit = limits.preauth_connections,
                    "kubelet API: too many connections awaiting authentication; closing new ones (VK_KUBELET_PREAUTH_CONNECTIONS)"
                );
                refused_logged = true;
            }
            drop(tcp);
            continue;
        };
        refused_logged = false;
        let preauth_slot = limits::PreAuthSlot::new(permit);
        let handshake_timeout = limits.tls_handshake_timeout;
        let acceptor = acceptor.clone();
        let app = app.clone();
        let stop = cancel.clone();
        tasks.spawn(async move {
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "kubelet API TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "kubelet API TLS handshake timed out");
                    return;
                }
            };
            // The client certificate, if any, was verified against the client CA during the
            // handshake; its identity rides along with every request of the connection.
            let peer_identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|leaf| PeerIdentity::from_der(leaf.as_ref()))
                .unwrap_or_default();
            let service = TowerToHyperService::new(
                app.layer(axum::Extension(peer_identity))
                    .layer(axum::Extension(preauth_slot.clone())),
            );
            // Upgrades are on for exec; an upgraded connection leaves this future and lives
            // on in its exec session.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades();
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "kubelet API connection ended with error");
            }
            // Never authenticated: the slot is freed with the connection.
            preauth_slot.release();
        });
    }
    drop(listener);
    tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("kubelet API connections still open after the shutdown grace");
        sessions_stop.cancel();
        // Sessions end promptly once cancelled; connections still open are dropped below.
        let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    }
    sessions_stop.cancel();
}

/// A running `/metrics` listener.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Serves `GET /metrics` (OpenMetrics text of `metrics`) on `addr` until cancelled.
    pub async fn start(
        addr: SocketAddr,
        metrics: Arc<dyn MetricsText>,
        parent: &CancellationToken,
    ) -> Result<Self, ServeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        let app = Router::new().route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { openmetrics(metrics.as_ref()) }
            }),
        );
        let cancel = parent.child_token();
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(async move {
                stop.cancelled().await;
            });
            if let Err(e) = served.await {
                tracing::warn!(error = %e, "metrics listener failed");
            }
        });
        tracing::info!(addr = %local_addr, "metrics listener started");
        Ok(MetricsServer {
            local_addr,
            cancel,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the listener; in-flight scrapes get [`SHUTDOWN_GRACE`], then the task is aborted
    /// so a hung scraper cannot hold shutdown.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}
