//! The token endpoint: gathers who the caller is (TokenReview of its bearer token, or its
//! verified client certificate) and the pods bound to its node, asks [`grant`] and signs.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use cocoon_api::crd::checkpoint::CocoonCheckpoint;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::config::TokenConfig;
use super::grant::{self, BoundPod, Caller, CheckpointFact, Principals};
use super::jwt::{Claims, Signer};

/// Requests served at once; more are answered 429 (each may cost a TokenReview and a list).
pub const MAX_IN_FLIGHT: usize = 64;
/// Longest TLS handshake, and longest wait for a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest Kubernetes bearer token accepted.
const MAX_BEARER_LEN: usize = 16 * 1024;

/// Errors of starting the token service.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{field} {path}: {detail}")]
    File {
        field: &'static str,
        path: String,
        detail: String,
    },
    #[error(transparent)]
    Key(#[from] super::jwt::JwtError),
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("asking the API server who the operator is (set REGISTRY_TOKEN_OPERATOR_USERS): {0}")]
    SelfReview(kube::Error),
}

/// The service's state.
pub struct TokenService {
    cfg: TokenConfig,
    signer: Signer,
    client: Client,
    who: Principals,
    in_flight: tokio::sync::Semaphore,
}

impl std::fmt::Debug for TokenService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenService")
            .field("cfg", &self.cfg)
            .field("kid", &self.signer.kid())
            .field("who", &self.who)
            .finish()
    }
}

impl TokenService {
    /// Loads the signing key and settles the operator's usernames (asking the API server when
    /// [`TokenConfig::operator_users`] is unset).
    pub async fn new(cfg: TokenConfig, client: Client) -> Result<TokenService, ServeError> {
        let pem = read(&cfg.key_file, super::ENV_KEY_FILE)?;
        let signer = Signer::from_pem(&pem, super::ENV_KEY_FILE)?;
        let operators = match &cfg.operator_users {
            Some(u) => u.clone(),
            None => {
                let api: Api<SelfSubjectReview> = Api::all(client.clone());
                let r = api
                    .create(&PostParams::default(), &SelfSubjectReview::default())
                    .await
                    .map_err(ServeError::SelfReview)?;
                r.status
                    .and_then(|s| s.user_info)
                    .and_then(|u| u.username)
                    .into_iter()
                    .collect()
            }
        };
        let who = Principals {
            operators,
            admin_users: cfg.admin_users.clone(),
            admin_groups: cfg.admin_groups.clone(),
            node_sa_namespace: cfg.node_sa_namespace.clone(),
        };
        Ok(TokenService {
            cfg,
            signer,
            client,
            who,
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        })
    }

    /// The `kid` of the tokens (the libtrust fingerprint of the signing key).
    pub fn kid(&self) -> &str {
        self.signer.kid()
    }
}

fn read(path: &std::path::Path, field: &'static str) -> Result<String, ServeError> {
    std::fs::read_to_string(path).map_err(|e| ServeError::File {
        field,
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// The identity a verified client certificate carries (CN = user, O = groups).
#[derive(Debug, Clone, Default)]
struct PeerCert(Option<(String, Vec<String>)>);

impl PeerCert {
    fn from_der(der: &[u8]) -> PeerCert {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return PeerCert(None);
        };
        let subject = cert.subject();
        let cn = subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .filter(|c| !c.is_empty())
            .map(str::to_owned);
        let orgs = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        PeerCert(cn.map(|cn| (cn, orgs)))
    }
}

/// Binds the listener (so a bad address fails start-up) and returns its address and the
/// serving future.
pub async fn bind(
    svc: Arc<TokenService>,
) -> Result<(SocketAddr, impl Future<Output = ()> + Send + 'static), ServeError> {
    let acceptor = match &svc.cfg.tls {
        Some((cert, key)) => Some(TlsAcceptor::from(tls_config(
            cert,
            key,
            svc.cfg.client_ca.as_deref(),
        )?)),
        None => None,
    };
    let listener = TcpListener::bind(&svc.cfg.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: svc.cfg.addr.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: svc.cfg.addr.clone(),
        source,
    })?;
    if acceptor.is_none() && !addr.ip().is_loopback() {
        warn!(%addr, "registry token service serves plain HTTP on a non-loopback address: put it behind TLS (REGISTRY_TOKEN_TLS_CERT_FILE)");
    }
    info!(%addr, tls = acceptor.is_some(), client_certs = svc.cfg.client_ca.is_some(), kid = svc.kid(), who = ?svc.who, "registry token service listening");
    let app = Router::new().route("/token", get(token)).with_state(svc);
    Ok((addr, accept_loop(listener, acceptor, app)))
}

fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let file_err = |field: &'static str, p: &std::path::Path, e: String| ServeError::File {
        field,
        path: p.display().to_string(),
        detail: e,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| file_err(super::ENV_TLS_CERT_FILE, cert, e.to_string()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| file_err(super::ENV_TLS_KEY_FILE, key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(path)
                .map_err(|e| file_err(super::ENV_CLIENT_CA_FILE, path, e.to_string()))?
            {
                let c = c.map_err(|e| file_err(super::ENV_CLIENT_CA_FILE, path, e.to_string()))?;
                roots
                    .add(c)
                    .map_err(|e| file_err(super::ENV_CLIENT_CA_FILE, path, e.to_string()))?;
            }
            // Bearer tokens still authenticate on connections without a certificate.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| ServeError::Tls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn accept_loop(listener: TcpListener, acceptor: Option<TlsAcceptor>, app: Router) {
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "registry token service: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "registry token service: too many connections; closing");
            drop(tcp);
            continue;
        };
        let app = app.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            // A client that never finishes its headers is closed.
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            let result = match acceptor {
                None => {
                    let svc = TowerToHyperService::new(app.layer(Extension(PeerCert::default())));
                    builder.serve_connection(TokioIo::new(tcp), svc).await
                }
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "registry token service: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    // Verified against the client CA during the handshake, when presented.
                    let cert = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|leaf| PeerCert::from_der(leaf.as_ref()))
                        .unwrap_or_default();
                    let svc = TowerToHyperService::new(app.layer(Extension(cert)));
                    builder.serve_connection(TokioIo::new(tls), svc).await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "registry token service connection ended with error");
            }
        });
    }
}

