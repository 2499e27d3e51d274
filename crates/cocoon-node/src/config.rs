//! The node agent's configuration (`contract.md` §12.2): every `VK_*` knob with its default
//! and its fatal message, parsed by a pure function over an env lookup so it is table-testable.
//!
//! Rules applied to every variable: an empty (or all-blank) value counts as unset. Choices for
//! points the spec leaves open:
//! * `VK_NODE_PODS`: unparsable, negative or 0 falls back to 256 (a node with 0 pod capacity
//!   is unusable: the scheduler reports "Too many pods"); the generic integer-knob rule (→ 0)
//!   applies to the `SNAPSHOT_*` knobs, where 0 means "use the built-in default".
//! * `VK_KUBELET_PORT`: unparsable falls back to 10250; an explicit `0` asks for an ephemeral
//!   port (tests).
//! * `VK_LOG_LEVEL`: `trace|debug|info|warn|warning|error|off`, case-insensitive.
//! * `VK_METRICS_ADDR` / `VK_PEER_ADDR`: Go-style listen addresses; `:9091` means
//!   `0.0.0.0:9091`. An unparsable metrics address is fatal. The metrics default is
//!   `127.0.0.1:9091` (the Go agent's `:9091` serves every namespace's figures to anyone).
//! * `VK_CLIENT_CA_FILE` / `VK_ANONYMOUS_AUTH`: kubelet API client authentication
//!   ([`crate::kubelet::auth`]); anonymous access only for the exact value `true`.
//! * Runtime backend: `VK_RUNTIME` = `cocoon` (default) | `sim`, with `VK_SIM_ROOT` for the
//!   simulator (read by [`cocoon_runtime::BackendChoice::from_env`]).
//! * `VK_CLONE_FROM_DIR_ROOTS` (not in the spec; tenant isolation): absolute, canonical
//!   directories separated by `,` or `:` (blank items dropped; a relative or non-canonical
//!   one is fatal). Unset or empty refuses every `vm.cocoonstack.io/clone-from-dir`.
//! * `VK_RUN_IMAGE_URL_ALLOW` / `VK_NETWORK_ALLOW` (not in the spec; host reach, see
//!   [`crate::pods::host_reach`]): URL prefixes an image URL must match by scheme, host,
//!   port and whole path segments, and the CNI networks a pod may pick (`*`: any). Unset or
//!   empty: no URL image, only the default network. An unparsable entry is fatal.
//! * `VK_ACCEPT_LEGACY_VM_NAMES` (not in the spec; mixed fleets): only the exact value `true`
//!   accepts the legacy unhashed VM name `vk-<ns>-<pod>` for new pods (see `pods::tenant` for
//!   the risk); default off.
//! * `VK_CLONE_BASE_KEEP` (not in the spec): unused clone-base snapshots kept per node, a
//!   non-negative integer, default 4; an unparsable value is fatal.
//! * `VK_UNMANAGED_IP_CIDRS` (not in the spec; issue 35 item 3, see
//!   [`crate::pods::unmanaged_ip`]): CIDRs separated by `,` or whitespace; unset or empty
//!   refuses every unmanaged pod with a pre-assigned IP. A bad CIDR is fatal.
//! * Kubelet API bounds (not in the spec; issue 26 item 8), [`parse_kubelet_limits`]:
//!   `VK_LOG_MAX_BYTES` (4 MiB), `VK_LOG_MAX_LINE_BYTES` (16 KiB), `VK_LOG_FOLLOWERS_PER_POD`
//!   (4), `VK_LOG_FOLLOWERS_PER_NODE` (64), `VK_LOG_READS_PER_NODE` (16), `VK_EXEC_SESSIONS_PER_POD` (8),
//!   `VK_EXEC_SESSIONS_PER_NODE` (64), `VK_KUBELET_PREAUTH_CONNECTIONS` (128),
//!   `VK_KUBELET_TLS_HANDSHAKE_TIMEOUT` (10s), `VK_STREAMING_CONNECTION_IDLE_TIMEOUT` (4h;
//!   0 disables, as the kubelet's flag). A count that is not a positive integer, or a bad
//!   duration, is fatal.
//! * Timing knobs (Lease renew, status refresh, fix-up) are not env vars: they are struct fields
//!   with the spec's defaults so tests can shorten them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use cocoon_api::contract::env::node as env;
use cocoon_runtime::BackendChoice;

