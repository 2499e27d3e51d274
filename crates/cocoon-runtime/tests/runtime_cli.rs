//! The real `cocoon` CLI backend against a scripted stand-in executable (§7.12): every test
//! writes a small shell script that records its argv and stdin and answers with canned output,
//! then asserts the exact invocations and the error classification.
//!
//! Answers are files in `<dir>/r/`: `<n>.out|.err|.code` for the n-th call (1-based), falling
//! back to `<verb>_<subverb>.*` (e.g. `vm_clone.out`); `.hang` makes the script sleep forever.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cocoon_runtime::cli::{CliConfig, CliRuntime};
use cocoon_runtime::{
    Capabilities, CloneRequest, CloneSource, CpuPolicy, EventKind, ExecRequest, RetryPolicy,
    RunRequest, Runtime, RuntimeError, StaleCreateOutcome, exec_capture,
};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SCRIPT: &str = r#"#!/bin/sh
dir='@DIR@'
n=$(( $(cat "$dir/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$dir/count"
printf '%s\n' "$@" > "$dir/argv.$n"
echo $$ > "$dir/pid.$n"
printf '%s' "${NO_COLOR-unset}" > "$dir/nocolor.$n"
cat > "$dir/stdin.$n"
key="$1_$2"
for k in "$n" "$key"; do
  if [ -e "$dir/r/$k.out" ] || [ -e "$dir/r/$k.err" ] || [ -e "$dir/r/$k.code" ] || [ -e "$dir/r/$k.hang" ]; then
    # Like a real producer, a write to a closed pipe fails the command.
    if [ -e "$dir/r/$k.out" ]; then cat "$dir/r/$k.out" || exit 141; fi
    [ -e "$dir/r/$k.err" ] && cat "$dir/r/$k.err" >&2
    [ -e "$dir/r/$k.hang" ] && exec sleep 600
    exit "$(cat "$dir/r/$k.code" 2>/dev/null || echo 0)"
  fi
done
exit 0
"#;

/// A temp dir holding the stand-in `cocoon` and its answers and recordings.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("r")).expect("mkdir");
        let script = SCRIPT.replace("@DIR@", &dir.path().display().to_string());
        let src = dir.path().join("cocoon.src");
        std::fs::write(&src, script).expect("write script");
        // The executable is written by another process: a file this process held open for
        // writing could be inherited by a child forked concurrently by another test, and
        // exec'ing it would then fail with ETXTBSY ("Text file busy").
        let status = std::process::Command::new("install")
            .args(["-m", "0755"])
            .arg(&src)
            .arg(dir.path().join("cocoon"))
            .status()
            .expect("run install");
        assert!(status.success(), "install the stand-in");
        Fake { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn bin(&self) -> PathBuf {
        self.path().join("cocoon")
    }

    fn config(&self) -> CliConfig {
        let mut cfg = CliConfig::new(self.bin());
        cfg.save_retry = RetryPolicy {
            interval: Duration::from_millis(10),
            deadline: Duration::from_secs(5),
        };
        cfg
    }

    fn runtime(&self) -> CliRuntime {
        CliRuntime::with_capabilities(self.config(), Capabilities::ALL)
    }

    /// Sets the answer of `key` (a call number or `verb_subverb`).
    fn answer(&self, key: &str, out: &str, err: &str, code: i32) {
        let r = self.path().join("r");
        std::fs::write(r.join(format!("{key}.out")), out).expect("out");
        std::fs::write(r.join(format!("{key}.err")), err).expect("err");
        std::fs::write(r.join(format!("{key}.code")), code.to_string()).expect("code");
    }

    fn hang(&self, key: &str) {
        std::fs::write(self.path().join("r").join(format!("{key}.hang")), "").expect("hang");
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(self.path().join("count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn argv(&self, n: usize) -> Vec<String> {
        std::fs::read_to_string(self.path().join(format!("argv.{n}")))
            .expect("argv recorded")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn all_argv(&self) -> Vec<Vec<String>> {
        (1..=self.calls()).map(|n| self.argv(n)).collect()
    }

    fn stdin(&self, n: usize) -> Vec<u8> {
        std::fs::read(self.path().join(format!("stdin.{n}"))).expect("stdin recorded")
    }

    fn pid(&self, n: usize) -> Option<i32> {
        std::fs::read_to_string(self.path().join(format!("pid.{n}")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

fn v(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// True once the process is gone or a zombie.
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
    }
}

async fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    while tokio::time::Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

const VM_JSON: &str = r#"{"id":"0123456789abcdef","hypervisor":"cloud-hypervisor","state":"running","config":{"cpu":2,"memory":1073741824,"name":"vm-a","image":"ubuntu"},"pid":4242,"network_configs":[{"tap":"tap0","mac":"02:00:00:00:00:01","network":null}]}"#;

#[tokio::test]
async fn capability_detection_reads_help_and_gates_optional_flags() {
    let fake = Fake::new();
    // Call 1: `vm clone --help`; call 2: `vm --help`. An old cocoon knows none of the flags.
    fake.answer(
        "1",
        "Usage: cocoon vm clone [flags] SNAPSHOT\n  --name string\n  --pull\n",
        "",
        0,
    );
    fake.answer("2", "Commands:\n  clone\n  run\n", "", 0);
    let rt = CliRuntime::detect(fake.config()).await;
    assert_eq!(rt.capabilities(), Capabilities::NONE);
    assert_eq!(fake.argv(1), v(&["vm", "clone", "--help"]));
    assert_eq!(fake.argv(2), v(&["vm", "--help"]));

    // Restore mode and CPU policy are dropped (with a warning); the call still happens.
    fake.answer("vm_clone", VM_JSON, "", 0);
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-a");
    req.restore_mode = "ondemand".into();
    req.cpu_policy = CpuPolicy {
        weight: 20,
        quota_us: 200_000,
        period_us: 100_000,
    };
    rt.clone_vm(req.clone()).await.expect("clone");
    assert_eq!(
        fake.argv(3),
        v(&[
            "vm", "clone", "--output", "json", "--name", "vm-a", "--", "snap-a"
        ])
    );

    // Clone-from-dir needs the feature: refused before anything runs.
    req.from = CloneSource::Dir("/var/lib/cocoon/snaps/foo".into());
    let err = rt.clone_vm(req).await.expect_err("unsupported");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(fake.calls(), 3);
    let err = rt
        .reconcile_stale_create("x")
        .await
        .expect_err("unsupported");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(fake.calls(), 3);

    // The old cocoon has no exec, logs or net: refused before anything runs.
    let err = rt
        .exec(ExecRequest::new("id1", ["true"]))
        .await
        .expect_err("no exec");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("the installed cocoon CLI has no vm exec"),
        "{err}"
    );
    let err = rt.logs("id1", Some(10)).await.expect_err("no logs");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    let err = rt.net_resize("id1", 0).await.expect_err("no net");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(fake.calls(), 3);

    // A new cocoon lists everything; each listed verb's own help is read.
    let fake = Fake::new();
    fake.answer(
        "1",
        "  --restore-mode string\n  --on-demand\n  --cpu-weight int\n  --cpu-quota-us int\n  --cpu-period-us int\n  --from-dir string\n",
        "",
        0,
    );
    fake.answer(
        "2",
        "Available Commands:\n  exec  run a command\n  logs  console log\n  net  resize NICs\n  reconcile-stale-create  collect a stale record\n  stop  Stop running VM(s)\n",
        "",
        0,
    );
    fake.answer(
        "3",
        "Flags:\n  -e, --env stringArray\n  -i, --interactive\n",
        "",
        0,
    );
    fake.answer("4", "Flags:\n      --tail int\n", "", 0);
    fake.answer("5", "Flags:\n      --nics int\n", "", 0);
    assert_eq!(
        CliRuntime::detect(fake.config()).await.capabilities(),
        Capabilities::ALL
    );
    assert_eq!(
        fake.all_argv()[2..],
        [
            v(&["vm", "exec", "--help"]),
            v(&["vm", "logs", "--help"]),
            v(&["vm", "net", "--help"]),
        ]
    );

    // No binary at all: no optional feature assumed, the §3.2 verbs are.
    let cfg = CliConfig::new("/nonexistent/cocoon");
    assert_eq!(
        CliRuntime::detect(cfg).await.capabilities(),
        Capabilities::UNDETECTED
    );
}

#[tokio::test]
async fn clone_builds_the_exact_argv_and_parses_the_record() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("vm_clone", VM_JSON, "", 0);
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-a");
    req.network = "cocoon-dhcp".into();
    req.pull = true;
    req.restore_mode = "mmap".into();
    req.nics = Some(1);
    req.cpu_policy = CpuPolicy {
        weight: 20,
        quota_us: 200_000,
        period_us: 100_000,
    };
    let vm = rt.clone_vm(req).await.expect("clone");
    assert_eq!(vm.id, "0123456789abcdef");
    assert_eq!(vm.name(), "vm-a");
    assert_eq!(vm.mac(), "02:00:00:00:00:01");
    assert_eq!(
        fake.argv(1),
        v(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-a",
            "--network",
            "cocoon-dhcp",
            "--pull",
            "--restore-mode",
            "mmap",
            "--nics",
            "1",
            "--cpu-weight",
            "20",
            "--cpu-quota-us",
            "200000",
            "--cpu-period-us",
            "100000",
            "--",
            "snap-a"
        ])
    );

    let mut req = CloneRequest::from_snapshot("unused", "vm-f");
    req.from = CloneSource::Dir("/var/lib/cocoon/snaps/foo".into());
    rt.clone_vm(req).await.expect("clone from dir");
    assert_eq!(
        fake.argv(2),
        v(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-f",
            "--pull",
            "--from-dir",
            "/var/lib/cocoon/snaps/foo"
        ])
    );

    // An empty id is an error with the spec's wording.
    fake.answer("vm_clone", r#"{"id":"","state":"running"}"#, "", 0);
    let err = rt
        .clone_vm(CloneRequest::from_snapshot("s", "vm-z"))
        .await
        .expect_err("empty");
    assert_eq!(
        err.to_string(),
        "cocoon vm clone vm-z: empty VM record in JSON payload"
    );

    // A failure embeds the stderr and is classified.
    fake.answer("vm_clone", "", "Error: snapshot not found: s\n", 1);
    let err = rt
        .clone_vm(CloneRequest::from_snapshot("s", "vm-z"))
        .await
        .expect_err("fails");
    assert_eq!(
        err.to_string(),
        "cocoon vm clone vm-z: exit status 1 (stderr: Error: snapshot not found: s)"
    );
    assert!(err.is_snapshot_not_found());
}

#[tokio::test]
async fn run_converts_quantities_and_inspects_an_unsettled_record() {
    let fake = Fake::new();
    let rt = fake.runtime();
    // `vm run` prints a record that is not running yet: one extra inspect settles it.
    fake.answer(
        "vm_run",
        r#"{"id":"abc","state":"creating","pid":0}"#,
        "",
        0,
    );
    fake.answer("vm_inspect", VM_JSON, "", 0);
    let vm = rt
        .run(RunRequest {
            image: "ubuntu:24.04".into(),
            name: "vm-a".into(),
            cpu: 2,
            memory: "4Gi".into(),
            storage: "20Gi".into(),
            network: "cocoon-dhcp".into(),
            os: "WINDOWS".into(),
            ..RunRequest::default()
        })
        .await
        .expect("run");
    assert!(vm.is_running());
    assert_eq!(vm.pid, 4242);
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&[
                "vm",
                "run",
                "--output",
                "json",
                "--name",
                "vm-a",
                "--cpu",
                "2",
                "--memory",
                "4294967296",
                "--storage",
                "21474836480",
                "--network",
                "cocoon-dhcp",
                "--windows",
                "--",
                "ubuntu:24.04"
            ]),
            v(&["vm", "inspect", "--", "abc"]),
        ]
    );

    // A settled record needs no inspect.
    fake.answer("vm_run", VM_JSON, "", 0);
    rt.run(RunRequest {
        image: "img".into(),
        ..RunRequest::default()
    })
    .await
    .expect("run");
    assert_eq!(fake.calls(), 3);
    assert_eq!(
        fake.argv(3),
        v(&["vm", "run", "--output", "json", "--", "img"])
    );
}

#[tokio::test]
async fn inspect_tells_vm_not_found_from_transient_errors() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("vm_inspect", "", "Error: VM not found: vm-x\n", 1);
    let err = rt.inspect("vm-x").await.expect_err("missing");
    assert!(err.is_vm_not_found(), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cocoon vm inspect vm-x: exit status 1 (stderr: Error: VM not found: vm-x)"
    );
    assert_eq!(fake.argv(1), v(&["vm", "inspect", "--", "vm-x"]));

    fake.answer(
        "vm_inspect",
        "",
        "dial unix /run/cocoon.sock: connection refused\n",
        1,
    );
    let err = rt.inspect("vm-x").await.expect_err("transient");
    assert!(matches!(err, RuntimeError::Other(_)), "{err:?}");

    // Undecodable output is an error, not a panic.
    fake.answer("vm_inspect", "{not json", "", 0);
    assert!(matches!(
        rt.inspect("vm-x").await,
        Err(RuntimeError::Other(_))
    ));

    // A missing binary is not "VM not found".
    let rt =
        CliRuntime::with_capabilities(CliConfig::new("/nonexistent/cocoon"), Capabilities::ALL);
    let err = rt.inspect("vm-x").await.expect_err("no binary");
    assert!(matches!(err, RuntimeError::Other(_)), "{err:?}");
}

#[tokio::test]
async fn list_handles_the_empty_texts_and_skips_empty_ids() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("vm_list", "No VMs found.\n", "", 0);
    assert!(rt.list().await.expect("list").is_empty());
    assert_eq!(fake.argv(1), v(&["vm", "list", "-o", "json"]));
    fake.answer("vm_list", &format!(r#"[{VM_JSON},{{"id":""}}]"#), "", 0);
    let vms = rt.list().await.expect("list");
    assert_eq!(vms.len(), 1);
    fake.answer("vm_list", "", "permission denied\n", 1);
    assert!(rt.list().await.is_err());
}

#[tokio::test]
async fn simple_verbs_use_their_exact_argv() {
    let fake = Fake::new();
    let rt = fake.runtime();
    rt.remove("id1").await.expect("rm");
    rt.start("id1").await.expect("start");
    fake.answer("vm_logs", "line1\nline2\n", "", 0);
    assert_eq!(
        rt.logs("id1", Some(20)).await.expect("logs"),
        b"line1\nline2\n"
    );
    rt.net_resize("id1", 0).await.expect("net");
    rt.ensure_image("ghcr.io/x/y:1", true).await.expect("pull");
    rt.image_present("sha256:abc").await.expect("present");
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&["vm", "rm", "--force", "--", "id1"]),
            v(&["vm", "start", "--", "id1"]),
            v(&["vm", "logs", "--tail", "20", "--", "id1"]),
            v(&["vm", "net", "--nics", "0", "--", "id1"]),
            v(&["image", "pull", "--force", "--", "ghcr.io/x/y:1"]),
            v(&["image", "inspect", "--", "sha256:abc"]),
        ]
    );

    // Combined-output commands report `(output: ...)`.
    fake.answer("vm_rm", "stopping\n", "Error: VM not found: id1\n", 1);
    let err = rt.remove("id1").await.expect_err("rm fails");
    assert!(err.is_vm_not_found());
    assert_eq!(
        err.to_string(),
        "cocoon vm rm id1: exit status 1 (output: stopping\nError: VM not found: id1)"
    );

    fake.answer(
        "image_inspect",
        "",
        "image ubuntu not found in any backend\n",
        1,
    );
    assert!(
        rt.image_present("ubuntu")
            .await
            .expect_err("missing")
            .is_image_not_found()
    );
    fake.answer("image_inspect", "", "config missing: not found\n", 1);
    let err = rt.image_present("ubuntu").await.expect_err("other");
    assert!(
        !err.is_image_not_found(),
        "a generic not found is not ImageNotFound"
    );
}