/// An error answer in the registry's JSON error shape.
fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"errors": [{"code": code, "message": message}]});
    json(status, &body)
}

/// A JSON answer.
fn json(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The bearer credential of the request: `Bearer <token>`, or Basic with the token as password.
fn presented_token(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once(' ')?;
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.trim().to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        text.split_once(':')?.1.to_owned()
    } else {
        return None;
    };
    (!token.is_empty()).then_some(token)
}

/// A Kubernetes node name as the field selector may carry it (a DNS subdomain).
fn is_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

async fn token(
    State(svc): State<Arc<TokenService>>,
    Extension(cert): Extension<PeerCert>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Ok(_permit) = svc.in_flight.try_acquire() else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "TOOMANYREQUESTS",
            "too many token requests",
        );
    };
    let query = query.unwrap_or_default();
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .take(4 * grant::MAX_SCOPES)
        .collect();
    let service = pairs
        .iter()
        .find(|(k, _)| k == "service")
        .map(|(_, v)| v.as_str());
    if service != Some(svc.cfg.service.as_str()) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "UNSUPPORTED",
            &format!("service must be {:?}", svc.cfg.service),
        );
    }
    let scopes = match grant::parse_scopes(
        pairs
            .iter()
            .filter(|(k, _)| k == "scope")
            .map(|(_, v)| v.as_str()),
    ) {
        Ok(s) => s,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "DENIED", &e.to_string()),
    };
    // Who is asking: a bearer token reviewed by the API server, else a verified client
    // certificate, else nobody (an empty grant, as the spec does for anonymous requests).
    let (user, groups) = if let Some(t) = presented_token(&headers) {
        if t.len() > MAX_BEARER_LEN {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "credentials refused",
            );
        }
        match review(&svc.client, t, &svc.cfg.audiences).await {
            Ok(Some(u)) => u,
            Ok(None) => {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "UNAUTHORIZED",
                    "credentials refused",
                );
            }
            Err(e) => {
                warn!(error = %e, "registry token: TokenReview failed");
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "UNAVAILABLE",
                    "cannot review credentials now",
                );
            }
        }
    } else {
        cert.0.unwrap_or_default()
    };
    let caller = if user.is_empty() {
        Caller::Other
    } else {
        grant::classify(&user, &groups, &svc.who)
    };
    let (pods, checkpoints) = match &caller {
        Caller::Node(node) if is_node_name(node) => {
            match tokio::try_join!(bound_pods(&svc.client, node), checkpoints(&svc.client)) {
                Ok(facts) => facts,
                Err(e) => {
                    warn!(node, error = %e, "registry token: listing the node's pods or the checkpoints failed");
                    return refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "UNAVAILABLE",
                        "cannot list pods now",
                    );
                }
            }
        }
        _ => (Vec::new(), Vec::new()),
    };
    let caller = match caller {
        Caller::Node(n) if !is_node_name(&n) => Caller::Other,
        c => c,
    };
    let access = grant::grant(&caller, &scopes, &pods, &checkpoints, &svc.cfg.base);
    let now = chrono::Utc::now();
    let ttl = i64::try_from(svc.cfg.ttl.as_secs()).unwrap_or(300);
    let jti = match svc.signer.jti() {
        Ok(j) => j,
        Err(_) => {
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "UNKNOWN",
                "signing failed",
            );
        }
    };
    info!(
        user = %user,
        ?caller,
        requested = scopes.len(),
        granted = ?access.iter().map(|a| format!("{}:{}", a.name, a.actions.join(","))).collect::<Vec<_>>(),
        "registry token issued"
    );
    let claims = Claims {
        iss: svc.cfg.issuer.clone(),
        sub: user,
        aud: svc.cfg.service.clone(),
        exp: now.timestamp() + ttl,
        nbf: now.timestamp(),
        iat: now.timestamp(),
        jti,
        access,
    };
    match svc.signer.sign(&claims) {
        Ok(jwt) => json(
            StatusCode::OK,
            &serde_json::json!({
                "token": jwt,
                "access_token": jwt,
                "expires_in": ttl,
                "issued_at": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            }),
        ),
        Err(e) => {
            warn!(error = %e, "registry token: signing failed");
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "UNKNOWN",
                "signing failed",
            )
        }
    }
}