use crate::kubelet::limits::KubeletLimits;
pub use crate::node::{CapacityOverrides, Timings};
use crate::pods::host_reach::{self, HostReach};
use crate::settings::Settings;

/// A configuration error; every variant's text is the fatal message the process exits with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("construct registry client: OCI_REGISTRY must be set")]
    MissingRegistry,
    #[error("parse VK_RESTORE_MODE: restore mode must be copy, ondemand or mmap, got {0:?}")]
    RestoreMode(String),
    #[error("parse VK_RESERVE_PERCENT={0:?}: must be 0-100")]
    ReservePercent(String),
    #[error("parse VK_LOG_LEVEL: invalid log level {0:?}")]
    LogLevel(String),
    #[error("parse VK_LOG_FORMAT={0:?}: want text or json")]
    LogFormat(String),
    #[error("parse VK_NODE_IP={0:?}: not an IP address")]
    NodeIp(String),
    #[error("detect node IP: no non-loopback IPv4 address found; set VK_NODE_IP")]
    NoNodeIp,
    #[error("parse {var}={value:?}: {reason}")]
    ListenAddr {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("parse VK_SNAPSHOT_CPU_CLASS={0:?}: must be a valid label value")]
    SnapshotCpuClass(String),
    #[error("select runtime backend: {0}")]
    Runtime(String),
    #[error("parse VK_CLONE_FROM_DIR_ROOTS: root {0:?} must be an absolute, canonical path")]
    CloneFromDirRoot(String),
    #[error("parse {var}: {reason}")]
    HostReach { var: &'static str, reason: String },
    #[error("parse VK_CLONE_BASE_KEEP: must be a non-negative integer, got {0:?}")]
    CloneBaseKeep(String),
    #[error("parse VK_UNMANAGED_IP_CIDRS: {0}")]
    UnmanagedIpCidrs(String),
    #[error("parse {var}={value:?}: {reason}")]
    Limit {
        var: &'static str,
        value: String,
        reason: String,
    },
}

impl ConfigError {
    /// The variable at fault, to say where its value came from.
    pub fn var(&self) -> &'static str {
        match self {
            ConfigError::MissingRegistry => env::OCI_REGISTRY,
            ConfigError::RestoreMode(_) => env::RESTORE_MODE,
            ConfigError::ReservePercent(_) => env::RESERVE_PERCENT,
            ConfigError::LogLevel(_) => env::LOG_LEVEL,
            ConfigError::LogFormat(_) => env::LOG_FORMAT,
            ConfigError::NodeIp(_) | ConfigError::NoNodeIp => env::NODE_IP,
            ConfigError::ListenAddr { var, .. }
            | ConfigError::HostReach { var, .. }
            | ConfigError::Limit { var, .. } => var,
            ConfigError::SnapshotCpuClass(_) => env::SNAPSHOT_CPU_CLASS,
            ConfigError::Runtime(_) => cocoon_runtime::ENV_RUNTIME,
            ConfigError::CloneFromDirRoot(_) => env::CLONE_FROM_DIR_ROOTS,
            ConfigError::CloneBaseKeep(_) => env::CLONE_BASE_KEEP,
            ConfigError::UnmanagedIpCidrs(_) => env::UNMANAGED_IP_CIDRS,
        }
    }
}

/// What to do with a VM that no pod claims (`VK_ORPHAN_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanPolicy {
    Destroy,
    Alert,
    Keep,
}

impl OrphanPolicy {
    /// Lower-cased and trimmed; anything unknown behaves like `alert` (the safe middle: it
    /// neither destroys nor silently keeps).
    pub fn parse(raw: &str) -> Self {
        match raw.trim().to_ascii_lowercase().as_str() {
            "destroy" => OrphanPolicy::Destroy,
            "keep" => OrphanPolicy::Keep,
            _ => OrphanPolicy::Alert,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OrphanPolicy::Destroy => "destroy",
            OrphanPolicy::Alert => "alert",
            OrphanPolicy::Keep => "keep",
        }
    }
}

/// How a clone restores memory (`VK_RESTORE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreMode {
    Copy,
    OnDemand,
    Mmap,
}

