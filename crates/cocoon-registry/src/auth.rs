//! Registry credentials (anonymous, basic, bearer, identity token) from the environment and the
//! Docker config keychain (auths, credHelpers, credsStore); parsing of WWW-Authenticate.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use crate::error::{Error, Result};

/// Environment variable: user name for basic auth (with [`ENV_PASSWORD`]).
pub const ENV_USERNAME: &str = "OCI_REGISTRY_USERNAME";
/// Environment variable: password for basic auth (with [`ENV_USERNAME`]).
pub const ENV_PASSWORD: &str = "OCI_REGISTRY_PASSWORD";
/// Environment variable: a registry bearer token sent as is on every request.
pub const ENV_TOKEN: &str = "OCI_REGISTRY_TOKEN";
/// Environment variable: directory holding the Docker `config.json` (Docker's own name).
pub const ENV_DOCKER_CONFIG: &str = "DOCKER_CONFIG";
/// Environment variable: the token realm (URL) of a registry that uses cocoon's registry token
/// service (`cocoon-operator run` with `REGISTRY_TOKEN_ADDR`). Set: the Kubernetes credential
/// ([`ENV_KUBERNETES_TOKEN_FILE`] and/or the client certificate of
/// [`crate::config::ENV_CLIENT_CERT_FILE`]) is presented to exactly this realm, and to no other.
pub const ENV_TOKEN_REALM: &str = "OCI_REGISTRY_TOKEN_REALM";
/// Environment variable: the file holding the Kubernetes bearer token presented to
/// [`ENV_TOKEN_REALM`] (read again for every token fetch, so rotated tokens are picked up).
/// Default: [`DEFAULT_KUBERNETES_TOKEN_FILE`] when it exists.
pub const ENV_KUBERNETES_TOKEN_FILE: &str = "OCI_REGISTRY_KUBERNETES_TOKEN_FILE";
/// The in-cluster ServiceAccount token.
pub const DEFAULT_KUBERNETES_TOKEN_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// How long a `docker-credential-*` helper may take before it is killed.
pub const DEFAULT_HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// What a redacted secret prints as in `Debug` output.
pub(crate) const REDACTED: &str = "<redacted>";

/// Credentials for one registry host.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// No credentials; bearer challenges are answered with anonymous tokens.
    #[default]
    Anonymous,
    /// User name and password: sent as Basic auth, and to token endpoints.
    Basic { username: String, password: String },
    /// A registry token sent as `Authorization: Bearer` on every request.
    Bearer { token: String },
    /// An OAuth2 refresh token (Docker's `identitytoken`), exchanged at the token endpoint.
    IdentityToken { token: String },
    /// A Kubernetes bearer token (or none: a client certificate authenticates) presented only
    /// to the token realm `realm` (cocoon's registry token service).
    KubernetesToken {
        realm: url::Url,
        token: Option<String>,
    },
}

impl std::fmt::Debug for Credentials {
    // Never print secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
            Credentials::Bearer { .. } => f.write_str("Bearer(***)"),
            Credentials::IdentityToken { .. } => f.write_str("IdentityToken(***)"),
            Credentials::KubernetesToken { realm, token } => write!(
                f,
                "KubernetesToken({realm}, {})",
                if token.is_some() { "***" } else { "no token" }
            ),
        }
    }
}

impl Credentials {
    /// Basic credentials.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials::Basic {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The `Authorization` value for Basic auth, when these are basic credentials.
    pub(crate) fn basic_header(&self) -> Option<String> {
        match self {
            Credentials::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            _ => None,
        }
    }
}

/// Where credentials come from; resolved again whenever the registry asks for them, so that
/// short-lived helper tokens are refreshed.
#[derive(Debug, Clone, Default)]
pub enum CredentialSource {
    /// Fixed credentials.
    Static(Credentials),
    /// The Docker config keychain for the registry host.
    DockerConfig {
        /// The `config.json` path.
        path: PathBuf,
        /// Directory of `docker-credential-*` helpers; `None` searches `PATH`.
        helper_dir: Option<PathBuf>,
        /// A helper still running after this long is killed and the resolution fails
        /// ([`Error::HelperTimeout`]); pulls and pushes do not wait on a hung helper.
        helper_timeout: Duration,
    },
    /// Anonymous.
    #[default]
    Anonymous,
    /// cocoon's registry token service at `realm`, presented the Kubernetes token in
    /// `token_file` (`None`: a client certificate alone authenticates).
    KubernetesToken {
        realm: url::Url,
        token_file: Option<PathBuf>,
    },
}

