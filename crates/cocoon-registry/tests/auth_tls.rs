//! Bearer-token auth and HTTPS against the real registry (docker-registry 2.8.2 started here
//! with token auth or TLS, which testenv's helper does not offer).
//!
//! The token issuer is a minimal HTTP endpoint in this test that signs ES256 JWTs the
//! registry verifies against the certificate in its `rootcertbundle`; TLS uses a private CA
//! given to the client as `ca_file` (`OCI_REGISTRY_CA_FILE`).

mod common;

use std::net::TcpListener as StdListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use cocoon_registry::{
    CredentialSource, Credentials, DeleteOutcome, ErrorClass, PushOptions, RegistryClient,
    RegistryConfig,
};
use common::{FileSpec, TempDir, mode, same_content, write_snapshot_dir};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVICE: &str = "cocoon-test-registry";
const ISSUER: &str = "cocoon-test-issuer";
const USER: &str = "alice";
const PASSWORD: &str = "token-pw";

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// Signs registry tokens granting whatever scopes were asked for, to `alice` only.
struct Issuer {
    key: EcdsaKeyPair,
    cert_der: Vec<u8>,
    rng: SystemRandom,
}

impl Issuer {
    fn token(&self, scopes: &[String]) -> String {
        let header = serde_json::json!({
            "typ": "JWT", "alg": "ES256",
            "x5c": [base64::engine::general_purpose::STANDARD.encode(&self.cert_der)],
        });
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let access: Vec<serde_json::Value> = scopes
            .iter()
            .filter_map(|s| {
                let mut parts = s.rsplitn(2, ':');
                let actions = parts.next()?;
                let (kind, name) = parts.next()?.split_once(':')?;
                Some(serde_json::json!({"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
            })
            .collect();
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
            "iat": now, "jti": format!("{now}-{}", scopes.len()), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            b64url(&serde_json::to_vec(&header).expect("json")),
            b64url(&serde_json::to_vec(&claims).expect("json"))
        );
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("sign");
        format!("{signing_input}.{}", b64url(sig.as_ref()))
    }
}

/// Serves `GET /token?service=..&scope=..` over HTTP/1.1, one request per connection;
/// `fetches` counts the tokens issued (to `alice` only), `requests` every request.
async fn serve_tokens(
    listener: tokio::net::TcpListener,
    issuer: Arc<Issuer>,
    fetches: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let (issuer, fetches, requests) = (issuer.clone(), fetches.clone(), requests.clone());
        tokio::spawn(async move {
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            requests.fetch_add(1, Ordering::SeqCst);
            let text = String::from_utf8_lossy(&req).to_string();
            let target = text.split_whitespace().nth(1).unwrap_or("");
            let url = url::Url::parse(&format!("http://x{target}")).expect("url");
            let scopes: Vec<String> = url
                .query_pairs()
                .filter(|(k, _)| k == "scope")
                .map(|(_, v)| v.to_string())
                .collect();
            let want = format!(
                "basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
            );
            let authorized = text.lines().any(|l| {
                l.to_ascii_lowercase().starts_with("authorization:")
                    && l[14..].trim().eq_ignore_ascii_case(&want)
            });
            let (status, body) = if authorized && url.path() == "/token" {
                fetches.fetch_add(1, Ordering::SeqCst);
                (
                    "200 OK",
                    serde_json::json!({"token": issuer.token(&scopes), "expires_in": 300})
                        .to_string(),
                )
            } else {
                (
                    "401 Unauthorized",
                    r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#
                        .to_string(),
                )
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

/// The registry process, killed on drop.
struct TokenRegistry {
    child: tokio::process::Child,
    addr: String,
}

impl Drop for TokenRegistry {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts docker-registry in `dir` with `extra` appended to its config (an `auth:` section,
/// or `tls:` under `http:`), waiting until its port accepts connections.
async fn start_registry(dir: &Path, extra: &str) -> TokenRegistry {
    let bin = cocoon_testenv::paths::default_registry_bin();
    // A port taken between probing and binding makes the registry exit; try another.
    for attempt in 0..3 {
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let addr = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\nhttp:\n  addr: {addr}\n{extra}",
                data = dir.join("data").display(),
            ),
        )
        .expect("config");
        let log = std::fs::File::create(dir.join(format!("registry-{attempt}.log"))).expect("log");
        let mut child = tokio::process::Command::new(&bin)
            .arg("serve")
            .arg(&config)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn docker-registry");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                return TokenRegistry { child, addr };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill().await;
    }
    panic!(
        "docker-registry did not come up; see the logs in {}",
        dir.display()
    );
}

/// The token issuer (its signing key, the registry's trusted root) serving on loopback; the
/// registry is told to send clients to `http://<realm_host>:<port>/token`.
struct TokenService {
    root: std::path::PathBuf,
    realm: String,
    fetches: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl TokenService {
    async fn start(dir: &Path, realm_host: &str) -> TokenService {
        // The issuer's key and self-signed certificate (the registry's trusted root).
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let cert = rcgen::CertificateParams::new(vec!["cocoon-token-issuer".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let root = dir.join("root.pem");
        std::fs::write(&root, cert.pem()).expect("write");
        let issuer = Arc::new(Issuer {
            key: EcdsaKeyPair::from_pkcs8(
                &ECDSA_P256_SHA256_FIXED_SIGNING,
                &key.serialize_der(),
                &SystemRandom::new(),
            )
            .expect("pkcs8"),
            cert_der: cert.der().to_vec(),
            rng: SystemRandom::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let realm = format!("http://{realm_host}:{port}/token");
        let fetches = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(serve_tokens(
            listener,
            issuer,
            fetches.clone(),
            requests.clone(),
        ));
        TokenService {
            root,
            realm,
            fetches,
            requests,
            server,
        }
    }

    /// The registry's `auth:` section.
    fn auth_config(&self) -> String {
        format!(
            "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            self.realm,
            self.root.display()
        )
    }
}

impl Drop for TokenService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A private CA and a server certificate for `127.0.0.1`/`localhost` under `dir`: the CA's
/// PEM path and the registry's `tls:` lines (under `http:`).
fn tls_material(dir: &Path) -> (std::path::PathBuf, String) {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let server_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let server =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params")
            .signed_by(
                &server_key,
                &rcgen::Issuer::from_params(&ca_params, &ca_key),
            )
            .expect("server cert");
    let (ca_pem, cert_pem, key_pem) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca_pem, ca.pem()).expect("write");
    std::fs::write(&cert_pem, server.pem()).expect("write");
    std::fs::write(&key_pem, server_key.serialize_pem()).expect("write");
    let tls = format!(
        "  tls:\n    certificate: {}\n    key: {}\n",
        cert_pem.display(),
        key_pem.display()
    );
    (ca_pem, tls)
}

fn client(addr: &str, creds: Credentials) -> RegistryClient {
    let mut cfg = RegistryConfig::for_registry(addr).expect("cfg");
    cfg.credentials = CredentialSource::Static(creds);
    RegistryClient::new(cfg).expect("client")
}

#[tokio::test]
async fn bearer_token_flow_pushes_pulls_and_deletes_and_refuses_bad_credentials() {
    let work = TempDir::new("cocoon-reg-token");
    let tokens = TokenService::start(work.path(), "127.0.0.1").await;
    let fetches = tokens.fetches.clone();
    let reg = start_registry(work.path(), &tokens.auth_config()).await;

    // Refused credentials and no credentials are auth errors, not "absent".
    for creds in [Credentials::basic(USER, "wrong"), Credentials::Anonymous] {
        let err = client(&reg.addr, creds)
            .has_manifest("vk-tok", "hibernate")
            .await
            .expect_err("refused");
        assert_eq!(err.class(), ErrorClass::Unauthorized, "{err}");
    }

    let c = client(&reg.addr, Credentials::basic(USER, PASSWORD));
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = vec![
        FileSpec::dense("config.json", 1000),
        FileSpec::dense("cidata.img", 200_000),
        FileSpec::sparse("memory-ranges", 8 << 20, vec![(1 << 20, 1 << 20)]),
    ];
    write_snapshot_dir(&src, "vk-tok", "sid-tok", &files, 21);
    assert!(
        !c.has_manifest("vk-tok", "hibernate")
            .await
            .expect("probe with a pull token")
    );
    c.push_snapshot_dir("vk-tok", &src, &PushOptions::new("hibernate", "img"))
        .await
        .expect("push with a push token");
    let fetched_after_push = fetches.load(Ordering::SeqCst);
    // One token per scope, reused across every blob of the push.
    assert!(
        fetched_after_push <= 3,
        "{fetched_after_push} token fetches for a probe and a push"
    );

    let dst = work.path().join("dst");
    c.pull_snapshot_to_dir("vk-tok", "hibernate", &dst, "vk-tok")
        .await
        .expect("pull");
    for f in &files {
        assert!(
            same_content(&src.join(f.name), &dst.join(f.name)).unwrap_or(false),
            "{}",
            f.name
        );
        assert_eq!(mode(&dst.join(f.name)), f.mode);
    }
    assert!(matches!(
        c.delete_tag("vk-tok", "hibernate")
            .await
            .expect("delete with a delete token"),
        DeleteOutcome::Deleted(_)
    ));
    assert!(!c.has_manifest("vk-tok", "hibernate").await.expect("probe"));
    assert!(
        c.catalog()
            .await
            .expect("catalog with a registry:catalog:* token")
            .contains(&"vk-tok".to_string())
    );
    drop(reg);
}

#[tokio::test]
async fn https_registry_with_a_private_ca() {
    let work = TempDir::new("cocoon-reg-tls");
    let (ca_pem, tls) = tls_material(work.path());
    let reg = start_registry(work.path(), &tls).await;
    // Loopback defaults to plain HTTP; an explicit https:// asks for TLS.
    let base = format!("https://{}", reg.addr);

    // Without the CA the server is not trusted: a transport error, never "absent".
    let untrusted =
        RegistryClient::new(RegistryConfig::for_registry(&base).expect("cfg")).expect("client");
    let err = untrusted
        .has_manifest("vk-tls", "latest")
        .await
        .expect_err("untrusted certificate");
    assert_eq!(err.class(), ErrorClass::Transport, "{err}");

    let mut cfg = RegistryConfig::for_registry(&base).expect("cfg");
    cfg.ca_file = Some(ca_pem);
    let c = RegistryClient::new(cfg).expect("client");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let files = vec![
        FileSpec::dense("config.json", 500),
        FileSpec::dense("overlay.qcow2", 3 << 20),
    ];
    write_snapshot_dir(&src, "vk-tls", "sid-tls", &files, 31);
    c.push_snapshot_dir("vk-tls", &src, &PushOptions::new("latest", "img"))
        .await
        .expect("push over TLS");
    let dst = work.path().join("dst");
    let report = c
        .pull_snapshot_to_dir("vk-tls", "latest", &dst, "vk-tls")
        .await
        .expect("pull over TLS");
    assert_eq!(report.snapshot_id, "sid-tls");
    for f in &files {
        assert!(
            same_content(&src.join(f.name), &dst.join(f.name)).unwrap_or(false),
            "{}",
            f.name
        );
    }
    drop(reg);
}

/// The client got no token (`Unauthorized`) although it asked the realm, which never saw
/// the credentials (`why`).
fn assert_realm_got_no_credentials(err: &cocoon_registry::Error, tokens: &TokenService, why: &str) {
    assert_eq!(err.class(), ErrorClass::Unauthorized, "{err}");
    assert!(
        tokens.requests.load(Ordering::SeqCst) > 0,
        "the realm was asked"
    );
    assert_eq!(tokens.fetches.load(Ordering::SeqCst), 0, "{why}");
}

/// Issue 26 item 9: a token realm on another host than the registry, or reached over http
/// from an https registry, gets no credentials: the client asks it for an anonymous token
/// (which this issuer refuses), so the registered user's password never leaves for it.
#[tokio::test]
async fn a_realm_elsewhere_or_downgraded_gets_no_credentials() {
    // Another host: the registry listens on 127.0.0.1, its realm names `localhost`.
    let work = TempDir::new("cocoon-reg-realm-host");
    let tokens = TokenService::start(work.path(), "localhost").await;
    let reg = start_registry(work.path(), &tokens.auth_config()).await;
    let err = client(&reg.addr, Credentials::basic(USER, PASSWORD))
        .has_manifest("vk-realm", "hibernate")
        .await
        .expect_err("no token without credentials");
    assert_realm_got_no_credentials(
        &err,
        &tokens,
        "the realm on another host never saw the credentials",
    );
    drop(reg);

    // A downgrade: the registry is https, its realm (same host) plain http.
    let work = TempDir::new("cocoon-reg-realm-downgrade");
    let tokens = TokenService::start(work.path(), "127.0.0.1").await;
    let (ca_pem, tls) = tls_material(work.path());
    let reg = start_registry(work.path(), &format!("{tls}{}", tokens.auth_config())).await;
    let mut cfg = RegistryConfig::for_registry(&format!("https://{}", reg.addr)).expect("cfg");
    cfg.ca_file = Some(ca_pem);
    cfg.credentials = CredentialSource::Static(Credentials::basic(USER, PASSWORD));
    let err = RegistryClient::new(cfg)
        .expect("client")
        .has_manifest("vk-realm", "hibernate")
        .await
        .expect_err("no token without credentials");
    assert_realm_got_no_credentials(
        &err,
        &tokens,
        "the plain-http realm never saw the credentials",
    );
    drop(reg);
}