#[tokio::test]
async fn exec_passes_env_stdin_and_maps_exit_codes() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("vm_exec", "hello from guest\n", "a warning\n", 0);
    let mut req = ExecRequest::new("id1", ["sh", "-c", "cat > /x"]);
    req.env.insert("Z".into(), "1".into());
    req.env.insert("A".into(), "2".into());
    let out = cocoon_runtime::CaptureBuf::new();
    let err = cocoon_runtime::CaptureBuf::new();
    req.stdin = Some(Box::pin(std::io::Cursor::new(b"payload".to_vec())));
    req.stdout = Some(out.writer());
    req.stderr = Some(err.writer());
    rt.exec(req).await.expect("exec");
    assert_eq!(
        fake.argv(1),
        v(&[
            "vm", "exec", "-i", "-e", "A=2", "-e", "Z=1", "id1", "--", "sh", "-c", "cat > /x"
        ])
    );
    assert_eq!(fake.stdin(1), b"payload");
    assert_eq!(out.text(), "hello from guest\n");
    assert_eq!(err.text(), "a warning\n");

    fake.answer("vm_exec", "", "", 3);
    let res = exec_capture(&rt, "id1", &["false"], None).await;
    let e = res.result.expect_err("exit 3");
    assert_eq!(e.exit_code(), Some(3));
    assert_eq!(e.to_string(), "cocoon vm exec id1: exit 3");
    assert_eq!(fake.argv(2), v(&["vm", "exec", "id1", "--", "false"]));

    // Rejected before anything runs.
    assert!(rt.exec(ExecRequest::new("", ["ls"])).await.is_err());
    assert!(
        rt.exec(ExecRequest::new("id1", Vec::<String>::new()))
            .await
            .is_err()
    );
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn snapshot_save_heals_collisions_per_spec() {
    let fake = Fake::new();
    let rt = fake.runtime();
    // 1 save → taken (new wording with holder), 2–3 rm holder → locked, 4 rm ok, 5 save ok.
    fake.answer(
        "1",
        "",
        "Error: snapshot name \"vk-a\" already in use by 9f86d081\n",
        1,
    );
    fake.answer(
        "2",
        "",
        "snapshot 9f86d081 is in use by an active export\n",
        1,
    );
    fake.answer(
        "3",
        "",
        "snapshot 9f86d081 is in use by an active export\n",
        1,
    );
    fake.answer("4", "", "", 0);
    fake.answer("5", "", "", 0);
    rt.snapshot_save("vk-a", "vmid").await.expect("save heals");
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&["snapshot", "save", "--name", "vk-a", "--", "vmid"]),
            v(&["snapshot", "rm", "--", "9f86d081"]),
            v(&["snapshot", "rm", "--", "9f86d081"]),
            v(&["snapshot", "rm", "--", "9f86d081"]),
            v(&["snapshot", "save", "--name", "vk-a", "--", "vmid"]),
        ]
    );

    // Old wording: the holder is the name itself; any other rm error fails at once.
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("1", "", "snapshot name \"vk-a\" already exists\n", 1);
    fake.answer("2", "", "permission denied\n", 1);
    let err = rt
        .snapshot_save("vk-a", "vmid")
        .await
        .expect_err("rm fails");
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(fake.argv(2), v(&["snapshot", "rm", "--", "vk-a"]));
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn snapshot_rm_inspect_and_list() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer("snapshot_rm", "", "Error: No such snapshot: vk-a\n", 1);
    rt.snapshot_remove_if_exists("vk-a")
        .await
        .expect("not found is fine");
    fake.answer(
        "snapshot_rm",
        "",
        "snapshot \"vk-a\" is in use by an active clone\n",
        1,
    );
    let err = rt
        .snapshot_remove_if_exists("vk-a")
        .await
        .expect_err("locked");
    assert!(matches!(err, RuntimeError::InUse(_)), "{err:?}");

    fake.answer("snapshot_inspect", "", "snapshot not found: vk-b\n", 1);
    assert!(
        rt.snapshot_inspect("vk-b")
            .await
            .expect_err("missing")
            .is_snapshot_not_found()
    );
    fake.answer(
        "snapshot_inspect",
        "{\n  \"id\": \"sid\",\n  \"name\": \"vk-b\",\n  \"hypervisor\": \"firecracker\",\n  \"image_blob_ids\": {\"ab\": {}}\n}\n",
        "",
        0,
    );
    let s = rt.snapshot_inspect("vk-b").await.expect("inspect");
    assert_eq!(
        (s.id.as_str(), s.hypervisor.as_str()),
        ("sid", "firecracker")
    );

    fake.answer("snapshot_list", "No snapshots found.\n", "", 0);
    assert!(rt.snapshot_list().await.expect("list").is_empty());
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&["snapshot", "rm", "--", "vk-a"]),
            v(&["snapshot", "rm", "--", "vk-a"]),
            v(&["snapshot", "inspect", "--", "vk-b"]),
            v(&["snapshot", "inspect", "--", "vk-b"]),
            v(&["snapshot", "list", "-o", "json"]),
        ]
    );
}

