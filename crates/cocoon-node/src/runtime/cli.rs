//! The real backend: runs `VK_COCOON_BIN` directly (no sudo) with the exact argv of §3.2,
//! parses its JSON, classifies its errors by phrase and streams snapshots through its pipes.
//!
//! Every child is started with `kill_on_drop`, so dropping a call (or a stream's completion)
//! kills the `cocoon` process, which is how cancellation reaches it.
//!
//! Capability detection (§3.1): [`CliRuntime::detect`] runs `cocoon vm clone --help` and
//! `cocoon vm --help` once and looks for `--restore-mode`, the three `--cpu-*` flags,
//! `--from-dir` and the `reconcile-stale-create` verb. Missing restore-mode / CPU-policy flags
//! are omitted with a warning; a request that needs `--from-dir` (or the stale-create verb)
//! fails with [`RuntimeError::Unsupported`]. If the help cannot be run at all, no optional
//! feature is assumed.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use async_trait::async_trait;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;

use super::Runtime;
use super::args::{self, Capabilities};
use super::error::{Result, RuntimeError, classify};
use super::events::{EventStream, VmEvent, parse_event_line};
use super::heal::{RawSnapshotVerbs, RetryPolicy, save_healing};
use super::io::{ExportHandle, ImportHandle};
use super::parse;
use super::stats;
use super::types::{
    ByteWriter, CloneRequest, ExecRequest, RunRequest, SnapshotRecord, StaleCreateOutcome,
    VmRecord, VmStats,
};

/// Longest event line accepted (§5 reader rules); longer lines are skipped.
pub const MAX_EVENT_LINE: usize = 1 << 20;

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

fn trimmed(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
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
        CliRuntime { cfg, caps }
    }

    /// A backend whose capabilities are detected from the installed CLI's help texts.
    pub async fn detect(cfg: CliConfig) -> Self {
        let mut rt = CliRuntime {
            cfg,
            caps: Capabilities::NONE,
        };
        let clone_help = rt.help_text(&args::clone_help_args()).await;
        let vm_help = rt.help_text(&args::vm_help_args()).await;
        match (clone_help, vm_help) {
            (Some(c), Some(v)) => rt.caps = Capabilities::from_help(&c, &v),
            _ => tracing::warn!(
                bin = %rt.cfg.bin.display(),
                "cannot read cocoon help; assuming no restore-mode, CPU-policy or from-dir support"
            ),
        }
        tracing::info!(caps = ?rt.caps, "cocoon capabilities");
        rt
    }

    /// The capabilities in force.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn command(&self, argv: &[String]) -> Command {
        let mut c = Command::new(&self.cfg.bin);
        c.args(argv)
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
        Ok(output)
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
        let done = async move {
            let status = child
                .wait()
                .await
                .map_err(|e| RuntimeError::Other(format!("{label}: wait: {e}")))?;
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
        })
    }
}

#[async_trait]
impl RawSnapshotVerbs for CliRuntime {
    async fn raw_save(&self, name: &str, vm_id: &str) -> Result<()> {
        let label = format!("cocoon snapshot save {name}");
        self.run_combined(&label, &args::snapshot_save_args(name, vm_id))
            .await
            .map(drop)
    }

    async fn raw_rm(&self, name: &str) -> Result<()> {
        let label = format!("cocoon snapshot rm {name}");
        self.run_combined(&label, &args::snapshot_rm_args(name))
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

/// Copies a child pipe into the caller's writer (or discards it).
async fn pump(
    pipe: Option<impl AsyncRead + Unpin>,
    sink: Option<ByteWriter>,
) -> std::io::Result<()> {
    let Some(mut pipe) = pipe else {
        return Ok(());
    };
    match sink {
        Some(mut w) => {
            tokio::io::copy(&mut pipe, &mut w).await?;
            w.flush().await
        }
        None => tokio::io::copy(&mut pipe, &mut tokio::io::sink())
            .await
            .map(drop),
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
        let out = self.run_stdout(&label, &args::inspect_args(vm)).await?;
        parse::parse_vm(&label, &out)
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        let label = "cocoon vm list";
        let out = self.run_stdout(label, &args::list_args()).await?;
        parse::parse_vm_list(label, &out)
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.run_combined(&format!("cocoon vm rm {id}"), &args::remove_args(id))
            .await
            .map(drop)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.run_stdout(&format!("cocoon vm start {id}"), &args::start_args(id))
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
        let argv = args::exec_args(&id, &argv, &env, stdin.is_some())?;
        let label = format!("cocoon vm exec {id}");
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
            let (out, err) = tokio::join!(pump(child_out, stdout), pump(child_err, stderr));
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
        out.and(err)
            .map_err(|e| RuntimeError::Other(format!("{label}: copy output: {e}")))?;
        match status.code() {
            Some(0) => Ok(()),
            Some(code) => Err(RuntimeError::exit(&id, code)),
            None => Err(RuntimeError::Other(format!(
                "{label}: {}",
                exit_text(&status)
            ))),
        }
    }

    async fn logs(&self, id: &str, tail: Option<u64>) -> Result<Vec<u8>> {
        self.run_stdout(&format!("cocoon vm logs {id}"), &args::logs_args(id, tail))
            .await
    }

    async fn net_resize(&self, id: &str, nics: u32) -> Result<()> {
        self.run_stdout(
            &format!("cocoon vm net {id}"),
            &args::net_resize_args(id, nics),
        )
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
            .run_stdout(&label, &args::snapshot_inspect_args(name))
            .await?;
        parse::parse_snapshot(&label, &out)
    }

    async fn snapshot_list(&self) -> Result<Vec<SnapshotRecord>> {
        let label = "cocoon snapshot list";
        let out = self.run_stdout(label, &args::snapshot_list_args()).await?;
        parse::parse_snapshot_list(label, &out)
    }

    async fn snapshot_import(&self, name: &str) -> Result<ImportHandle> {
        self.snapshot_remove_if_exists(name).await?;
        self.spawn_import(
            format!("cocoon snapshot import {name}"),
            &args::snapshot_import_args(name),
        )
    }

    async fn snapshot_export(&self, name: &str) -> Result<ExportHandle> {
        let label = format!("cocoon snapshot export {name}");
        let mut child = self.spawn(&label, self.command(&args::snapshot_export_args(name)))?;
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
            &args::image_pull_args(image, force),
        )
        .await
        .map(drop)
    }

    async fn image_present(&self, name_or_digest: &str) -> Result<()> {
        let label = format!("cocoon image inspect {name_or_digest}");
        let output = self
            .run_combined(&label, &args::image_inspect_args(name_or_digest))
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
            &args::image_import_args(name),
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
            .run_stdout(&label, &args::reconcile_stale_create_args(id))
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
    fn exit_texts_are_go_style() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_text(&ExitStatus::from_raw(1 << 8)), "exit status 1");
        assert_eq!(exit_text(&ExitStatus::from_raw(9)), "signal: 9");
    }
}
