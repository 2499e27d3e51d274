//! The HTTP shell: a hyper HTTP/1.1 pool with rustls (ring passed explicitly), Basic and
//! bearer-token challenges, redirects, per-call and no-progress timeouts, streaming bodies.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use url::Url;

use crate::auth::{
    Challenge, CredentialSource, Credentials, RealmCredentials, TokenResponse, parse_challenge,
};
use crate::config::RegistryConfig;
use crate::error::{Error, Result, error_from_status};
use crate::reference::Scheme;

/// Request body type of the pool.
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, io::Error>;

/// Largest error or small-response body read into memory.
pub(crate) const MAX_SMALL_BODY: usize = 4 << 20;
/// Redirects followed for GET and HEAD.
const MAX_REDIRECTS: usize = 5;
/// Token lifetime assumed when the token endpoint does not say (the spec's minimum).
const DEFAULT_TOKEN_SECS: u64 = 60;
/// Longest a token is cached, whatever `expires_in` says (a huge value must not overflow the
/// expiry instant).
const MAX_TOKEN_SECS: u64 = 24 * 3600;

/// How long a token the endpoint gave `expires_in` seconds stays cached: between
/// [`DEFAULT_TOKEN_SECS`] and [`MAX_TOKEN_SECS`], renewed 10 s early.
fn token_cache_for(expires_in: Option<u64>) -> Duration {
    let secs = expires_in
        .unwrap_or(DEFAULT_TOKEN_SECS)
        .clamp(DEFAULT_TOKEN_SECS, MAX_TOKEN_SECS);
    // Renew a little early so an in-flight request does not carry a dying token.
    Duration::from_secs(secs).saturating_sub(Duration::from_secs(10))
}

/// Most bearer tokens cached at once. Scopes name repositories, which tenants choose (image
/// refs), so the cache is bounded: expired tokens are dropped on every insert, and a full
/// cache drops the tokens that expire first.
pub(crate) const MAX_CACHED_TOKENS: usize = 256;

/// Makes room for one more token in `tokens` at `now`: drops every expired entry, then the
/// soonest-expiring ones until fewer than `max` remain.
fn prune_tokens<K: Clone + Eq + std::hash::Hash, V>(
    tokens: &mut HashMap<K, (V, Instant)>,
    now: Instant,
    max: usize,
) {
    tokens.retain(|_, (_, exp)| *exp > now);
    while !tokens.is_empty() && tokens.len() >= max {
        let Some(first) = tokens
            .iter()
            .min_by_key(|(_, (_, exp))| *exp)
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        tokens.remove(&first);
    }
}

/// The token scope of a call (`repository:<name>:<actions>` or `registry:catalog:*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Scope(pub String);

impl Scope {
    pub(crate) fn repo(path: &str, actions: &str) -> Scope {
        Scope(format!("repository:{path}:{actions}"))
    }

    pub(crate) fn catalog() -> Scope {
        Scope("registry:catalog:*".into())
    }
}

/// How long a call may take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    /// The whole exchange, headers and body.
    Total(Duration),
    /// No byte may take longer than this to move (large transfers).
    Idle(Duration),
}

/// A request body that can be produced again (for an auth retry or a redirect).
pub(crate) enum Body {
    Empty,
    Full(Bytes),
    /// `len` bytes from a factory; each call starts the stream from its beginning.
    Stream {
        len: u64,
        make: Box<dyn Fn(Progress) -> ReqBody + Send + Sync>,
    },
}

impl Body {
    fn make(&self, progress: &Progress) -> (ReqBody, Option<u64>) {
        match self {
            Body::Empty => (Empty::new().map_err(|n| match n {}).boxed_unsync(), None),
            Body::Full(b) => (
                Full::new(b.clone()).map_err(|n| match n {}).boxed_unsync(),
                Some(b.len() as u64),
            ),
            Body::Stream { len, make } => (make(progress.clone()), Some(*len)),
        }
    }
}

/// A request to send.
pub(crate) struct Req {
    pub method: Method,
    pub url: Url,
    pub scope: Option<Scope>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Body,
    pub limit: Limit,
}

impl Req {
    pub(crate) fn new(method: Method, url: Url, scope: Option<Scope>, limit: Limit) -> Req {
        Req {
            method,
            url,
            scope,
            headers: Vec::new(),
            body: Body::Empty,
            limit,
        }
    }