impl RestoreMode {
    /// Case-insensitive and trimmed.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "copy" => Ok(RestoreMode::Copy),
            "ondemand" => Ok(RestoreMode::OnDemand),
            "mmap" => Ok(RestoreMode::Mmap),
            _ => Err(ConfigError::RestoreMode(raw.to_string())),
        }
    }

    /// The spelling the `cocoon` CLI takes.
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Copy => "copy",
            RestoreMode::OnDemand => "ondemand",
            RestoreMode::Mmap => "mmap",
        }
    }
}

/// The whole node-agent configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// `VK_NODE_NAME` (`cocoon-pool`).
    pub node_name: String,
    /// `VK_NODE_POOL` (`default`).
    pub pool: String,
    /// `VK_NODE_IP`, else the first non-loopback IPv4.
    pub node_ip: IpAddr,
    /// `VK_PROVIDER_ID`.
    pub provider_id: Option<String>,
    /// `VK_ORPHAN_POLICY` (`destroy`).
    pub orphan_policy: OrphanPolicy,
    /// `VK_LOG_LEVEL` (`info`), validated and lower-cased.
    pub log_level: String,
    /// `OCI_REGISTRY` (required).
    pub oci_registry: String,
    /// `GOOGLE_APPLICATION_CREDENTIALS`.
    pub google_credentials: Option<PathBuf>,
    /// `VK_LEASES_PATH`.
    pub leases_path: PathBuf,
    /// `VK_COCOON_BIN`.
    pub cocoon_bin: PathBuf,
    /// `VK_RESTORE_MODE` (`ondemand`).
    pub restore_mode: RestoreMode,
    /// `VK_METRICS_ADDR` (`127.0.0.1:9091`; `:9091` → `0.0.0.0:9091`).
    pub metrics_addr: SocketAddr,
    /// `VK_TLS_CERT`.
    pub tls_cert: PathBuf,
    /// `VK_TLS_KEY`.
    pub tls_key: PathBuf,
    /// `VK_CLIENT_CA_FILE`: verifies kubelet API client certificates (`None`: none accepted).
    pub client_ca_file: Option<PathBuf>,
    /// `VK_ANONYMOUS_AUTH` (`false`): requests without credentials reach authorization as
    /// `system:anonymous` instead of getting 401.
    pub anonymous_auth: bool,
    /// `VK_RESERVE_PERCENT` (20).
    pub reserve_percent: u32,
    /// `VK_NODE_CPU` / `VK_NODE_MEM` / `VK_NODE_STORAGE` / `VK_NODE_HUGEPAGES`.
    pub overrides: CapacityOverrides,
    /// `VK_NODE_PODS` (256).
    pub pods: u32,
    /// `COCOON_ROOT_DIR` (`/var/lib/cocoon`).
    pub cocoon_root_dir: PathBuf,
    /// `SNAPSHOT_ZSTD_LEVEL` (0 = no compression).
    pub snapshot_zstd_level: u64,
    /// `SNAPSHOT_CHUNK_SIZE_MIB` (0 = no chunking).
    pub snapshot_chunk_size_mib: u64,
    /// `SNAPSHOT_TRANSFER_CONCURRENCY` (0 = 8).
    pub snapshot_transfer_concurrency: u64,
    /// `SNAPSHOT_MEMORY_BUDGET_MIB` (0 = 9216).
    pub snapshot_memory_budget_mib: u64,
    /// `SNAPSHOT_PULL_BUDGET_MIB` (2048).
    pub snapshot_pull_budget_mib: u64,
    /// `VK_KUBELET_PORT` (10250; 0 = ephemeral).
    pub kubelet_port: u16,
    /// `VK_COCOON_NET_CONTROL_SOCKET`; `None` when explicitly set to empty (release disabled).
    pub cocoon_net_control_socket: Option<PathBuf>,
    /// `COCOON_CGROUP_PARENT` (`cocoon.slice`).
    pub cgroup_parent: String,
    /// `VK_STAGING_DIR`.
    pub staging_dir: Option<PathBuf>,
    /// `VK_PEER_ADDR` (`:12501`), unparsed.
    pub peer_addr: String,
    /// `VK_COCOON_SNAPSHOT_DIR`.
    pub cocoon_snapshot_dir: PathBuf,
    /// `VK_SNAPSHOT_CPU_CLASS`, a valid label value.
    pub snapshot_cpu_class: Option<String>,
    /// `VK_COCOON_MACOS_BIN`.
    pub cocoon_macos_bin: PathBuf,
    /// `COCOON_MACOS_VNC_PASSWORD`.
    pub macos_vnc_password: Option<String>,
    /// `VK_RUNTIME` (+ `VK_COCOON_BIN` / `VK_SIM_ROOT`).
    pub runtime: BackendChoice,
    /// `VK_CLONE_FROM_DIR_ROOTS` (empty: every `clone-from-dir` is refused).
    pub clone_from_dir_roots: Vec<PathBuf>,
    /// `VK_RUN_IMAGE_URL_ALLOW` and `VK_NETWORK_ALLOW` (empty: no URL image, only the
    /// default network).
    pub host_reach: HostReach,
    /// `VK_ACCEPT_LEGACY_VM_NAMES` (default off).
    pub accept_legacy_vm_names: bool,
    /// `VK_CLONE_BASE_KEEP` (default 4).
    pub clone_base_keep: usize,
    /// `VK_UNMANAGED_IP_CIDRS` (empty: every unmanaged pod with a pre-assigned IP is
    /// refused).
    pub unmanaged_ip_ranges: Vec<crate::pods::unmanaged_ip::IpRange>,
    /// Heartbeat and fix-up timings (not env-configurable).
    pub timings: Timings,
    /// Bounds on kubelet API work (`VK_LOG_MAX_BYTES`, `VK_LOG_MAX_LINE_BYTES`,
    /// `VK_LOG_FOLLOWERS_PER_POD`/`_NODE`, `VK_LOG_READS_PER_NODE`,
    /// `VK_EXEC_SESSIONS_PER_POD`/`_NODE`,
    /// `VK_KUBELET_PREAUTH_CONNECTIONS`, `VK_KUBELET_TLS_HANDSHAKE_TIMEOUT`,
    /// `VK_STREAMING_CONNECTION_IDLE_TIMEOUT`); see [`parse_kubelet_limits`].
    pub kubelet_limits: KubeletLimits,
    /// `VK_ACTIVITY_INTERVAL`, `VK_ACTIVITY_CPU_THRESHOLD`, `VK_EXEC_WAKE_WAIT` (issue 39).
    pub activity: crate::activity::ActivityConfig,
    /// Every setting of [`crate::settings::SETTINGS`] as given, for the readers after this
    /// parse (runtime backend, registry access, kubeconfig, systemd notification).
    pub settings: Settings,
}