/// Parses [`ENV_TOKEN_REALM`]: an absolute `https` URL (plain `http` only for a loopback host),
/// no user info, query or fragment.
pub fn parse_token_realm(value: &str) -> Result<url::Url> {
    let url = url::Url::parse(value.trim())
        .map_err(|e| Error::invalid(ENV_TOKEN_REALM, format!("{value:?}: {e}")))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(Error::invalid(
                ENV_TOKEN_REALM,
                format!("{value:?}: plain http only for a loopback host; use https"),
            ));
        }
        _ => {
            return Err(Error::invalid(
                ENV_TOKEN_REALM,
                format!("{value:?}: not an http(s) URL"),
            ));
        }
    }
    if url.host().is_none()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(Error::invalid(
            ENV_TOKEN_REALM,
            format!(
                "{value:?}: must be scheme://host[:port]/path without user info, query or fragment"
            ),
        ));
    }
    Ok(url)
}

/// Whether the challenge's `realm` is the configured token realm `allowed`: same scheme, host,
/// port and path (the query the client adds is not compared).
pub fn is_token_realm(allowed: &url::Url, realm: &url::Url) -> bool {
    allowed.scheme() == realm.scheme()
        && allowed.host_str().map(str::to_ascii_lowercase)
            == realm.host_str().map(str::to_ascii_lowercase)
        && allowed.port_or_known_default() == realm.port_or_known_default()
        && allowed.path() == realm.path()
        && realm.username().is_empty()
        && realm.password().is_none()
}

impl CredentialSource {
    /// The source the environment selects, in order: [`ENV_TOKEN_REALM`] (token auth, with
    /// [`ENV_KUBERNETES_TOKEN_FILE`]; refused next to static credentials); [`ENV_TOKEN`];
    /// [`ENV_USERNAME`] with [`ENV_PASSWORD`]; the Docker config at `$DOCKER_CONFIG/config.json` or
    /// `$HOME/.docker/config.json` when it exists; else anonymous.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<CredentialSource> {
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(realm) = get(ENV_TOKEN_REALM) {
            for other in [ENV_TOKEN, ENV_USERNAME, ENV_PASSWORD] {
                if get(other).is_some() {
                    return Err(Error::invalid(
                        ENV_TOKEN_REALM,
                        format!(
                            "cannot be combined with {other}: choose token auth or static credentials"
                        ),
                    ));
                }
            }
            let realm = parse_token_realm(&realm)?;
            let token_file = match get(ENV_KUBERNETES_TOKEN_FILE) {
                Some(f) => Some(PathBuf::from(f)),
                None => Some(PathBuf::from(DEFAULT_KUBERNETES_TOKEN_FILE)).filter(|p| p.is_file()),
            };
            return Ok(CredentialSource::KubernetesToken { realm, token_file });
        }
        if let Some(token) = get(ENV_TOKEN) {
            return Ok(CredentialSource::Static(Credentials::Bearer { token }));
        }
        match (get(ENV_USERNAME), get(ENV_PASSWORD)) {
            (Some(username), Some(password)) => {
                return Ok(CredentialSource::Static(Credentials::Basic {
                    username,
                    password,
                }));
            }
            (Some(_), None) => {
                return Err(Error::invalid(
                    ENV_PASSWORD,
                    format!("must be set with {ENV_USERNAME}"),
                ));
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    ENV_USERNAME,
                    format!("must be set with {ENV_PASSWORD}"),
                ));
            }
            (None, None) => {}
        }
        let path = match (get(ENV_DOCKER_CONFIG), get("HOME")) {
            (Some(dir), _) => Some(PathBuf::from(dir).join("config.json")),
            (None, Some(home)) => Some(PathBuf::from(home).join(".docker").join("config.json")),
            (None, None) => None,
        };
        Ok(match path {
            Some(path) if path.is_file() => CredentialSource::DockerConfig {
                path,
                helper_dir: None,
                helper_timeout: DEFAULT_HELPER_TIMEOUT,
            },
            _ => CredentialSource::Anonymous,
        })
    }

    /// The credentials for `host` (`host[:port]`), running a credential helper if the Docker
    /// config names one. Blocking: call from a blocking context.
    pub fn resolve(&self, host: &str) -> Result<Credentials> {
        match self {
            CredentialSource::Static(c) => Ok(c.clone()),
            CredentialSource::Anonymous => Ok(Credentials::Anonymous),
            CredentialSource::KubernetesToken { realm, token_file } => {
                let token = match token_file {
                    None => None,
                    Some(path) => {
                        let t = std::fs::read_to_string(path).map_err(|e| {
                            Error::io(
                                format!("reading {ENV_KUBERNETES_TOKEN_FILE} {}", path.display()),
                                e,
                            )
                        })?;
                        Some(t.trim().to_owned()).filter(|t| !t.is_empty())
                    }
                };
                Ok(Credentials::KubernetesToken {
                    realm: realm.clone(),
                    token,
                })
            }
            CredentialSource::DockerConfig {
                path,
                helper_dir,
                helper_timeout,
            } => {
                let bytes = std::fs::read(path)
                    .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
                let cfg = DockerConfig::parse(&bytes)
                    .map_err(|e| e.context(format!("docker config {}", path.display())))?;
                cfg.credentials_for(host, &|helper, server| {
                    run_helper(helper_dir.as_deref(), helper, server, *helper_timeout)
                })
            }
        }
    }
}