    pub(crate) fn header(mut self, name: HeaderName, value: &str) -> Result<Req> {
        let v = HeaderValue::from_str(value).map_err(|_| {
            Error::invalid(name.as_str(), format!("invalid header value {value:?}"))
        })?;
        self.headers.push((name, v));
        Ok(self)
    }

    pub(crate) fn body(mut self, body: Body) -> Req {
        self.body = body;
        self
    }
}

/// Last time a byte moved, for the no-progress timeout; and whether the request body has
/// been sent completely (from then on the registry is committing, which may take longer).
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    start: Instant,
    last_ms: Arc<AtomicU64>,
    body_sent: Arc<AtomicBool>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            body_sent: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(crate) fn tick(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn body_done(&self) {
        self.tick();
        self.body_sent.store(true, Ordering::Relaxed);
    }

    fn is_body_sent(&self) -> bool {
        self.body_sent.load(Ordering::Relaxed)
    }

    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A body fed from a channel by a producer thread; ticks [`Progress`] per frame.
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    len: u64,
    sent: u64,
    progress: Progress,
}

impl ChannelBody {
    pub(crate) fn new(rx: mpsc::Receiver<io::Result<Bytes>>, len: u64, progress: Progress) -> Self {
        ChannelBody {
            rx,
            len,
            sent: 0,
            progress,
        }
    }
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, io::Error>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.sent += b.len() as u64;
                self.progress.tick();
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) if self.sent < self.len => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "body producer stopped early",
            )))),
            Poll::Ready(None) => {
                self.progress.body_done();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len - self.sent.min(self.len))
    }
}

/// Cached authorization for the registry host.
#[derive(Default)]
struct AuthCache {
    /// Basic header, once the registry asked for Basic auth.
    basic: Option<HeaderValue>,
    /// Bearer headers per scope, with expiry.
    tokens: HashMap<Scope, (HeaderValue, Instant)>,
}

/// The connection pool plus auth state for one registry.
pub(crate) struct Http {
    client: Client<HttpsConnector<HttpConnector>, ReqBody>,
    origin: Url,
    host: String,
    credentials: CredentialSource,
    cache: Mutex<AuthCache>,
    /// Serialises token fetches so parallel transfers do not stampede the token endpoint.
    token_fetch: tokio::sync::Mutex<()>,
    pub(crate) request_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) commit_timeout: Duration,
    user_agent: HeaderValue,
}