#[tokio::test]
async fn import_and_export_stream_through_the_pipes() {
    let fake = Fake::new();
    let rt = fake.runtime();
    let tar = vec![7u8; 300_000];
    let h = rt
        .snapshot_import("vk-a-hibernate-import")
        .await
        .expect("import");
    h.write_all(&tar).await.expect("import completes");
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&["snapshot", "rm", "--", "vk-a-hibernate-import"]),
            v(&["snapshot", "import", "--name", "vk-a-hibernate-import"]),
        ]
    );
    assert_eq!(fake.stdin(2), tar);

    fake.answer("snapshot_import", "", "invalid tar header\n", 2);
    let h = rt.snapshot_import("vk-a").await.expect("import starts");
    let err = h.write_all(b"junk").await.expect_err("import fails");
    assert_eq!(
        err.to_string(),
        "cocoon snapshot import vk-a: exit status 2 (stderr: invalid tar header)"
    );

    fake.answer("snapshot_export", "TARBYTES", "", 0);
    let h = rt.snapshot_export("vk-a").await.expect("export");
    assert_eq!(h.read_to_end().await.expect("read"), b"TARBYTES");
    assert_eq!(
        fake.argv(fake.calls()),
        v(&["snapshot", "export", "-o", "-", "--", "vk-a"])
    );

    fake.answer(
        "snapshot_export",
        "partial",
        "snapshot not found: vk-a\n",
        1,
    );
    let h = rt.snapshot_export("vk-a").await.expect("export starts");
    assert!(
        h.read_to_end()
            .await
            .expect_err("fails")
            .is_snapshot_not_found()
    );

    let h = rt.image_import("win11:24h2").await.expect("image import");
    h.write_all(b"QFI\xfbqcow2").await.expect("done");
    assert_eq!(
        fake.argv(fake.calls()),
        v(&["image", "import", "--", "win11:24h2"])
    );
    assert_eq!(fake.stdin(fake.calls()), b"QFI\xfbqcow2");
}

