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
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;

mod exec_out;

use exec_out::{Peeked, exec_cli_failure, exec_cli_refusal, pump};

use super::Runtime;
use super::args::HelpTexts;
use super::args::{self, Capabilities};
use super::error::{Result, RuntimeError, classify, strip_ansi};
use super::events::{EventStream, VmEvent, parse_event_line};
use super::heal::{RawSnapshotVerbs, RetryPolicy, save_healing};
use super::io::{ExportHandle, ImportHandle};
use super::parse;
use super::stats;
use super::types::{
    CloneRequest, ExecRequest, RunRequest, SnapshotRecord, StaleCreateOutcome, VmRecord, VmStats,
};

/// Longest event line accepted (§5 reader rules); longer lines are skipped.
pub const MAX_EVENT_LINE: usize = 1 << 20;

/// Most bytes of console log a `vm logs` capture keeps unless the caller gives its own cap
/// ([`Runtime::logs_capped`]); older lines are dropped first.
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
    /// procfs root for [`Runtime::vm_stats`] (`/proc`).
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

/// One line of the event stream, bounded by `max` bytes.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A complete line without its newline.
    Text(Vec<u8>),
    /// A line longer than `max`, skipped up to its newline.
    TooLong,
}

/// Reads the next line (the last one may lack its newline); `None` at end of input.
async fn next_line(
    r: &mut (impl AsyncBufRead + Unpin),
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => Some(Line::TooLong),
                (false, true) => None,
                (false, false) => Some(Line::Text(buf)),
            });
        }
        let (take, newline) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&avail[..take]);
            }
        }
        r.consume(take + usize::from(newline));
        if newline {
            return Ok(Some(if too_long {
                Line::TooLong
            } else {
                Line::Text(buf)
            }));
        }
    }
}

/// Keeps the last `lines` lines of a byte stream within `max_bytes` (older lines, then the
/// start of an over-long line, are dropped first): the agent's own tail for a `vm logs`
/// without `--tail`.
#[derive(Debug)]
pub struct TailKeeper {
    lines: usize,
    max_bytes: usize,
    done: std::collections::VecDeque<Vec<u8>>,
    bytes: usize,
    partial: Vec<u8>,
}

impl TailKeeper {
    /// A keeper of the last `lines` lines, at most `max_bytes` bytes.
    pub fn new(lines: usize, max_bytes: usize) -> Self {
        TailKeeper {
            lines,
            max_bytes,
            done: std::collections::VecDeque::new(),
            bytes: 0,
            partial: Vec::new(),
        }
    }

    /// Feeds the next chunk of the stream.
    pub fn push(&mut self, mut chunk: &[u8]) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&chunk[..=i]);
            self.cut_partial();
            let line = std::mem::take(&mut self.partial);
            self.bytes += line.len();
            self.done.push_back(line);
            chunk = &chunk[i + 1..];
            self.trim();
        }
        self.partial.extend_from_slice(chunk);
        self.trim();
    }

    fn trim(&mut self) {
        while self.done.len() > self.lines
            || (self.bytes + self.partial.len() > self.max_bytes && !self.done.is_empty())
        {
            if let Some(old) = self.done.pop_front() {
                self.bytes -= old.len();
            }
        }
        // Cut an over-long line only once it reaches twice the bound, so a huge line costs
        // one move per `max_bytes` of input, not one per chunk.
        if self.partial.len() > self.max_bytes.saturating_mul(2) {
            self.cut_partial();
        }
    }

    fn cut_partial(&mut self) {
        if self.partial.len() > self.max_bytes {
            let cut = self.partial.len() - self.max_bytes;
            self.partial.drain(..cut);
        }
    }

    /// The kept tail. A last line without newline counts as a line.
    pub fn finish(mut self) -> Vec<u8> {
        self.cut_partial();
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.bytes += line.len();
            self.done.push_back(line);
            self.trim();
        }
        self.done.into_iter().flatten().collect()
    }
}

/// State of the CLI event stream: the child, its stdout lines and its drained stderr.
struct Watch {
    child: Child,
    lines: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    finished: bool,
}

