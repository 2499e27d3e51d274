//! `cocoon-operator --version` names the workspace version and the git revision the binary was
//! built from.

use std::process::Command;

#[test]
fn version_flag_names_version_and_revision() {
    let git = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    assert!(git.status.success(), "the tests run inside a git checkout");
    let rev = String::from_utf8(git.stdout).unwrap().trim().to_string();

    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-operator"))
        .arg("--version")
        .output()
        .expect("run cocoon-operator");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "cocoon-operator {} (git {rev})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}
