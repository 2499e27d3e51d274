//! The operator image (Containerfile, scripts/image.sh): built with podman, pushed to the real
//! test registry, pulled back and run read-only, as its non-root user, without a network.
//! `--version` names the workspace version and git revision, `crd` prints exactly
//! manifests/crds, and the image config carries the user, entrypoint and OCI labels.

use std::process::Command;

use cocoon_e2e::{git_revision, run_ok, stdout, workspace_root, workspace_version};

/// podman as measured on this host: runc (crun fails on hybrid cgroups), explicit rlimits.
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]);
    cmd
}

/// Runs the image from the registry (always pulled) read-only, without a network, with every
/// capability dropped, as the image's own user.
fn run_image(image: &str, args: &[&str]) -> String {
    let out = run_ok(
        podman()
            .args([
                "run",
                "--rm",
                "--pull=always",
                "--tls-verify=false",
                "--read-only",
                "--network=none",
                "--cap-drop=ALL",
                "--security-opt=no-new-privileges",
                "--ulimit=nofile=1024:1024",
                "--ulimit=nproc=1024:1024",
                image,
            ])
            .args(args),
    );
    stdout(&out)
}

#[tokio::test]
async fn operator_image_is_pushed_and_runs_read_only_as_non_root() {
    cocoon_testenv::run_test(|env| async move {
        let registry = env.registry_addr().to_string();
        tokio::task::spawn_blocking(move || check_image(&registry)).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

fn check_image(registry: &str) {
    let root = workspace_root();
    let version = workspace_version();
    let (rev, full_rev) = (git_revision(true), git_revision(false));
    let prefix = format!("{registry}/{}", cocoon_testenv::unique_name("image"));

    let out = run_ok(
        Command::new(root.join("scripts/image.sh"))
            .args(["--push", &prefix, "--insecure"])
            .current_dir(&root),
    );
    let pushed: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let tagged = format!("{prefix}/cocoon-operator-rs:v{version}");
    let exact = format!("{prefix}/cocoon-operator-rs:v{version}-{rev}");
    assert_eq!(pushed, [tagged.clone(), exact.clone()]);
    // Forget the local copies: every run below pulls what the registry holds.
    run_ok(podman().args(["rmi", &tagged, &exact]));

    assert_eq!(
        run_image(&exact, &["--version"]),
        format!("cocoon-operator {version} (git {rev})\n")
    );
    let mut expected = String::new();
    for (file, _) in cocoon_api::crd::render_files().expect("render the CRDs") {
        let committed = std::fs::read_to_string(root.join("manifests/crds").join(&file))
            .unwrap_or_else(|e| panic!("read manifests/crds/{file}: {e}"));
        expected.push_str("---\n");
        expected.push_str(&committed);
    }
    assert_eq!(
        run_image(&tagged, &["crd"]),
        expected,
        "`crd` in the image differs from manifests/crds"
    );

    // The image config as the registry serves it.
    let config: serde_json::Value =
        serde_json::from_str(&stdout(&run_ok(Command::new("skopeo").args([
            "inspect",
            "--config",
            "--tls-verify=false",
            &format!("docker://{exact}"),
        ]))))
        .expect("skopeo prints the config as JSON");
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532", "{config:#}");
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/cocoon-operator"]),
        "{config:#}"
    );
    assert_eq!(c["Cmd"], serde_json::json!(["run"]), "{config:#}");
    let labels = &c["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        format!("v{version}")
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        full_rev.as_str()
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        "https://github.com/cocoonstack/cocoon"
    );

    // Size: the layers as pushed (compressed), and the goal of staying under 30 MB.
    let manifest: serde_json::Value =
        serde_json::from_str(&stdout(&run_ok(Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{exact}"),
        ]))))
        .expect("skopeo prints the manifest as JSON");
    let layers: u64 = manifest["layers"]
        .as_array()
        .expect("manifest layers")
        .iter()
        .map(|l| l["size"].as_u64().expect("layer size"))
        .sum();
    eprintln!("operator image: {layers} bytes of compressed layers");
    assert!(layers < 30_000_000, "image layers are {layers} bytes");
}