#[tokio::test]
async fn watch_events_decodes_lines_and_reports_the_end() {
    let fake = Fake::new();
    let rt = fake.runtime();
    let lines = [
        r#"{"event":"ADDED","vm":{"id":"a","state":"running","config":{"name":"va"}}}"#,
        "",
        "this is not json",
        r#"{"event":"ADDED","vm":{"id":"","config":{"name":""}}}"#,
        r#"{"event":"MODIFIED","vm":{"id":"a","state":"stopped (stale)","config":{"name":"va"}}}"#,
        r#"{"event":"DELETED","vm":{"id":"a","state":"stopped","config":{"name":"va"}}}"#,
    ];
    fake.answer("vm_status", &lines.join("\n"), "", 0);
    let stream = rt.watch_events().await.expect("start");
    let events: Vec<_> = stream.collect().await;
    assert_eq!(
        fake.argv(1),
        v(&["vm", "status", "--event", "--format", "json"])
    );
    let kinds: Vec<(EventKind, String)> = events
        .into_iter()
        .map(|e| e.expect("event"))
        .map(|e| (e.kind, e.vm.state))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Added, "running".to_owned()),
            (EventKind::Modified, "stopped (stale)".to_owned()),
            (EventKind::Deleted, "stopped".to_owned()),
        ]
    );

    // A non-zero exit ends the stream with an error item.
    fake.answer("vm_status", "", "cannot watch: permission denied\n", 1);
    let items: Vec<_> = rt.watch_events().await.expect("start").collect().await;
    assert_eq!(items.len(), 1);
    assert!(
        items[0]
            .as_ref()
            .expect_err("error")
            .to_string()
            .contains("permission denied")
    );

    // Start failure: no binary.
    let rt =
        CliRuntime::with_capabilities(CliConfig::new("/nonexistent/cocoon"), Capabilities::ALL);
    assert!(rt.watch_events().await.is_err());
}

