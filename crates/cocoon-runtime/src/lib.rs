//! The VM runtime interface of `runtime.md` §1 and its two backends: the host's `cocoon` CLI
//! ([`cli::CliRuntime`]) and the in-process simulator ([`sim::SimRuntime`]).
//!
//! The node agent holds an `Arc<dyn Runtime>` and never learns which backend it talks to.
//!
//! # Choosing the backend
//!
//! | env | meaning |
//! |---|---|
//! | `VK_RUNTIME` | `cocoon` (default; also when unset or empty) or `sim` |
//! | `VK_COCOON_BIN` | the `cocoon` binary of the real backend (default `/usr/local/bin/cocoon`) |
//! | `VK_SIM_ROOT` | the simulator's state directory (required for `sim`) |
//!
//! The simulator reads further `VK_SIM_*` knobs (see [`sim::SimConfig::from_env`]); its lease
//! file is `VK_LEASES_PATH`, the same path the node agent reads leases from.
//! [`BackendChoice::from_env`] reads the switch; [`BackendChoice::open`] builds the backend.
//!
//! # Shape of the interface
//!
//! * Object safety: `Runtime` uses `#[async_trait]`. Native `async fn` in traits is not
//!   dyn-compatible, and hand-written `Pin<Box<dyn Future>>` signatures for twenty methods
//!   would bury the interface; async-trait produces exactly those boxed `Send` futures.
//! * Cancellation is by dropping the future. The CLI backend starts every child with
//!   `kill_on_drop`, so a dropped call kills its `cocoon` process; the simulator's latencies
//!   are plain `tokio` sleeps that end with the future.
//! * Errors are [`RuntimeError`]: callers tell apart exactly the classes of §1's last column
//!   (`VmNotFound` vs transient, `ExitCode(n)` vs transport, `SnapshotNotFound`,
//!   `ImageNotFound`, name taken / in use), classified by the §3.4 phrases.
//! * Streams: `snapshot_import`/`image_import` return an [`ImportHandle`] (a sink and a
//!   completion), `snapshot_export` an [`ExportHandle`] (a reader and a completion), and
//!   `watch_events` an [`EventStream`]. Close the stream side before awaiting completion.
//! * The clone method is `clone_vm`, because a method named `clone` on `Arc<dyn Runtime>`
//!   would resolve to `Arc::clone`.

pub mod args;
#[cfg(test)]
mod args_tests;
pub mod cli;
pub mod error;
pub mod events;
mod heal;
pub mod io;
pub mod parse;
pub mod sim;
pub mod stats;
pub mod tarfmt;
pub mod types;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

pub use args::{Capabilities, HelpTexts};
pub use error::{Result, RuntimeError, classify};
pub use events::{EventDiffer, EventKind, EventStream, VmEvent};
pub use heal::RetryPolicy;
pub use io::{CaptureBuf, Completion, ExportHandle, ImportHandle};
pub use types::{
    ByteReader, ByteWriter, CloneRequest, CloneSource, CpuPolicy, ExecRequest, IdSet,
    NetworkConfig, NicNetwork, RunRequest, SnapshotRecord, StaleCreateOutcome, StorageConfig,
    TapStats, VmConfig, VmRecord, VmStats,
};

/// One method per operation of `runtime.md` §1. Every method maps to exactly one `cocoon`
/// invocation in the real backend (except `snapshot_save` and `snapshot_import`, which may
/// first remove a snapshot).
#[async_trait]
pub trait Runtime: Send + Sync {
    /// `"cocoon"` or `"sim"`, for logs.
    fn backend_name(&self) -> &'static str;

    /// `clone`: a new VM from a snapshot (or `--from-dir`); any error is a failure.
    async fn clone_vm(&self, req: CloneRequest) -> Result<VmRecord>;

    /// `run`: create and start a VM from an image; returns a running record with a PID.
    async fn run(&self, req: RunRequest) -> Result<VmRecord>;

    /// `inspect` by id, name or id prefix (≥ 3 characters); `VmNotFound` is definitive, every
    /// other error is transient.
    async fn inspect(&self, vm: &str) -> Result<VmRecord>;

    /// `list`: every VM (fatal at startup if it fails).
    async fn list(&self) -> Result<Vec<VmRecord>>;

