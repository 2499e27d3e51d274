//! Authentication and authorization of the kubelet API, the way the kubelet does it with
//! `--client-ca-file`, `--authentication-token-webhook` and `--authorization-mode=Webhook`.
//!
//! * **Who.** A client certificate verified against the configured client CA
//!   (`VK_CLIENT_CA_FILE`; the TLS layer does the verification) names the user: CN is the user
//!   name, each O a group, plus `system:authenticated`. Without one, a bearer token is checked
//!   with a `TokenReview`. With neither, the request is refused with 401, unless anonymous
//!   access is enabled (`VK_ANONYMOUS_AUTH=true`, off by default): it then runs as
//!   `system:anonymous` in `system:unauthenticated` and still has to pass authorization.
//! * **May they.** Every authenticated request is authorized with a `SubjectAccessReview` on
//!   the resource `nodes` named after this node, with the kubelet's mapping
//!   ([`request_attributes`]): the verb comes from the HTTP method, the subresource from the
//!   path (`stats`, `metrics`, `log` for `/logs/`, `spec`, `checkpoint`, and `proxy` for
//!   everything else: exec, attach, port-forward, run, container logs). A denial is 403, a
//!   failed review 500; neither reaches a VM.
//! * **Caches.** Decisions are cached like the kubelet's (allowed 5 min, denied 30 s), token
//!   reviews 2 min (failed ones 10 s), each in a bounded map keyed by a digest, so no outside
//!   input grows memory without bound and no token is kept in memory ([`crate::review`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authorization::v1::ResourceAttributes;

use crate::review::{AccessTarget, ReviewCache, bearer_token};
pub use crate::review::{
    CachePolicy, Decision, KubeReviewer, MAX_TOKEN_BYTES, Refusal, ReviewError, TtlCache, UserInfo,
};

/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The user of an anonymous request (when enabled).
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of an anonymous request.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// How long review answers are reused and how many are kept: the kubelet's defaults (a
/// token 2 min, allowed 5 min, denied 30 s), a failed token review 10 s, 4096 entries per cache.
pub const CACHE_POLICY: CachePolicy = CachePolicy {
    token: Duration::from_secs(120),
    token_failure: Duration::from_secs(10),
    allowed: Duration::from_secs(300),
    denied: Duration::from_secs(30),
    capacity: 4096,
};

impl UserInfo {
    /// The identity of a verified client certificate: CN is the user, each O a group.
    pub fn from_certificate(common_name: &str, organizations: &[String]) -> Self {
        let mut groups: Vec<String> = organizations.to_vec();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        UserInfo {
            username: common_name.to_owned(),
            groups,
            ..UserInfo::default()
        }
    }

    /// The identity of an anonymous request.
    pub fn anonymous() -> Self {
        UserInfo {
            username: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..UserInfo::default()
        }
    }
}

/// The identity the TLS layer verified for one connection (`None`: no client certificate).
#[derive(Debug, Clone, Default)]
pub struct PeerIdentity(pub Option<UserInfo>);

impl PeerIdentity {
    /// Reads CN and O of a client certificate the TLS layer has already verified. A
    /// certificate without a CN gives no identity (the request then needs a token).
    pub fn from_der(der: &[u8]) -> Self {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return PeerIdentity(None);
        };
        let subject = cert.subject();
        let cn = subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_owned);
        let orgs: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        PeerIdentity(
            cn.filter(|c| !c.is_empty())
                .map(|cn| UserInfo::from_certificate(&cn, &orgs)),
        )
    }
}

/// What a request asks of the node, as a `SubjectAccessReview` states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The kubelet's mapping of a request to attributes on `nodes/<subresource>`: the verb from
/// the method (`None` for a method the kubelet does not map), the subresource from the path.
pub fn request_attributes(method: &Method, path: &str) -> Option<Attributes> {
    let verb = match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    };
    let subresource = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/spec", "spec"),
        ("/checkpoint", "checkpoint"),
    ]
    .iter()
    .find(|(prefix, _)| is_subpath(path, prefix))
    .map_or("proxy", |(_, sub)| sub);
    Some(Attributes { verb, subresource })
}