impl NodeConfig {
    /// Reads the process environment; the node IP falls back to interface detection.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok(), first_non_loopback_ipv4)
    }

    /// Builds the configuration from merged `settings` (environment over `--config` file),
    /// keeping them, with their origins, in [`NodeConfig::settings`].
    pub fn from_settings(
        settings: &Settings,
        detect_ip: impl FnOnce() -> Option<Ipv4Addr>,
    ) -> Result<Self, ConfigError> {
        let mut cfg = Self::from_lookup(|k| settings.get(k), detect_ip)?;
        cfg.settings = settings.clone();
        Ok(cfg)
    }

    /// Builds the configuration from `get` (an env lookup) and `detect_ip` (called only when
    /// `VK_NODE_IP` is unset).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        detect_ip: impl FnOnce() -> Option<Ipv4Addr>,
    ) -> Result<Self, ConfigError> {
        let val = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let or = |k: &str, d: &str| val(k).unwrap_or_else(|| d.to_string());

        let log_level = parse_log_level(&or(env::LOG_LEVEL, env::DEFAULT_LOG_LEVEL))?;

        let node_ip = match val(env::NODE_IP) {
            Some(raw) => raw
                .trim()
                .parse::<IpAddr>()
                .map_err(|_| ConfigError::NodeIp(raw.clone()))?,
            None => IpAddr::V4(detect_ip().ok_or(ConfigError::NoNodeIp)?),
        };

        let oci_registry = val(env::OCI_REGISTRY)
            .map(|v| v.trim().to_string())
            .ok_or(ConfigError::MissingRegistry)?;

        let restore_mode = match val(env::RESTORE_MODE) {
            Some(raw) => RestoreMode::parse(&raw)?,
            None => RestoreMode::OnDemand,
        };

        let reserve_percent = match val(env::RESERVE_PERCENT) {
            Some(raw) => match raw.trim().parse::<u32>() {
                Ok(p) if p <= 100 => p,
                _ => return Err(ConfigError::ReservePercent(raw)),
            },
            None => env::DEFAULT_RESERVE_PERCENT,
        };

        let metrics_raw = or(env::METRICS_ADDR, env::DEFAULT_METRICS_ADDR);
        let metrics_addr =
            parse_listen_addr(&metrics_raw).map_err(|reason| ConfigError::ListenAddr {
                var: env::METRICS_ADDR,
                value: metrics_raw.clone(),
                reason,
            })?;

        let snapshot_cpu_class = match val(env::SNAPSHOT_CPU_CLASS) {
            Some(raw) if is_label_value(raw.trim()) => Some(raw.trim().to_string()),
            Some(raw) => return Err(ConfigError::SnapshotCpuClass(raw)),
            None => None,
        };

        let pods = match val(env::NODE_PODS).map(|v| v.trim().parse::<i64>()) {
            Some(Ok(n)) if n > 0 => u32::try_from(n).unwrap_or(u32::MAX),
            Some(_) => {
                tracing::warn!(
                    var = env::NODE_PODS,
                    "pod capacity must be a positive integer; using the default"
                );
                env::DEFAULT_NODE_PODS
            }
            None => env::DEFAULT_NODE_PODS,
        };

        let kubelet_port = match val(env::KUBELET_PORT).map(|v| v.trim().parse::<u16>()) {
            Some(Ok(p)) => p,
            Some(Err(_)) => {
                tracing::warn!(
                    var = env::KUBELET_PORT,
                    "unparsable kubelet port; using the default"
                );
                env::DEFAULT_KUBELET_PORT
            }
            None => env::DEFAULT_KUBELET_PORT,
        };

        // Set-but-empty disables lease release, so this one does not treat empty as unset.
        let cocoon_net_control_socket = match get(env::COCOON_NET_CONTROL_SOCKET) {
            Some(v) if v.trim().is_empty() => None,
            Some(v) => Some(PathBuf::from(v.trim())),
            None => Some(PathBuf::from(env::DEFAULT_COCOON_NET_CONTROL_SOCKET)),
        };

        let runtime =
            BackendChoice::from_env(&get).map_err(|e| ConfigError::Runtime(e.to_string()))?;

        let clone_from_dir_roots =
            parse_clone_roots(val(env::CLONE_FROM_DIR_ROOTS).as_deref().unwrap_or(""))?;
        let host_reach = parse_host_reach(&val)?;

        let clone_base_keep = match val(env::CLONE_BASE_KEEP) {
            Some(raw) => raw
                .trim()
                .parse::<usize>()
                .map_err(|_| ConfigError::CloneBaseKeep(raw.clone()))?,
            None => env::DEFAULT_CLONE_BASE_KEEP,
        };

        let unmanaged_ip_ranges = crate::pods::unmanaged_ip::parse_ranges(
            &val(env::UNMANAGED_IP_CIDRS).unwrap_or_default(),
        )
        .map_err(ConfigError::UnmanagedIpCidrs)?;

        let int_knob = |k: &str, default: u64| match val(k) {
            Some(raw) => raw.trim().parse::<u64>().unwrap_or(0),
            None => default,
        };

        Ok(NodeConfig {
            node_name: or(env::NODE_NAME, env::DEFAULT_NODE_NAME)
                .trim()
                .to_string(),
            pool: or(env::NODE_POOL, env::DEFAULT_NODE_POOL)
                .trim()
                .to_string(),
            node_ip,
            provider_id: val(env::PROVIDER_ID).map(|v| v.trim().to_string()),
            orphan_policy: OrphanPolicy::parse(&or(env::ORPHAN_POLICY, env::DEFAULT_ORPHAN_POLICY)),
            log_level,
            oci_registry,
            google_credentials: val(env::GOOGLE_APPLICATION_CREDENTIALS).map(PathBuf::from),
            leases_path: or(env::LEASES_PATH, env::DEFAULT_LEASES_PATH).into(),
            cocoon_bin: or(env::COCOON_BIN, env::DEFAULT_COCOON_BIN).into(),
            restore_mode,
            metrics_addr,
            tls_cert: or(env::TLS_CERT, env::DEFAULT_TLS_CERT).into(),
            tls_key: or(env::TLS_KEY, env::DEFAULT_TLS_KEY).into(),
            client_ca_file: val(env::CLIENT_CA_FILE).map(|v| PathBuf::from(v.trim())),
            anonymous_auth: val(env::ANONYMOUS_AUTH).is_some_and(|v| v.trim() == "true"),
            reserve_percent,
            overrides: CapacityOverrides {
                cpu: val(env::NODE_CPU).map(|v| v.trim().to_string()),
                memory: val(env::NODE_MEM).map(|v| v.trim().to_string()),
                storage: val(env::NODE_STORAGE).map(|v| v.trim().to_string()),
                hugepages: val(env::NODE_HUGEPAGES).map(|v| v.trim().to_string()),
            },
            pods,
            cocoon_root_dir: or(env::COCOON_ROOT_DIR, env::DEFAULT_COCOON_ROOT_DIR).into(),
            snapshot_zstd_level: int_knob(env::SNAPSHOT_ZSTD_LEVEL, 0),
            snapshot_chunk_size_mib: int_knob(env::SNAPSHOT_CHUNK_SIZE_MIB, 0),
            snapshot_transfer_concurrency: int_knob(env::SNAPSHOT_TRANSFER_CONCURRENCY, 0),
            snapshot_memory_budget_mib: int_knob(env::SNAPSHOT_MEMORY_BUDGET_MIB, 0),
            snapshot_pull_budget_mib: int_knob(
                env::SNAPSHOT_PULL_BUDGET_MIB,
                env::DEFAULT_SNAPSHOT_PULL_BUDGET_MIB,
            ),
            kubelet_port,
            cocoon_net_control_socket,
            cgroup_parent: or(env::COCOON_CGROUP_PARENT, env::DEFAULT_COCOON_CGROUP_PARENT),
            staging_dir: val(env::STAGING_DIR).map(PathBuf::from),
            peer_addr: or(env::PEER_ADDR, env::DEFAULT_PEER_ADDR),
            cocoon_snapshot_dir: or(env::COCOON_SNAPSHOT_DIR, env::DEFAULT_COCOON_SNAPSHOT_DIR)
                .into(),
            snapshot_cpu_class,
            cocoon_macos_bin: or(env::COCOON_MACOS_BIN, env::DEFAULT_COCOON_MACOS_BIN).into(),
            macos_vnc_password: val(env::COCOON_MACOS_VNC_PASSWORD),
            runtime,
            clone_from_dir_roots,
            host_reach,
            accept_legacy_vm_names: val(env::ACCEPT_LEGACY_VM_NAMES)
                .is_some_and(|v| v.trim() == "true"),
            clone_base_keep,
            unmanaged_ip_ranges,
            timings: Timings::default(),
            kubelet_limits: parse_kubelet_limits(&val)?,
            activity: crate::activity::ActivityConfig::from_lookup(&val).map_err(|e| {
                ConfigError::Limit {
                    var: e.var,
                    value: e.value,
                    reason: e.reason,
                }
            })?,
            settings: Settings::capture(&get),
        })
    }
}