impl Http {
    pub(crate) fn new(cfg: &RegistryConfig) -> Result<Http> {
        let origin = Url::parse(&cfg.origin())
            .map_err(|e| Error::invalid("OCI_REGISTRY", format!("{}: {e}", cfg.origin())))?;
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        let user_agent = HeaderValue::from_str(&cfg.user_agent)
            .map_err(|e| Error::invalid("user_agent", format!("{:?}: {e}", cfg.user_agent)))?;
        let tls = tls_config(cfg)?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(32)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https);
        Ok(Http {
            client,
            host: cfg.base.host().to_string(),
            origin,
            credentials: cfg.credentials.clone(),
            cache: Mutex::new(AuthCache::default()),
            token_fetch: tokio::sync::Mutex::new(()),
            request_timeout: cfg.request_timeout,
            idle_timeout: cfg.transfer_idle_timeout,
            commit_timeout: cfg.commit_timeout,
            user_agent,
        })
    }

    /// `<origin>/v2/<path>`.
    pub(crate) fn url(&self, path: &str) -> Result<Url> {
        self.origin
            .join(&format!("/v2/{path}"))
            .map_err(|e| Error::invalid("url", format!("{path}: {e}")))
    }

    /// Resolves a `Location` header against the registry origin.
    pub(crate) fn resolve_location(&self, base: &Url, location: &str) -> Result<Url> {
        base.join(location)
            .map_err(|e| Error::protocol(format!("bad Location {location:?}: {e}")))
    }

    fn same_host(&self, url: &Url) -> bool {
        url.scheme() == self.origin.scheme()
            && url.host_str() == self.origin.host_str()
            && url.port_or_known_default() == self.origin.port_or_known_default()
    }

    /// Sends `req`, answering auth challenges once and following redirects of GET/HEAD.
    /// Returns the final response whatever its status.
    pub(crate) async fn send(&self, req: &Req) -> Result<Response<Incoming>> {
        match req.limit {
            Limit::Total(d) => tokio::time::timeout(d, self.send_inner(req, &Progress::new()))
                .await
                .map_err(|_| {
                    Error::timeout(format!(
                        "{} {} took longer than {}s",
                        req.method,
                        redact(&req.url),
                        d.as_secs_f32()
                    ))
                })?,
            Limit::Idle(d) => {
                let progress = Progress::new();
                let fut = self.send_inner(req, &progress);
                tokio::pin!(fut);
                let tick = (d / 4).max(Duration::from_millis(50));
                loop {
                    tokio::select! {
                        r = &mut fut => return r,
                        _ = tokio::time::sleep(tick) => {
                            // Once the body is out, the registry is committing the blob
                            // (S3-backed ones copy it), which gets the longer limit.
                            let allowed = if progress.is_body_sent() { self.commit_timeout.max(d) } else { d };
                            if progress.idle_for() > allowed {
                                return Err(Error::timeout(format!(
                                    "{} {}: no progress for {}s",
                                    req.method, redact(&req.url), allowed.as_secs_f32()
                                )));
                            }
                        }
                    }
                }
            }
        }
    }

    async fn send_inner(&self, req: &Req, progress: &Progress) -> Result<Response<Incoming>> {
        let mut url = req.url.clone();
        let mut redirects = 0;
        let mut auth_retried = false;
        loop {
            let auth = if self.same_host(&url) {
                self.cached_auth(req.scope.as_ref())
            } else {
                None
            };
            let resp = self.send_once(req, &url, auth.clone(), progress).await?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED && self.same_host(&url) && !auth_retried {
                auth_retried = true;
                let challenge = resp
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_challenge);
                if let Some(ch) = challenge
                    && self
                        .authorize(&ch, req.scope.as_ref(), auth.as_ref())
                        .await?
                {
                    continue;
                }
                return Ok(resp);
            }
            if status.is_redirection()
                && matches!(req.method, Method::GET | Method::HEAD)
                && let Some(loc) = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
            {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(Error::protocol(format!(
                        "too many redirects from {}",
                        redact(&req.url)
                    )));
                }
                url = self.resolve_location(&url, loc)?;
                continue;
            }
            return Ok(resp);
        }
    }

    async fn send_once(
        &self,
        req: &Req,
        url: &Url,
        auth: Option<HeaderValue>,
        progress: &Progress,
    ) -> Result<Response<Incoming>> {
        let (body, len) = req.body.make(progress);
        let mut builder = Request::builder()
            .method(req.method.clone())
            .uri(url.as_str())
            .header(header::USER_AGENT, self.user_agent.clone());
        if let Some(a) = auth {
            builder = builder.header(header::AUTHORIZATION, a);
        }
        if let Some(len) = len {
            builder = builder.header(header::CONTENT_LENGTH, len);
        } else if matches!(req.method, Method::PUT | Method::POST | Method::PATCH) {
            builder = builder.header(header::CONTENT_LENGTH, 0);
        }
        for (k, v) in &req.headers {
            builder = builder.header(k, v);
        }
        let request = builder
            .body(body)
            .map_err(|e| Error::invalid("request", e.to_string()))?;
        progress.tick();
        let resp = self.client.request(request).await.map_err(|e| {
            Error::transport(format!(
                "{} {}: {}",
                req.method,
                redact(url),
                error_chain(&e)
            ))
        })?;
        progress.tick();
        Ok(resp)
    }

    fn cached_auth(&self, scope: Option<&Scope>) -> Option<HeaderValue> {
        if let CredentialSource::Static(Credentials::Bearer { token }) = &self.credentials {
            return HeaderValue::from_str(&format!("Bearer {token}")).ok();
        }
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(scope) = scope
            && let Some((h, exp)) = cache.tokens.get(scope)
            && *exp > Instant::now()
        {
            return Some(h.clone());
        }
        cache.basic.clone()
    }

    /// Answers a challenge; `true` when the request should be sent again.
    async fn authorize(
        &self,
        ch: &Challenge,
        scope: Option<&Scope>,
        sent: Option<&HeaderValue>,
    ) -> Result<bool> {
        if matches!(
            self.credentials,
            CredentialSource::Static(Credentials::Bearer { .. })
        ) {
            return Ok(false); // a fixed token that was refused stays refused
        }
        let _guard = self.token_fetch.lock().await;
        // Another task may have refreshed the auth while this one waited.
        if let Some(now) = self.cached_auth(scope)
            && Some(&now) != sent
        {
            return Ok(true);
        }
        let creds = self.resolve_credentials().await?;
        match ch {
            Challenge::Basic => {
                let Some(h) = creds.basic_header() else {
                    return Ok(false);
                };
                let v = HeaderValue::from_str(&h)
                    .map_err(|_| Error::invalid("credentials", "not a valid header value"))?;
                if sent == Some(&v) {
                    return Ok(false); // the registry rejected these very credentials
                }
                self.cache.lock().unwrap_or_else(|p| p.into_inner()).basic = Some(v);
                Ok(true)
            }
            Challenge::Bearer {
                realm,
                service,
                scope: asked,
            } => {
                let mut scopes: Vec<String> = Vec::new();
                if let Some(s) = scope {
                    scopes.push(s.0.clone());
                }
                if let Some(a) = asked
                    && !scopes.contains(a)
                {
                    scopes.push(a.clone());
                }
                let (token, ttl) = self
                    .fetch_token(realm, service.as_deref(), &scopes, &creds)
                    .await?;
                let v = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| Error::protocol("token endpoint returned an invalid token"))?;
                if sent == Some(&v) {
                    return Ok(false);
                }
                let key = scope.cloned().unwrap_or_else(|| Scope(scopes.join(" ")));
                let now = Instant::now();
                let exp = now + token_cache_for(ttl);
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                prune_tokens(&mut cache.tokens, now, MAX_CACHED_TOKENS);
                cache.tokens.insert(key, (v, exp));
                Ok(true)
            }
        }
    }

    async fn resolve_credentials(&self) -> Result<Credentials> {
        let src = self.credentials.clone();
        let host = self.host.clone();
        tokio::task::spawn_blocking(move || src.resolve(&host))
            .await
            .map_err(|e| Error::io("resolving credentials", io::Error::other(e.to_string())))?
    }

    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scopes: &[String],
        creds: &Credentials,
    ) -> Result<(String, Option<u64>)> {
        let mut url = Url::parse(realm)
            .map_err(|e| Error::protocol(format!("bad token realm {realm:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::protocol(format!("bad token realm {realm:?}")));
        }
        let decision = match creds {
            // Kubernetes credentials go to the configured realm only, whatever its host.
            Credentials::KubernetesToken { realm: allowed, .. } => {
                if crate::auth::is_token_realm(allowed, &url) {
                    RealmCredentials::Send
                } else {
                    RealmCredentials::NotTheTokenRealm
                }
            }
            _ => RealmCredentials::decide(&self.origin, &url),
        };
        let creds = if decision == RealmCredentials::Send {
            creds
        } else {
            if !matches!(creds, Credentials::Anonymous) {
                tracing::warn!(
                    realm = %redact(&url),
                    registry = %self.origin,
                    ?decision,
                    "not sending credentials to this token realm (not the registry's own host and scheme, or not OCI_REGISTRY_TOKEN_REALM); asking for an anonymous token"
                );
            }
            &Credentials::Anonymous
        };
        let req = match creds {
            Credentials::IdentityToken { token } => {
                // OAuth2 refresh-token grant, as Docker does with an identity token.
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                form.append_pair("grant_type", "refresh_token");
                form.append_pair("refresh_token", token);
                form.append_pair("client_id", "cocoon");
                if let Some(s) = service {
                    form.append_pair("service", s);
                }
                if !scopes.is_empty() {
                    form.append_pair("scope", &scopes.join(" "));
                }
                Req::new(Method::POST, url, None, Limit::Total(self.request_timeout))
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")?
                    .body(Body::Full(Bytes::from(form.finish())))
            }
            _ => {
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = service {
                        q.append_pair("service", s);
                    }
                    for s in scopes {
                        q.append_pair("scope", s);
                    }
                }
                let mut r = Req::new(Method::GET, url, None, Limit::Total(self.request_timeout));
                if let Some(b) = creds.basic_header() {
                    r = r.header(header::AUTHORIZATION, &b)?;
                }
                if let Credentials::KubernetesToken { token: Some(t), .. } = creds {
                    // Checked here so that an error never quotes the token.
                    if !t.bytes().all(|b| b.is_ascii_graphic()) {
                        return Err(Error::invalid(
                            crate::auth::ENV_KUBERNETES_TOKEN_FILE,
                            "the token holds characters a header cannot carry",
                        ));
                    }
                    r = r.header(header::AUTHORIZATION, &format!("Bearer {t}"))?;
                }
                r
            }
        };
        let resp = tokio::time::timeout(
            self.request_timeout,
            self.send_once(&req, &req.url, None, &Progress::new()),
        )
        .await
        .map_err(|_| Error::timeout("token request timed out"))??;
        let status = resp.status();
        let body = self.read_small(resp, MAX_SMALL_BODY).await?;
        if !status.is_success() {
            return Err(match status.as_u16() {
                401 | 403 => Error::Unauthorized {
                    message: format!("token endpoint refused the credentials ({status})"),
                },
                s => error_from_status("token", s, &body, None),
            });
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|e| Error::protocol(format!("token response: {e}")))?;
        parsed
            .into_token()
            .ok_or_else(|| Error::protocol("token response has no token"))
    }
}

