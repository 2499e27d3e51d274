//! Every setting the node agent reads, in one table ([`SETTINGS`]): its name (the environment
//! variable, and the key of the optional YAML file `cocoon-operator node --config FILE`), the
//! default it shows, what it means, and whether only the environment may set it.
//!
//! The table is the gate, not just documentation: [`Settings`] holds exactly the table's names,
//! and every reader of the agent (the [`crate::config`] parse, the runtime backend, the
//! registry's access settings, the kubeconfig, systemd notification) looks values up there. A
//! name missing from the table reads as unset; `settings_tests.rs` greps the sources for every
//! variable name they read and fails on one the table lacks, so `node --help` (generated from
//! the table by [`help_text`]) and `node.env.example` cannot drift from what the agent reads.
//!
//! The file ([`FileSettings::parse`]) is a YAML mapping whose keys are the variable names as
//! written in the environment (`VK_NODE_NAME: host-1`): one spelling to grep for, copied from
//! or to `node.env` as is. Values are strings, numbers or booleans (`~`/empty = an empty
//! value); a list or mapping, an unknown key (with the closest known name suggested) or a key
//! only the environment may set is refused, naming the key and the file. The environment
//! overrides the file: a variable present in the environment wins even when empty, since some
//! settings give an empty value a meaning (`VK_COCOON_NET_CONTROL_SOCKET=` disables the lease
//! release).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cocoon_api::contract::env::node as env;

/// Where a setting may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The environment or the `--config` file.
    Any,
    /// The environment only: systemd (or the login) sets it for this one process.
    EnvOnly,
}

/// The group a setting is listed under in `node --help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Node,
    Kubernetes,
    Registry,
    Snapshots,
    Runtime,
    KubeletApi,
    Tenants,
    Logging,
    Simulator,
    Systemd,
}

impl Group {
    /// The heading in `node --help`.
    pub fn title(self) -> &'static str {
        match self {
            Group::Node => "Node identity and capacity",
            Group::Kubernetes => "Kubernetes API",
            Group::Registry => "Snapshot registry",
            Group::Snapshots => "Snapshot transfer",
            Group::Runtime => "VM runtime",
            Group::KubeletApi => "Kubelet API and metrics",
            Group::Tenants => "What tenants may reach, and bounds on their work",
            Group::Logging => "Logging",
            Group::Simulator => "Simulated runtime (VK_RUNTIME=sim: demos and tests)",
            Group::Systemd => "Set by systemd (environment only)",
        }
    }
}

/// One setting of the node agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable, also the key in the `--config` file.
    pub name: &'static str,
    /// The default as shown to the operator (`""`: unset).
    pub default: &'static str,
    /// What it does, one sentence or two.
    pub meaning: &'static str,
    pub group: Group,
    pub source: Source,
}

