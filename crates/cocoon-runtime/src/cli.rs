//! The real backend: runs `VK_COCOON_BIN` directly (no sudo) with the exact argv of §3.2,
//! parses its JSON, classifies its errors by phrase and streams snapshots through its pipes.
//!
//! Every name, id, ref and directory is validated before it reaches an argv, and positionals
//! follow `--` (see [`args`](super::args)): a value that fails is refused with
//! [`RuntimeError::InvalidArgument`] and no process starts.
//!
//! Every child is started with `kill_on_drop`, so dropping a call (or a stream's completion)
//! kills the `cocoon` process, which is how cancellation reaches it.
//!
//! Every child runs with `NO_COLOR=1` (the CLI colours its stderr log lines otherwise), and
//! ANSI escapes are stripped from any CLI text that ends up in an error.
//!
//! Capability detection (§3.1): [`CliRuntime::detect`] runs `cocoon vm clone --help` and
//! `cocoon vm --help` once, then `cocoon vm <verb> --help` for each of `exec`, `logs` and `net`
//! the `vm` help lists, and looks for `--restore-mode`, `--on-demand`, the three `--cpu-*`
//! flags, `--from-dir`, the `reconcile-stale-create` verb, and `exec -i`, `logs --tail`,
//! `net --nics` (see [`Capabilities::from_help`]). Missing restore-mode / CPU-policy flags
//! are omitted with a warning (restore mode `ondemand` becomes the boolean `--on-demand` of
//! v0.3.8); a request that needs `--from-dir`, the stale-create verb, `vm exec` (or its `-i`
//! for stdin) or `vm net --nics` fails with [`RuntimeError::Unsupported`] before anything
//! runs. `vm logs` without `--tail` runs without it and the agent keeps the last lines
//! itself (bounded, [`MAX_LOG_TAIL_BYTES`]). If the help cannot be run at all, no optional
//! feature is assumed, the §3.2 verbs are ([`Capabilities::UNDETECTED`]).
//!
//! Supported releases (issue 40): v0.3.8 and v0.5.x. `vm stop --timeout N` (both have it;
//! capability `stop` = the `vm` help lists `stop`) is the graceful shutdown a caller runs
//! before `vm rm --force`, which on v0.5.x kills at once. v0.5.x's `vm exec` reports its own
//! failures as `Error: exec: …` with exit status 1: those are runtime errors, not the guest's
//! exit code (the table in `cli/exec_out.rs`).
//!
//! Whatever the capabilities say, a CLI that answers with its command *group* help and exit
//! status 0 (a release without the verb) or with `unknown flag` / `unknown shorthand flag`
//! yields [`RuntimeError::Unsupported`], never a result; for `exec`, whose output streams to
//! the caller, that check is made only when the capabilities were not detected (a guest
//! command may print such texts itself).

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

mod exec_out;
mod stream;
mod verbs;

use exec_out::Peeked;
pub use stream::TailKeeper;

use super::args::HelpTexts;
use super::args::{self, Capabilities};
use super::error::{Result, RuntimeError, classify, strip_ansi};
use super::heal::{RawSnapshotVerbs, RetryPolicy};
use super::io::ImportHandle;

/// Longest event line accepted (§5 reader rules); longer lines are skipped.
pub const MAX_EVENT_LINE: usize = 1 << 20;

/// Most bytes of console log a `vm logs` capture keeps unless the caller gives its own cap
/// ([`Runtime::logs_capped`](crate::Runtime::logs_capped)); older lines are dropped first.
pub const MAX_LOG_TAIL_BYTES: usize = 4 << 20;

/// Leading bytes of an undetected `exec`'s output kept to recognise the CLI's own texts.
const EXEC_PEEK: usize = 16 << 10;

/// Configuration of the CLI backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliConfig {
    /// The `cocoon` binary (`VK_COCOON_BIN`).
    pub bin: PathBuf,
    /// §3.3 retry of a locked snapshot holder.
    pub save_retry: RetryPolicy,
    /// procfs root for [`Runtime::vm_stats`](crate::Runtime::vm_stats) (`/proc`).
    pub proc_root: PathBuf,
    /// sysfs network root for TAP counters (`/sys/class/net`).
    pub sys_net_root: PathBuf,
}

impl CliConfig {
    /// Defaults for `bin`.
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        CliConfig {
            bin: bin.into(),
            save_retry: RetryPolicy::default(),
            proc_root: PathBuf::from("/proc"),
            sys_net_root: PathBuf::from("/sys/class/net"),
        }
    }
}

/// The `cocoon` CLI backend.
#[derive(Debug, Clone)]
pub struct CliRuntime {
    cfg: CliConfig,
    caps: Capabilities,
    /// The capabilities were detected (or given), not assumed.
    detected: bool,
}

