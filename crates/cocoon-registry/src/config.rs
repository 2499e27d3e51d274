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
/// Environment variable: a PEM client certificate (chain) presented on TLS connections, e.g. a
/// node's kubelet certificate for cocoon's registry token service; with [`ENV_CLIENT_KEY_FILE`].
pub const ENV_CLIENT_CERT_FILE: &str = "OCI_REGISTRY_CLIENT_CERT_FILE";
/// Environment variable: the PEM key of [`ENV_CLIENT_CERT_FILE`].
pub const ENV_CLIENT_KEY_FILE: &str = "OCI_REGISTRY_CLIENT_KEY_FILE";
/// Environment variable: parallel blob transfers (registry.md §5.5; 0 = 8).
pub const ENV_TRANSFER_CONCURRENCY: &str = env_names::SNAPSHOT_TRANSFER_CONCURRENCY;

/// Environment variable: zstd level of pushed layers (registry.md §5.5; 0 = off).
pub const ENV_ZSTD_LEVEL: &str = env_names::SNAPSHOT_ZSTD_LEVEL;
/// Environment variable: chunk size of pushed files in MiB (registry.md §5.5; 0 = off).
pub const ENV_CHUNK_SIZE_MIB: &str = env_names::SNAPSHOT_CHUNK_SIZE_MIB;
/// Environment variable: memory a push may hold in chunk buffers, MiB (0 = 9216).
pub const ENV_MEMORY_BUDGET_MIB: &str = env_names::SNAPSHOT_MEMORY_BUDGET_MIB;
/// Environment variable: memory a pull may hold in prefetched chunks, MiB (default 2048).
pub const ENV_PULL_BUDGET_MIB: &str = env_names::SNAPSHOT_PULL_BUDGET_MIB;

/// Default push memory budget (`SNAPSHOT_MEMORY_BUDGET_MIB` = 0).
pub const DEFAULT_MEMORY_BUDGET: u64 = 9216 << 20;
/// Default pull prefetch budget.
pub const DEFAULT_PULL_BUDGET: u64 = env_names::DEFAULT_SNAPSHOT_PULL_BUDGET_MIB << 20;
/// Highest zstd level accepted (libzstd's maximum).
pub const MAX_ZSTD_LEVEL: i32 = 22;

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
    /// A client certificate and key (PEM files) for TLS connections.
    pub client_cert: Option<(PathBuf, PathBuf)>,
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
    /// The v2 wire format of pushes (registry.md §5.5); all off = the v1 artifact.
    pub v2: V2Options,
    /// Memory a v2 push may hold in chunk buffers (raw and compressed), in bytes.
    pub memory_budget: u64,
    /// Memory a v2 pull may hold in prefetched chunks, in bytes.
    pub pull_budget: u64,
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
            client_cert: None,
            request_timeout: Duration::from_secs(30),
            transfer_idle_timeout: Duration::from_secs(60),
            commit_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            transfer_concurrency: DEFAULT_TRANSFER_CONCURRENCY,
            chunk_size: DEFAULT_CHUNK_SIZE,
            spool_dir: None,
            v2: V2Options::default(),
            memory_budget: DEFAULT_MEMORY_BUDGET,
            pull_budget: DEFAULT_PULL_BUDGET,
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
        let mut cfg = Self::for_registry(&base)?.with_access_env(env)?;
        if let Some(v) = env(ENV_TRANSFER_CONCURRENCY).filter(|v| !v.trim().is_empty()) {
            cfg.transfer_concurrency = parse_concurrency(&v)?;
        }
        let knob = |name: &str| -> Result<u64> {
            match env(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(0),
                Some(v) => v.trim().parse::<u64>().map_err(|_| {
                    Error::invalid(name, format!("{v:?} is not a non-negative number"))
                }),
            }
        };
        cfg.apply_snapshot_knobs(
            knob(ENV_ZSTD_LEVEL)?,
            knob(ENV_CHUNK_SIZE_MIB)?,
            knob(ENV_MEMORY_BUDGET_MIB)?,
            match env(ENV_PULL_BUDGET_MIB).filter(|v| !v.trim().is_empty()) {
                None => env_names::DEFAULT_SNAPSHOT_PULL_BUDGET_MIB,
                Some(_) => knob(ENV_PULL_BUDGET_MIB)?,
            },
        )?;
        Ok(cfg)
    }

    /// The same configuration with how the registry is reached and who we are there taken
    /// from `env`: [`ENV_INSECURE`], [`ENV_CA_FILE`], [`ENV_CLIENT_CERT_FILE`] with
    /// [`ENV_CLIENT_KEY_FILE`], the listing bounds of [`ListLimits::from_env_with`] and the
    /// credentials of [`CredentialSource::from_env`]. The node agent and the operator call it
    /// on the registry their own configuration names.
    pub fn with_access_env(
        mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<RegistryConfig> {
        if let Some(v) = env(ENV_INSECURE) {
            self.insecure_hosts = parse_insecure(&v, &self.base);
        }
        if let Some(p) = env(ENV_CA_FILE).filter(|p| !p.is_empty()) {
            self.ca_file = Some(PathBuf::from(p));
        }
        let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        self.client_cert = match (get(ENV_CLIENT_CERT_FILE), get(ENV_CLIENT_KEY_FILE)) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(Error::invalid(
                    ENV_CLIENT_KEY_FILE,
                    format!("must be set with {ENV_CLIENT_CERT_FILE}"),
                ));
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    ENV_CLIENT_CERT_FILE,
                    format!("must be set with {ENV_CLIENT_KEY_FILE}"),
                ));
            }
        };
        self.list_limits = ListLimits::from_env_with(env)?;
        self.credentials = CredentialSource::from_env(env)?;
        Ok(self)
    }

    /// Sets the snapshot knobs of registry.md §5.5 as the node agent reads them: zstd level
    /// (0 = off, at most 22), chunk size in MiB (0 = off), push memory budget in MiB (0 =
    /// 9216), pull budget in MiB (0 = the default 2048).
    pub fn apply_snapshot_knobs(
        &mut self,
        zstd_level: u64,
        chunk_size_mib: u64,
        memory_budget_mib: u64,
        pull_budget_mib: u64,
    ) -> Result<()> {
        let level = i32::try_from(zstd_level)
            .ok()
            .filter(|l| *l <= MAX_ZSTD_LEVEL)
            .ok_or_else(|| {
                Error::invalid(
                    ENV_ZSTD_LEVEL,
                    format!("{zstd_level} is not a level from 0 to {MAX_ZSTD_LEVEL}"),
                )
            })?;
        if chunk_size_mib > 1 << 20 {
            return Err(Error::invalid(
                ENV_CHUNK_SIZE_MIB,
                format!("{chunk_size_mib} MiB is too large"),
            ));
        }
        self.v2 = V2Options {
            zstd_level: level,
            chunk_size: chunk_size_mib << 20,
        };
        self.memory_budget = match memory_budget_mib {
            0 => DEFAULT_MEMORY_BUDGET,
            m => m.saturating_mul(1 << 20),
        };
        self.pull_budget = match pull_budget_mib {
            0 => DEFAULT_PULL_BUDGET,
            m => m.saturating_mul(1 << 20),
        };
        Ok(())
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

/// The v2 wire format knobs of a push (registry.md §5.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V2Options {
    /// zstd level of files of at least 1 MiB; 0 = no compression.
    pub zstd_level: i32,
    /// Files are split into chunks of this many bytes; 0 = no chunking.
    pub chunk_size: u64,
}