impl Watch {
    /// The next decodable event; undecodable or over-long lines are logged and skipped, events
    /// whose VM has neither id nor name are dropped. At end of output the child is reaped and
    /// a non-zero exit becomes a final error item.
    async fn next_event(&mut self) -> Option<Result<VmEvent>> {
        if self.finished {
            return None;
        }
        loop {
            match next_line(&mut self.lines, MAX_EVENT_LINE).await {
                Ok(Some(Line::Text(bytes))) => {
                    let text = String::from_utf8_lossy(&bytes);
                    match parse_event_line(&text) {
                        None => continue,
                        Some(Ok(ev)) if ev.vm.id.is_empty() && ev.vm.config.name.is_empty() => {
                            tracing::debug!("event without VM id or name dropped");
                        }
                        Some(Ok(ev)) => return Some(Ok(ev)),
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "undecodable VM event line skipped");
                        }
                    }
                }
                Ok(Some(Line::TooLong)) => {
                    tracing::warn!(max = MAX_EVENT_LINE, "over-long VM event line skipped");
                }
                Ok(None) => return self.finish().await,
                Err(e) => {
                    self.finished = true;
                    return Some(Err(RuntimeError::Other(format!(
                        "cocoon vm status: read events: {e}"
                    ))));
                }
            }
        }
    }

    async fn finish(&mut self) -> Option<Result<VmEvent>> {
        self.finished = true;
        let status = match self.child.wait().await {
            Ok(s) => s,
            Err(e) => {
                return Some(Err(RuntimeError::Other(format!(
                    "cocoon vm status: wait: {e}"
                ))));
            }
        };
        let stderr = match self.stderr.take() {
            Some(h) => h.await.unwrap_or_default(),
            None => Vec::new(),
        };
        (!status.success()).then(|| {
            Err(classify(format!(
                "cocoon vm status: {} (stderr: {})",
                exit_text(&status),
                trimmed(&stderr)
            )))
        })
    }
}

