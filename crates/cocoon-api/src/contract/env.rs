//! Environment variable names, flags and string defaults of `contract.md` §12.
//! Names are kept unchanged so existing Deployments and systemd units keep working.

/// §12.1 operator.
pub mod operator {
    /// kubeconfig path (default: in-cluster config).
    pub const KUBECONFIG: &str = "KUBECONFIG";
    /// Log level (default `info`).
    pub const LOG_LEVEL: &str = "OPERATOR_LOG_LEVEL";
    /// Registry base; required.
    pub const OCI_REGISTRY: &str = "OCI_REGISTRY";
    /// GCP service-account key for registry auth (beyond).
    pub const GOOGLE_APPLICATION_CREDENTIALS: &str = "GOOGLE_APPLICATION_CREDENTIALS";
    /// Prometheus listener; flag `--metrics-bind-address`.
    pub const METRICS_ADDR: &str = "METRICS_ADDR";
    /// `/healthz` and `/readyz` listener; flag `--health-probe-bind-address`.
    pub const PROBE_ADDR: &str = "PROBE_ADDR";
    /// Leader election on/off (unparsable = true); flag `--leader-elect`.
    pub const LEADER_ELECT: &str = "LEADER_ELECT";
    /// Max concurrent CocoonSet reconciles; flag `--cocoonset-concurrency`.
    pub const COCOONSET_CONCURRENCY: &str = "COCOONSET_CONCURRENCY";
    /// Max concurrent CocoonHibernation reconciles; flag `--hibernation-concurrency`.
    pub const HIBERNATION_CONCURRENCY: &str = "HIBERNATION_CONCURRENCY";

    /// Flag of [`METRICS_ADDR`].
    pub const FLAG_METRICS_BIND_ADDRESS: &str = "metrics-bind-address";
    /// Flag of [`PROBE_ADDR`].
    pub const FLAG_HEALTH_PROBE_BIND_ADDRESS: &str = "health-probe-bind-address";
    /// Flag of [`LEADER_ELECT`].
    pub const FLAG_LEADER_ELECT: &str = "leader-elect";
    /// Flag of [`COCOONSET_CONCURRENCY`].
    pub const FLAG_COCOONSET_CONCURRENCY: &str = "cocoonset-concurrency";
    /// Flag of [`HIBERNATION_CONCURRENCY`].
    pub const FLAG_HIBERNATION_CONCURRENCY: &str = "hibernation-concurrency";

    /// Default of [`LOG_LEVEL`].
    pub const DEFAULT_LOG_LEVEL: &str = "info";
    /// Default of [`METRICS_ADDR`].
    pub const DEFAULT_METRICS_ADDR: &str = ":8080";
    /// Default of [`PROBE_ADDR`].
    pub const DEFAULT_PROBE_ADDR: &str = ":8081";
    /// Default of both concurrency knobs.
    pub const DEFAULT_CONCURRENCY: u32 = 4;
    /// Leader-election Lease name, in the operator's own namespace.
    pub const LEADER_ELECTION_ID: &str = "cocoon-operator.cocoonset.cocoonstack.io";
}