/// A finished child: exit status and both outputs.
struct Captured {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Go-style text of a non-success exit: `exit status N` or `signal: N`.
fn exit_text(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal: {sig}"),
        (None, None) => status.to_string(),
    }
}

/// CLI output as diagnostic text: lossy UTF-8, ANSI escapes stripped, trimmed.
fn trimmed(bytes: &[u8]) -> String {
    strip_ansi(&String::from_utf8_lossy(bytes))
        .trim()
        .to_owned()
}

/// The error of a verb the installed CLI does not have.
fn no_verb(label: &str, verb: &str) -> RuntimeError {
    RuntimeError::Unsupported(format!(
        "{label}: the installed cocoon CLI has no vm {verb}"
    ))
}

/// The error of a flag the installed CLI's verb does not have.
fn no_flag(label: &str, verb: &str, flag: &str, why: &str) -> RuntimeError {
    RuntimeError::Unsupported(format!(
        "{label}: the installed cocoon CLI's vm {verb} has no {flag} ({why})"
    ))
}

/// A successful exit whose stdout is the CLI's group help is a missing verb, not a result.
fn group_help_instead_of_result(label: &str, stdout: &[u8]) -> Option<RuntimeError> {
    let text = String::from_utf8_lossy(stdout);
    args::is_group_help(&text).then(|| {
        RuntimeError::Unsupported(format!(
            "{label}: the installed cocoon CLI does not have this command (it printed its command help)"
        ))
    })
}

/// Drains a child pipe in the background so the child never blocks on it.
fn drain(pipe: Option<impl AsyncRead + Unpin + Send + 'static>) -> JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            // A read error only truncates the diagnostic text.
            let _ = p.read_to_end(&mut buf).await;
        }
        buf
    })
}

impl CliRuntime {
    /// A backend with explicitly given capabilities (no detection).
    pub fn with_capabilities(cfg: CliConfig, caps: Capabilities) -> Self {
        CliRuntime {
            cfg,
            caps,
            detected: true,
        }
    }

    /// A backend whose capabilities are detected from the installed CLI's help texts.
    pub async fn detect(cfg: CliConfig) -> Self {
        let mut rt = CliRuntime {
            cfg,
            caps: Capabilities::UNDETECTED,
            detected: false,
        };
        let clone_help = rt.help_text(&args::clone_help_args()).await;
        let vm_help = rt.help_text(&args::vm_help_args()).await;
        match (clone_help, vm_help) {
            (Some(clone), Some(vm)) => {
                let mut help = HelpTexts {
                    clone,
                    vm,
                    ..HelpTexts::default()
                };
                for verb in args::PROBED_VERBS {
                    if !args::lists_verb(&help.vm, verb) {
                        continue;
                    }
                    let text = rt.help_text(&args::verb_help_args(verb)).await;
                    match verb {
                        "exec" => help.exec = text,
                        "logs" => help.logs = text,
                        _ => help.net = text,
                    }
                }
                rt.caps = Capabilities::from_help(&help);
                rt.detected = true;
            }
            _ => tracing::warn!(
                bin = %rt.cfg.bin.display(),
                "cannot read cocoon help; assuming no restore-mode, CPU-policy or from-dir support"
            ),
        }
        tracing::info!(caps = ?rt.caps, detected = rt.detected, "cocoon capabilities");
        for (missing, what) in [
            (
                !rt.caps.exec,
                "vm exec: kubectl exec and guest fix-ups will fail",
            ),
            (!rt.caps.logs, "vm logs: kubectl logs will fail"),
            (
                !rt.caps.net_nics,
                "vm net --nics: Windows hibernate on cloud-hypervisor will fail",
            ),
        ] {
            if missing {
                tracing::warn!(bin = %rt.cfg.bin.display(), "installed cocoon CLI has no {what}");
            }
        }
        rt
    }

    /// The capabilities in force.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn command(&self, argv: &[String]) -> Command {
        let mut c = Command::new(&self.cfg.bin);
        c.args(argv)
            .env("NO_COLOR", "1")
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn spawn(&self, label: &str, mut cmd: Command) -> Result<Child> {
        cmd.spawn().map_err(|e| {
            RuntimeError::Other(format!("{label}: start {}: {e}", self.cfg.bin.display()))
        })
    }

