//! Client configuration: the registry base, plain-HTTP switch, credentials, timeouts, retries
//! and transfer tuning, built explicitly or from the environment (names documented below).

use std::path::PathBuf;
use std::time::Duration;

use cocoon_api::contract::env::node as env_names;

use crate::auth::CredentialSource;
use crate::error::{Error, Result};
use crate::paging::ListLimits;
use crate::reference::{RegistryBase, Scheme};
use crate::retry::RetryPolicy;

/// Environment variable: the registry base (registry.md §1). Required.
pub const ENV_OCI_REGISTRY: &str = env_names::OCI_REGISTRY;
/// Environment variable: registries reached over plain HTTP although not loopback, as a
/// comma-separated list of `host[:port]` (or `true` for the `OCI_REGISTRY` host).
pub const ENV_INSECURE: &str = "OCI_REGISTRY_INSECURE";
/// Environment variable: a PEM file of extra CA certificates trusted for the registry.
pub const ENV_CA_FILE: &str = "OCI_REGISTRY_CA_FILE";
/// Environment variable: parallel blob transfers (registry.md §5.5; 0 = 8).
pub const ENV_TRANSFER_CONCURRENCY: &str = env_names::SNAPSHOT_TRANSFER_CONCURRENCY;

/// The `User-Agent` of a client whose binary did not name itself.
pub const DEFAULT_USER_AGENT: &str = concat!("cocoon-registry/", env!("CARGO_PKG_VERSION"));

/// Default parallel blob transfers.
pub const DEFAULT_TRANSFER_CONCURRENCY: usize = 8;
/// Blobs larger than this are uploaded in chunks of this size.
pub const DEFAULT_CHUNK_SIZE: u64 = 64 << 20;

/// Everything the client needs to reach one registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Host, port and path prefix (`OCI_REGISTRY`).
    pub base: RegistryBase,
    /// Non-loopback hosts reached over plain HTTP.
    pub insecure_hosts: Vec<String>,
    /// Where credentials come from.
    pub credentials: CredentialSource,
    /// Extra CA certificates (PEM) for the registry's TLS.
    pub ca_file: Option<PathBuf>,
    /// Whole-call limit for calls without a large body (HEAD, manifest GET/PUT, DELETE, POST,
    /// token fetches, tag lists).
    pub request_timeout: Duration,
    /// Blob transfers fail when no byte moves for this long (a whole-call limit would cap the
    /// snapshot size instead of detecting a stall).
    pub transfer_idle_timeout: Duration,
    /// How long the registry may take to answer once a blob's last byte is sent, or to
    /// answer the closing PUT of a chunked upload (it commits the blob then; registries on
    /// object storage copy it, which takes time proportional to its size).
    pub commit_timeout: Duration,
    /// TCP connect limit.
    pub connect_timeout: Duration,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// Parallel blob transfers of one push or pull.
    pub transfer_concurrency: usize,
    /// Blobs larger than this upload as PATCH chunks of this size; smaller ones in one PUT.
    pub chunk_size: u64,
    /// Where a tar-stream push spools entries (default: the system temp dir).
    pub spool_dir: Option<PathBuf>,
    /// The `User-Agent` of every request ([`DEFAULT_USER_AGENT`] unless a binary names
    /// itself, e.g. `cocoon-operator/<version>`).
    pub user_agent: String,
    /// Bounds on paginated listings (catalog, tag lists): page size, page cap, entry cap.
    pub list_limits: ListLimits,
}

impl RegistryConfig {
    /// A configuration with defaults for `base` (anonymous).
    pub fn new(base: RegistryBase) -> RegistryConfig {
        RegistryConfig {
            base,
            insecure_hosts: Vec::new(),
            credentials: CredentialSource::Anonymous,
            ca_file: None,
            request_timeout: Duration::from_secs(30),
            transfer_idle_timeout: Duration::from_secs(60),
            commit_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            transfer_concurrency: DEFAULT_TRANSFER_CONCURRENCY,
            chunk_size: DEFAULT_CHUNK_SIZE,
            spool_dir: None,
            user_agent: DEFAULT_USER_AGENT.to_string(),
            list_limits: ListLimits::default(),
        }
    }

    /// The same configuration, sending `user_agent` as the `User-Agent` of every request.
    pub fn with_user_agent(mut self, user_agent: impl Into<String>) -> RegistryConfig {
        self.user_agent = user_agent.into();
        self
    }

    /// Parses `OCI_REGISTRY` into a default configuration.
    pub fn for_registry(oci_registry: &str) -> Result<RegistryConfig> {
        Ok(Self::new(RegistryBase::parse(oci_registry)?))
    }

    /// Reads the process environment (see [`RegistryConfig::from_env_with`]).
    pub fn from_env() -> Result<RegistryConfig> {
        Self::from_env_with(&|k| std::env::var(k).ok())
    }

