//! Annotation keys of `contract.md` §5–§7, byte-for-byte: the VM spec, runtime and lifecycle
//! keys on pods, the node-agent-private pod keys, and the operator's CocoonSet bookkeeping keys.

// ---- §5 VM spec (op writes at build; node reads; op reads for drift) ----

/// VM name (§2.2); written once, then always read back instead of recomputed.
pub const VM_NAME: &str = "vm.cocoonstack.io/name";
/// Image or snapshot reference the VM is built from.
pub const IMAGE: &str = "cocoonset.cocoonstack.io/image";
/// `clone` | `run` | `static`; empty means `clone`, `run` compared case-insensitively.
pub const MODE: &str = "cocoonset.cocoonstack.io/mode";
/// Guest OS: `linux` | `windows` | `android` | `macos`.
pub const OS: &str = "cocoonset.cocoonstack.io/os";
/// Root disk size as a Quantity string (used only by `vm run`).
pub const STORAGE: &str = "cocoonset.cocoonstack.io/storage";
/// CNI conflist name, passed as `--network`.
pub const NETWORK: &str = "cocoonset.cocoonstack.io/network";
/// `always` | `main-only` | `never`; empty means `always`.
pub const SNAPSHOT_POLICY: &str = "cocoonset.cocoonstack.io/snapshot-policy";
/// The main's VM name a sub-agent forks from.
pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
/// Connection type hint: `ssh` | `rdp` | `vnc` | `adb` (not used by node behaviour).
pub const CONN_TYPE: &str = "vm.cocoonstack.io/conn-type";
/// Hypervisor backend: `cloud-hypervisor` | `firecracker`.
pub const BACKEND: &str = "vm.cocoonstack.io/backend";
/// `true` = the node agent manages this VM; absent for `static` toolboxes.
pub const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
/// `true` = bypass the node's image cache.
pub const FORCE_PULL: &str = "cocoonset.cocoonstack.io/force-pull";
/// `true` = pass `--no-direct-io` to the runtime.
pub const NO_DIRECT_IO: &str = "vm.cocoonstack.io/no-direct-io";
/// Decimal TCP port for the readiness probe instead of ICMP; only written when > 0.
pub const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";

// ---- §6 runtime and lifecycle ----

/// Runtime VM id (node writes; op pre-writes for `static` toolboxes).
pub const VM_ID: &str = "vm.cocoonstack.io/id";
/// Primary IPv4 of the VM; may be empty.
pub const VM_IP: &str = "vm.cocoonstack.io/ip";
/// Decimal VNC port (static toolboxes; only when > 0).
pub const VNC_PORT: &str = "vm.cocoonstack.io/vnc-port";
/// `true` = hibernate requested; awake is represented by absence.
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
/// `true` = restore this VM from its `:hibernate` snapshot at create.
pub const RESTORE_FROM_HIBERNATE: &str = "vm.cocoonstack.io/restore-from-hibernate";
/// `true` = keep host-local `<vm>` and `fork-<vm>` snapshots on pod delete (warm-wake cache).
pub const KEEP_SNAPSHOT_ON_DELETE: &str = "vm.cocoonstack.io/keep-snapshot-on-delete";
/// `creating` | `ready` | `hibernating` | `hibernated` | `failed`, written by the node.
pub const LIFECYCLE_STATE: &str = "vm.cocoonstack.io/lifecycle-state";
/// int64: CocoonSet generation the node observed, written in the same patch as the state.
pub const LIFECYCLE_OBSERVED_GENERATION: &str = "vm.cocoonstack.io/lifecycle-observed-generation";
/// Free-text lifecycle message, same patch as the state; removed whenever empty.
pub const LIFECYCLE_STATE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";
/// The CocoonSet `metadata.generation` stamped on the pod by the operator.
pub const GENERATION: &str = "cocoonset.cocoonstack.io/generation";
/// The CocoonSet generation at which the pod's rebuild budget ran out.
pub const DEAD_LETTER: &str = "cocoonset.cocoonstack.io/dead-letter";

// ---- §6.1 node-agent-private pod annotations ----

/// Base64 (standard, padded) of the newline-joined network fixup script a human must run.
pub const POST_CLONE_HINT: &str = "vm.cocoonstack.io/post-clone-hint";
/// Automatic post-clone fixup state: `running` | `done` | `failed` (sticky) — beyond.
pub const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";
/// Per-attempt post-clone errors joined, truncated to [`POST_CLONE_ERRORS_MAX_BYTES`] — beyond.
pub const POST_CLONE_ERRORS: &str = "vm.cocoonstack.io/post-clone-errors";
/// Byte bound of [`POST_CLONE_ERRORS`].
pub const POST_CLONE_ERRORS_MAX_BYTES: usize = 4096;
/// Value of [`POST_CLONE_STATE`] while the fixup runs.
pub const POST_CLONE_STATE_RUNNING: &str = "running";
/// Value of [`POST_CLONE_STATE`] after a successful fixup.
pub const POST_CLONE_STATE_DONE: &str = "done";
/// Value of [`POST_CLONE_STATE`] after the fixup gave up; sticky.
pub const POST_CLONE_STATE_FAILED: &str = "failed";
/// Absolute canonical host path of an exported snapshot directory to clone from.
pub const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";

// ---- §7 CocoonSet annotations (op only) ----

/// Comma-joined, sorted, de-duplicated VM names stashed for teardown registry GC.
pub const DELETE_VM_NAMES: &str = "cocoonset.cocoonstack.io/delete-vm-names";
/// JSON: pod name → `{"count":<int>,"lastDeleted":"<RFC3339Nano>"}` rebuild budget ledger.
pub const REBUILD_HISTORY: &str = "cocoonset.cocoonstack.io/rebuild-history";
/// Node the main lived on at a release-policy seat release (wake affinity hint).
pub const HIBERNATED_ON_NODE: &str = "cocoonset.cocoonstack.io/hibernated-on-node";
/// RFC3339 UTC (seconds) start of the current `Suspending` phase; drives the suspend deadline.
pub const SUSPENDING_SINCE: &str = "cocoonset.cocoonstack.io/suspending-since";
/// JSON reclaim record `{"generation":..,"vms":[..],"restore":[..],"suspended":[..]}`.
pub const HIBERNATE_RECLAIM: &str = "cocoonset.cocoonstack.io/hibernate-reclaim";

/// The only true value of a boolean annotation; false is written by removing the key.
pub const TRUE: &str = "true";