/// The kubelet API limits from `val` (an env lookup that already maps blank to unset): each
/// count a positive integer, each duration Go-style or seconds; unset keeps the default of
/// [`KubeletLimits::default`]; anything else is fatal, naming the variable. The handshake
/// timeout must be positive; an idle timeout of 0 disables it (the kubelet's semantics).
pub fn parse_kubelet_limits(
    val: &dyn Fn(&str) -> Option<String>,
) -> Result<KubeletLimits, ConfigError> {
    let d = KubeletLimits::default();
    let count = |var: &'static str, default: usize| match val(var) {
        None => Ok(default),
        Some(raw) => match raw.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ConfigError::Limit {
                var,
                value: raw,
                reason: "must be a positive integer".into(),
            }),
        },
    };
    let duration = |var: &'static str, default: Duration, zero_ok: bool| match val(var) {
        None => Ok(default),
        Some(raw) => match crate::kubelet::limits::parse_duration(&raw) {
            Ok(d) if zero_ok || !d.is_zero() => Ok(d),
            Ok(_) => Err(ConfigError::Limit {
                var,
                value: raw,
                reason: "must be positive".into(),
            }),
            Err(reason) => Err(ConfigError::Limit {
                var,
                value: raw,
                reason,
            }),
        },
    };
    Ok(KubeletLimits {
        log_max_bytes: count(env::LOG_MAX_BYTES, d.log_max_bytes)?,
        log_max_line_bytes: count(env::LOG_MAX_LINE_BYTES, d.log_max_line_bytes)?,
        log_followers_per_pod: count(env::LOG_FOLLOWERS_PER_POD, d.log_followers_per_pod)?,
        log_followers_per_node: count(env::LOG_FOLLOWERS_PER_NODE, d.log_followers_per_node)?,
        log_reads_per_node: count(env::LOG_READS_PER_NODE, d.log_reads_per_node)?,
        exec_sessions_per_pod: count(env::EXEC_SESSIONS_PER_POD, d.exec_sessions_per_pod)?,
        exec_sessions_per_node: count(env::EXEC_SESSIONS_PER_NODE, d.exec_sessions_per_node)?,
        preauth_connections: count(env::KUBELET_PREAUTH_CONNECTIONS, d.preauth_connections)?,
        tls_handshake_timeout: duration(
            env::KUBELET_TLS_HANDSHAKE_TIMEOUT,
            d.tls_handshake_timeout,
            false,
        )?,
        streaming_idle_timeout: duration(
            env::STREAMING_CONNECTION_IDLE_TIMEOUT,
            d.streaming_idle_timeout,
            true,
        )?,
    })
}