/// The parts of Docker's `config.json` that carry credentials. `Debug` redacts the secrets.
#[derive(Debug, Default, Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// What a `docker-credential-<name> get` printed.
#[derive(Deserialize)]
pub(crate) struct HelperOutput {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// `Some("<redacted>")` for a set secret, `None` for an absent one: `Debug` output tells
/// whether a secret is there, never what it is.
fn redacted(secret: &Option<String>) -> Option<&'static str> {
    secret.as_ref().map(|_| REDACTED)
}

impl std::fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `auth` is base64 of user:password, as secret as the password.
        f.debug_struct("AuthEntry")
            .field("auth", &redacted(&self.auth))
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("identitytoken", &redacted(&self.identitytoken))
            .field("registrytoken", &redacted(&self.registrytoken))
            .finish()
    }
}

impl std::fmt::Debug for HelperOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperOutput")
            .field("username", &self.username)
            .field("secret", &REDACTED)
            .finish()
    }
}

/// Runs a credential helper: `(helper name, server) → helper stdout, or None when the helper
/// has no credentials for the server`.
pub type HelperRunner<'a> = dyn Fn(&str, &str) -> Result<Option<Vec<u8>>> + 'a;

impl DockerConfig {
    /// Parses `config.json` bytes.
    pub fn parse(bytes: &[u8]) -> Result<DockerConfig> {
        serde_json::from_slice(bytes).map_err(|e| Error::invalid("config.json", e.to_string()))
    }