#[tokio::test]
async fn dropping_a_call_or_a_stream_kills_the_child() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.hang("vm_inspect");
    {
        let call = rt.inspect("id1");
        tokio::pin!(call);
        let started = tokio::select! {
            r = &mut call => panic!("a hanging inspect returned: {r:?}"),
            ok = wait_until(Duration::from_secs(10), || fake.pid(1).is_some()) => ok,
        };
        assert!(started, "the child never started");
        // Dropping the call here is the cancellation.
    }
    let pid = fake.pid(1).expect("child ran");
    assert!(
        wait_until(Duration::from_secs(10), || is_dead(pid)).await,
        "inspect child {pid} still alive after cancellation"
    );

    fake.hang("vm_status");
    let mut stream = rt.watch_events().await.expect("start");
    // Give the child time to start, then drop the stream without reading.
    assert!(wait_until(Duration::from_secs(10), || fake.pid(2).is_some()).await);
    let pid = fake.pid(2).expect("watch child");
    let nothing = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
    assert!(nothing.is_err(), "no events from a silent watcher");
    drop(stream);
    assert!(
        wait_until(Duration::from_secs(10), || is_dead(pid)).await,
        "watch child {pid} still alive after the stream was dropped"
    );
}

#[tokio::test]
async fn export_stream_closed_early_fails_the_completion() {
    let fake = Fake::new();
    let rt = fake.runtime();
    // 1 MiB on stdout: the child blocks on the pipe until we close it.
    let big = "x".repeat(1 << 20);
    fake.answer("snapshot_export", &big, "", 0);
    let mut h = rt.snapshot_export("vk-a").await.expect("export");
    let mut first = [0u8; 16];
    h.stream.read_exact(&mut first).await.expect("read some");
    drop(h.stream);
    let res = tokio::time::timeout(Duration::from_secs(10), h.done)
        .await
        .expect("completes");
    assert!(res.is_err(), "a broken pipe is not a clean export");
}