    /// Builds the configuration from `env`: [`ENV_OCI_REGISTRY`] (required),
    /// [`ENV_INSECURE`], [`ENV_CA_FILE`], [`ENV_TRANSFER_CONCURRENCY`], the listing bounds of
    /// [`ListLimits::from_env_with`], and the credential
    /// variables of [`CredentialSource::from_env`].
    pub fn from_env_with(env: &dyn Fn(&str) -> Option<String>) -> Result<RegistryConfig> {
        let base = env(ENV_OCI_REGISTRY).unwrap_or_default();
        let mut cfg = Self::for_registry(&base)?;
        if let Some(v) = env(ENV_INSECURE) {
            cfg.insecure_hosts = parse_insecure(&v, &cfg.base);
        }
        if let Some(p) = env(ENV_CA_FILE).filter(|p| !p.is_empty()) {
            cfg.ca_file = Some(PathBuf::from(p));
        }
        if let Some(v) = env(ENV_TRANSFER_CONCURRENCY).filter(|v| !v.trim().is_empty()) {
            cfg.transfer_concurrency = parse_concurrency(&v)?;
        }
        cfg.list_limits = ListLimits::from_env_with(env)?;
        cfg.credentials = CredentialSource::from_env(env)?;
        Ok(cfg)
    }

    /// The scheme requests use.
    pub fn scheme(&self) -> Scheme {
        self.base.scheme(&self.insecure_hosts)
    }

    /// `http(s)://host[:port]`.
    pub fn origin(&self) -> String {
        let s = match self.scheme() {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{s}://{}", self.base.host())
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.transfer_concurrency == 0 {
            return Err(Error::invalid("transfer_concurrency", "must be at least 1"));
        }
        self.list_limits.validate()?;
        if self.chunk_size < (1 << 20) {
            return Err(Error::invalid("chunk_size", "must be at least 1 MiB"));
        }
        if self.request_timeout.is_zero()
            || self.transfer_idle_timeout.is_zero()
            || self.commit_timeout.is_zero()
        {
            return Err(Error::invalid("timeout", "must be positive"));
        }
        Ok(())
    }
}

fn parse_insecure(v: &str, base: &RegistryBase) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .flat_map(|h| {
            if h.eq_ignore_ascii_case("true") {
                Some(base.host().to_string())
            } else if h.eq_ignore_ascii_case("false") {
                None
            } else {
                Some(h.to_ascii_lowercase())
            }
        })
        .collect()
}

fn parse_concurrency(v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(0) => Ok(DEFAULT_TRANSFER_CONCURRENCY),
        Ok(n) if n <= 256 => Ok(n),
        _ => Err(Error::invalid(
            ENV_TRANSFER_CONCURRENCY,
            format!("{v:?} is not a number from 0 to 256"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Credentials, ENV_PASSWORD, ENV_USERNAME};

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| owned.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn oci_registry_is_required() {
        let e = RegistryConfig::from_env_with(&env(&[])).err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some("OCI_REGISTRY must be set".into())
        );
    }

    #[test]
    fn loopback_is_plain_http_and_others_need_opt_in() {
        let c = RegistryConfig::from_env_with(&env(&[("OCI_REGISTRY", "127.0.0.1:5055")]))
            .expect("cfg");
        assert_eq!(c.origin(), "http://127.0.0.1:5055");
        let c = RegistryConfig::from_env_with(&env(&[("OCI_REGISTRY", "reg.lan:5000/vms")]))
            .expect("cfg");
        assert_eq!(c.origin(), "https://reg.lan:5000");
        let c = RegistryConfig::from_env_with(&env(&[
            ("OCI_REGISTRY", "reg.lan:5000/vms"),
            ("OCI_REGISTRY_INSECURE", "true"),
        ]))
        .expect("cfg");
        assert_eq!(c.origin(), "http://reg.lan:5000");
        let c = RegistryConfig::from_env_with(&env(&[
            ("OCI_REGISTRY", "reg.lan:5000"),
            ("OCI_REGISTRY_INSECURE", "other:1, reg.lan:5000"),
        ]))
        .expect("cfg");
        assert_eq!(c.scheme(), Scheme::Http);
    }

    #[test]
    fn transfer_concurrency_zero_means_eight_and_garbage_is_rejected() {
        let base = ("OCI_REGISTRY", "r.io");
        let c =
            RegistryConfig::from_env_with(&env(&[base, ("SNAPSHOT_TRANSFER_CONCURRENCY", "0")]))
                .expect("cfg");
        assert_eq!(c.transfer_concurrency, 8);
        let c =
            RegistryConfig::from_env_with(&env(&[base, ("SNAPSHOT_TRANSFER_CONCURRENCY", "3")]))
                .expect("cfg");
        assert_eq!(c.transfer_concurrency, 3);
        let e =
            RegistryConfig::from_env_with(&env(&[base, ("SNAPSHOT_TRANSFER_CONCURRENCY", "x")]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert!(e.starts_with("SNAPSHOT_TRANSFER_CONCURRENCY:"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_environment() {
        let c = RegistryConfig::from_env_with(&env(&[
            ("OCI_REGISTRY", "r.io"),
            (ENV_USERNAME, "u"),
            (ENV_PASSWORD, "p"),
        ]))
        .expect("cfg");
        assert!(matches!(
            c.credentials,
            CredentialSource::Static(Credentials::Basic { .. })
        ));
    }
}