/// Parses `VK_CLONE_FROM_DIR_ROOTS`: items separated by `,` or `:`, trimmed, blanks dropped;
/// each must be absolute and canonical (a trailing `/` is tolerated).
pub fn parse_clone_roots(raw: &str) -> Result<Vec<PathBuf>, ConfigError> {
    raw.split([',', ':'])
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            let v2 = if v.len() > 1 {
                v.trim_end_matches('/')
            } else {
                v
            };
            if v2.starts_with('/') && crate::pods::rules::clean_path(v2) == v2 {
                Ok(PathBuf::from(v2))
            } else {
                Err(ConfigError::CloneFromDirRoot(v.to_string()))
            }
        })
        .collect()
}

/// Parses `VK_RUN_IMAGE_URL_ALLOW` and `VK_NETWORK_ALLOW` through `val` (blank = unset).
fn parse_host_reach(val: &impl Fn(&str) -> Option<String>) -> Result<HostReach, ConfigError> {
    let err = |var: &'static str| move |reason: String| ConfigError::HostReach { var, reason };
    let raw = |k: &str| val(k).unwrap_or_default();
    Ok(HostReach {
        run_image_urls: host_reach::parse_url_allow(&raw(env::RUN_IMAGE_URL_ALLOW))
            .map_err(err(env::RUN_IMAGE_URL_ALLOW))?,
        networks: host_reach::parse_network_allow(&raw(env::NETWORK_ALLOW))
            .map_err(err(env::NETWORK_ALLOW))?,
    })
}