    async fn capture(&self, label: &str, argv: &[String]) -> Result<Captured> {
        let child = self.spawn(label, self.command(argv))?;
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
        Ok(Captured {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    /// Help text (stdout + stderr, whatever the exit status); `None` if it cannot run.
    async fn help_text(&self, argv: &[String]) -> Option<String> {
        let c = self.capture("cocoon help", argv).await.ok()?;
        Some(format!("{}\n{}", trimmed(&c.stdout), trimmed(&c.stderr)))
    }

    /// A command whose stdout is the result and whose stderr goes into the error:
    /// `<label>: <exit error> (stderr: <trimmed stderr>)`.
    async fn run_stdout(&self, label: &str, argv: &[String]) -> Result<Vec<u8>> {
        let c = self.capture(label, argv).await?;
        if !c.status.success() {
            return Err(classify(format!(
                "{label}: {} (stderr: {})",
                exit_text(&c.status),
                trimmed(&c.stderr)
            )));
        }
        if let Some(e) = group_help_instead_of_result(label, &c.stdout) {
            return Err(e);
        }
        Ok(c.stdout)
    }

    /// A command whose output is combined: `<label>: <err> (output: <trimmed output>)`.
    async fn run_combined(&self, label: &str, argv: &[String]) -> Result<String> {
        let c = self.capture(label, argv).await?;
        let output = [trimmed(&c.stdout), trimmed(&c.stderr)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        if !c.status.success() {
            return Err(classify(format!(
                "{label}: {} (output: {output})",
                exit_text(&c.status)
            )));
        }
        if let Some(e) = group_help_instead_of_result(label, &c.stdout) {
            return Err(e);
        }
        Ok(output)
    }

    /// `vm logs` (`argv`): the output streams through a [`TailKeeper`] of the last `lines`
    /// lines, so memory stays bounded by `max_bytes` (on a release without `--tail`, the
    /// whole log streams through it).
    async fn logs_tailed_here(
        &self,
        label: &str,
        argv: &[String],
        lines: usize,
        max_bytes: usize,
    ) -> Result<Vec<u8>> {
        let mut child = self.spawn(label, self.command(argv))?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| RuntimeError::Other(format!("{label}: no stdout pipe")))?;
        let err = drain(child.stderr.take());
        let mut keeper = TailKeeper::new(lines, max_bytes);
        // The start of the output too, to tell the CLI's group help (a release without the
        // verb) from a log, whatever the tail kept.
        let mut head = Peeked::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = stdout
                .read(&mut buf)
                .await
                .map_err(|e| RuntimeError::Other(format!("{label}: read: {e}")))?;
            if n == 0 {
                break;
            }
            head.see(&buf[..n], EXEC_PEEK);
            keeper.push(&buf[..n]);
        }
        let status = child
            .wait()
            .await
            .map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
        let stderr = err.await.unwrap_or_default();
        if !status.success() {
            return Err(classify(format!(
                "{label}: {} (stderr: {})",
                exit_text(&status),
                trimmed(&stderr)
            )));
        }
        if let Some(e) = head
            .whole()
            .and_then(|whole| group_help_instead_of_result(label, whole))
        {
            return Err(e);
        }
        Ok(keeper.finish())
    }

    /// Spawns a child whose stdin is the returned sink (`snapshot import`, `image import`).
    fn spawn_import(&self, label: String, argv: &[String]) -> Result<ImportHandle> {
        let mut cmd = self.command(argv);
        cmd.stdin(Stdio::piped());
        let mut child = self.spawn(&label, cmd)?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| RuntimeError::Other(format!("{label}: no stdin pipe")))?;
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let done = async move {
            let killed = async {
                // A dropped sender (no abort) must not end the wait.
                if kill_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let waited = tokio::select! {
                s = child.wait() => Some(s),
                () = killed => None,
            };
            let Some(status) = waited else {
                // SIGKILL and reap: nothing the importer read may be registered.
                let _ = child.kill().await;
                return Err(RuntimeError::Other(format!("{label}: aborted")));
            };
            let status = status.map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
            let _ = out.await;
            let stderr = err.await.unwrap_or_default();
            if status.success() {
                Ok(())
            } else {
                Err(classify(format!(
                    "{label}: {} (stderr: {})",
                    exit_text(&status),
                    trimmed(&stderr)
                )))
            }
        };
        Ok(ImportHandle {
            sink: Box::pin(stdin),
            done: Box::pin(done),
            abort: Box::new(move || {
                let _ = kill_tx.send(());
            }),
        })
    }
}

#[async_trait]
impl RawSnapshotVerbs for CliRuntime {
    async fn raw_save(&self, name: &str, vm_id: &str) -> Result<()> {
        let label = format!("cocoon snapshot save {name}");
        self.run_combined(&label, &args::snapshot_save_args(name, vm_id)?)
            .await
            .map(drop)
    }

    async fn raw_rm(&self, name: &str) -> Result<()> {
        let label = format!("cocoon snapshot rm {name}");
        self.run_combined(&label, &args::snapshot_rm_args(name)?)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_texts_are_go_style() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_text(&ExitStatus::from_raw(1 << 8)), "exit status 1");
        assert_eq!(exit_text(&ExitStatus::from_raw(9)), "signal: 9");
    }
}