const fn s(
    group: Group,
    name: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Setting {
    Setting {
        name,
        default,
        meaning,
        group,
        source: Source::Any,
    }
}

const fn env_only(
    group: Group,
    name: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Setting {
    Setting {
        name,
        default,
        meaning,
        group,
        source: Source::EnvOnly,
    }
}

use Group::*;

/// Every setting the node agent reads (`contract.md` §12.2 and beyond), grouped as `node
/// --help` lists them.
pub const SETTINGS: &[Setting] = &[
    s(
        Node,
        env::NODE_NAME,
        env::DEFAULT_NODE_NAME,
        "Node name; also the spec.nodeName field selector of the pods this agent runs.",
    ),
    s(
        Node,
        env::NODE_POOL,
        env::DEFAULT_NODE_POOL,
        "Value of the node label cocoonstack.io/pool.",
    ),
    s(
        Node,
        env::NODE_IP,
        "first non-loopback IPv4",
        "The Node's InternalIP and the kubelet API's listen address; also in the self-signed certificate.",
    ),
    s(
        Node,
        env::PROVIDER_ID,
        "",
        "Copied to node.spec.providerID (stops cloud node controllers deleting the Node).",
    ),
    s(
        Node,
        env::ORPHAN_POLICY,
        env::DEFAULT_ORPHAN_POLICY,
        "destroy | alert | keep: what happens to a VM no pod claims (anything else behaves like alert).",
    ),
    s(
        Node,
        env::RESERVE_PERCENT,
        "20",
        "Percentage of every capacity held back from allocatable, 0-100.",
    ),
    s(
        Node,
        env::NODE_CPU,
        "detected",
        "CPU capacity override (a Quantity).",
    ),
    s(
        Node,
        env::NODE_MEM,
        "detected",
        "Memory capacity override (a Quantity).",
    ),
    s(
        Node,
        env::NODE_STORAGE,
        "detected",
        "Ephemeral-storage capacity override (a Quantity).",
    ),
    s(
        Node,
        env::NODE_HUGEPAGES,
        "detected",
        "hugepages-2Mi capacity override (a Quantity).",
    ),
    s(
        Node,
        env::NODE_PODS,
        "256",
        "Pod capacity; not a positive integer: 256.",
    ),
    s(
        Node,
        env::SNAPSHOT_CPU_CLASS,
        "",
        "Snapshot compatibility class of this host (label cocoonstack.io/snapshot-cpu-class); a valid label value.",
    ),
    s(
        Kubernetes,
        env::KUBECONFIG,
        "~/.kube/config, then in-cluster",
        "Kubeconfig files (colon-separated, merged): the host's own node identity, never a cluster-wide credential.",
    ),
    s(
        Registry,
        env::OCI_REGISTRY,
        "required",
        "Registry base (host[:port][/prefix]) holding VM snapshots.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_INSECURE",
        "",
        "true (the base's host) or a list of host[:port]: plain HTTP. Only for a registry on a trusted network.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_CA_FILE",
        "",
        "PEM bundle of a private registry CA.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_CLIENT_CERT_FILE",
        "",
        "Client certificate for the registry or its token realm (with the key).",
    ),
    s(
        Registry,
        "OCI_REGISTRY_CLIENT_KEY_FILE",
        "",
        "Key of OCI_REGISTRY_CLIENT_CERT_FILE.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_USERNAME",
        "",
        "Registry user (with OCI_REGISTRY_PASSWORD).",
    ),
    s(
        Registry,
        "OCI_REGISTRY_PASSWORD",
        "",
        "Registry password (with OCI_REGISTRY_USERNAME).",
    ),
    s(
        Registry,
        "OCI_REGISTRY_TOKEN",
        "",
        "Static bearer token for the registry.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_TOKEN_REALM",
        "",
        "URL of the operator's registry token service (token auth; not with static credentials).",
    ),
    s(
        Registry,
        "OCI_REGISTRY_KUBERNETES_TOKEN_FILE",
        "the pod's ServiceAccount token, if present",
        "ServiceAccount token file presented to the token realm.",
    ),
    s(
        Registry,
        "DOCKER_CONFIG",
        "$HOME/.docker",
        "Directory of a Docker config.json with registry credentials (used when no other credential is set).",
    ),
    s(
        Registry,
        env::GOOGLE_APPLICATION_CREDENTIALS,
        "",
        "GCP service-account key for the registry.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_LIST_MAX_PAGES",
        "1000",
        "Most pages one registry listing walks.",
    ),
    s(
        Registry,
        "OCI_REGISTRY_LIST_MAX_ENTRIES",
        "100000",
        "Most entries one registry listing collects.",
    ),
    env_only(
        Registry,
        "HOME",
        "",
        "Home directory, for $HOME/.docker/config.json when DOCKER_CONFIG is unset.",
    ),
    s(
        Snapshots,
        env::SNAPSHOT_ZSTD_LEVEL,
        "0",
        "Push: zstd level, 0 = no compression (at most 22).",
    ),
    s(
        Snapshots,
        env::SNAPSHOT_CHUNK_SIZE_MIB,
        "0",
        "Push: chunk size in MiB, 0 = no chunking.",
    ),
    s(
        Snapshots,
        env::SNAPSHOT_TRANSFER_CONCURRENCY,
        "0 (= 8)",
        "Parallel chunk transfers.",
    ),
    s(
        Snapshots,
        env::SNAPSHOT_MEMORY_BUDGET_MIB,
        "0 (= 9216)",
        "Push buffer cap in MiB.",
    ),
    s(
        Snapshots,
        env::SNAPSHOT_PULL_BUDGET_MIB,
        "2048",
        "Pull prefetch cap in MiB.",
    ),
    s(
        Snapshots,
        env::RESTORE_MODE,
        env::DEFAULT_RESTORE_MODE,
        "copy | ondemand | mmap: how a clone restores memory.",
    ),
    s(
        Snapshots,
        env::STAGING_DIR,
        "",
        "Peer restore: staging directory for files fetched from another node.",
    ),
    s(
        Snapshots,
        env::PEER_ADDR,
        env::DEFAULT_PEER_ADDR,
        "Peer restore: listen address of the snapshot-plan/slice API.",
    ),
    s(
        Snapshots,
        env::COCOON_SNAPSHOT_DIR,
        env::DEFAULT_COCOON_SNAPSHOT_DIR,
        "The cocoon CLI's localfile snapshot directory.",
    ),
    s(
        Runtime,
        "VK_RUNTIME",
        "cocoon",
        "cocoon (the cocoon CLI) | sim (the in-process simulator, needs VK_SIM_ROOT).",
    ),
    s(
        Runtime,
        env::COCOON_BIN,
        env::DEFAULT_COCOON_BIN,
        "The cocoon CLI, executed directly as the agent's child.",
    ),
    s(
        Runtime,
        env::COCOON_ROOT_DIR,
        env::DEFAULT_COCOON_ROOT_DIR,
        "cocoon root (statfs target, run-dir prefix).",
    ),
    s(
        Runtime,
        env::LEASES_PATH,
        env::DEFAULT_LEASES_PATH,
        "cocoon-net's DHCP lease file (read only).",
    ),
    s(
        Runtime,
        env::COCOON_NET_CONTROL_SOCKET,
        env::DEFAULT_COCOON_NET_CONTROL_SOCKET,
        "cocoon-net control socket for DHCP lease release; set but empty disables the release.",
    ),
    s(
        Runtime,
        env::COCOON_CGROUP_PARENT,
        env::DEFAULT_COCOON_CGROUP_PARENT,
        "cgroup slice holding the VMs (per-VM CPU stats).",
    ),
    s(
        Runtime,
        env::COCOON_MACOS_BIN,
        env::DEFAULT_COCOON_MACOS_BIN,
        "cocoon-macos binary (macOS guests).",
    ),
    s(
        Runtime,
        env::COCOON_MACOS_VNC_PASSWORD,
        "",
        "VNC password of macOS guests.",
    ),
    s(
        KubeletApi,
        env::KUBELET_PORT,
        "10250",
        "Kubelet API port (0: an ephemeral port, for tests).",
    ),
    s(
        KubeletApi,
        env::TLS_CERT,
        env::DEFAULT_TLS_CERT,
        "Kubelet serving certificate (missing: an in-memory self-signed one).",
    ),
    s(
        KubeletApi,
        env::TLS_KEY,
        env::DEFAULT_TLS_KEY,
        "Key of VK_TLS_CERT.",
    ),
    s(
        KubeletApi,
        env::CLIENT_CA_FILE,
        "",
        "CA bundle verifying kubelet API client certificates (the API server's); unset: none accepted.",
    ),
    s(
        KubeletApi,
        env::ANONYMOUS_AUTH,
        "false",
        "true: requests without credentials are authorized as system:anonymous instead of getting 401.",
    ),
    s(
        KubeletApi,
        env::METRICS_ADDR,
        env::DEFAULT_METRICS_ADDR,
        "Prometheus listener (plain HTTP, no authentication: keep it on loopback).",
    ),
    s(
        KubeletApi,
        env::LOG_MAX_BYTES,
        "4194304",
        "Most console-log bytes one logs answer carries.",
    ),
    s(
        KubeletApi,
        env::LOG_MAX_LINE_BYTES,
        "16384",
        "Longer console-log lines are cut to this many bytes.",
    ),
    s(
        KubeletApi,
        env::LOG_FOLLOWERS_PER_POD,
        "4",
        "Concurrent logs -f followers of one pod.",
    ),
    s(
        KubeletApi,
        env::LOG_FOLLOWERS_PER_NODE,
        "64",
        "Concurrent logs -f followers on the node.",
    ),
    s(
        KubeletApi,
        env::LOG_READS_PER_NODE,
        "16",
        "Concurrent console-log captures on the node.",
    ),
    s(
        KubeletApi,
        env::EXEC_SESSIONS_PER_POD,
        "8",
        "Concurrent exec sessions into one pod.",
    ),
    s(
        KubeletApi,
        env::EXEC_SESSIONS_PER_NODE,
        "64",
        "Concurrent exec sessions on the node.",
    ),
    s(
        KubeletApi,
        env::KUBELET_PREAUTH_CONNECTIONS,
        "128",
        "Kubelet API connections awaiting authentication.",
    ),
    s(
        KubeletApi,
        env::KUBELET_TLS_HANDSHAKE_TIMEOUT,
        "10s",
        "Longest kubelet API TLS handshake.",
    ),
    s(
        KubeletApi,
        env::STREAMING_CONNECTION_IDLE_TIMEOUT,
        "4h",
        "Idle exec / logs -f streams are closed after this; 0 disables.",
    ),
    s(
        KubeletApi,
        env::ACTIVITY_INTERVAL,
        "60s",
        "Publish an active VM's last activity on its pod at most this often (idle suspend).",
    ),
    s(
        KubeletApi,
        env::ACTIVITY_CPU_THRESHOLD,
        "200m",
        "VM CPU use above this (200m, 0.5) counts as activity.",
    ),
    s(
        KubeletApi,
        env::EXEC_WAKE_WAIT,
        "60s",
        "An exec into a suspended pod waits this long for its VM to run again.",
    ),
    s(
        Tenants,
        env::CLONE_FROM_DIR_ROOTS,
        "",
        "Directories vm.cocoonstack.io/clone-from-dir may name (absolute, , or : separated); unset: none.",
    ),
    s(
        Tenants,
        env::RUN_IMAGE_URL_ALLOW,
        "",
        "URL prefixes a mode=run image URL may use (scheme, host, port, whole path segments); unset: none.",
    ),
    s(
        Tenants,
        env::NETWORK_ALLOW,
        "",
        "CNI networks pods may name (* = any); unset: the default network only.",
    ),
    s(
        Tenants,
        env::UNMANAGED_IP_CIDRS,
        "",
        "CIDRs unmanaged pods may pre-assign their IP from; unset: none.",
    ),
    s(
        Tenants,
        env::ACCEPT_LEGACY_VM_NAMES,
        "false",
        "true: accept legacy vk-<ns>-<pod> VM names for new pods (ambiguous between namespaces).",
    ),
    s(
        Tenants,
        env::CLONE_BASE_KEEP,
        "4",
        "Unused clone-base snapshots kept on the host.",
    ),
    s(
        Logging,
        env::LOG_LEVEL,
        env::DEFAULT_LOG_LEVEL,
        "trace | debug | info | warn | error | off; invalid exits with status 1.",
    ),
    s(
        Logging,
        env::LOG_FORMAT,
        "text",
        "text | json (one JSON object per line); invalid exits with status 1.",
    ),
    s(
        Simulator,
        "VK_SIM_ROOT",
        "",
        "State directory of the simulated runtime (required with VK_RUNTIME=sim).",
    ),
    s(
        Simulator,
        "VK_SIM_LEASE_DELAY_MS",
        "",
        "Delay before a simulated VM's DHCP lease appears.",
    ),
    s(
        Simulator,
        "VK_SIM_TICK_MS",
        "",
        "Simulated event tick interval.",
    ),
    s(
        Simulator,
        "VK_SIM_LATENCY_SCALE",
        "1",
        "Multiplies every simulated latency (e.g. 20 for a slow-motion demo).",
    ),
    s(
        Simulator,
        "VK_SIM_DISK_SIZE",
        "",
        "Simulated guest disk size (a Quantity).",
    ),
    s(Simulator, "VK_SIM_DISK_FILL", "", "sparse | filled."),
    s(
        Simulator,
        "VK_SIM_MEMORY_SIZE",
        "",
        "Logical size of a simulated snapshot's memory (a Quantity).",
    ),
    s(Simulator, "VK_SIM_MEMORY_FILL", "", "sparse | realistic."),
    s(
        Simulator,
        "VK_SIM_IMAGES",
        "",
        "Pullable images, comma separated, ref or ref=cloudimg|oci.",
    ),
    s(
        Simulator,
        "VK_SIM_PERMISSIVE_PULL",
        "false",
        "true: any image ref can be pulled.",
    ),
    s(
        Simulator,
        "VK_SIM_STATIC_NETWORKS",
        "",
        "Comma-separated static networks.",
    ),
    s(
        Simulator,
        "VK_SIM_IP_POOL",
        "",
        "CIDR of the simulated address pool.",
    ),
    s(
        Simulator,
        "VK_SIM_ECHO_PORTS",
        "",
        "Ports each running simulated VM echoes TCP on, at its address (comma separated).",
    ),
    s(
        Simulator,
        "VK_SIM_COLLISION_WORDING",
        "",
        "already-exists | in-use-by | held-by.",
    ),
    env_only(
        Systemd,
        crate::systemd::NOTIFY_SOCKET,
        "",
        "Type=notify: where READY=1, WATCHDOG=1 and STOPPING=1 go (a path or @abstract).",
    ),
    env_only(
        Systemd,
        crate::systemd::WATCHDOG_USEC,
        "",
        "WatchdogSec= in microseconds: WATCHDOG=1 every half of it while the agent's main loops turn.",
    ),
    env_only(
        Systemd,
        crate::systemd::WATCHDOG_PID,
        "",
        "The process the watchdog is for (another: no pings).",
    ),
];

/// The table entry of `name`.
pub fn lookup(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The closest known name to `key` (case-insensitive edit distance), when close enough to be a
/// likely typo or a lower-case spelling.
pub fn closest(key: &str) -> Option<&'static str> {
    let want = key.to_ascii_uppercase();
    SETTINGS
        .iter()
        .map(|s| (edit_distance(&want, s.name), s.name))
        .filter(|(d, name)| *d <= 2.max(name.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The settings section of `cocoon-operator node --help`: every variable of [`SETTINGS`] by
/// group, with its default and meaning.
pub fn help_text() -> String {
    let mut out = String::from(
        "Configuration: environment variables, or the same names as keys of the YAML file given \
         with --config (the environment overrides the file; an unknown key is refused). An empty \
         value counts as unset unless noted.\n",
    );
    let mut group = None;
    for s in SETTINGS {
        if group != Some(s.group) {
            group = Some(s.group);
            out.push_str(&format!("\n{}:\n", s.group.title()));
        }
        let default = if s.default.is_empty() {
            "unset"
        } else {
            s.default
        };
        out.push_str(&format!(
            "  {} [default: {default}]\n      {}\n",
            s.name, s.meaning
        ));
    }
    out
}

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Env,
    File,
}

/// The values of the table's settings (and nothing else), each with its origin. `Debug` shows
/// the names only: some values are credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Settings {
    values: BTreeMap<&'static str, (String, Origin)>,
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .field("file", &self.file)
            .finish()
    }
}

impl Settings {
    /// The table's settings as `get` (an environment lookup) has them.
    pub fn capture(get: impl Fn(&str) -> Option<String>) -> Self {
        Self::merge(None, get)
    }

    /// The table's settings from `env`, then from `file` for the names `env` does not have
    /// (present in the environment, even empty, wins). Environment-only settings never come
    /// from the file ([`FileSettings::parse`] refuses them).
    pub fn merge(file: Option<&FileSettings>, env: impl Fn(&str) -> Option<String>) -> Self {
        let mut values = BTreeMap::new();
        for s in SETTINGS {
            if let Some(v) = env(s.name) {
                values.insert(s.name, (v, Origin::Env));
            } else if let Some(v) = file.and_then(|f| f.values.get(s.name)) {
                values.insert(s.name, (v.clone(), Origin::File));
            }
        }
        Settings {
            values,
            file: file.map(|f| f.path.clone()),
        }
    }

    /// The value of `name` (`None`: unset, or not a setting of the table).
    pub fn get(&self, name: &str) -> Option<String> {
        self.values.get(name).map(|(v, _)| v.clone())
    }

    /// The file `name`'s value came from, when it came from the `--config` file.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        match self.values.get(name) {
            Some((_, Origin::File)) => self.file.as_deref(),
            _ => None,
        }
    }
}

