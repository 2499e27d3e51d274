//! Help text snapshots: what a new user reads first. `UPDATE_SNAPSHOTS=1 cargo test -p
//! kubectl-cocoon --test help` rewrites them after an intended change.

use std::path::PathBuf;

fn snapshot(name: &str, args: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    assert!(out.stderr.is_empty(), "help goes to stdout");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &out.stdout).expect("write snapshot");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(
        want == got,
        "help of {args:?} changed; review and run with UPDATE_SNAPSHOTS=1\n--- want\n{want}\n--- got\n{got}"
    );
}

#[test]
fn top_level_help() {
    snapshot("help.txt", &["--help"]);
}

#[test]
fn suspend_help() {
    snapshot("suspend-help.txt", &["suspend", "--help"]);
}

#[test]
fn migrate_help() {
    snapshot("migrate-help.txt", &["migrate", "--help"]);
}
