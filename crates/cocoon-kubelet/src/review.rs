//! Bearer tokens checked with a `TokenReview` and requests authorized with a
//! `SubjectAccessReview`, each answer kept in a bounded, expiring cache keyed by a digest (so no
//! outside input grows memory without bound and no token is kept in memory). The one
//! implementation behind the kubelet API's [`auth`](crate::auth) and the operator's secure
//! `/metrics` (`cocoon_operator::metrics_auth`); each of them says what is reviewed (a node
//! subresource, a non-resource URL), for how long answers are reused, and who they trust
//! without a token.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// A token longer than this is refused without a review (real tokens are a few KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// An authenticated identity, as a `TokenReview` or a client certificate gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
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

/// What a `SubjectAccessReview` asks about.
#[derive(Debug, Clone)]
pub enum AccessTarget {
    /// A resource (the kubelet API: `nodes/<subresource>` of one node).
    Resource(Box<ResourceAttributes>),
    /// A non-resource URL (the operator's `/metrics`).
    NonResource(NonResourceAttributes),
}

/// The answer of an access review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The authorizer's reason, if any.
    pub reason: String,
}

/// The reviews through one API server client; the kubelet API and the operator's `/metrics`
/// each implement their reviewer trait for it.
#[derive(Clone)]
pub struct KubeReviewer {
    client: Client,
}

impl KubeReviewer {
    pub fn new(client: Client) -> Self {
        KubeReviewer { client }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// Who the bearer token belongs to (a `TokenReview`); `Ok(None)` when the API server does not
/// accept it.
pub async fn review_token(client: &Client, token: &str) -> Result<Option<UserInfo>, ReviewError> {
    let api: Api<TokenReview> = Api::all(client.clone());
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

/// Whether `user` may do `target` (a `SubjectAccessReview`). An explicit denial wins over an
/// allow.
pub async fn review_access(
    client: &Client,
    user: &UserInfo,
    target: AccessTarget,
) -> Result<Decision, ReviewError> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let (resource_attributes, non_resource_attributes) = match target {
        AccessTarget::Resource(r) => (Some(*r), None),
        AccessTarget::NonResource(n) => (None, Some(n)),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
            resource_attributes,
            non_resource_attributes,
        },
        ..SubjectAccessReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(ReviewError::Access)?;
    let status = answer.status.unwrap_or_default();
    Ok(Decision {
        allowed: status.allowed && status.denied != Some(true),
        reason: status.reason.unwrap_or_default(),
    })
}

/// The bearer token of an `Authorization` header value, if it carries one.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, rest) = authorization?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}

/// Why a request is refused before it reaches a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no usable credentials.
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

/// How long review answers are reused, and how many of each kind are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    /// A token the API server accepted.
    pub token: Duration,
    /// A token it did not accept.
    pub token_failure: Duration,
    /// An allowed decision.
    pub allowed: Duration,
    /// A denied decision.
    pub denied: Duration,
    /// Entries per cache; past it, expired entries go first, then the one expiring soonest.
    pub capacity: usize,
}

/// Token reviews and access decisions, each reviewed once per [`CachePolicy`] period.
#[derive(Debug)]
pub struct ReviewCache {
    policy: CachePolicy,
    tokens: TtlCache<[u8; 32], Option<UserInfo>>,
    decisions: TtlCache<[u8; 32], Decision>,
}

impl ReviewCache {
    pub fn new(policy: CachePolicy) -> Self {
        ReviewCache {
            policy,
            tokens: TtlCache::new(policy.capacity),
            decisions: TtlCache::new(policy.capacity),
        }
    }

    /// Who `token` belongs to: the cached answer, else `review`'s, which is kept unless it
    /// failed (`Err`). A token over [`MAX_TOKEN_BYTES`] is `None` without a review.
    pub async fn user_of<E, F, Fut>(&self, token: &str, review: F) -> Result<Option<UserInfo>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<UserInfo>, E>>,
    {
        if token.len() > MAX_TOKEN_BYTES {
            return Ok(None);
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(known) = self.tokens.get(&key, now) {
            return Ok(known);
        }
        let reviewed = review().await?;
        let ttl = if reviewed.is_some() {
            self.policy.token
        } else {
            self.policy.token_failure
        };
        self.tokens.put(key, reviewed.clone(), ttl, now);
        Ok(reviewed)
    }

    /// Whether `user` may do what `attributes` name: the cached decision, else `review`'s,
    /// which is kept unless it failed (`Err`). `attributes` are everything the review depends
    /// on besides the user, in a fixed order.
    pub async fn decision<E, F, Fut>(
        &self,
        user: &UserInfo,
        attributes: &[&str],
        review: F,
    ) -> Result<Decision, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Decision, E>>,
    {
        let key = decision_key(user, attributes);
        let now = Instant::now();
        if let Some(known) = self.decisions.get(&key, now) {
            return Ok(known);
        }
        let decided = review().await?;
        let ttl = if decided.allowed {
            self.policy.allowed
        } else {
            self.policy.denied
        };
        self.decisions.put(key, decided.clone(), ttl, now);
        Ok(decided)
    }

    /// Number of cached (token reviews, decisions).
    pub fn cached(&self) -> (usize, usize) {
        (self.tokens.len(), self.decisions.len())
    }
}

/// The cache key of a decision: a digest over everything the review depends on.
fn decision_key(user: &UserInfo, attributes: &[&str]) -> [u8; 32] {
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
    for a in attributes {
        field(a);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_entries_expire() {
        let c: TtlCache<u32, u32> = TtlCache::new(3);
        let t0 = Instant::now();
        for i in 0..100 {
            c.put(i, i, Duration::from_secs(10 + u64::from(i)), t0);
            assert!(c.len() <= 3, "{} entries after {i}", c.len());
        }
        // The soonest-expiring entries were dropped; the newest survive.
        assert_eq!(c.get(&99, t0), Some(99));
        assert_eq!(c.get(&0, t0), None);
        // Expiry.
        assert_eq!(c.get(&99, t0 + Duration::from_secs(200)), None);
        // Expired entries make room first.
        let t1 = t0 + Duration::from_secs(1000);
        c.put(1000, 1, Duration::from_secs(1), t1);
        c.put(1001, 1, Duration::from_secs(1), t1);
        assert_eq!(c.get(&1000, t1), Some(1));
        assert_eq!(c.get(&1001, t1), Some(1));
    }

    #[test]
    fn a_decision_key_covers_the_user_and_every_attribute() {
        let alice = UserInfo {
            username: "alice".into(),
            groups: vec!["b".into(), "a".into()],
            ..UserInfo::default()
        };
        let key = |u: &UserInfo, a: &[&str]| decision_key(u, a);
        let base = key(&alice, &["get", "stats"]);
        // The groups' order does not matter.
        let reordered = UserInfo {
            groups: vec!["a".into(), "b".into()],
            ..alice.clone()
        };
        assert_eq!(key(&reordered, &["get", "stats"]), base);
        // Anything else does.
        let mut extra = alice.clone();
        extra.extra.insert("scopes".into(), vec!["x".into()]);
        let bob = UserInfo {
            username: "bob".into(),
            ..alice.clone()
        };
        for other in [
            key(&alice, &["get", "proxy"]),
            key(&alice, &["create", "stats"]),
            key(&alice, &["gets", "tats"]),
            key(&bob, &["get", "stats"]),
            key(&extra, &["get", "stats"]),
        ] {
            assert_ne!(other, base);
        }
    }
}