    /// `remove`: stop (SIGTERM, then SIGKILL) and delete. Returns `VmNotFound` for a missing
    /// VM; callers that treat that as success decide so themselves.
    async fn remove(&self, id: &str) -> Result<()>;

    /// `stop` (beyond §1, issue 40): ask the guest to shut down (ACPI power button), the
    /// runtime waiting at most `timeout` (whole seconds, at least 1) for it. `VmNotFound` for
    /// a missing VM. The caller bounds the call itself: dropping it ends the wait (the CLI
    /// backend kills its `cocoon vm stop` child), and a guest that ignores the request keeps
    /// the call pending until the runtime's own timeout handling ends it.
    async fn stop(&self, id: &str, timeout: std::time::Duration) -> Result<()>;

    /// `start`: restart a stopped or errored VM in place (disk and network kept).
    async fn start(&self, id: &str) -> Result<()>;

    /// `exec`: run argv in the guest; a non-zero guest exit is [`RuntimeError::ExitCode`].
    async fn exec(&self, req: ExecRequest) -> Result<()>;

    /// `logs`: what `cocoon vm logs` prints (on v0.5.x the hypervisor's log, not the guest
    /// console; the simulator keeps a console log), optionally only the last `tail` lines, at most
    /// [`cli::MAX_LOG_TAIL_BYTES`] of it (see [`Runtime::logs_capped`]).
    async fn logs(&self, id: &str, tail: Option<u64>) -> Result<Vec<u8>> {
        self.logs_capped(id, tail, cli::MAX_LOG_TAIL_BYTES).await
    }

    /// `logs` keeping at most `max_bytes` of the newest output (older lines, then the start
    /// of an over-long line, are dropped while it is read): the guest decides how much it
    /// prints, so the capture never holds more than this, whatever the log's size.
    async fn logs_capped(&self, id: &str, tail: Option<u64>, max_bytes: usize) -> Result<Vec<u8>>;

    /// `net_resize`: hot-resize the NIC count (cloud-hypervisor only).
    async fn net_resize(&self, id: &str, nics: u32) -> Result<()>;

    /// `snapshot_save`: save `vm_id` as `name`; a taken name is replaced (§3.3).
    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()>;

    /// `snapshot_remove_if_exists`: not-found counts as success; a locked snapshot is
    /// [`RuntimeError::InUse`].
    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()>;

    /// `snapshot_inspect`: `SnapshotNotFound` vs other.
    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord>;

    /// `snapshot_list` (optional verb, used by the reclaimer).
    async fn snapshot_list(&self) -> Result<Vec<SnapshotRecord>>;

    /// `snapshot_import`: removes `name` if present, then returns a sink for the §2.3 tar. The
    /// name becomes visible only when the completion resolves `Ok`.
    async fn snapshot_import(&self, name: &str) -> Result<ImportHandle>;

    /// `snapshot_export`: the §2.3 tar of `name` as a stream.
    async fn snapshot_export(&self, name: &str) -> Result<ExportHandle>;

    /// `ensure_image`: `image pull [--force] <ref>`.
    async fn ensure_image(&self, image: &str, force: bool) -> Result<()>;

    /// `image_present`: `Ok` if the store has it by name or digest, else `ImageNotFound`.
    async fn image_present(&self, name_or_digest: &str) -> Result<()>;

    /// `image_import`: a sink for a qcow2 or tar stream stored under `name`.
    async fn image_import(&self, name: &str) -> Result<ImportHandle>;

    /// `watch_events`: the §5 event stream. An `Err` here is a start failure; the stream's end
    /// is the end of the source.
    async fn watch_events(&self) -> Result<EventStream>;

    /// `reconcile_stale_create` (optional verb): collect a stale `creating` record.
    async fn reconcile_stale_create(&self, id: &str) -> Result<StaleCreateOutcome>;

    /// Resource usage of a VM (§7.11): PID, RSS, CPU time, TAP counters. The real backend
    /// reads procfs/sysfs for the record's PID and TAPs; the simulator synthesises values.
    async fn vm_stats(&self, vm: &VmRecord) -> Result<VmStats>;
}