    /// Credentials for `host`, Docker's order: a `credHelpers` entry for the host, else the
    /// `credsStore` helper, else the `auths` entry; a helper without credentials for the host
    /// falls through to `auths`.
    pub fn credentials_for(&self, host: &str, run: &HelperRunner<'_>) -> Result<Credentials> {
        let want = normalize_server(host);
        let helper = self
            .cred_helpers
            .iter()
            .find(|(k, _)| normalize_server(k) == want)
            .map(|(_, v)| v.as_str())
            .or(self.creds_store.as_deref())
            .filter(|h| !h.is_empty());
        if let Some(helper) = helper {
            // Helpers are keyed by the server as Docker writes it: the bare host.
            if let Some(out) = run(helper, host)? {
                let parsed: HelperOutput = serde_json::from_slice(&out).map_err(|e| {
                    Error::invalid(format!("docker-credential-{helper} output"), e.to_string())
                })?;
                return Ok(if parsed.username == "<token>" {
                    Credentials::IdentityToken {
                        token: parsed.secret,
                    }
                } else {
                    Credentials::Basic {
                        username: parsed.username,
                        password: parsed.secret,
                    }
                });
            }
        }
        let Some(entry) = self
            .auths
            .iter()
            .find(|(k, _)| normalize_server(k) == want)
            .map(|(_, v)| v)
        else {
            return Ok(Credentials::Anonymous);
        };
        if let Some(t) = entry.registrytoken.as_deref().filter(|t| !t.is_empty()) {
            return Ok(Credentials::Bearer {
                token: t.to_string(),
            });
        }
        if let Some(t) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
            return Ok(Credentials::IdentityToken {
                token: t.to_string(),
            });
        }
        if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let field = format!("auths.{host}.auth");
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| Error::invalid(&field, format!("not base64: {e}")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| Error::invalid(&field, "not UTF-8 after base64 decoding"))?;
            let Some((u, p)) = text.split_once(':') else {
                return Err(Error::invalid(&field, "must encode user:password"));
            };
            return Ok(Credentials::basic(u, p));
        }
        match (&entry.username, &entry.password) {
            (Some(u), Some(p)) if !u.is_empty() => Ok(Credentials::basic(u, p)),
            _ => Ok(Credentials::Anonymous),
        }
    }
}

/// `https://index.docker.io/v1/` → `docker.io`; `https://host:5000/x` → `host:5000`.
fn normalize_server(s: &str) -> String {
    let s = s.trim();
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    let host = s.split('/').next().unwrap_or(s).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => host,
    }
}

/// Runs `docker-credential-<helper> get` with the server on stdin; kills it (and whatever it
/// started) when it has not exited within `timeout`.
fn run_helper(
    dir: Option<&Path>,
    helper: &str,
    server: &str,
    timeout: Duration,
) -> Result<Option<Vec<u8>>> {
    if helper.is_empty() || helper.contains(['/', '\0']) {
        return Err(Error::invalid(
            "credHelpers",
            format!("invalid helper name {helper:?}"),
        ));
    }
    let bin = format!("docker-credential-{helper}");
    let program = match dir {
        Some(d) => d.join(&bin),
        None => PathBuf::from(&bin),
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout kills what the helper started as well.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io(format!("running {bin}"), e))?;
    let deadline = Instant::now() + timeout;
    // Readers on threads of their own: a helper writing more than a pipe holds must not
    // block on us while we wait for it to exit.
    let (tx, rx) = mpsc::channel();
    read_on_thread(child.stdout.take(), Pipe::Stdout, tx.clone());
    read_on_thread(child.stderr.take(), Pipe::Stderr, tx);
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits without reading its stdin closes the pipe: not an error here,
        // its exit status tells.
        let _ = stdin.write_all(server.as_bytes());
    }
    let status = match wait_until(&mut child, deadline) {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill_group(&mut child);
            tracing::warn!(helper = %bin, ?timeout, "credential helper timed out; killed");
            return Err(Error::HelperTimeout {
                helper: helper.to_string(),
                after: timeout,
            });
        }
        Err(e) => {
            kill_group(&mut child);
            return Err(Error::io(format!("waiting for {bin}"), e));
        }
    };
    // The output, unless something the helper left behind holds its pipes open.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((Pipe::Stdout, b)) => stdout = b,
            Ok((Pipe::Stderr, b)) => stderr = b,
            Err(_) => {
                kill_group(&mut child);
                return Err(Error::HelperTimeout {
                    helper: helper.to_string(),
                    after: timeout,
                });
            }
        }
    }
    if status.success() {
        return Ok(Some(stdout));
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    // The helper protocol's way of saying "nothing stored for this server".
    if text.to_ascii_lowercase().contains("credentials not found") {
        return Ok(None);
    }
    Err(Error::io(
        format!("{bin} get"),
        std::io::Error::other(format!("{status} ({})", text.trim())),
    ))
}