/// §12.2 node agent.
pub mod node {
    /// Node name; also the `spec.nodeName` field selector for pods.
    pub const NODE_NAME: &str = "VK_NODE_NAME";
    /// Value of the node label `cocoonstack.io/pool`.
    pub const NODE_POOL: &str = "VK_NODE_POOL";
    /// Node `InternalIP`.
    pub const NODE_IP: &str = "VK_NODE_IP";
    /// Copied to `node.spec.providerID`.
    pub const PROVIDER_ID: &str = "VK_PROVIDER_ID";
    /// `destroy` | `alert` | `keep`.
    pub const ORPHAN_POLICY: &str = "VK_ORPHAN_POLICY";
    /// Log level; invalid exits with status 1.
    pub const LOG_LEVEL: &str = "VK_LOG_LEVEL";
    /// Log format, `text` (default) or `json`; invalid exits with status 1 (beyond).
    pub const LOG_FORMAT: &str = "VK_LOG_FORMAT";
    /// Colon-separated kubeconfig list.
    pub const KUBECONFIG: &str = "KUBECONFIG";
    /// Registry base; required.
    pub const OCI_REGISTRY: &str = "OCI_REGISTRY";
    /// GCP key (beyond).
    pub const GOOGLE_APPLICATION_CREDENTIALS: &str = "GOOGLE_APPLICATION_CREDENTIALS";
    /// cocoon-net DHCP lease file.
    pub const LEASES_PATH: &str = "VK_LEASES_PATH";
    /// cocoon CLI path.
    pub const COCOON_BIN: &str = "VK_COCOON_BIN";
    /// `copy` | `ondemand` | `mmap`.
    pub const RESTORE_MODE: &str = "VK_RESTORE_MODE";
    /// Prometheus listener.
    pub const METRICS_ADDR: &str = "VK_METRICS_ADDR";
    /// Kubelet serving certificate.
    pub const TLS_CERT: &str = "VK_TLS_CERT";
    /// Kubelet serving key.
    pub const TLS_KEY: &str = "VK_TLS_KEY";
    /// CA bundle that verifies kubelet API client certificates (beyond; the kubelet's
    /// `--client-ca-file`). Empty: no client certificate is accepted.
    pub const CLIENT_CA_FILE: &str = "VK_CLIENT_CA_FILE";
    /// `true` lets kubelet API requests without credentials through to authorization as
    /// `system:anonymous` (beyond; the kubelet's `--anonymous-auth`, here off by default).
    pub const ANONYMOUS_AUTH: &str = "VK_ANONYMOUS_AUTH";
    /// Reserved capacity percentage, 0–100.
    pub const RESERVE_PERCENT: &str = "VK_RESERVE_PERCENT";
    /// CPU capacity override (Quantity).
    pub const NODE_CPU: &str = "VK_NODE_CPU";
    /// Memory capacity override (Quantity).
    pub const NODE_MEM: &str = "VK_NODE_MEM";
    /// Storage capacity override (Quantity).
    pub const NODE_STORAGE: &str = "VK_NODE_STORAGE";
    /// Hugepages capacity override (Quantity).
    pub const NODE_HUGEPAGES: &str = "VK_NODE_HUGEPAGES";
    /// Pod capacity.
    pub const NODE_PODS: &str = "VK_NODE_PODS";
    /// cocoon root directory.
    pub const COCOON_ROOT_DIR: &str = "COCOON_ROOT_DIR";
    /// Push zstd level (beyond; 0 = off).
    pub const SNAPSHOT_ZSTD_LEVEL: &str = "SNAPSHOT_ZSTD_LEVEL";
    /// Push chunk size in MiB (beyond; 0 = off).
    pub const SNAPSHOT_CHUNK_SIZE_MIB: &str = "SNAPSHOT_CHUNK_SIZE_MIB";
    /// Parallel chunk transfers (beyond; 0 = 8).
    pub const SNAPSHOT_TRANSFER_CONCURRENCY: &str = "SNAPSHOT_TRANSFER_CONCURRENCY";
    /// Push buffer cap in MiB (beyond; 0 = 9216).
    pub const SNAPSHOT_MEMORY_BUDGET_MIB: &str = "SNAPSHOT_MEMORY_BUDGET_MIB";
    /// Pull prefetch cap in MiB (beyond; default 2048).
    pub const SNAPSHOT_PULL_BUDGET_MIB: &str = "SNAPSHOT_PULL_BUDGET_MIB";
    /// Kubelet API port (beyond; default 10250).
    pub const KUBELET_PORT: &str = "VK_KUBELET_PORT";
    /// cocoon-net control socket (beyond; set-but-empty disables lease release).
    pub const COCOON_NET_CONTROL_SOCKET: &str = "VK_COCOON_NET_CONTROL_SOCKET";
    /// cgroup slice for per-VM CPU stats (beyond).
    pub const COCOON_CGROUP_PARENT: &str = "COCOON_CGROUP_PARENT";
    /// Peer restore staging directory (beyond).
    pub const STAGING_DIR: &str = "VK_STAGING_DIR";
    /// Peer restore listen address (beyond).
    pub const PEER_ADDR: &str = "VK_PEER_ADDR";
    /// cocoon localfile snapshot directory (beyond).
    pub const COCOON_SNAPSHOT_DIR: &str = "VK_COCOON_SNAPSHOT_DIR";
    /// Node snapshot CPU class label value (beyond).
    pub const SNAPSHOT_CPU_CLASS: &str = "VK_SNAPSHOT_CPU_CLASS";
    /// cocoon-macos binary (beyond).
    pub const COCOON_MACOS_BIN: &str = "VK_COCOON_MACOS_BIN";
    /// macOS guest VNC password (beyond).
    pub const COCOON_MACOS_VNC_PASSWORD: &str = "COCOON_MACOS_VNC_PASSWORD";
    /// Directories `vm.cocoonstack.io/clone-from-dir` may name (not in the spec; tenant
    /// isolation): absolute paths separated by `,` or `:`. Unset or empty refuses every
    /// `clone-from-dir`.
    pub const CLONE_FROM_DIR_ROOTS: &str = "VK_CLONE_FROM_DIR_ROOTS";
    /// URL prefixes a `mode=run` image URL may start with (not in the spec; host reach):
    /// `http(s)://host[:port][/path]` separated by `,` or whitespace, matched by scheme, host,
    /// port and whole path segments. Unset or empty refuses every URL image.
    pub const RUN_IMAGE_URL_ALLOW: &str = "VK_RUN_IMAGE_URL_ALLOW";
    /// CNI networks `cocoonset.cocoonstack.io/network` may name (not in the spec; host
    /// reach), separated by `,` or whitespace; `*` allows any. Unset or empty allows only the
    /// default network (no annotation).
    pub const NETWORK_ALLOW: &str = "VK_NETWORK_ALLOW";
    /// Accept the legacy unhashed VM name `vk-<ns>-<pod>` for new pods (not in the spec;
    /// mixed fleets driven by the Go operator v0.3.3). Only the exact value `true` enables it;
    /// default off. The legacy form is ambiguous between namespaces (`a-b`/`x` vs `a`/`b-x`):
    /// safe only on single-tenant clusters or where no namespace name is a dash-extension of
    /// another.
    pub const ACCEPT_LEGACY_VM_NAMES: &str = "VK_ACCEPT_LEGACY_VM_NAMES";
    /// Clone-base snapshots no tracked pod uses that are kept on the node (not in the spec;
    /// bounds the disk that cycling image tags takes). A non-negative integer; default
    /// [`DEFAULT_CLONE_BASE_KEEP`].
    pub const CLONE_BASE_KEEP: &str = "VK_CLONE_BASE_KEEP";
    /// Default of [`CLONE_BASE_KEEP`].
    pub const DEFAULT_CLONE_BASE_KEEP: usize = 4;
    /// CIDRs an unmanaged pod's pre-assigned `vm.cocoonstack.io/ip` must lie in (not in the
    /// spec; issue 35 item 3): IPv4 and IPv6 ranges separated by `,` or whitespace. Unset or
    /// empty refuses every unmanaged pod with a pre-assigned IP.
    pub const UNMANAGED_IP_CIDRS: &str = "VK_UNMANAGED_IP_CIDRS";