/// `path` is `prefix` or below it (`/statsx` is not below `/stats`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The API server side of authentication and authorization.
#[async_trait]
pub trait Reviewer: Send + Sync + 'static {
    /// Who the bearer token belongs to; `Ok(None)` when the API server says it is not valid.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError>;
    /// Whether `user` may do `attrs` on the node `node`.
    async fn review_access(
        &self,
        user: &UserInfo,
        attrs: Attributes,
        node: &str,
    ) -> Result<Decision, ReviewError>;
}

/// Through the API server: `TokenReview` and `SubjectAccessReview` creates (the node ClusterRole
/// grants both).
#[async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        crate::review::review_token(self.client(), token).await
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        attrs: Attributes,
        node: &str,
    ) -> Result<Decision, ReviewError> {
        let target = AccessTarget::Resource(Box::new(ResourceAttributes {
            verb: Some(attrs.verb.to_owned()),
            version: Some("v1".to_owned()),
            resource: Some("nodes".to_owned()),
            subresource: Some(attrs.subresource.to_owned()),
            name: Some(node.to_owned()),
            ..ResourceAttributes::default()
        }));
        crate::review::review_access(self.client(), user, target).await
    }
}

/// The authentication and authorization settings of one kubelet API server.
#[derive(Clone)]
pub struct KubeletAuth {
    reviewer: Arc<dyn Reviewer>,
    anonymous: bool,
    node_name: String,
    cache: Arc<ReviewCache>,
}

impl std::fmt::Debug for KubeletAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletAuth")
            .field("anonymous", &self.anonymous)
            .field("node_name", &self.node_name)
            .field("cached", &self.cache.cached())
            .finish_non_exhaustive()
    }
}

fn describe(user: &UserInfo, attrs: Attributes) -> String {
    format!(
        "user={}, verb={}, resource=nodes, subresource(s)=[{}]",
        user.username, attrs.verb, attrs.subresource
    )
}

impl KubeletAuth {
    /// Authentication by client certificate (verified by TLS) and token review, authorization
    /// by access review, both through `reviewer`; `anonymous` lets requests without
    /// credentials through to authorization as `system:anonymous`.
    pub fn new(reviewer: Arc<dyn Reviewer>, node_name: &str, anonymous: bool) -> Self {
        KubeletAuth {
            reviewer,
            anonymous,
            node_name: node_name.to_owned(),
            cache: Arc::new(ReviewCache::new(CACHE_POLICY)),
        }
    }

    /// Number of cached decisions (tests, debugging).
    pub fn cached_decisions(&self) -> usize {
        self.cache.cached().1
    }

    /// Who makes the request: the verified certificate's user, else the bearer token's (a
    /// `TokenReview`), else anonymous when enabled.
    pub async fn authenticate(
        &self,
        peer: &PeerIdentity,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if let Some(user) = &peer.0 {
            return Ok(user.clone());
        }
        let Some(token) = bearer_token(authorization) else {
            return if self.anonymous {
                Ok(UserInfo::anonymous())
            } else {
                Err(Refusal::Unauthorized)
            };
        };
        // A failed review is not cached: the next request asks again.
        let reviewed = self
            .cache
            .user_of(token, || self.reviewer.review_token(token))
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "kubelet API token review failed");
                Refusal::Unauthorized
            })?;
        reviewed.ok_or(Refusal::Unauthorized)
    }

    /// Whether `user` may do `attrs` on this node (cached).
    pub async fn authorize(&self, user: &UserInfo, attrs: Attributes) -> Result<(), Refusal> {
        let decision = self
            .cache
            .decision(user, &[attrs.verb, attrs.subresource], || {
                self.reviewer.review_access(user, attrs, &self.node_name)
            })
            .await
            .map_err(|e| {
                tracing::warn!(user = %user.username, error = %e, "kubelet API access review failed");
                Refusal::Error(format!("Authorization error ({})\n", describe(user, attrs)))
            })?;
        if decision.allowed {
            Ok(())
        } else {
            tracing::debug!(user = %user.username, verb = attrs.verb, subresource = attrs.subresource, reason = %decision.reason, "kubelet API request forbidden");
            Err(Refusal::Forbidden(format!(
                "Forbidden ({})\n",
                describe(user, attrs)
            )))
        }
    }

    /// Authenticates and authorizes one request.
    pub async fn check(
        &self,
        peer: &PeerIdentity,
        method: &Method,
        path: &str,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        let user = self.authenticate(peer, authorization).await?;
        let attrs = request_attributes(method, path).ok_or(Refusal::MethodNotAllowed)?;
        self.authorize(&user, attrs).await?;
        Ok(user)
    }
}

