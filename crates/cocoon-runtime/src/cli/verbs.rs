//! The [`Runtime`] verbs of the CLI backend: each builds its §3.2 argv, runs it and parses
//! the answer.

use std::process::Stdio;

use async_trait::async_trait;
use tokio::io::{AsyncWriteExt, BufReader};

use super::super::Runtime;
use super::super::args;
use super::super::error::{Result, RuntimeError, classify};
use super::super::events::EventStream;
use super::super::heal::{RawSnapshotVerbs, save_healing};
use super::super::io::{ExportHandle, ImportHandle};
use super::super::parse;
use super::super::stats;
use super::super::types::{
    CloneRequest, ExecRequest, RunRequest, SnapshotRecord, StaleCreateOutcome, VmRecord, VmStats,
};
use super::exec_out::{exec_cli_failure, exec_cli_refusal, pump};
use super::stream::Watch;
use super::{CliRuntime, EXEC_PEEK, drain, exit_text, no_flag, no_verb, trimmed};

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