/// Output of [`exec_capture`].
#[derive(Debug)]
pub struct ExecOutput {
    /// The exec result (`ExitCode(n)` for a non-zero guest exit).
    pub result: Result<()>,
    /// Everything the guest wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything the guest wrote to stderr.
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// Stdout as lossy UTF-8.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `argv` in `vm` with optional stdin bytes and captures both output streams.
pub async fn exec_capture(
    rt: &dyn Runtime,
    vm: &str,
    argv: &[&str],
    stdin: Option<Vec<u8>>,
) -> ExecOutput {
    let out = CaptureBuf::new();
    let err = CaptureBuf::new();
    let mut req = ExecRequest::new(vm, argv.iter().copied());
    req.stdout = Some(out.writer());
    req.stderr = Some(err.writer());
    req.stdin = stdin.map(|b| Box::pin(std::io::Cursor::new(b)) as ByteReader);
    let result = rt.exec(req).await;
    ExecOutput {
        result,
        stdout: out.contents(),
        stderr: err.contents(),
    }
}

/// Env var selecting the backend: `cocoon` (default) or `sim`.
pub const ENV_RUNTIME: &str = "VK_RUNTIME";
/// Env var with the simulator's state directory.
pub const ENV_SIM_ROOT: &str = "VK_SIM_ROOT";

/// Which backend the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    /// The real `cocoon` CLI at this path.
    Cocoon {
        /// `VK_COCOON_BIN`.
        bin: PathBuf,
    },
    /// The simulator with this state root.
    Sim {
        /// `VK_SIM_ROOT`.
        root: PathBuf,
    },
}

impl BackendChoice {
    /// Reads `VK_RUNTIME`, `VK_COCOON_BIN` and `VK_SIM_ROOT` through `get` (pass
    /// `|k| std::env::var(k).ok()`). Unknown values and `sim` without a root are errors.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        use cocoon_api::contract::env::node;
        let non_empty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        match non_empty(ENV_RUNTIME).as_deref().map(str::trim) {
            None | Some("cocoon") => Ok(BackendChoice::Cocoon {
                bin: PathBuf::from(
                    non_empty(node::COCOON_BIN)
                        .unwrap_or_else(|| node::DEFAULT_COCOON_BIN.to_owned()),
                ),
            }),
            Some("sim") => non_empty(ENV_SIM_ROOT)
                .map(|root| BackendChoice::Sim {
                    root: PathBuf::from(root),
                })
                .ok_or_else(|| {
                    RuntimeError::Other(format!("{ENV_RUNTIME}=sim needs {ENV_SIM_ROOT}"))
                }),
            Some(other) => Err(RuntimeError::Other(format!(
                "{ENV_RUNTIME}={other:?}: want \"cocoon\" or \"sim\""
            ))),
        }
    }

    /// Builds the backend. For `sim`, the remaining `VK_SIM_*` knobs and `VK_LEASES_PATH` are
    /// read through `get`; the returned [`sim::SimHandle`] is `Some` only for the simulator.
    pub async fn open(
        &self,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(Arc<dyn Runtime>, Option<sim::SimHandle>)> {
        match self {
            BackendChoice::Cocoon { bin } => {
                let rt = cli::CliRuntime::detect(cli::CliConfig::new(bin.clone())).await;
                Ok((Arc::new(rt), None))
            }
            BackendChoice::Sim { root } => {
                let cfg = sim::SimConfig::from_env(root.clone(), get)?;
                let rt = sim::SimRuntime::open(cfg)?;
                let handle = rt.handle();
                Ok((Arc::new(rt), Some(handle)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn backend_switch() {
        assert_eq!(
            BackendChoice::from_env(env(&[])).expect("default"),
            BackendChoice::Cocoon {
                bin: PathBuf::from("/usr/local/bin/cocoon")
            }
        );
        assert_eq!(
            BackendChoice::from_env(env(&[
                ("VK_RUNTIME", "cocoon"),
                ("VK_COCOON_BIN", "/opt/c")
            ]))
            .expect("cocoon"),
            BackendChoice::Cocoon {
                bin: PathBuf::from("/opt/c")
            }
        );
        assert_eq!(
            BackendChoice::from_env(env(&[("VK_RUNTIME", "sim"), ("VK_SIM_ROOT", "/tmp/s")]))
                .expect("sim"),
            BackendChoice::Sim {
                root: PathBuf::from("/tmp/s")
            }
        );
        assert!(BackendChoice::from_env(env(&[("VK_RUNTIME", "sim")])).is_err());
        assert!(BackendChoice::from_env(env(&[("VK_RUNTIME", "qemu")])).is_err());
    }
}
