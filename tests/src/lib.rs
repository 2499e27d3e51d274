//! End-to-end scenarios live in tests/; this library holds the few helpers the shipping tests
//! (image, krew) share: the workspace's root, version and git revision, and running a command
//! to completion with its output in the failure message.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The workspace root (the directory holding `Cargo.toml`, `scripts/`, `manifests/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits inside the workspace")
        .to_path_buf()
}

/// The workspace version (`[workspace.package] version`, which every crate inherits).
pub fn workspace_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// `git rev-parse [--short] HEAD` of the checkout the tests run in.
pub fn git_revision(short: bool) -> String {
    let mut cmd = Command::new("git");
    cmd.arg("rev-parse");
    if short {
        cmd.arg("--short");
    }
    let out = run_ok(cmd.arg("HEAD").current_dir(workspace_root()));
    stdout(&out).trim().to_string()
}

/// Runs `cmd` to completion; panics naming the command, with its stdout and stderr, unless it
/// exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command's stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
