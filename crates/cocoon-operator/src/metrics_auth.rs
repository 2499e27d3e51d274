//! Authentication and authorization of the operator's `/metrics`, the way controller-runtime's
//! secure metrics (`filters.WithAuthenticationAndAuthorization`) do it.
//!
//! * **Who.** The request's bearer token is checked with a `TokenReview`. Without one (or with
//!   one the API server does not accept) the answer is 401.
//! * **May they.** The authenticated user is authorized with a `SubjectAccessReview` on the
//!   non-resource URL of the request path (`/metrics`) with the verb of its method (`get` for
//!   GET and HEAD). A denial is 403; a review that could not be made is 500. The
//!   `cocoon-metrics-reader` ClusterRole grants `get` on `/metrics`.
//! * **Caches.** Like controller-runtime's delegating authenticator and authorizer: token
//!   reviews 1 min (failed ones 10 s), allowed decisions 5 min, denied 30 s, each in a bounded
//!   map keyed by a digest, so a scraper costs two reviews per few minutes, no outside input
//!   grows memory without bound, and no token is kept in memory.
//!
//! The probe listener (`/healthz`, `/livez`, `/readyz`) is separate and stays open: kubelet
//! probes carry no token.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// The ClusterRole that may read `/metrics` (manifests/operator/rbac.yaml, the chart).
pub const METRICS_READER_ROLE: &str = "cocoon-metrics-reader";
/// How long a successful token review is reused (controller-runtime's default).
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How long a refused or failed token review is reused.
pub const TOKEN_FAILURE_TTL: Duration = Duration::from_secs(10);
/// How long an allowed decision is reused (controller-runtime's default).
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied decision is reused (controller-runtime's default).
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries per cache; past it, expired entries go first, then the one expiring soonest.
pub const CACHE_CAPACITY: usize = 1024;
/// A token longer than this is refused without a review (real tokens are a few KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// An authenticated identity, as a `TokenReview` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request asks: a verb on a non-resource URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub path: String,
}

/// The verb of an HTTP method, as the API server maps it for non-resource URLs (`None` for
/// a method it does not map).
pub fn verb_of(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// A review call that failed (transport, API error, or a malformed answer).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("token review: {0}")]
    Token(#[source] kube::Error),
    #[error("subject access review: {0}")]
    Access(#[source] kube::Error),
    #[error("token review: authenticated without a user")]
    NoUser,
}

/// The API server side of authentication and authorization.
#[async_trait]
pub trait Reviewer: Send + Sync + 'static {
    /// Who the bearer token belongs to; `Ok(None)` when the API server does not accept it.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError>;
    /// Whether `user` may do `attrs`.
    async fn review_access(&self, user: &UserInfo, attrs: &Attributes)
    -> Result<bool, ReviewError>;
}

/// [`Reviewer`] through the API server: `TokenReview` and `SubjectAccessReview` creates (the
/// operator's ClusterRole grants both).
#[derive(Clone)]
pub struct KubeReviewer {
    client: Client,
}

impl KubeReviewer {
    pub fn new(client: Client) -> Self {
        KubeReviewer { client }
    }
}

#[async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::Token)?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let user = status.user.ok_or(ReviewError::NoUser)?;
        Ok(Some(UserInfo {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default().into_iter().collect(),
        }))
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> Result<bool, ReviewError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(attrs.path.clone()),
                    verb: Some(attrs.verb.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::Access)?;
        let status = answer.status.unwrap_or_default();
        Ok(status.allowed && status.denied != Some(true))
    }
}