/// The user and groups of a bearer token; `None` when the API server does not authenticate it
/// (for one of `audiences`, when given).
async fn review(
    client: &Client,
    token: String,
    audiences: &[String],
) -> Result<Option<(String, Vec<String>)>, kube::Error> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let tr = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        ..TokenReview::default()
    };
    let r = api.create(&PostParams::default(), &tr).await?;
    let Some(status) = r.status else {
        return Ok(None);
    };
    if status.authenticated != Some(true) {
        return Ok(None);
    }
    // The API server names the audiences it matched; none of ours: not for us.
    if !audiences.is_empty()
        && !status
            .audiences
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|a| audiences.contains(a))
    {
        return Ok(None);
    }
    let user = status.user.unwrap_or_default();
    Ok(user
        .username
        .filter(|u| !u.is_empty())
        .map(|u| (u, user.groups.unwrap_or_default())))
}

/// The pods bound to `node` now, in every namespace.
async fn bound_pods(client: &Client, node: &str) -> Result<Vec<BoundPod>, kube::Error> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        // The field selector is the API server's; the check is ours.
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|p| {
            let annotation = |key: &str| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .cloned()
            };
            let image = annotation(cocoon_api::contract::annotations::IMAGE);
            let from_checkpoint =
                annotation(cocoon_api::contract::checkpoint::FROM_CHECKPOINT_ANNOTATION);
            Some(BoundPod {
                namespace: p.metadata.namespace?,
                name: p.metadata.name?,
                image,
                from_checkpoint,
            })
        })
        .collect())
}

/// The CocoonCheckpoints of every namespace now: the checkpoint repositories are derived from
/// them (a node's push while it takes one, a pod's pull once it is Ready).
async fn checkpoints(client: &Client) -> Result<Vec<CheckpointFact>, kube::Error> {
    let api: Api<CocoonCheckpoint> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|c| {
            let status = c.status.unwrap_or_default();
            Some(CheckpointFact {
                namespace: c.metadata.namespace?,
                name: c.metadata.name?,
                uid: c.metadata.uid?,
                node: status.node,
                phase: status.phase,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().expect("header"));
        h
    }

    #[test]
    fn the_kubernetes_token_comes_as_bearer_or_as_the_basic_password() {
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let rows: [(String, Option<&str>); 8] = [
            ("Bearer abc.def".into(), Some("abc.def")),
            ("bearer   abc".into(), Some("abc")),
            // Basic: the user name ends at the first `:`, the rest is the token.
            (basic("system:node:vk1:abc.def"), Some("node:vk1:abc.def")),
            (basic("user:abc"), Some("abc")),
            (basic("user:"), None),
            ("Basic !!!".into(), None),
            ("Negotiate abc".into(), None),
            ("Bearer ".into(), None),
        ];
        for (value, want) in rows {
            assert_eq!(presented_token(&auth(&value)).as_deref(), want, "{value}");
        }
        assert_eq!(presented_token(&HeaderMap::new()), None);
    }

    #[test]
    fn node_names_are_dns_subdomains_before_they_reach_a_field_selector() {
        assert!(is_node_name("vk-1.example"));
        for bad in ["", "a,spec.nodeName!=x", "A", "a b", &"a".repeat(254)] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }
}