impl Http {
    /// Reads a whole (small) body within the request timeout; more than `max` bytes is a
    /// protocol error.
    pub(crate) async fn read_small(&self, resp: Response<Incoming>, max: usize) -> Result<Bytes> {
        let d = self.request_timeout;
        tokio::time::timeout(d, read_small_body(resp, max))
            .await
            .map_err(|_| {
                Error::timeout(format!(
                    "reading a response body took longer than {}s",
                    d.as_secs_f32()
                ))
            })?
    }

    /// The error for a non-success answer (reads a bounded part of the body for the message).
    pub(crate) async fn status_error(&self, resp: Response<Incoming>, what: &str) -> Error {
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers());
        let body = self.read_small(resp, 64 << 10).await.unwrap_or_default();
        error_from_status(what, status, &body, retry_after)
    }
}

async fn read_small_body(resp: Response<Incoming>, max: usize) -> Result<Bytes> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Error::transport(format!("reading body: {}", error_chain(&e))))?;
        if let Ok(d) = frame.into_data() {
            if out.len() + d.len() > max {
                return Err(Error::protocol(format!(
                    "response body larger than {max} bytes"
                )));
            }
            out.extend_from_slice(&d);
        }
    }
    Ok(Bytes::from(out))
}

fn retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// A response header as a string.
pub(crate) fn header_str<'a>(resp: &'a Response<Incoming>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Reads a streaming response body frame by frame, failing when no data arrives for `idle`.
/// The watchdog is one long-lived timer re-armed only when it fires, so a data frame costs
/// no timer work (per-frame timeouts were a large share of a parallel pull's CPU).
pub(crate) struct BodyReader {
    body: Incoming,
    idle: Duration,
    watchdog: Pin<Box<tokio::time::Sleep>>,
    last_data: Instant,
}