/// The axum middleware: refuses a request that does not pass [`KubeletAuth::check`].
pub async fn middleware(State(auth): State<KubeletAuth>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<PeerIdentity>()
        .cloned()
        .unwrap_or_default();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match auth
        .check(
            &peer,
            req.method(),
            req.uri().path(),
            authorization.as_deref(),
        )
        .await
    {
        Ok(user) => {
            tracing::trace!(user = %user.username, path = %req.uri().path(), "kubelet API request authorized");
            // The connection is through authentication: it no longer counts against the
            // pre-authentication limit.
            if let Some(slot) = req.extensions().get::<super::limits::PreAuthSlot>() {
                slot.release();
            }
            next.run(req).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_kubelet_mapping_of_requests_to_node_subresources() {
        let rows: &[(Method, &str, &str, &str)] = &[
            // exec, attach, port-forward and run are proxy; the API server posts them.
            (Method::POST, "/exec/ns/p/agent", "create", "proxy"),
            (Method::GET, "/exec/ns/p/agent", "get", "proxy"),
            (Method::POST, "/attach/ns/p/agent", "create", "proxy"),
            (Method::POST, "/portForward/ns/p", "create", "proxy"),
            (Method::POST, "/run/ns/p/agent", "create", "proxy"),
            // container logs are proxy too (the kubelet's `log` is the node's /logs/).
            (Method::GET, "/containerLogs/ns/p/agent", "get", "proxy"),
            (Method::GET, "/logs/syslog", "get", "log"),
            (Method::GET, "/logs", "get", "log"),
            (Method::GET, "/stats/summary", "get", "stats"),
            (Method::GET, "/stats", "get", "stats"),
            (Method::GET, "/metrics/resource", "get", "metrics"),
            (Method::GET, "/metrics", "get", "metrics"),
            (Method::GET, "/spec/", "get", "spec"),
            (Method::POST, "/checkpoint/ns/p/c", "create", "checkpoint"),
            // A look-alike prefix is not the subresource.
            (Method::GET, "/statsx", "get", "proxy"),
            (Method::GET, "/metricsfoo/x", "get", "proxy"),
            (Method::GET, "/healthz", "get", "proxy"),
            (Method::HEAD, "/healthz", "get", "proxy"),
            (Method::PUT, "/x", "update", "proxy"),
            (Method::PATCH, "/x", "patch", "proxy"),
            (Method::DELETE, "/x", "delete", "proxy"),
        ];
        for (method, path, verb, sub) in rows {
            assert_eq!(
                request_attributes(method, path),
                Some(Attributes {
                    verb,
                    subresource: sub
                }),
                "{method} {path}"
            );
        }
        assert_eq!(request_attributes(&Method::OPTIONS, "/healthz"), None);
        assert_eq!(request_attributes(&Method::TRACE, "/exec/a/b/c"), None);
    }

    #[test]
    fn a_certificate_names_the_user_and_its_groups() {
        let u = UserInfo::from_certificate("kube-apiserver-kubelet-client", &["ops".into()]);
        assert_eq!(u.username, "kube-apiserver-kubelet-client");
        assert_eq!(
            u.groups,
            vec!["ops".to_string(), AUTHENTICATED_GROUP.into()]
        );
        let anon = UserInfo::anonymous();
        assert_eq!(
            (anon.username.as_str(), anon.groups.as_slice()),
            (ANONYMOUS_USER, &[UNAUTHENTICATED_GROUP.to_string()][..])
        );
    }

    #[test]
    fn peer_identity_reads_cn_and_o() {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "team-a");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let id = PeerIdentity::from_der(cert.der());
        let u = id.0.expect("identity");
        assert_eq!(u.username, "alice");
        assert_eq!(
            u.groups,
            vec!["team-a".to_string(), AUTHENTICATED_GROUP.into()]
        );
        assert!(PeerIdentity::from_der(b"not a certificate").0.is_none());
    }

    /// Counts reviews; tokens `good-*` authenticate as `user-*`; only `admin` is allowed.
    #[derive(Default)]
    struct Counting {
        tokens: AtomicUsize,
        access: AtomicUsize,
    }

    #[async_trait]
    impl Reviewer for Counting {
        async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
            self.tokens.fetch_add(1, Ordering::SeqCst);
            Ok(token.strip_prefix("good-").map(|u| UserInfo {
                username: u.to_owned(),
                groups: vec![AUTHENTICATED_GROUP.into()],
                ..UserInfo::default()
            }))
        }
        async fn review_access(
            &self,
            user: &UserInfo,
            _attrs: Attributes,
            _node: &str,
        ) -> Result<Decision, ReviewError> {
            self.access.fetch_add(1, Ordering::SeqCst);
            Ok(Decision {
                allowed: user.username == "admin",
                reason: String::new(),
            })
        }
    }

    #[tokio::test]
    async fn decisions_and_token_reviews_are_cached() {
        let rev = Arc::new(Counting::default());
        let auth = KubeletAuth::new(rev.clone(), "n1", false);
        let none = PeerIdentity::default();
        for _ in 0..5 {
            let r = auth
                .check(
                    &none,
                    &Method::POST,
                    "/exec/a/b/c",
                    Some("Bearer good-admin"),
                )
                .await;
            assert_eq!(r.map(|u| u.username), Ok("admin".to_string()));
            let r = auth
                .check(&none, &Method::POST, "/exec/a/b/c", Some("Bearer good-eve"))
                .await;
            assert!(
                matches!(r, Err(Refusal::Forbidden(ref m)) if m.contains("user=eve, verb=create, resource=nodes, subresource(s)=[proxy]")),
                "{r:?}"
            );
            let r = auth
                .check(&none, &Method::GET, "/stats/summary", Some("Bearer bad"))
                .await;
            assert_eq!(r, Err(Refusal::Unauthorized));
        }
        // One review per distinct token and per distinct (user, attributes).
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 3);
        assert_eq!(rev.access.load(Ordering::SeqCst), 2);
        assert_eq!(auth.cached_decisions(), 2);
    }

    #[tokio::test]
    async fn no_credentials_is_401_unless_anonymous_is_enabled() {
        let rev = Arc::new(Counting::default());
        let none = PeerIdentity::default();
        let closed = KubeletAuth::new(rev.clone(), "n1", false);
        for header in [None, Some("Basic abc"), Some("Bearer "), Some("Bearer")] {
            assert_eq!(
                closed.check(&none, &Method::GET, "/healthz", header).await,
                Err(Refusal::Unauthorized),
                "{header:?}"
            );
        }
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 0);
        assert_eq!(rev.access.load(Ordering::SeqCst), 0);
        // Opted in: anonymous still has to pass authorization.
        let open = KubeletAuth::new(rev.clone(), "n1", true);
        let r = open.check(&none, &Method::GET, "/healthz", None).await;
        assert!(
            matches!(r, Err(Refusal::Forbidden(ref m)) if m.contains("user=system:anonymous")),
            "{r:?}"
        );
        // A verified certificate wins over any header and needs no token review.
        let cert = PeerIdentity(Some(UserInfo::from_certificate("admin", &[])));
        let r = closed
            .check(&cert, &Method::GET, "/healthz", Some("Bearer good-eve"))
            .await;
        assert_eq!(r.map(|u| u.username), Ok("admin".to_string()));
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 0);
        // A huge token is refused without a review.
        let huge = format!("Bearer good-{}", "x".repeat(MAX_TOKEN_BYTES));
        assert_eq!(
            closed.check(&none, &Method::GET, "/x", Some(&huge)).await,
            Err(Refusal::Unauthorized)
        );
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 0);
        assert_eq!(
            closed.check(&cert, &Method::OPTIONS, "/x", None).await,
            Err(Refusal::MethodNotAllowed)
        );
    }
}