#[tokio::test]
async fn reconcile_stale_create_parses_the_outcome() {
    let fake = Fake::new();
    let rt = fake.runtime();
    fake.answer(
        "vm_reconcile-stale-create",
        r#"{"id":"x","outcome":"collected"}"#,
        "",
        0,
    );
    assert_eq!(
        rt.reconcile_stale_create("x").await.expect("ok"),
        StaleCreateOutcome::Collected
    );
    assert_eq!(
        fake.argv(1),
        v(&["vm", "reconcile-stale-create", "-o", "json", "--", "x"])
    );
    fake.answer(
        "vm_reconcile-stale-create",
        r#"{"id":"x","outcome":""}"#,
        "",
        0,
    );
    assert!(rt.reconcile_stale_create("x").await.is_err());
}

#[tokio::test]
async fn import_sink_accepts_streaming_writes() {
    // The sink is an ordinary AsyncWrite: write in pieces, shut down, then complete.
    let fake = Fake::new();
    let rt = fake.runtime();
    let mut h = rt.snapshot_import("vk-s").await.expect("import");
    for chunk in [&b"abc"[..], &b"def"[..]] {
        h.sink.write_all(chunk).await.expect("write");
    }
    h.sink.shutdown().await.expect("close");
    drop(h.sink);
    h.done.await.expect("done");
    assert_eq!(fake.stdin(2), b"abcdef");
}

