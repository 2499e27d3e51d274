//! End-to-end scenarios live in tests/: the operator, real node agents and the plugin together,
//! and the shipping tests. This library holds the few helpers they share: the workspace's root,
//! version and git revision, the workspace's built binaries, running a command to completion
//! with its output in the failure message, and helm.

use std::path::{Path, PathBuf};
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

/// The workspace binary `name` of the build this test belongs to: `target/<profile>/<name>`,
/// next to the `deps/` directory holding the test executable. A test of another package cannot
/// have cargo build it (`CARGO_BIN_EXE_<name>` exists only in the binary's own package), so it
/// must be built first, as `scripts/test.sh` does with `cargo build --workspace --all-targets`;
/// panics with that advice when it is missing.
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable is in target/<profile>/deps");
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is not built: run `cargo build --workspace --bins` (scripts/test.sh builds every \
         target before it tests)",
        bin.display()
    );
    bin
}

/// The plugin binary, `kubectl-cocoon` ([`built_binary`]).
pub fn kubectl_cocoon() -> PathBuf {
    built_binary("kubectl-cocoon")
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

/// The helm binary: `COCOON_HELM` when set (it must be executable), else the one
/// scripts/helm.sh builds into the cache (once) and prints.
pub fn helm_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("COCOON_HELM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "COCOON_HELM={} is not a file (unset it to use scripts/helm.sh)",
            path.display()
        );
        return path;
    }
    let script = workspace_root().join("scripts/helm.sh");
    let out = Command::new(&script).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} to find helm ({e}); set COCOON_HELM to a helm v3 binary",
            script.display()
        )
    });
    assert!(
        out.status.success(),
        "{} could not provide helm (set COCOON_HELM to a helm v3 binary):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(stdout(&out).trim());
    assert!(
        path.is_file(),
        "helm.sh printed {}, which is not a file",
        path.display()
    );
    path
}

/// `helm` with its config, cache and data inside `home` (nothing outside it is touched).
pub fn helm(home: &Path) -> Command {
    let mut cmd = Command::new(helm_bin());
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    cmd
}