/// Which output of a helper a reader thread read.
enum Pipe {
    Stdout,
    Stderr,
}

/// Reads `pipe` to its end on a thread of its own and sends the bytes to `tx`.
fn read_on_thread<R: Read + Send + 'static>(
    pipe: Option<R>,
    which: Pipe,
    tx: mpsc::Sender<(Pipe, Vec<u8>)>,
) {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send((which, buf));
    });
}

/// Waits for `child` to exit until `deadline`; `None` when it is still running then.
fn wait_until(
    child: &mut Child,
    deadline: Instant,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    // std has no wait with a timeout: poll, starting fast (helpers usually answer at once).
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Kills the helper's process group and reaps the helper.
fn kill_group(child: &mut Child) {
    // The group id is the helper's pid (`process_group(0)`). It cannot have been reused:
    // the helper is not reaped yet, or (its output still open) something it started is
    // still in the group, and a pid is not handed out while a group of that id exists.
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) takes plain integers and touches no memory of this process.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses the first challenge of a `WWW-Authenticate` value; `None` for unknown schemes.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, rest) = match value.find(char::is_whitespace) {
        Some(i) => (&value[..i], value[i..].trim_start()),
        None => (value, ""),
    };
    let params = parse_params(rest);
    let get = |k: &str| {
        params
            .iter()
            .find(|(pk, _)| pk.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    } else {
        None
    }
}

/// `k1="v1",k2=v2` with quoted strings that may contain commas and `\"` escapes.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() && chars.peek().is_none() {
            break;
        }
        let mut val = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some(n) = chars.next() {
                                val.push(n);
                            }
                        }
                        '"' => break,
                        c => val.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    val.push(c);
                    chars.next();
                }
            }
        }
        let key = key.trim().to_string();
        if !key.is_empty() {
            out.push((key, val.trim().to_string()));
        }
        if chars.peek().is_none() {
            break;
        }
    }
    out
}

/// The token endpoint's answer (`token` or `access_token`, optional lifetime). `Debug`
/// redacts the tokens.
#[derive(Deserialize)]
pub(crate) struct TokenResponse {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub access_token: Option<String>,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl std::fmt::Debug for TokenResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenResponse")
            .field("token", &redacted(&self.token))
            .field("access_token", &redacted(&self.access_token))
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

impl TokenResponse {
    pub(crate) fn into_token(self) -> Option<(String, Option<u64>)> {
        let t = self
            .token
            .filter(|t| !t.is_empty())
            .or(self.access_token.filter(|t| !t.is_empty()))?;
        Some((t, self.expires_in))
    }
}

/// Whether a bearer challenge's token realm may receive the registry's credentials (Basic
/// user/password or an identity token).
///
/// The realm comes from the registry's `WWW-Authenticate` answer, so a compromised or
/// impersonated registry (or anyone on the path of a plain-HTTP one) could point it anywhere.
/// Credentials go only to the registry's own host (compared case-insensitively; the port may
/// differ, a token service beside the registry is common) over the registry's own scheme, or
/// over `https` when the registry is plain `http`. Anything else (another host, an https →
/// http downgrade, a scheme that is neither) asks for an anonymous token instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealmCredentials {
    /// Send the credentials.
    Send,
    /// The realm is on another host than the registry.
    OtherHost,
    /// The registry is reached over https but the realm over http.
    Downgrade,
    /// Kubernetes credentials, and the realm is not the configured token realm.
    NotTheTokenRealm,
}

impl RealmCredentials {
    /// Decides for the registry at `origin` and the token realm `realm`.
    pub fn decide(origin: &url::Url, realm: &url::Url) -> RealmCredentials {
        let host = |u: &url::Url| u.host_str().map(str::to_ascii_lowercase);
        if host(origin).is_none() || host(origin) != host(realm) {
            return RealmCredentials::OtherHost;
        }
        match (origin.scheme(), realm.scheme()) {
            (o, r) if o == r => RealmCredentials::Send,
            ("http", "https") => RealmCredentials::Send,
            _ => RealmCredentials::Downgrade,
        }
    }
}