impl V2Options {
    /// Whether pushes write the v2 format at all.
    pub fn enabled(&self) -> bool {
        self.zstd_level > 0 || self.chunk_size > 0
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
    fn snapshot_knobs_default_to_v1_and_bad_values_name_the_variable() {
        let base = ("OCI_REGISTRY", "r.io");
        let c = RegistryConfig::from_env_with(&env(&[base])).expect("cfg");
        assert!(!c.v2.enabled());
        assert_eq!(c.memory_budget, 9216 << 20);
        assert_eq!(c.pull_budget, 2048 << 20);
        let c = RegistryConfig::from_env_with(&env(&[
            base,
            ("SNAPSHOT_ZSTD_LEVEL", "3"),
            ("SNAPSHOT_CHUNK_SIZE_MIB", "64"),
            ("SNAPSHOT_MEMORY_BUDGET_MIB", "512"),
            ("SNAPSHOT_PULL_BUDGET_MIB", "256"),
        ]))
        .expect("cfg");
        assert_eq!(
            c.v2,
            V2Options {
                zstd_level: 3,
                chunk_size: 64 << 20
            }
        );
        assert_eq!((c.memory_budget, c.pull_budget), (512 << 20, 256 << 20));
        for (k, v) in [
            ("SNAPSHOT_ZSTD_LEVEL", "23"),
            ("SNAPSHOT_ZSTD_LEVEL", "-1"),
            ("SNAPSHOT_CHUNK_SIZE_MIB", "x"),
        ] {
            let e = RegistryConfig::from_env_with(&env(&[base, (k, v)]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.starts_with(&format!("{k}:")), "{k}={v}: {e}");
        }
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

    #[test]
    fn access_settings_apply_to_a_registry_named_elsewhere() {
        // The node agent and the operator name the registry in their own configuration.
        let c = RegistryConfig::for_registry("r.io/p")
            .expect("base")
            .with_access_env(&env(&[
                (ENV_USERNAME, "u"),
                (ENV_PASSWORD, "p"),
                (ENV_CA_FILE, "/ca.pem"),
                (ENV_CLIENT_CERT_FILE, "/c.pem"),
                (ENV_CLIENT_KEY_FILE, "/k.pem"),
            ]))
            .expect("cfg");
        assert!(matches!(
            c.credentials,
            CredentialSource::Static(Credentials::Basic { .. })
        ));
        assert_eq!(c.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            c.client_cert,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        let e = RegistryConfig::for_registry("r.io")
            .expect("base")
            .with_access_env(&env(&[(ENV_CLIENT_CERT_FILE, "/c.pem")]))
            .err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some(format!(
                "{ENV_CLIENT_KEY_FILE}: must be set with {ENV_CLIENT_CERT_FILE}"
            ))
        );
    }
}
