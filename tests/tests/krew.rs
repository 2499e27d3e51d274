//! The krew release (plugin/.krew.yaml, scripts/release.sh): the real krew installs the plugin
//! from the locally built archive with the rendered manifest (so the archive's sha256 and the
//! manifest agree, and krew accepts the manifest), and kubectl then runs `kubectl cocoon` from
//! KREW_ROOT/bin. The same run's node host archive (cocoon-node-<version>-linux-amd64.tar.gz)
//! holds exactly the static cocoon-operator, which runs, and the unit, env example and install
//! guide as committed.

use std::path::Path;
use std::process::Command;

use cocoon_e2e::{git_revision, run_ok, stdout, workspace_root, workspace_version};

#[tokio::test]
async fn krew_installs_the_release_archive_and_kubectl_runs_the_plugin() {
    cocoon_testenv::run_test(|env| async move {
        let kubectl = env.bin_dir().join("kubectl");
        let kubeconfig = env.kubeconfig_path().to_path_buf();
        tokio::task::spawn_blocking(move || check_krew(&kubectl, &kubeconfig)).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
}

fn check_krew(kubectl: &Path, kubeconfig: &Path) {
    let root = workspace_root();
    let version = workspace_version();
    let rev = git_revision(true);
    let work = tempfile::tempdir().expect("temp dir");
    let dist = work.path().join("dist");
    let krew_root = work.path().join("krew");

    let out = run_ok(
        Command::new(root.join("scripts/release.sh"))
            .arg("--out")
            .arg(&dist)
            .current_dir(&root),
    );
    let manifest = stdout(&out).trim().to_string();
    assert_eq!(Path::new(&manifest), dist.join("cocoon.yaml"));
    let archive = dist.join("kubectl-cocoon-linux-amd64.tar.gz");
    check_host_archive(&dist, version, &rev);
    let krew = stdout(&run_ok(&mut Command::new(root.join("scripts/krew.sh"))))
        .trim()
        .to_string();

    // HOME and KREW_ROOT inside the temp dir: nothing outside it is touched.
    let home = work.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let path = format!(
        "{}:{}",
        krew_root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let krew_env = |cmd: &mut Command| {
        cmd.env("HOME", &home)
            .env("KREW_ROOT", &krew_root)
            .env("KREW_NO_UPGRADE_CHECK", "1")
            .env("PATH", &path)
            .env("NO_COLOR", "1");
    };
    let mut install = Command::new(&krew);
    install
        .arg("install")
        .arg(format!("--manifest={manifest}"))
        .arg(format!("--archive={}", archive.display()));
    krew_env(&mut install);
    run_ok(&mut install);

    // krew unpacked the shim, the completions and the licence next to the plugin.
    let store = krew_root.join(format!("store/cocoon/v{version}"));
    for file in [
        "kubectl-cocoon",
        "kubectl_complete-cocoon",
        "LICENSE",
        "completions/kubectl-cocoon.bash",
        "completions/_kubectl-cocoon",
        "completions/kubectl-cocoon.fish",
        "completions/kubectl-cocoon.ps1",
    ] {
        assert!(
            store.join(file).is_file(),
            "{file} missing from {}",
            store.display()
        );
    }

    // krew recorded the install (`krew list` needs the index, which is a git clone of the
    // network), and kubectl finds the plugin it linked into KREW_ROOT/bin.
    assert!(krew_root.join("receipts/cocoon.yaml").is_file());
    let mut list = Command::new(kubectl);
    list.args(["plugin", "list", "--name-only"]);
    krew_env(&mut list);
    let plugins = stdout(&run_ok(&mut list));
    assert!(plugins.lines().any(|l| l == "kubectl-cocoon"), "{plugins}");

    // Through kubectl: the plugin krew linked into KREW_ROOT/bin.
    let mut client = Command::new(kubectl);
    client.args(["cocoon", "version", "--client"]);
    krew_env(&mut client);
    assert_eq!(
        stdout(&run_ok(&mut client)),
        format!("Client Version: {version}\nClient Revision: {rev}\n")
    );
    // And against the test cluster: kubectl hands the plugin its environment (KUBECONFIG).
    let mut full = Command::new(kubectl);
    full.args(["cocoon", "version"]);
    krew_env(&mut full);
    full.env("KUBECONFIG", kubeconfig);
    let text = stdout(&run_ok(&mut full));
    assert!(
        text.starts_with(&format!(
            "Client Version: {version}\nClient Revision: {rev}\nOperator Version: "
        )),
        "{text}"
    );
}

/// The node host archive next to the plugin's: its checksum file, its exact entries, the binary
/// (`--version` names this build) and the committed unit, env example, guide and licence.
fn check_host_archive(dist: &Path, version: &str, rev: &str) {
    let root = workspace_root();
    let dir = format!("cocoon-node-{version}-linux-amd64");
    let name = format!("{dir}.tar.gz");
    run_ok(
        Command::new("sha256sum")
            .args(["--check", "--strict", &format!("{name}.sha256")])
            .current_dir(dist),
    );
    let listing = stdout(&run_ok(
        Command::new("tar").arg("-tzf").arg(dist.join(&name)),
    ));
    let files = [
        "INSTALL.md",
        "LICENSE",
        "cocoon-node.service",
        "cocoon-operator",
        "node.env.example",
    ];
    let mut want = vec![format!("{dir}/")];
    want.extend(files.iter().map(|f| format!("{dir}/{f}")));
    assert_eq!(listing.lines().collect::<Vec<_>>(), want, "{name}");

    let unpacked = tempfile::tempdir().expect("temp dir");
    run_ok(
        Command::new("tar")
            .arg("-xzf")
            .arg(dist.join(&name))
            .arg("-C")
            .arg(unpacked.path()),
    );
    let host = unpacked.path().join(&dir);
    let bin = host.join("cocoon-operator");
    assert_eq!(
        stdout(&run_ok(Command::new(&bin).arg("--version"))),
        format!("cocoon-operator {version} (git {rev})\n")
    );
    let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
    let said = format!("{}{}", stdout(&ldd), String::from_utf8_lossy(&ldd.stderr));
    assert!(
        said.contains("not a dynamic executable") || said.contains("statically linked"),
        "{said}"
    );
    for (file, committed) in [
        ("cocoon-node.service", "manifests/node/cocoon-node.service"),
        ("node.env.example", "manifests/node/node.env.example"),
        ("INSTALL.md", "manifests/node/INSTALL.md"),
        ("LICENSE", "LICENSE"),
    ] {
        assert_eq!(
            std::fs::read(host.join(file)).expect(file),
            std::fs::read(root.join(committed)).expect(committed),
            "{file} in {name} differs from {committed}"
        );
    }
}