#[async_trait]
impl Runtime for CliRuntime {
    fn backend_name(&self) -> &'static str {
        "cocoon"
    }

    async fn clone_vm(&self, req: CloneRequest) -> Result<VmRecord> {
        let built = args::clone_args(&req, &self.caps)?;
        for w in &built.warnings {
            tracing::warn!(vm = %req.to, "{w}");
        }
        let target = if req.to.is_empty() {
            req.from.label()
        } else {
            req.to.clone()
        };
        let label = format!("cocoon vm clone {target}");
        let out = self.run_stdout(&label, &built.argv).await?;
        let vm = parse::parse_vm(&label, &out)?;
        if vm.id.is_empty() {
            return Err(RuntimeError::Other(format!(
                "cocoon vm clone {}: empty VM record in JSON payload",
                req.to
            )));
        }
        Ok(vm)
    }

    async fn run(&self, req: RunRequest) -> Result<VmRecord> {
        let built = args::run_args(&req, &self.caps)?;
        for w in &built.warnings {
            tracing::warn!(vm = %req.name, "{w}");
        }
        let label = format!("cocoon vm run {}", req.name);
        let out = self.run_stdout(&label, &built.argv).await?;
        let vm = parse::parse_vm(&label, &out)?;
        if vm.id.is_empty() {
            return Err(RuntimeError::Other(format!(
                "{label}: empty VM record in JSON payload"
            )));
        }
        // `vm run` may print the record before the hypervisor reports running; one inspect
        // gives the caller the settled state and PID.
        if !vm.is_running() || vm.pid == 0 {
            return self.inspect(&vm.id).await;
        }
        Ok(vm)
    }

    async fn inspect(&self, vm: &str) -> Result<VmRecord> {
        let label = format!("cocoon vm inspect {vm}");
        let out = self.run_stdout(&label, &args::inspect_args(vm)?).await?;
        parse::parse_vm(&label, &out)
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        let label = "cocoon vm list";
        let out = self.run_stdout(label, &args::list_args()).await?;
        parse::parse_vm_list(label, &out)
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.run_combined(&format!("cocoon vm rm {id}"), &args::remove_args(id)?)
            .await
            .map(drop)
    }

    async fn stop(&self, id: &str, timeout: std::time::Duration) -> Result<()> {
        let label = format!("cocoon vm stop {id}");
        if !self.caps.stop {
            return Err(no_verb(&label, "stop"));
        }
        let argv = args::stop_args(id, timeout.as_secs())?;
        self.run_combined(&label, &argv).await.map(drop)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.run_stdout(&format!("cocoon vm start {id}"), &args::start_args(id)?)
            .await
            .map(drop)
    }

    async fn exec(&self, req: ExecRequest) -> Result<()> {
        let ExecRequest {
            id,
            argv,
            env,
            stdin,
            stdout,
            stderr,
        } = req;
        let label = format!("cocoon vm exec {id}");
        if !self.caps.exec {
            return Err(no_verb(&label, "exec"));
        }
        if stdin.is_some() && !self.caps.exec_stdin {
            return Err(no_flag(
                &label,
                "exec",
                "-i",
                "stdin cannot reach the guest",
            ));
        }
        let argv = args::exec_args(&id, &argv, &env, stdin.is_some())?;
        let mut cmd = self.command(&argv);
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = self.spawn(&label, cmd)?;
        let child_in = child.stdin.take();
        let child_out = child.stdout.take();
        let child_err = child.stderr.take();

        let feed = async move {
            if let (Some(mut from), Some(mut to)) = (stdin, child_in) {
                // The guest may exit without reading all of stdin: a broken pipe is expected.
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            }
        };
        let main = async {
            let (out, err) = tokio::join!(
                pump(child_out, stdout, EXEC_PEEK),
                pump(child_err, stderr, EXEC_PEEK)
            );
            let status = child.wait().await;
            (out, err, status)
        };
        // Feeding stdin must not keep us waiting after the guest command has exited.
        tokio::pin!(feed);
        tokio::pin!(main);
        let mut fed = false;
        let (out, err, status) = loop {
            tokio::select! {
                () = &mut feed, if !fed => fed = true,
                r = &mut main => break r,
            }
        };
        let status = status.map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
        let copy_err =
            |e: std::io::Error| RuntimeError::Other(format!("{label}: copy output: {e}"));
        let (out, err) = (out.map_err(copy_err)?, err.map_err(copy_err)?);
        if !self.detected
            && let Some(e) = exec_cli_refusal(&label, status.code(), &out, &err)
        {
            return Err(e);
        }
        if let Some(e) = exec_cli_failure(&label, status.code(), &err) {
            return Err(e);
        }
        match status.code() {
            Some(0) => Ok(()),
            Some(code) => Err(RuntimeError::exit(&id, code)),
            None => Err(RuntimeError::Other(format!(
                "{label}: {}",
                exit_text(&status)
            ))),
        }
    }

    async fn logs_capped(&self, id: &str, tail: Option<u64>, max_bytes: usize) -> Result<Vec<u8>> {
        let label = format!("cocoon vm logs {id}");
        if !self.caps.logs {
            return Err(no_verb(&label, "logs"));
        }
        // The output always streams through a bounded keeper: `--tail` bounds lines, not
        // bytes, and a guest decides how long its lines are.
        let argv = args::logs_args(id, tail.filter(|_| self.caps.logs_tail))?;
        let lines = tail.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        self.logs_tailed_here(&label, &argv, lines, max_bytes).await
    }

    async fn net_resize(&self, id: &str, nics: u32) -> Result<()> {
        let label = format!("cocoon vm net {id}");
        if !self.caps.net {
            return Err(no_verb(&label, "net"));
        }
        if !self.caps.net_nics {
            return Err(no_flag(
                &label,
                "net",
                "--nics",
                "the NIC count cannot be changed",
            ));
        }
        self.run_stdout(&label, &args::net_resize_args(id, nics)?)
            .await
            .map(drop)
    }

    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()> {
        save_healing(self, name, vm_id, self.cfg.save_retry).await
    }

    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()> {
        match self.raw_rm(name).await {
            Err(RuntimeError::SnapshotNotFound(_)) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord> {
        let label = format!("cocoon snapshot inspect {name}");
        let out = self
            .run_stdout(&label, &args::snapshot_inspect_args(name)?)
            .await?;
        parse::parse_snapshot(&label, &out)
    }

    async fn snapshot_list(&self) -> Result<Vec<SnapshotRecord>> {
        let label = "cocoon snapshot list";
        let out = self.run_stdout(label, &args::snapshot_list_args()).await?;
        parse::parse_snapshot_list(label, &out)
    }

    async fn snapshot_import(&self, name: &str) -> Result<ImportHandle> {
        let argv = args::snapshot_import_args(name)?;
        self.snapshot_remove_if_exists(name).await?;
        self.spawn_import(format!("cocoon snapshot import {name}"), &argv)
    }

    async fn snapshot_export(&self, name: &str) -> Result<ExportHandle> {
        let label = format!("cocoon snapshot export {name}");
        let mut child = self.spawn(&label, self.command(&args::snapshot_export_args(name)?))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RuntimeError::Other(format!("{label}: no stdout pipe")))?;
        let err = drain(child.stderr.take());
        let done = async move {
            let status = child
                .wait()
                .await
                .map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
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
        Ok(ExportHandle {
            stream: Box::pin(stdout),
            done: Box::pin(done),
        })
    }

    async fn ensure_image(&self, image: &str, force: bool) -> Result<()> {
        self.run_combined(
            &format!("cocoon image pull {image}"),
            &args::image_pull_args(image, force)?,
        )
        .await
        .map(drop)
    }

    async fn image_present(&self, name_or_digest: &str) -> Result<()> {
        let label = format!("cocoon image inspect {name_or_digest}");
        let output = self
            .run_combined(&label, &args::image_inspect_args(name_or_digest)?)
            .await?;
        // Some releases print the miss and still exit 0.
        match classify(output) {
            e @ RuntimeError::ImageNotFound(_) => {
                Err(RuntimeError::ImageNotFound(format!("{label}: {e}")))
            }
            _ => Ok(()),
        }
    }

    async fn image_import(&self, name: &str) -> Result<ImportHandle> {
        self.spawn_import(
            format!("cocoon image import {name}"),
            &args::image_import_args(name)?,
        )
    }

    async fn watch_events(&self) -> Result<EventStream> {
        let label = "cocoon vm status";
        let mut child = self.spawn(label, self.command(&args::watch_args()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RuntimeError::Other(format!("{label}: no stdout pipe")))?;
        let stderr = Some(drain(child.stderr.take()));
        let watch = Watch {
            child,
            lines: BufReader::new(stdout),
            stderr,
            finished: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            watch,
            |mut w| async move { w.next_event().await.map(|item| (item, w)) },
        )))
    }

    async fn reconcile_stale_create(&self, id: &str) -> Result<StaleCreateOutcome> {
        if !self.caps.reconcile_stale_create {
            return Err(RuntimeError::Unsupported(format!(
                "cocoon vm reconcile-stale-create {id}: not supported by the installed cocoon"
            )));
        }
        let label = format!("cocoon vm reconcile-stale-create {id}");
        let out = self
            .run_stdout(&label, &args::reconcile_stale_create_args(id)?)
            .await?;
        parse::parse_stale_create(&label, &out)
    }

    async fn vm_stats(&self, vm: &VmRecord) -> Result<VmStats> {
        let vm = vm.clone();
        let (proc_root, sys) = (self.cfg.proc_root.clone(), self.cfg.sys_net_root.clone());
        tokio::task::spawn_blocking(move || stats::read_stats(&vm, &proc_root, &sys))
            .await
            .map_err(|e| RuntimeError::Other(format!("stats task: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_skipped_when_too_long() {
        let input = b"first\nxxxxxxxxxxxxxxxxxxxx\n\nlast-no-newline".to_vec();
        let mut r = tokio::io::BufReader::with_capacity(4, input.as_slice());
        let mut got = Vec::new();
        while let Some(l) = next_line(&mut r, 16).await.expect("read") {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                Line::Text(b"first".to_vec()),
                Line::TooLong,
                Line::Text(Vec::new()),
                Line::Text(b"last-no-newline".to_vec()),
            ]
        );
    }

    #[test]
    fn tail_keeper_keeps_the_last_lines_within_the_byte_bound() {
        // chunks, lines, max bytes, the kept tail.
        type Case = (&'static [&'static [u8]], usize, usize, &'static [u8]);
        let cases: &[Case] = &[
            (&[b"a\nb\nc\n"], 2, 100, b"b\nc\n"),
            // Chunks split lines anywhere.
            (
                &[b"on", b"e\ntw", b"o\nthr", b"ee\n"],
                2,
                100,
                b"two\nthree\n",
            ),
            // A last line without newline is a line.
            (&[b"a\nb\nc"], 2, 100, b"b\nc"),
            (&[b"a\n"], 5, 100, b"a\n"),
            (&[b""], 5, 100, b""),
            (&[b"a\nb\n"], 0, 100, b""),
            // The byte bound drops older lines first ...
            (&[b"aaaa\nbbbb\ncccc\n"], 10, 10, b"bbbb\ncccc\n"),
            // ... then the start of a line longer than the bound.
            (&[b"x\n0123456789abcdef"], 10, 8, b"89abcdef"),
            (
                &[b"0123456789", b"abcdefghij", b"klmnopqrst"],
                10,
                8,
                b"mnopqrst",
            ),
            // A cut line that then ends is kept (its end), later lines after it.
            (&[b"0123456789abcdefghij\n", b"z\n"], 10, 8, b"z\n"),
            (&[b"0123456789abcdefghij\n"], 10, 8, b"defghij\n"),
        ];
        for (chunks, lines, max, want) in cases {
            let mut k = TailKeeper::new(*lines, *max);
            for c in *chunks {
                k.push(c);
            }
            assert_eq!(
                String::from_utf8_lossy(&k.finish()),
                String::from_utf8_lossy(want),
                "{chunks:?} lines={lines} max={max}"
            );
        }
    }

    #[test]
    fn exit_texts_are_go_style() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_text(&ExitStatus::from_raw(1 << 8)), "exit status 1");
        assert_eq!(exit_text(&ExitStatus::from_raw(9)), "signal: 9");
    }
}