    /// Default of [`NODE_NAME`].
    pub const DEFAULT_NODE_NAME: &str = "cocoon-pool";
    /// Default of [`NODE_POOL`].
    pub const DEFAULT_NODE_POOL: &str = "default";
    /// Default of [`ORPHAN_POLICY`].
    pub const DEFAULT_ORPHAN_POLICY: &str = "destroy";
    /// Default of [`LOG_LEVEL`].
    pub const DEFAULT_LOG_LEVEL: &str = "info";
    /// Default of [`LEASES_PATH`].
    pub const DEFAULT_LEASES_PATH: &str = "/var/lib/cocoon/net/leases.json";
    /// Default of [`COCOON_BIN`].
    pub const DEFAULT_COCOON_BIN: &str = "/usr/local/bin/cocoon";
    /// Default of [`RESTORE_MODE`].
    pub const DEFAULT_RESTORE_MODE: &str = "ondemand";
    /// Default of [`METRICS_ADDR`]: loopback only (the listener has no authentication; the
    /// Go agent's `:9091` exposes every namespace's metrics to the network).
    pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9091";
    /// Default of [`TLS_CERT`].
    pub const DEFAULT_TLS_CERT: &str = "/etc/cocoon/vk/tls/vk-kubelet.crt";
    /// Default of [`TLS_KEY`].
    pub const DEFAULT_TLS_KEY: &str = "/etc/cocoon/vk/tls/vk-kubelet.key";
    /// Default of [`RESERVE_PERCENT`].
    pub const DEFAULT_RESERVE_PERCENT: u32 = 20;
    /// Default of [`NODE_PODS`].
    pub const DEFAULT_NODE_PODS: u32 = 256;
    /// Default of [`COCOON_ROOT_DIR`].
    pub const DEFAULT_COCOON_ROOT_DIR: &str = "/var/lib/cocoon";
    /// Default of [`SNAPSHOT_PULL_BUDGET_MIB`].
    pub const DEFAULT_SNAPSHOT_PULL_BUDGET_MIB: u64 = 2048;
    /// Default of [`KUBELET_PORT`].
    pub const DEFAULT_KUBELET_PORT: u16 = 10250;
    /// Default of [`COCOON_NET_CONTROL_SOCKET`].
    pub const DEFAULT_COCOON_NET_CONTROL_SOCKET: &str = "/run/cocoon-net/control.sock";
    /// Default of [`COCOON_CGROUP_PARENT`].
    pub const DEFAULT_COCOON_CGROUP_PARENT: &str = "cocoon.slice";
    /// Default of [`PEER_ADDR`].
    pub const DEFAULT_PEER_ADDR: &str = ":12501";
    /// Default of [`COCOON_SNAPSHOT_DIR`].
    pub const DEFAULT_COCOON_SNAPSHOT_DIR: &str = "/var/lib/cocoon/snapshot/localfile";
    /// Default of [`COCOON_MACOS_BIN`].
    pub const DEFAULT_COCOON_MACOS_BIN: &str = "/usr/local/bin/cocoon-macos";