/// Validates a log level; returns it lower-cased.
pub fn parse_log_level(raw: &str) -> Result<String, ConfigError> {
    let level = raw.trim().to_ascii_lowercase();
    match level.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" | "off" => Ok(level),
        "warning" => Ok("warn".into()),
        _ => Err(ConfigError::LogLevel(raw.to_string())),
    }
}

/// The node agent's log format (`VK_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line (tracing-subscriber's JSON format, as the operator's
    /// `OPERATOR_LOG_FORMAT=json`).
    Json,
}

/// Parses `VK_LOG_FORMAT`: `text` or `json` (any case, surrounding blanks ignored); empty
/// means the default, `text`.
pub fn parse_log_format(raw: &str) -> Result<LogFormat, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "" | "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(ConfigError::LogFormat(raw.to_string())),
    }
}

/// Parses a Go-style listen address: `:port` (all interfaces), `host:port` with an IP host,
/// `localhost:port`, or `[v6]:port`.
pub fn parse_listen_addr(raw: &str) -> Result<SocketAddr, String> {
    let raw = raw.trim();
    if let Some(port) = raw.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match raw.rsplit_once(':') {
        Some(("localhost", port)) => {
            let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
            Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
        }
        _ => Err("want [host]:port with an IP host".into()),
    }
}

/// A Kubernetes label value: at most 63 characters, alphanumerics plus `-_.`, starting and
/// ending with an alphanumeric.
pub fn is_label_value(v: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    v.len() <= 63
        && v.chars().all(ok_char)
        && v.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The first non-loopback IPv4 address of any interface that is up, in `getifaddrs` order.
pub fn first_non_loopback_ipv4() -> Option<Ipv4Addr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we own until freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs and not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) != 0;
        if ifa.ifa_addr.is_null() || !up {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family we check first.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET addresses are sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        if !ip.is_loopback() && !ip.is_unspecified() {
            found = Some(ip);
            break;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}