/// An error of the `--config` file; each names the file and, where one is at fault, the key.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("parse {path}: {reason}")]
    Yaml { path: String, reason: String },
    #[error("{path}: unknown key {key:?}{hint}")]
    UnknownKey {
        path: String,
        key: String,
        hint: String,
    },
    #[error("{path}: {key} is set by systemd or the login, not by the config file")]
    EnvOnly { path: String, key: String },
    #[error("{path}: {key}: want a string, number or boolean, got {got}")]
    BadValue {
        path: String,
        key: String,
        got: &'static str,
    },
}

/// The settings of a `--config` file, values as strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSettings {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

impl FileSettings {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the YAML `text` of `path` (named in errors): a mapping of table names to
    /// scalars; an empty document is no settings.
    pub fn parse(path: &Path, text: &str) -> Result<Self, FileError> {
        let shown = path.display().to_string();
        let doc: Option<BTreeMap<String, serde_json::Value>> = serde_saphyr::from_str(text)
            .map_err(|e| FileError::Yaml {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
        let mut values = BTreeMap::new();
        for (key, value) in doc.unwrap_or_default() {
            let Some(setting) = lookup(&key) else {
                let hint = closest(&key)
                    .map(|n| format!(" (did you mean {n}?)"))
                    .unwrap_or_default();
                return Err(FileError::UnknownKey {
                    path: shown,
                    key,
                    hint,
                });
            };
            if setting.source == Source::EnvOnly {
                return Err(FileError::EnvOnly { path: shown, key });
            }
            let text = match value {
                serde_json::Value::Null => String::new(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::String(s) => s,
                serde_json::Value::Array(_) => {
                    return Err(FileError::BadValue {
                        path: shown,
                        key,
                        got: "a list",
                    });
                }
                serde_json::Value::Object(_) => {
                    return Err(FileError::BadValue {
                        path: shown,
                        key,
                        got: "a mapping",
                    });
                }
            };
            values.insert(key, text);
        }
        Ok(FileSettings {
            path: path.to_path_buf(),
            values,
        })
    }
}