/// A map whose entries expire, holding at most `capacity` of them.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The live value of `key`, as of `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let map = self.entries.lock().ok()?;
        map.get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(v, _)| v.clone())
    }

    /// Stores `value` until `now + ttl`. A full map first drops its expired entries, then the
    /// one that expires soonest.
    pub fn put(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let Ok(mut map) = self.entries.lock() else {
            return;
        };
        if map.len() >= self.capacity && !map.contains_key(&key) {
            map.retain(|_, (_, expires)| *expires > now);
            if map.len() >= self.capacity
                && let Some(soonest) = map
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&soonest);
            }
        }
        map.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a request is refused before it reaches `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no bearer token, or one the API server does not accept.
    Unauthorized,
    /// 403: authenticated, not allowed.
    Forbidden(String),
    /// 405: a method without a verb.
    MethodNotAllowed,
    /// 500: a review could not be made.
    Error(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
        match self {
            Refusal::Unauthorized => {
                (StatusCode::UNAUTHORIZED, text, "Unauthorized\n").into_response()
            }
            Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, text, m).into_response(),
            Refusal::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, text, "Method Not Allowed\n").into_response()
            }
            Refusal::Error(m) => (StatusCode::INTERNAL_SERVER_ERROR, text, m).into_response(),
        }
    }
}

/// The bearer token of an `Authorization` header value, if it carries one.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, rest) = authorization?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}

/// The authentication and authorization of the metrics listener.
#[derive(Clone)]
pub struct MetricsAuth {
    reviewer: Arc<dyn Reviewer>,
    tokens: Arc<TtlCache<[u8; 32], Option<UserInfo>>>,
    decisions: Arc<TtlCache<[u8; 32], bool>>,
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsAuth")
            .field("tokens", &self.tokens.len())
            .field("decisions", &self.decisions.len())
            .finish_non_exhaustive()
    }
}

impl MetricsAuth {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        MetricsAuth {
            reviewer,
            tokens: Arc::new(TtlCache::new(CACHE_CAPACITY)),
            decisions: Arc::new(TtlCache::new(CACHE_CAPACITY)),
        }
    }

    /// Through the API server of `client`.
    pub fn kube(client: Client) -> Self {
        Self::new(Arc::new(KubeReviewer::new(client)))
    }

    /// Number of cached (token reviews, decisions).
    pub fn cached(&self) -> (usize, usize) {
        (self.tokens.len(), self.decisions.len())
    }

    /// Who presents the bearer token in `authorization` (a cached `TokenReview`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo, Refusal> {
        let token = bearer_token(authorization).ok_or(Refusal::Unauthorized)?;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::Unauthorized);
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        let reviewed = match self.tokens.get(&key, now) {
            Some(r) => r,
            None => {
                let r = match self.reviewer.review_token(token).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics token review failed");
                        None
                    }
                };
                let ttl = if r.is_some() {
                    TOKEN_TTL
                } else {
                    TOKEN_FAILURE_TTL
                };
                self.tokens.put(key, r.clone(), ttl, now);
                r
            }
        };
        reviewed.ok_or(Refusal::Unauthorized)
    }

    /// Whether `user` may do `attrs` (a cached `SubjectAccessReview`).
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), Refusal> {
        let key = decision_key(user, attrs);
        let now = Instant::now();
        let allowed = match self.decisions.get(&key, now) {
            Some(d) => d,
            None => {
                let d = self
                    .reviewer
                    .review_access(user, attrs)
                    .await
                    .map_err(|e| {
                        tracing::warn!(user = %user.username, error = %e, "metrics access review failed");
                        Refusal::Error(format!("Authorization error ({})\n", describe(user, attrs)))
                    })?;
                let ttl = if d { ALLOWED_TTL } else { DENIED_TTL };
                self.decisions.put(key, d, ttl, now);
                d
            }
        };
        if allowed {
            Ok(())
        } else {
            tracing::debug!(user = %user.username, verb = attrs.verb, path = %attrs.path, "metrics request forbidden");
            Err(Refusal::Forbidden(format!(
                "Forbidden ({})\n",
                describe(user, attrs)
            )))
        }
    }

    /// Authenticates and authorizes one request.
    pub async fn check(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        let user = self.authenticate(authorization).await?;
        let verb = verb_of(method).ok_or(Refusal::MethodNotAllowed)?;
        let attrs = Attributes {
            verb,
            path: path.to_owned(),
        };
        self.authorize(&user, &attrs).await?;
        Ok(user)
    }
}

fn describe(user: &UserInfo, attrs: &Attributes) -> String {
    format!(
        "user={}, verb={}, nonResourceURL={}",
        user.username, attrs.verb, attrs.path
    )
}

/// The cache key of a decision: a digest over everything the review depends on.
fn decision_key(user: &UserInfo, attrs: &Attributes) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut field = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field(&user.username);
    field(&user.uid);
    let mut groups = user.groups.clone();
    groups.sort();
    for g in &groups {
        field(g);
    }
    field("|extra|");
    for (k, vs) in &user.extra {
        field(k);
        for v in vs {
            field(v);
        }
        field("|");
    }
    field(attrs.verb);
    field(&attrs.path);
    h.finalize().into()
}

/// The axum middleware: refuses a request that does not pass [`MetricsAuth::check`].
pub async fn middleware(State(auth): State<MetricsAuth>, req: Request, next: Next) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match auth
        .check(req.method(), req.uri().path(), authorization.as_deref())
        .await
    {
        Ok(user) => {
            tracing::trace!(user = %user.username, "metrics request authorized");
            next.run(req).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts reviews; tokens `good-*` authenticate as `*`, `broken` fails the review; only
    /// `prometheus` may get `/metrics`; `flaky` fails the access review.
    #[derive(Default)]
    struct Counting {
        tokens: AtomicUsize,
        access: AtomicUsize,
    }

    #[async_trait]
    impl Reviewer for Counting {
        async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
            self.tokens.fetch_add(1, Ordering::SeqCst);
            if token == "broken" {
                return Err(ReviewError::NoUser);
            }
            Ok(token.strip_prefix("good-").map(|u| UserInfo {
                username: u.to_owned(),
                groups: vec!["system:authenticated".into()],
                ..UserInfo::default()
            }))
        }
        async fn review_access(
            &self,
            user: &UserInfo,
            attrs: &Attributes,
        ) -> Result<bool, ReviewError> {
            self.access.fetch_add(1, Ordering::SeqCst);
            if user.username == "flaky" {
                return Err(ReviewError::NoUser);
            }
            Ok(user.username == "prometheus" && attrs.path == "/metrics" && attrs.verb == "get")
        }
    }

    #[test]
    fn bearer_tokens_and_verbs() {
        let rows: &[(Option<&str>, Option<&str>)] = &[
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic dXNlcjpwYXNz"), None),
            (Some("Bearer "), None),
            (Some("Bearer"), None),
            (None, None),
        ];
        for (header, want) in rows {
            assert_eq!(bearer_token(*header), *want, "{header:?}");
        }
        assert_eq!(verb_of(&Method::GET), Some("get"));
        assert_eq!(verb_of(&Method::HEAD), Some("get"));
        assert_eq!(verb_of(&Method::POST), Some("post"));
        assert_eq!(verb_of(&Method::OPTIONS), None);
    }

    #[tokio::test]
    async fn the_status_of_each_kind_of_caller() {
        let auth = MetricsAuth::new(Arc::new(Counting::default()));
        let get = |h: Option<&'static str>| {
            let auth = auth.clone();
            async move { auth.check(&Method::GET, "/metrics", h).await }
        };
        // (situation, Authorization header, outcome)
        let rows: Vec<(&str, Option<&'static str>, Result<&str, Refusal>)> = vec![
            ("no token: 401", None, Err(Refusal::Unauthorized)),
            (
                "not a bearer token: 401",
                Some("Basic cDpw"),
                Err(Refusal::Unauthorized),
            ),
            (
                "a token the API server refuses: 401",
                Some("Bearer bad"),
                Err(Refusal::Unauthorized),
            ),
            (
                "a token review that fails: 401",
                Some("Bearer broken"),
                Err(Refusal::Unauthorized),
            ),
            (
                "a valid token without the role: 403",
                Some("Bearer good-eve"),
                Err(Refusal::Forbidden(
                    "Forbidden (user=eve, verb=get, nonResourceURL=/metrics)\n".into(),
                )),
            ),
            (
                "an access review that fails: 500",
                Some("Bearer good-flaky"),
                Err(Refusal::Error(
                    "Authorization error (user=flaky, verb=get, nonResourceURL=/metrics)\n".into(),
                )),
            ),
            (
                "the reader: through",
                Some("Bearer good-prometheus"),
                Ok("prometheus"),
            ),
        ];
        for (situation, header, want) in rows {
            let got = get(header).await.map(|u| u.username);
            assert_eq!(got.as_deref().map_err(Clone::clone), want, "{situation}");
        }
        let huge: &'static str =
            Box::leak(format!("Bearer good-{}", "x".repeat(MAX_TOKEN_BYTES)).into_boxed_str());
        assert_eq!(
            get(Some(huge)).await,
            Err(Refusal::Unauthorized),
            "a huge token"
        );
        assert_eq!(
            auth.check(&Method::OPTIONS, "/metrics", Some("Bearer good-prometheus"))
                .await,
            Err(Refusal::MethodNotAllowed)
        );
    }

    #[tokio::test]
    async fn reviews_are_cached_per_token_and_per_decision() {
        let rev = Arc::new(Counting::default());
        let auth = MetricsAuth::new(rev.clone());
        for _ in 0..5 {
            for h in ["Bearer good-prometheus", "Bearer good-eve", "Bearer bad"] {
                let _ = auth.check(&Method::GET, "/metrics", Some(h)).await;
            }
        }
        // One token review per distinct token, one access review per distinct user.
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 3);
        assert_eq!(rev.access.load(Ordering::SeqCst), 2);
        assert_eq!(auth.cached(), (3, 2));
        // No token, no review at all.
        let _ = auth.check(&Method::GET, "/metrics", None).await;
        assert_eq!(rev.tokens.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_cache_is_bounded_and_entries_expire() {
        let c: TtlCache<u32, u32> = TtlCache::new(3);
        let t0 = Instant::now();
        for i in 0..100 {
            c.put(i, i, Duration::from_secs(10 + u64::from(i)), t0);
            assert!(c.len() <= 3, "{} entries after {i}", c.len());
        }
        assert_eq!(c.get(&99, t0), Some(99));
        assert_eq!(
            c.get(&0, t0),
            None,
            "the soonest-expiring entries went first"
        );
        assert_eq!(c.get(&99, t0 + Duration::from_secs(200)), None, "expired");
    }
}