#[tokio::test]
async fn every_child_runs_with_no_color() {
    let fake = Fake::new();
    let rt = CliRuntime::detect(fake.config()).await;
    rt.list().await.expect("list");
    let _ = rt
        .snapshot_export("vk-a")
        .await
        .expect("export")
        .read_to_end()
        .await;
    rt.image_import("img")
        .await
        .expect("image import")
        .write_all(b"QFI")
        .await
        .expect("import");
    let n = fake.calls();
    assert!(n >= 5, "{n} calls");
    for i in 1..=n {
        let seen =
            std::fs::read_to_string(fake.path().join(format!("nocolor.{i}"))).expect("recorded");
        assert_eq!(
            seen,
            "1",
            "call {i} {:?} ran without NO_COLOR=1",
            fake.argv(i)
        );
    }
}

#[tokio::test]
async fn group_help_with_exit_zero_and_unknown_flags_are_unsupported() {
    let fake = Fake::new();
    let rt = fake.runtime();
    let group = "Manage virtual machines\n\nUsage:\n  cocoon vm [command]\n\nAvailable Commands:\n  clone  Clone\n\nUse \"cocoon vm [command] --help\" for more information about a command.\n";
    fake.answer("vm_logs", group, "", 0);
    let err = rt.logs("id1", Some(5)).await.expect_err("help is no log");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    fake.answer("vm_inspect", group, "", 0);
    let err = rt.inspect("id1").await.expect_err("help is no record");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    fake.answer("vm_net", "", "Error: unknown flag: --nics\n", 1);
    let err = rt.net_resize("id1", 0).await.expect_err("unknown flag");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("unknown flag: --nics"), "{err}");
}

#[tokio::test]
async fn logs_without_tail_support_are_tailed_by_the_agent() {
    let fake = Fake::new();
    let caps = Capabilities {
        logs_tail: false,
        ..Capabilities::ALL
    };
    let rt = CliRuntime::with_capabilities(fake.config(), caps);
    let log: String = (1..=500).map(|i| format!("line {i}\n")).collect();
    fake.answer("vm_logs", &log, "", 0);
    let got = rt.logs("id1", Some(3)).await.expect("logs");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "line 498\nline 499\nline 500\n"
    );
    assert_eq!(fake.argv(1), v(&["vm", "logs", "--", "id1"]));
    // No tail requested: the whole log.
    let got = rt.logs("id1", None).await.expect("logs");
    assert_eq!(got.len(), log.len());
    // Errors keep the CLI's wording.
    fake.answer("vm_logs", "", "Error: vm id1: VM not found\n", 1);
    assert!(
        rt.logs("id1", Some(3))
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );
}

/// A guest that prints more than the capture cap (here a 3 MiB line, then lines) costs the
/// agent at most the cap, with `--tail` (the CLI bounds lines, not bytes) and without.
#[tokio::test]
async fn log_captures_are_bounded_in_bytes() {
    let fake = Fake::new();
    let mut log = "x".repeat(3 << 20);
    log.push('\n');
    log.push_str("after\nend\n");
    fake.answer("vm_logs", &log, "", 0);
    for logs_tail in [true, false] {
        let caps = Capabilities {
            logs_tail,
            ..Capabilities::ALL
        };
        let rt = CliRuntime::with_capabilities(fake.config(), caps);
        let got = rt.logs_capped("id1", Some(200), 4096).await.expect("logs");
        assert!(got.len() <= 4096, "tail={logs_tail}: {} bytes", got.len());
        assert!(
            got.ends_with(b"after\nend\n"),
            "tail={logs_tail}: newest kept"
        );
        // Only the newest lines fit: the huge line's start is gone.
        let got = rt.logs_capped("id1", None, 8).await.expect("logs");
        assert_eq!(got, b"end\n", "tail={logs_tail}");
    }
}

