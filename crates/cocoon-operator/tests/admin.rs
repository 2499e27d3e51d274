//! The admin endpoints over real HTTP: /readyz flips only once the controller caches synced,
//! /metrics serves OpenMetrics text with the spec's names.

use std::sync::Arc;
use std::time::Duration;

use cocoon_api::crd::hibernation::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
use cocoon_operator::admin::{self, Readiness};
use cocoon_operator::hibernation::{self, decide::Timing};
use cocoon_operator::metrics::Metrics;
use cocoon_operator::registry::{OciTagRegistry, TagRegistry};
use cocoon_registry::{RegistryClient, RegistryConfig};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A plain HTTP/1.1 GET on loopback; returns (status, content-type, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ctype = raw
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, ctype, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_after_sync_and_metrics_names() {
    cocoon_testenv::run_test(|env| async move {
        let client = env.client()?;
        let ns = cocoon_testenv::create_namespace(&client, "admin").await?;
        let metrics = Arc::new(Metrics::new());
        let readiness = Arc::new(Readiness::default());
        let (maddr, paddr, serve) = admin::bind("127.0.0.1:0", "127.0.0.1:0", metrics.clone(), readiness.clone(), None).await?;
        tokio::spawn(serve);
        assert_eq!(get(paddr, "/healthz").await?.0, 200);
        assert_eq!(get(paddr, "/livez").await?.0, 200);
        assert_eq!(get(paddr, "/readyz").await?.0, 503, "not ready before any cache synced");

        let reg: Arc<dyn TagRegistry> = Arc::new(OciTagRegistry::new(RegistryClient::new(RegistryConfig::for_registry(env.registry_addr())?)?));
        let recorder = Recorder::new(client.clone(), Reporter { controller: "cocoon-operator".into(), instance: None });
        let ctx = Arc::new(hibernation::Context::new(client.clone(), recorder, metrics.clone(), reg, Timing::default()));
        let ns2 = ns.clone();
        let r = readiness.clone();
        tokio::spawn(async move { hibernation::run(ctx, Some(&ns2), 2, std::future::pending(), r).await });
        cocoon_testenv::poll("/readyz ok after the caches synced", Duration::from_secs(30), || async {
            match get(paddr, "/readyz").await {
                Ok((200, _, _)) => cocoon_testenv::Probe::Ready(()),
                other => cocoon_testenv::Probe::NotYet(format!("{other:?} flag={}", readiness.is_ready())),
            }
        })
        .await?;

        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
        let cr = CocoonHibernation::new("m", CocoonHibernationSpec { pod_ref: PodRef { name: "m".into() }, desire: Desire::Hibernate });
        crs.create(&PostParams::default(), &cr).await?;
        let body = cocoon_testenv::wait_until("a reconcile shows in /metrics", Duration::from_secs(30), || async {
            let (status, ctype, body) = get(maddr, "/metrics").await.ok()?;
            (status == 200 && ctype.starts_with("application/openmetrics-text") && body.contains("cocoon_operator_reconcile_duration_seconds_count{controller=\"cocoonhibernation\"}"))
                .then_some(body)
        })
        .await?;
        assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
        cocoon_testenv::delete_namespace(&client, &ns).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}
