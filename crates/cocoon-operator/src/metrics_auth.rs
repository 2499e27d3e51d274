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
//!   grows memory without bound, and no token is kept in memory. The reviews and caches are
//!   the kubelet API's (`cocoon_kubelet::review`).
//!
//! The probe listener (`/healthz`, `/livez`, `/readyz`) is separate and stays open: kubelet
//! probes carry no token.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cocoon_kubelet::review::{AccessTarget, Decision, ReviewCache};
pub use cocoon_kubelet::review::{
    CachePolicy, KubeReviewer, MAX_TOKEN_BYTES, Refusal, ReviewError, TtlCache, UserInfo,
    bearer_token,
};
use k8s_openapi::api::authorization::v1::NonResourceAttributes;
use kube::Client;

/// The ClusterRole that may read `/metrics` (manifests/operator/rbac.yaml, the chart).
pub const METRICS_READER_ROLE: &str = "cocoon-metrics-reader";
/// How long review answers are reused and how many are kept: controller-runtime's defaults
/// (a token 1 min, allowed 5 min, denied 30 s), a refused or failed token review 10 s, 1024
/// entries per cache.
pub const CACHE_POLICY: CachePolicy = CachePolicy {
    token: Duration::from_secs(60),
    token_failure: Duration::from_secs(10),
    allowed: Duration::from_secs(300),
    denied: Duration::from_secs(30),
    capacity: 1024,
};

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

/// The API server side of authentication and authorization.
#[async_trait]
pub trait Reviewer: Send + Sync + 'static {
    /// Who the bearer token belongs to; `Ok(None)` when the API server does not accept it.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError>;
    /// Whether `user` may do `attrs`.
    async fn review_access(&self, user: &UserInfo, attrs: &Attributes)
    -> Result<bool, ReviewError>;
}

/// Through the API server: `TokenReview` and `SubjectAccessReview` creates (the operator's ClusterRole
/// grants both).
#[async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        cocoon_kubelet::review::review_token(self.client(), token).await
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
    ) -> Result<bool, ReviewError> {
        let target = AccessTarget::NonResource(NonResourceAttributes {
            path: Some(attrs.path.clone()),
            verb: Some(attrs.verb.to_owned()),
        });
        let decision = cocoon_kubelet::review::review_access(self.client(), user, target).await?;
        Ok(decision.allowed)
    }
}

/// The authentication and authorization of the metrics listener.
#[derive(Clone)]
pub struct MetricsAuth {
    reviewer: Arc<dyn Reviewer>,
    cache: Arc<ReviewCache>,
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsAuth")
            .field("cached", &self.cache.cached())
            .finish_non_exhaustive()
    }
}

impl MetricsAuth {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        MetricsAuth {
            reviewer,
            cache: Arc::new(ReviewCache::new(CACHE_POLICY)),
        }
    }

    /// Through the API server of `client`.
    pub fn kube(client: Client) -> Self {
        Self::new(Arc::new(KubeReviewer::new(client)))
    }

    /// Number of cached (token reviews, decisions).
    pub fn cached(&self) -> (usize, usize) {
        self.cache.cached()
    }

    /// Who presents the bearer token in `authorization` (a cached `TokenReview`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<UserInfo, Refusal> {
        let token = bearer_token(authorization).ok_or(Refusal::Unauthorized)?;
        // A failed review counts as a refused token, and is cached as one.
        let Ok(reviewed) = self
            .cache
            .user_of(token, || async {
                Ok::<_, std::convert::Infallible>(
                    self.reviewer.review_token(token).await.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "metrics token review failed");
                        None
                    }),
                )
            })
            .await;
        reviewed.ok_or(Refusal::Unauthorized)
    }

    /// Whether `user` may do `attrs` (a cached `SubjectAccessReview`).
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), Refusal> {
        let decision = self
            .cache
            .decision(user, &[attrs.verb, &attrs.path], || async {
                let allowed = self.reviewer.review_access(user, attrs).await?;
                Ok(Decision {
                    allowed,
                    reason: String::new(),
                })
            })
            .await
            .map_err(|e: ReviewError| {
                tracing::warn!(user = %user.username, error = %e, "metrics access review failed");
                Refusal::Error(format!("Authorization error ({})\n", describe(user, attrs)))
            })?;
        if decision.allowed {
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
}