#[tokio::test]
async fn exec_flags_the_cli_lacks_are_refused_before_running() {
    let fake = Fake::new();
    let caps = Capabilities {
        exec_stdin: false,
        net_nics: false,
        ..Capabilities::ALL
    };
    let rt = CliRuntime::with_capabilities(fake.config(), caps);
    let mut req = ExecRequest::new("id1", ["cat"]);
    req.stdin = Some(Box::pin(std::io::Cursor::new(b"x".to_vec())));
    let err = rt.exec(req).await.expect_err("no -i");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("has no -i"), "{err}");
    let err = rt.net_resize("id1", 0).await.expect_err("no --nics");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(fake.calls(), 0);
    // Without stdin the exec runs.
    rt.exec(ExecRequest::new("id1", ["true"]))
        .await
        .expect("exec");
    assert_eq!(fake.argv(1), v(&["vm", "exec", "id1", "--", "true"]));
}

/// Issue 26 item 9: a name, id or ref that could read as a `cocoon` flag (or breaks the name
/// rules) is refused before any process starts, and every positional follows `--`.
#[tokio::test]
async fn names_that_read_as_flags_are_refused_before_exec() {
    let fake = Fake::new();
    let rt = fake.runtime();
    let refused = |r: Result<(), RuntimeError>, what: &str| match r {
        Err(RuntimeError::InvalidArgument(m)) => {
            assert!(m.contains("refused before running cocoon"), "{what}: {m}");
        }
        other => panic!("{what}: want InvalidArgument, got {other:?}"),
    };
    refused(rt.remove("--all").await, "vm rm");
    refused(rt.start("-h").await, "vm start");
    refused(rt.inspect("--help").await.map(drop), "vm inspect");
    refused(rt.logs("-f", Some(1)).await.map(drop), "vm logs");
    refused(rt.net_resize("--nics=9", 1).await, "vm net");
    refused(
        rt.snapshot_save("--force", "vmid").await,
        "snapshot save name",
    );
    refused(rt.snapshot_save("vk-a", "-x").await, "snapshot save vm");
    refused(rt.snapshot_remove_if_exists("-rf").await, "snapshot rm");
    refused(
        rt.snapshot_inspect("--output=x").await.map(drop),
        "snapshot inspect",
    );
    refused(rt.snapshot_import("-n").await.map(drop), "snapshot import");
    refused(rt.snapshot_export("-o").await.map(drop), "snapshot export");
    refused(rt.ensure_image("--force", false).await, "image pull");
    refused(rt.ensure_image("img with space", false).await, "image pull");
    refused(rt.image_present("-q").await, "image inspect");
    refused(rt.image_import("--x").await.map(drop), "image import");
    refused(
        rt.clone_vm(CloneRequest::from_snapshot("--from-dir=/etc", "vm-a"))
            .await
            .map(drop),
        "clone source",
    );
    refused(
        rt.clone_vm(CloneRequest::from_snapshot("snap-a", "-vm"))
            .await
            .map(drop),
        "clone name",
    );
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-a");
    req.network = "--bridge=cni0".into();
    refused(rt.clone_vm(req).await.map(drop), "clone network");
    refused(
        rt.run(RunRequest {
            image: "--windows".into(),
            name: "vm-a".into(),
            ..RunRequest::default()
        })
        .await
        .map(drop),
        "run image",
    );
    refused(
        rt.reconcile_stale_create("--all").await.map(drop),
        "reconcile-stale-create",
    );
    let err = exec_capture(&rt, "-i", &["true"], None).await.result;
    refused(err, "vm exec");
    assert_eq!(fake.calls(), 0, "nothing ran: {:?}", fake.all_argv());

    // Accepted values still run, each positional after `--`.
    rt.remove("vk-a").await.expect("rm");
    rt.ensure_image("https://cloud.example/img.qcow2", false)
        .await
        .expect("pull");
    assert_eq!(
        fake.all_argv(),
        vec![
            v(&["vm", "rm", "--force", "--", "vk-a"]),
            v(&["image", "pull", "--", "https://cloud.example/img.qcow2"]),
        ]
    );
}
