//! The kubelet HTTPS API and the `/metrics` listener, served for real on loopback: logs
//! through a test PodBackend (with and without a live VM), the not-implemented routes, the
//! stats endpoints, and the spec's metric names on `/metrics`.

use std::sync::Arc;

use async_trait::async_trait;
use cocoon_node::kubelet::{
    ATTACH_NOT_IMPLEMENTED, BackendError, ExecError, ExecIo, KubeletServer, MetricsServer,
    NO_LIVE_VM_BODY, PORT_FORWARD_NOT_IMPLEMENTED, PodBackend, PodStats, TlsMaterial,
};
use cocoon_node::metrics::NodeMetrics;
use cocoon_node::node::HostReader;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// One pod with a VM (`ns/live`), everything else has none.
struct FakePods;

#[async_trait]
impl PodBackend for FakePods {
    async fn logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        tail: u32,
    ) -> Result<Option<Vec<u8>>, BackendError> {
        match (namespace, pod) {
            ("ns", "live") => Ok(Some(
                format!("log of {container}, tail {tail}\n").into_bytes(),
            )),
            ("ns", "broken") => Err(BackendError("cocoon vm logs: exit 3".into())),
            _ => Ok(None),
        }
    }

    async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        _io: ExecIo,
    ) -> Result<(), ExecError> {
        Err(ExecError::NoLiveVm {
            namespace: namespace.into(),
            pod: pod.into(),
        })
    }

    async fn stats(&self) -> Result<Vec<PodStats>, BackendError> {
        Ok(vec![PodStats {
            namespace: "ns".into(),
            name: "live".into(),
            uid: "u-1".into(),
            cpu_usage_ns: 2_500_000_000,
            memory_rss_bytes: 4096,
            network_rx_bytes: 10,
            network_tx_bytes: 20,
        }])
    }
}

/// Accepts exactly the pinned certificate (the server's self-signed one).
#[derive(Debug)]
struct Pinned {
    der: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "unexpected server certificate".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A minimal HTTPS GET: returns (status, body).
async fn https_get(server: &KubeletServer, method: &str, path: &str) -> (u16, String) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            der: server.certificate_der().to_vec(),
            provider,
        }))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("tls handshake");
    let req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    // The server closes after the response (Connection: close); a TLS close_notify may be
    // missing, so an unexpected EOF after data is fine.
    let _ = tls.read_to_end(&mut raw).await;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_string())
}

#[tokio::test]
async fn kubelet_api_over_https() {
    let cancel = CancellationToken::new();
    let root = tempfile::tempdir().expect("tempdir");
    let tls = TlsMaterial::self_signed("vk-test", "127.0.0.1".parse().expect("ip")).expect("tls");
    let server = KubeletServer::start(
        "127.0.0.1:0".parse().expect("addr"),
        &tls,
        Arc::new(FakePods),
        HostReader::new(root.path().to_path_buf()),
        "vk-test",
        &cancel,
    )
    .await
    .expect("start");
    assert_ne!(server.port(), 0);

    let (code, body) = https_get(&server, "GET", "/containerLogs/ns/live/agent?tailLines=7").await;
    assert_eq!((code, body.as_str()), (200, "log of agent, tail 7\n"));
    let (code, body) = https_get(&server, "GET", "/containerLogs/ns/live/agent").await;
    assert_eq!((code, body.as_str()), (200, "log of agent, tail 200\n"));
    let (code, body) = https_get(&server, "GET", "/containerLogs/ns/gone/agent").await;
    assert_eq!((code, body.as_str()), (200, NO_LIVE_VM_BODY));
    let (code, body) = https_get(&server, "GET", "/containerLogs/ns/broken/agent").await;
    assert_eq!(code, 500);
    assert!(body.contains("exit 3"), "{body}");

    let (code, body) = https_get(&server, "POST", "/attach/ns/live/agent?stdout=1").await;
    assert_eq!((code, body.as_str()), (501, ATTACH_NOT_IMPLEMENTED));
    let (code, body) = https_get(&server, "POST", "/portForward/ns/live").await;
    assert_eq!((code, body.as_str()), (501, PORT_FORWARD_NOT_IMPLEMENTED));

    let (code, body) = https_get(&server, "GET", "/stats/summary").await;
    assert_eq!(code, 200);
    let summary: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(summary["node"]["nodeName"], "vk-test");
    assert_eq!(summary["pods"][0]["podRef"]["name"], "live");
    assert_eq!(
        summary["pods"][0]["cpu"]["usageCoreNanoSeconds"],
        2_500_000_000u64
    );
    assert_eq!(summary["pods"][0]["memory"]["workingSetBytes"], 4096);
    assert_eq!(summary["pods"][0]["network"]["rxBytes"], 10);
    assert_eq!(summary["pods"][0]["containers"][0]["name"], "agent");

    let (code, body) = https_get(&server, "GET", "/metrics/resource").await;
    assert_eq!(code, 200);
    for want in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
        "container_cpu_usage_seconds_total{container=\"agent\",namespace=\"ns\",pod=\"live\"} 2.5",
        "container_memory_working_set_bytes{container=\"agent\",namespace=\"ns\",pod=\"live\"} 4096",
        "pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"live\"} 2.5",
        "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"live\"} 4096",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }

    server.shutdown().await;
    assert!(
        TcpStream::connect(("127.0.0.1", 1)).await.is_err(),
        "sanity: nothing listens on port 1"
    );
}

#[tokio::test]
async fn metrics_listener_serves_spec_names() {
    let cancel = CancellationToken::new();
    let root = tempfile::tempdir().expect("tempdir");
    let metrics = Arc::new(NodeMetrics::new(root.path()));
    metrics.pod_lifecycle("delete", "skipped", "no_vm");
    metrics.wake("ok");
    // Labelled families appear once a series exists; unlabelled ones are always present.
    metrics.vm_boot("clone", "sim", 1.0);
    let server = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), metrics, &cancel)
        .await
        .expect("start");

    let mut tcp = TcpStream::connect(server.local_addr())
        .await
        .expect("connect");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.expect("read");
    let (code, body) = parse_response(&raw);
    assert_eq!(code, 200);
    for want in [
        "cocoon_vk_pod_lifecycle_total{op=\"delete\",result=\"skipped\",reason=\"no_vm\"} 1",
        "cocoon_vk_wake_total{result=\"ok\"} 1",
        "cocoon_vk_vm_boot_duration_seconds_bucket{le=\"1.0\",mode=\"clone\",backend=\"sim\"} 1",
        "# TYPE cocoon_vk_snapshot_push_duration_seconds histogram",
        "cocoon_vk_vm_table_size 0",
        "cocoon_vk_node_storage_available_bytes ",
        "cocoon_vk_node_memory_used_bytes ",
        "cocoon_vk_node_cpu_seconds_total ",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    cancel.cancel();
    server.shutdown().await;
}
