//! `kubectl cocoon --version` and `kubectl cocoon version --client` name the workspace version
//! and the git revision the binary was built from, without contacting a cluster.

use std::process::Command;

/// The revision the build script should have embedded: this checkout's short HEAD.
fn head_revision() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    assert!(out.status.success(), "the tests run inside a git checkout");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn plugin(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(args)
        .env("NO_COLOR", "1")
        // No cluster: `--client` must not need one.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("run kubectl-cocoon");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_flag_names_version_and_revision() {
    let rev = head_revision();
    let (code, out, _) = plugin(&["--version"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        format!("kubectl-cocoon {} (git {rev})\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn version_client_prints_version_and_revision_without_a_cluster() {
    let rev = head_revision();
    let (code, out, err) = plugin(&["version", "--client"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!(
            "Client Version: {}\nClient Revision: {rev}\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(err, "", "--client never reaches for the kubeconfig");

    let (code, out, err) = plugin(&["version", "--client", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        v,
        serde_json::json!({
            "client": env!("CARGO_PKG_VERSION"),
            "client_revision": rev,
            "operator": null,
        })
    );
}