    // Bounds on tenant-driven work of the kubelet API (not in the spec; issue 26 item 8).
    // Counts are positive integers; durations Go-style (`4h`, `30s`, `500ms`) or seconds.

    /// Most console-log bytes one logs answer (or one read of a followed log) carries.
    pub const LOG_MAX_BYTES: &str = "VK_LOG_MAX_BYTES";
    /// Longer console-log lines are cut to this many bytes.
    pub const LOG_MAX_LINE_BYTES: &str = "VK_LOG_MAX_LINE_BYTES";
    /// Concurrent `logs -f` followers of one pod.
    pub const LOG_FOLLOWERS_PER_POD: &str = "VK_LOG_FOLLOWERS_PER_POD";
    /// Concurrent `logs -f` followers on the node.
    pub const LOG_FOLLOWERS_PER_NODE: &str = "VK_LOG_FOLLOWERS_PER_NODE";
    /// Concurrent console-log captures on the node.
    pub const LOG_READS_PER_NODE: &str = "VK_LOG_READS_PER_NODE";
    /// Concurrent exec sessions into one pod.
    pub const EXEC_SESSIONS_PER_POD: &str = "VK_EXEC_SESSIONS_PER_POD";
    /// Concurrent exec sessions on the node.
    pub const EXEC_SESSIONS_PER_NODE: &str = "VK_EXEC_SESSIONS_PER_NODE";
    /// Kubelet API connections awaiting authentication (TLS handshake and first request).
    pub const KUBELET_PREAUTH_CONNECTIONS: &str = "VK_KUBELET_PREAUTH_CONNECTIONS";
    /// Longest kubelet API TLS handshake.
    pub const KUBELET_TLS_HANDSHAKE_TIMEOUT: &str = "VK_KUBELET_TLS_HANDSHAKE_TIMEOUT";
    /// Idle exec / followed-log streams are closed after this (the kubelet's
    /// `--streaming-connection-idle-timeout`; `0` disables it).
    pub const STREAMING_CONNECTION_IDLE_TIMEOUT: &str = "VK_STREAMING_CONNECTION_IDLE_TIMEOUT";

    // Idle suspend (issue 39): what the node agent counts as a VM's activity and how often it
    // publishes it (`contract::idle`). Durations Go-style (`60s`, `1m`).

    /// How often the node publishes an active VM's last activity on its pod (default `60s`;
    /// shortened per pod to half the set's `suspendAfter`).
    pub const ACTIVITY_INTERVAL: &str = "VK_ACTIVITY_INTERVAL";
    /// CPU use of a VM above which it counts as active: a CPU quantity, `200m` (default) or
    /// `0.5` cores.
    pub const ACTIVITY_CPU_THRESHOLD: &str = "VK_ACTIVITY_CPU_THRESHOLD";
    /// How long an exec or attach to a suspended pod waits for its VM to run again (default
    /// `60s`); then it fails, saying the pod is still suspended.
    pub const EXEC_WAKE_WAIT: &str = "VK_EXEC_WAKE_WAIT";
}