impl BodyReader {
    pub(crate) fn new(resp: Response<Incoming>, idle: Duration) -> BodyReader {
        BodyReader {
            body: resp.into_body(),
            idle,
            watchdog: Box::pin(tokio::time::sleep(idle)),
            last_data: Instant::now(),
        }
    }

    /// The next data chunk; `None` at the end.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            let frame = tokio::select! {
                biased;
                f = self.body.frame() => f,
                _ = self.watchdog.as_mut() => {
                    let deadline = self.last_data + self.idle;
                    if Instant::now() >= deadline {
                        return Err(Error::timeout(format!(
                            "download: no data for {}s",
                            self.idle.as_secs_f32()
                        )));
                    }
                    self.watchdog.as_mut().reset(deadline.into());
                    continue;
                }
            };
            match frame {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(Error::transport(format!("download: {}", error_chain(&e))));
                }
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data()
                        && !d.is_empty()
                    {
                        self.last_data = Instant::now();
                        return Ok(Some(d));
                    }
                }
            }
        }
    }
}

/// The URL without its query (upload URLs carry state tokens that clutter logs).
pub(crate) fn redact(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

fn tls_config(cfg: &RegistryConfig) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    // Plain-HTTP registries never use TLS; skip reading the system store for them.
    if cfg.scheme() == Scheme::Https {
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "loading system CA certificates");
        }
        let (added, _ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, "system CA certificates");
    }
    if let Some(path) = &cfg.ca_file {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let field = crate::config::ENV_CA_FILE;
        let iter = CertificateDer::pem_file_iter(path)
            .map_err(|e| Error::invalid(field, format!("{}: {e}", path.display())))?;
        for cert in iter {
            let cert =
                cert.map_err(|e| Error::invalid(field, format!("{}: {e}", path.display())))?;
            roots
                .add(cert)
                .map_err(|e| Error::invalid(field, format!("{}: {e}", path.display())))?;
        }
    }
    // ALPN is left empty: the connector builder sets it to `http/1.1` from `enable_http1`.
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid("tls", e.to_string()))?
        .with_root_certificates(roots);
    let Some((cert, key)) = &cfg.client_cert else {
        return Ok(builder.with_no_client_auth());
    };
    // A client certificate (a node's kubelet certificate) authenticates to a token service
    // that verifies it against the cluster CA.
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let cert_field = crate::config::ENV_CLIENT_CERT_FILE;
    let key_field = crate::config::ENV_CLIENT_KEY_FILE;
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::invalid(cert_field, format!("{}: {e}", cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::invalid(key_field, format!("{}: {e}", key.display())))?;
    builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| Error::invalid(cert_field, e.to_string()))
}

/// Spawns a producer thread that reads `len` layer bytes from `reader` (already positioned)
/// into a channel body of `buf`-sized frames.
pub(crate) fn file_body(
    mut reader: crate::sparse::ExtentReader,
    len: u64,
    buf: usize,
    progress: Progress,
) -> ReqBody {
    // Two frames in flight per body: enough to keep the socket busy, small enough to bound
    // memory by (concurrency × 3 × buf).
    let (tx, rx) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let mut left = len;
        while left > 0 {
            let want = buf.min(usize::try_from(left).unwrap_or(usize::MAX));
            let chunk = reader.next_chunk(want);
            let stop = match &chunk {
                Ok(c) if c.is_empty() => true,
                Ok(c) => {
                    left -= c.len() as u64;
                    false
                }
                Err(_) => true,
            };
            if tx.blocking_send(chunk).is_err() || stop {
                break;
            }
        }
    });
    ChannelBody::new(rx, len, progress).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_cache_drops_expired_then_soonest_expiring() {
        let now = Instant::now();
        let at = |secs: u64| now + Duration::from_secs(secs);
        let mut tokens: HashMap<String, ((), Instant)> = HashMap::new();
        tokens.insert("gone".into(), ((), now - Duration::from_secs(1)));
        tokens.insert("a".into(), ((), at(30)));
        tokens.insert("b".into(), ((), at(10)));
        tokens.insert("c".into(), ((), at(20)));
        // Room for one more under a bound of 3: the expired entry and the soonest (b) go.
        prune_tokens(&mut tokens, now, 3);
        let mut left: Vec<&str> = tokens.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "c"]);
        // A tenant cycling through scopes never grows the cache past the bound.
        for n in 0..1000 {
            prune_tokens(&mut tokens, now, MAX_CACHED_TOKENS);
            tokens.insert(format!("repository:t{n}:pull"), ((), at(60 + n)));
            assert!(tokens.len() <= MAX_CACHED_TOKENS);
        }
        // The newest (latest-expiring) tokens are the ones kept.
        assert!(tokens.contains_key("repository:t999:pull"));
        assert!(!tokens.contains_key("repository:t0:pull"));
    }

    #[test]
    fn token_lifetimes_are_bounded() {
        let s = Duration::from_secs;
        assert_eq!(token_cache_for(None), s(50));
        assert_eq!(
            token_cache_for(Some(5)),
            s(50),
            "at least the spec's minimum"
        );
        assert_eq!(token_cache_for(Some(300)), s(290));
        // A token endpoint's absurd lifetime is capped: the expiry instant cannot overflow.
        let huge = token_cache_for(Some(u64::MAX));
        assert_eq!(huge, s(MAX_TOKEN_SECS - 10));
        assert!(Instant::now().checked_add(huge).is_some());
    }
}
