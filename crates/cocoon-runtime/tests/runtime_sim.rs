//! The simulated runtime through the `Runtime` trait, as the node agent uses it: persistence,
//! names, real snapshot files and tars, the guest model and its state token, leases, events,
//! latencies, failure injection and stats (`runtime.md` §7).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use cocoon_runtime::sim::{
    CollisionWording, CrashKind, DiskFill, DiskSpec, FailRule, ImageKind, Latencies, OutOfBandVm,
    SimConfig, SimHandle, SimRuntime, TOKEN_PATH, Verb,
};
use cocoon_runtime::tarfmt::{PAX_SPARSE_MAP, PAX_SPARSE_SIZE};
use cocoon_runtime::{
    CloneRequest, CloneSource, EventKind, EventStream, RetryPolicy, RunRequest, Runtime,
    RuntimeError, StaleCreateOutcome, VmEvent, VmRecord, exec_capture,
};
use futures::StreamExt;

const IMAGE: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";
const WAIT: Duration = Duration::from_secs(10);

fn config(root: &std::path::Path) -> SimConfig {
    let mut cfg = SimConfig::new(root);
    cfg.lease_delay = Duration::from_millis(30);
    cfg.save_retry = RetryPolicy {
        interval: Duration::from_millis(10),
        deadline: Duration::from_secs(5),
    };
    cfg.known_images.insert(IMAGE.into(), ImageKind::Oci);
    cfg.static_networks.insert("static-net".into());
    cfg
}

struct Node {
    _dir: tempfile::TempDir,
    rt: Arc<dyn Runtime>,
    sim: SimHandle,
}

fn node() -> Node {
    let dir = tempfile::tempdir().expect("tmp");
    let rt = SimRuntime::open(config(dir.path())).expect("open");
    let sim = rt.handle();
    Node {
        _dir: dir,
        rt: Arc::new(rt),
        sim,
    }
}

fn run_req(name: &str) -> RunRequest {
    RunRequest {
        image: IMAGE.into(),
        name: name.into(),
        network: "cocoon-dhcp".into(),
        ..RunRequest::default()
    }
}

async fn boot(n: &Node, name: &str) -> VmRecord {
    n.rt.ensure_image(IMAGE, false).await.expect("pull");
    n.rt.run(run_req(name)).await.expect("run")
}

async fn sh(rt: &dyn Runtime, vm: &str, script: &str) -> Result<String, RuntimeError> {
    let out = exec_capture(rt, vm, &["sh", "-c", script], None).await;
    out.result
        .map(|()| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn next_event(s: &mut EventStream) -> VmEvent {
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("an event in time")
        .expect("stream open")
        .expect("event ok")
}

async fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

#[tokio::test]
async fn run_needs_the_image_and_applies_defaults_minimums_and_name_rules() {
    let n = node();
    let err = n.rt.run(run_req("vm-a")).await.expect_err("no image yet");
    assert!(err.is_image_not_found(), "{err:?}");
    assert!(err.to_string().contains("not found in any backend"));

    let err =
        n.rt.ensure_image("docker.io/unknown:1", false)
            .await
            .expect_err("unknown");
    assert!(!err.is_image_not_found());
    n.rt.ensure_image(IMAGE, false).await.expect("known image");
    n.rt.image_present(IMAGE).await.expect("present by name");

    let vm = n.rt.run(run_req("vm-a")).await.expect("run");
    assert!(vm.is_running());
    assert!(vm.pid > 0);
    assert_eq!(vm.name(), "vm-a");
    assert_eq!(vm.hypervisor, "cloud-hypervisor");
    assert_eq!(
        (vm.config.cpu, vm.config.memory, vm.config.storage),
        (2, 1 << 30, 10 << 30)
    );
    assert_eq!(vm.config.image, IMAGE);
    assert_eq!(vm.network_configs.len(), 1);
    assert!(
        vm.network_configs[0].is_dhcp(),
        "DHCP NIC: no IP in the record"
    );
    assert_eq!(vm.ip(), "");
    n.rt.image_present(&vm.config.image_digest)
        .await
        .expect("present by digest");

    let mut small = run_req("vm-small");
    small.cpu = 1;
    small.memory = "128Mi".into();
    small.storage = "1Gi".into();
    small.backend = Some(cocoon_api::contract::Backend::Firecracker);
    small.os = "Windows".into();
    let vm = n.rt.run(small).await.expect("run small");
    assert_eq!(
        (vm.config.memory, vm.config.storage),
        (512 << 20, 10 << 30),
        "minimums"
    );
    assert_eq!(vm.hypervisor, "firecracker");
    assert!(vm.config.windows);

    let err = n.rt.run(run_req("vm-a")).await.expect_err("duplicate");
    assert!(matches!(err, RuntimeError::AlreadyExists { .. }), "{err:?}");
    assert!(n.rt.run(run_req("-bad")).await.is_err());
    assert!(n.rt.run(run_req(&"x".repeat(64))).await.is_err());
    let mut bad = run_req("vm-q");
    bad.memory = "lots".into();
    assert!(n.rt.run(bad).await.is_err());

    // References: id, name, id prefix.
    let vm = n.rt.inspect("vm-a").await.expect("by name");
    assert_eq!(n.rt.inspect(&vm.id).await.expect("by id").id, vm.id);
    assert_eq!(
        n.rt.inspect(&vm.id[..6]).await.expect("by prefix").id,
        vm.id
    );
    assert!(
        n.rt.inspect("nope")
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );
    assert_eq!(n.rt.list().await.expect("list").len(), 2);
}

#[tokio::test]
async fn state_survives_a_restart_and_vms_stay_running() {
    let dir = tempfile::tempdir().expect("tmp");
    let (vm, token) = {
        let rt = SimRuntime::open(config(dir.path())).expect("open");
        rt.ensure_image(IMAGE, false).await.expect("pull");
        let vm = rt.run(run_req("vm-a")).await.expect("run");
        sh(&rt, "vm-a", "echo kept > /root/marker")
            .await
            .expect("write");
        rt.snapshot_save("vm-a", &vm.id).await.expect("save");
        let token = rt.handle().guest_token("vm-a").expect("token");
        (vm, token)
    };
    let rt = SimRuntime::open(config(dir.path())).expect("reopen");
    let again = rt.inspect(&vm.id).await.expect("same VM");
    assert!(again.is_running(), "VMs stay running across a restart");
    assert_eq!(again.pid, vm.pid);
    assert_eq!(
        rt.snapshot_inspect("vm-a").await.expect("snapshot").name,
        "vm-a"
    );
    assert_eq!(
        sh(&rt, "vm-a", "cat /root/marker").await.expect("read"),
        "kept\n"
    );
    assert_eq!(rt.handle().guest_token("vm-a").expect("token"), token);
    rt.image_present(IMAGE)
        .await
        .expect("image store persisted");

    rt.handle()
        .crash("vm-a", CrashKind::KillProcess)
        .expect("kill");
    assert_eq!(
        rt.inspect("vm-a").await.expect("inspect").state,
        "stopped (stale)"
    );
    let rt = SimRuntime::open(config(dir.path())).expect("reopen");
    assert_eq!(
        rt.inspect("vm-a").await.expect("inspect").state,
        "stopped (stale)"
    );
}

#[tokio::test]
async fn the_state_token_follows_snapshots_and_clones_but_not_fresh_boots() {
    let n = node();
    let a = boot(&n, "vm-a").await;
    let token_a = n.sim.guest_token("vm-a").expect("token");
    assert_eq!(token_a.len(), 32);
    assert_eq!(
        sh(&*n.rt, "vm-a", &format!("cat {TOKEN_PATH}"))
            .await
            .expect("exec"),
        format!("{token_a}\n")
    );
    sh(&*n.rt, "vm-a", "echo before-hibernate > /home/agent/marker")
        .await
        .expect("marker");

    n.rt.snapshot_save("vm-a", &a.id).await.expect("save");
    n.rt.remove(&a.id).await.expect("remove");
    assert!(
        n.rt.inspect(&a.id)
            .await
            .expect_err("gone")
            .is_vm_not_found()
    );

    let woken =
        n.rt.clone_vm(CloneRequest::from_snapshot("vm-a", "vm-a"))
            .await
            .expect("wake");
    assert_ne!(woken.id, a.id);
    assert!(woken.is_running() && woken.first_booted);
    assert_eq!(n.sim.guest_token("vm-a").expect("token"), token_a);
    assert_eq!(
        sh(&*n.rt, "vm-a", "cat /home/agent/marker")
            .await
            .expect("read"),
        "before-hibernate\n"
    );
    // A restored guest keeps its source's hostname until the post-clone fixup rewrites it.
    let sub =
        n.rt.clone_vm(CloneRequest::from_snapshot("vm-a", "vm-a-sub"))
            .await
            .expect("fork");
    assert_eq!(
        sh(&*n.rt, &sub.id, "hostname").await.expect("hostname"),
        "vm-a\n"
    );
    assert_eq!(n.sim.guest_token(&sub.id).expect("token"), token_a);

    let fresh = boot(&n, "vm-b").await;
    assert_ne!(n.sim.guest_token(&fresh.id).expect("token"), token_a);
    assert_eq!(
        sh(&*n.rt, "vm-b", "hostname").await.expect("hostname"),
        "vm-b\n"
    );
}

#[tokio::test]
async fn exec_returns_exit_codes_like_the_cli() {
    let n = node();
    boot(&n, "vm-a").await;
    exec_capture(&*n.rt, "vm-a", &["true"], None)
        .await
        .result
        .expect("true");
    for (argv, code) in [
        (&["false"][..], 1),
        (&["exit", "42"][..], 42),
        (&["no-such-tool"][..], 127),
    ] {
        let err = exec_capture(&*n.rt, "vm-a", argv, None)
            .await
            .result
            .expect_err("fails");
        assert_eq!(err.exit_code(), Some(code), "{argv:?}");
    }
    let out = exec_capture(
        &*n.rt,
        "vm-a",
        &["sh", "-c", "cat > /etc/cfg; cat /etc/cfg"],
        Some(b"v=1".to_vec()),
    )
    .await;
    out.result.expect("stdin write");
    assert_eq!(out.stdout, b"v=1");
    assert_eq!(
        n.sim
            .guest_file("vm-a", "/etc/cfg")
            .expect("file")
            .as_deref(),
        Some("v=1")
    );

    n.sim.crash("vm-a", CrashKind::Stopped).expect("stop");
    let out = exec_capture(&*n.rt, "vm-a", &["true"], None).await;
    assert_eq!(out.result.expect_err("stopped").exit_code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
    let out = exec_capture(&*n.rt, "nope", &["true"], None).await;
    assert_eq!(out.result.expect_err("missing").exit_code(), Some(1));
    assert!(
        exec_capture(&*n.rt, "vm-a", &[], None)
            .await
            .result
            .expect_err("empty")
            .exit_code()
            .is_none()
    );
}

#[tokio::test]
async fn snapshot_save_writes_real_files_and_replaces_a_taken_name_in_every_wording() {
    let n = node();
    n.sim.set_disk(DiskSpec {
        size: 8 << 20,
        fill: DiskFill::Sparse,
    });
    let a = boot(&n, "vm-a").await;
    for wording in [
        CollisionWording::AlreadyExists,
        CollisionWording::InUseBy,
        CollisionWording::HeldBy,
    ] {
        n.sim.set_collision_wording(wording);
        let before = n.rt.snapshot_inspect("vm-a").await.map(|s| s.id).ok();
        n.rt.snapshot_save("vm-a", &a.id)
            .await
            .expect("save (replacing)");
        let after = n.rt.snapshot_inspect("vm-a").await.expect("inspect");
        assert_ne!(
            Some(after.id.clone()),
            before,
            "{wording:?}: a fresh snapshot id"
        );
        assert_eq!(after.image, IMAGE);
        assert_eq!(after.hypervisor, "cloud-hypervisor");
        assert_eq!((after.cpu, after.memory, after.nics), (2, 1 << 30, 1));
        assert_eq!(after.image_type, "oci");
    }
    assert_eq!(n.rt.snapshot_list().await.expect("list").len(), 1);
    let dir = n.sim.snapshot_dir("vm-a").expect("dir");
    for f in ["config.json", "state.json", "memory-ranges", "cow.raw"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert_eq!(
        std::fs::metadata(dir.join("cow.raw")).expect("disk").len(),
        8 << 20
    );
    let rec = n.rt.inspect("vm-a").await.expect("vm");
    let snap = n.rt.snapshot_inspect("vm-a").await.expect("snap");
    assert!(rec.snapshot_ids.contains(&snap.id));

    // A stopped VM cannot be saved; an invalid name is refused.
    assert!(n.rt.snapshot_save("bad name", &a.id).await.is_err());
    n.sim.crash("vm-a", CrashKind::Stopped).expect("stop");
    assert!(n.rt.snapshot_save("fork-vm-a", &a.id).await.is_err());
    n.rt.snapshot_remove_if_exists("vm-a").await.expect("rm");
    n.rt.snapshot_remove_if_exists("vm-a")
        .await
        .expect("rm again: not found is fine");
    assert!(
        n.rt.snapshot_inspect("vm-a")
            .await
            .expect_err("gone")
            .is_snapshot_not_found()
    );
    assert!(!dir.exists(), "data removed");
}

#[tokio::test]
async fn export_holds_the_snapshot_and_a_save_into_it_waits_for_the_hold() {
    let n = node();
    // Larger than the export pipe, so the unread export stays in progress.
    n.sim.set_disk(DiskSpec {
        size: 4 << 20,
        fill: DiskFill::Filled,
    });
    let a = boot(&n, "vm-a").await;
    n.rt.snapshot_save("vm-a", &a.id).await.expect("save");
    let export = n.rt.snapshot_export("vm-a").await.expect("export");
    // Nothing read yet: the export is stuck on its pipe and holds the snapshot.
    let err =
        n.rt.snapshot_remove_if_exists("vm-a")
            .await
            .expect_err("held");
    assert!(matches!(err, RuntimeError::InUse(_)), "{err:?}");
    assert!(err.to_string().contains("is in use by an active export"));

    // The save's healing retries the locked holder until the export finishes.
    let rt = n.rt.clone();
    let id = a.id.clone();
    let save = tokio::spawn(async move { rt.snapshot_save("vm-a", &id).await });
    assert!(n.sim.wait_calls(Verb::SnapshotSave, 2, WAIT).await);
    assert!(
        !save.is_finished(),
        "the save cannot replace a held snapshot"
    );
    assert_eq!(n.sim.snapshot_holds()["vm-a"], ["export"]);
    let old_id = n.rt.snapshot_inspect("vm-a").await.expect("snap").id;
    let tar = export.read_to_end().await.expect("export completes");
    assert!(!tar.is_empty());
    save.await
        .expect("join")
        .expect("save succeeds once the hold is gone");
    assert_ne!(
        n.rt.snapshot_inspect("vm-a").await.expect("snap").id,
        old_id
    );
    assert!(n.sim.snapshot_holds().is_empty());
}

#[tokio::test]
async fn export_import_round_trip_moves_real_bytes_and_keeps_the_identity() {
    let src = node();
    src.sim.set_disk(DiskSpec {
        size: 6 << 20,
        fill: DiskFill::Filled,
    });
    let a = boot(&src, "vm-a").await;
    sh(&*src.rt, "vm-a", "echo migrated > /data/m")
        .await
        .expect("marker");
    src.rt.snapshot_save("vm-a", &a.id).await.expect("save");
    let snap = src.rt.snapshot_inspect("vm-a").await.expect("snap");
    let tar = src
        .rt
        .snapshot_export("vm-a")
        .await
        .expect("export")
        .read_to_end()
        .await
        .expect("tar");
    assert!(
        tar.len() > 5 << 20,
        "a filled disk moves its bytes: {}",
        tar.len()
    );

    // The exact §2.3 layout: the envelope first, then the files, memory-ranges sparse.
    let mut archive = tar::Archive::new(tar.as_slice());
    let mut names = Vec::new();
    for (i, entry) in archive.entries().expect("entries").enumerate() {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").display().to_string();
        if i == 0 {
            let mut text = String::new();
            entry.read_to_string(&mut text).expect("envelope");
            let env: serde_json::Value = serde_json::from_str(&text).expect("json");
            assert_eq!(env["version"], 1);
            assert_eq!(env["config"]["id"], snap.id.as_str());
            assert!(env["config"].get("created_at").is_none());
            assert!(text.ends_with("}\n") && text.contains("\n  \"config\""));
        }
        if name == "memory-ranges" {
            let keys: Vec<String> = entry
                .pax_extensions()
                .expect("pax")
                .expect("sparse records")
                .map(|e| e.expect("ext").key().expect("key").to_owned())
                .collect();
            assert!(
                keys.contains(&PAX_SPARSE_MAP.to_owned())
                    && keys.contains(&PAX_SPARSE_SIZE.to_owned())
            );
        }
        names.push(name);
    }
    assert_eq!(
        names,
        [
            "snapshot.json",
            "config.json",
            "cow.raw",
            "memory-ranges",
            "state.json"
        ]
    );

    // Another node imports it under its wake name: pending until complete, then visible.
    let dst = node();
    let h = dst
        .rt
        .snapshot_import("vm-a-hibernate-import")
        .await
        .expect("import");
    assert!(
        dst.rt
            .snapshot_inspect("vm-a-hibernate-import")
            .await
            .is_err(),
        "pending"
    );
    let err = dst
        .rt
        .snapshot_remove_if_exists("vm-a-hibernate-import")
        .await
        .expect_err("pending is locked");
    assert!(matches!(err, RuntimeError::InUse(_)), "{err:?}");
    h.write_all(&tar).await.expect("import");
    let imported = dst
        .rt
        .snapshot_inspect("vm-a-hibernate-import")
        .await
        .expect("visible");
    assert_eq!(
        imported.id, snap.id,
        "the snapshot id survives the round trip"
    );
    assert_eq!(imported.name, "vm-a-hibernate-import");

    dst.sim.set_permissive_pull(true);
    let mut req = CloneRequest::from_snapshot("vm-a-hibernate-import", "vm-a");
    req.pull = true;
    dst.rt.clone_vm(req).await.expect("clone");
    dst.rt
        .image_present(IMAGE)
        .await
        .expect("--pull fetched the base image");
    assert_eq!(
        dst.sim.guest_token("vm-a").expect("token"),
        src.sim.guest_token("vm-a").expect("token")
    );
    assert_eq!(
        sh(&*dst.rt, "vm-a", "cat /data/m").await.expect("read"),
        "migrated\n"
    );
    let disk = dst.sim.vm_info("vm-a").expect("info").disk_path;
    let src_disk = src.sim.vm_info("vm-a").expect("info").disk_path;
    assert_eq!(
        std::fs::read(disk).expect("dst"),
        std::fs::read(src_disk).expect("src")
    );

    // Gzip input is accepted; garbage fails and leaves nothing behind.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).expect("gz");
    let gz = gz.finish().expect("gz");
    dst.rt
        .snapshot_import("gz")
        .await
        .expect("import")
        .write_all(&gz)
        .await
        .expect("gzip import");
    assert_eq!(dst.rt.snapshot_inspect("gz").await.expect("gz").id, snap.id);
    let err = dst
        .rt
        .snapshot_import("junk")
        .await
        .expect("start")
        .write_all(b"not a tar")
        .await;
    assert!(err.is_err());
    assert!(
        dst.rt
            .snapshot_inspect("junk")
            .await
            .expect_err("absent")
            .is_snapshot_not_found()
    );
}

#[tokio::test]
async fn clone_from_dir_and_missing_sources() {
    let n = node();
    let a = boot(&n, "vm-a").await;
    n.rt.snapshot_save("snap-a", &a.id).await.expect("save");
    let tar =
        n.rt.snapshot_export("snap-a")
            .await
            .expect("export")
            .read_to_end()
            .await
            .expect("tar");
    let staged = tempfile::tempdir().expect("tmp");
    cocoon_runtime::tarfmt::read_snapshot_tar(tar.as_slice(), staged.path()).expect("extract");
    std::fs::write(
        staged.path().join("snapshot.json"),
        cocoon_runtime::tarfmt::envelope_bytes(
            &n.rt.snapshot_inspect("snap-a").await.expect("snap"),
        )
        .expect("env"),
    )
    .expect("write envelope");

    let mut req = CloneRequest::from_snapshot("unused", "vm-dir");
    req.from = CloneSource::Dir(staged.path().to_path_buf());
    let vm = n.rt.clone_vm(req).await.expect("clone from dir");
    assert_eq!(vm.config.image, IMAGE);
    assert_eq!(
        n.sim.guest_token("vm-dir").expect("t"),
        n.sim.guest_token("vm-a").expect("t")
    );

    let err =
        n.rt.clone_vm(CloneRequest::from_snapshot("nope", "vm-x"))
            .await
            .expect_err("no snapshot");
    assert!(err.is_snapshot_not_found(), "{err:?}");
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-fc");
    req.backend = Some(cocoon_api::contract::Backend::Firecracker);
    assert!(
        n.rt.clone_vm(req).await.is_err(),
        "a CH snapshot cannot restore on FC"
    );
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-r");
    req.restore_mode = "teleport".into();
    assert!(n.rt.clone_vm(req).await.is_err());

    // Clone inherits and records its knobs.
    let mut req = CloneRequest::from_snapshot("snap-a", "vm-n");
    req.nics = Some(3);
    req.restore_mode = "mmap".into();
    req.cpu_policy.weight = 79;
    let vm = n.rt.clone_vm(req).await.expect("clone");
    assert_eq!(vm.network_configs.len(), 3);
    let info = n.sim.vm_info("vm-n").expect("info");
    assert_eq!(
        (info.restore_mode.as_str(), info.cpu_policy.weight),
        ("mmap", 79)
    );
    let default =
        n.rt.clone_vm(CloneRequest::from_snapshot("snap-a", ""))
            .await
            .expect("default name");
    assert_eq!(default.name(), format!("cocoon-clone-{}", default.id));
}

#[tokio::test]
async fn dhcp_leases_appear_after_the_delay_and_can_be_withheld() {
    let n = node();
    let a = boot(&n, "vm-a").await;
    let read_leases = || -> Vec<serde_json::Value> {
        std::fs::read(n.sim.lease_path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let mac = a.mac().to_owned();
    assert!(
        wait_for(|| read_leases().iter().any(|l| l["mac"] == mac.as_str())).await,
        "lease written after the delay"
    );
    let lease = read_leases()
        .into_iter()
        .find(|l| l["mac"] == mac.as_str())
        .expect("lease");
    assert!(lease["ip"].as_str().expect("ip").starts_with("10.88."));
    assert!(
        chrono::DateTime::parse_from_rfc3339(lease["expiry"].as_str().expect("expiry")).is_ok()
    );

    n.sim.withhold_leases(Some("vm-b"), true);
    let b = n.rt.run(run_req("vm-b")).await.expect("run b");
    // vm-b's lease is due after 30 ms; a later VM's lease proves time has passed.
    let c = n.rt.run(run_req("vm-c")).await.expect("run c");
    assert!(wait_for(|| read_leases().iter().any(|l| l["mac"] == c.mac())).await);
    assert!(
        !read_leases().iter().any(|l| l["mac"] == b.mac()),
        "withheld"
    );
    n.sim.withhold_leases(Some("vm-b"), false);
    assert!(
        read_leases().iter().any(|l| l["mac"] == b.mac()),
        "released at once"
    );

    let mut req = run_req("vm-s");
    req.network = "static-net".into();
    let s = n.rt.run(req).await.expect("static");
    assert!(!s.ip().is_empty(), "static NIC reports its IP");
    assert_eq!(
        s.network_configs[0].network.as_ref().expect("net").gateway,
        "10.88.0.1"
    );
    assert!(
        n.sim.leases().iter().all(|l| l.mac != s.mac()),
        "no DHCP lease for a static NIC"
    );

    let macs: std::collections::HashSet<String> =
        n.rt.list()
            .await
            .expect("list")
            .iter()
            .map(|v| v.mac().to_owned())
            .collect();
    assert_eq!(macs.len(), 4, "unique MACs");
    n.rt.remove(&a.id).await.expect("remove");
    assert!(
        !read_leases().iter().any(|l| l["mac"] == mac.as_str()),
        "lease released"
    );
}

#[tokio::test]
async fn events_follow_the_diff_rules_and_tick_at_once_after_own_changes() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config(dir.path());
    // An hour-long tick: every event below must come from an immediate tick.
    cfg.tick_interval = Duration::from_secs(3600);
    let rt = SimRuntime::open(cfg).expect("open");
    let sim = rt.handle();
    rt.ensure_image(IMAGE, false).await.expect("pull");
    let a = rt.run(run_req("vm-a")).await.expect("run");

    let mut events = rt.watch_events().await.expect("watch");
    let first = next_event(&mut events).await;
    assert_eq!(
        (first.kind, first.vm.id.as_str()),
        (EventKind::Added, a.id.as_str())
    );

    sim.crash("vm-a", CrashKind::KillProcess).expect("kill");
    let ev = next_event(&mut events).await;
    assert_eq!(
        (ev.kind, ev.vm.state.as_str()),
        (EventKind::Modified, "stopped (stale)")
    );
    assert_eq!(ev.vm.name(), "vm-a", "full record");

    rt.start(&a.id).await.expect("restart");
    let ev = next_event(&mut events).await;
    assert_eq!(
        (ev.kind, ev.vm.state.as_str()),
        (EventKind::Modified, "running")
    );

    // A run shows up as creating, then running.
    let b = rt.run(run_req("vm-b")).await.expect("run b");
    let ev = next_event(&mut events).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str()),
        (EventKind::Added, b.id.as_str())
    );
    let mut last = ev;
    while last.vm.state != "running" {
        last = next_event(&mut events).await;
        assert_eq!(last.kind, EventKind::Modified);
    }

    sim.delete_vm("vm-a").expect("out of band");
    let ev = next_event(&mut events).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str(), ev.vm.state.as_str()),
        (EventKind::Deleted, a.id.as_str(), "running")
    );

    let orphan = sim
        .create_vm(OutOfBandVm {
            name: "orphan".into(),
            ..OutOfBandVm::default()
        })
        .expect("out of band");
    let ev = next_event(&mut events).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str()),
        (EventKind::Added, orphan.id.as_str())
    );

    sim.close_event_streams();
    let end = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("ends in time");
    assert!(end.is_none(), "closed");

    sim.fail_watch_start(1);
    assert!(rt.watch_events().await.is_err(), "start failure");
    let mut again = rt.watch_events().await.expect("restart works");
    let mut added = [next_event(&mut again).await, next_event(&mut again).await];
    added.sort_by(|x, y| x.vm.name().cmp(y.vm.name()));
    assert!(
        added.iter().all(|e| e.kind == EventKind::Added),
        "first tick: all ADDED"
    );
    assert_eq!(added[0].vm.name(), "orphan");
}

#[tokio::test]
async fn failure_injection_and_call_log() {
    let n = node();
    let a = boot(&n, "vm-a").await;

    n.sim
        .fail_next(Verb::Inspect, 1, "Error: VM not found: vm-a");
    assert!(
        n.rt.inspect("vm-a")
            .await
            .expect_err("injected")
            .is_vm_not_found()
    );
    n.sim.fail_inspect_transient(2);
    for _ in 0..2 {
        let err = n.rt.inspect("vm-a").await.expect_err("transient");
        assert!(matches!(err, RuntimeError::Other(_)), "{err:?}");
    }
    n.rt.inspect("vm-a").await.expect("recovered");

    // A target-specific failure leaves other VMs alone; phrases are classified.
    n.sim.fail(
        FailRule::new(
            Verb::SnapshotRemove,
            "snapshot \"x\" is in use by an active clone",
        )
        .target("x"),
    );
    assert!(matches!(
        n.rt.snapshot_remove_if_exists("x").await,
        Err(RuntimeError::InUse(_))
    ));
    n.rt.snapshot_remove_if_exists("y")
        .await
        .expect("other target");
    n.sim.clear_failures();
    n.rt.snapshot_remove_if_exists("x").await.expect("cleared");

    n.sim.fail_always(Verb::Start, "boom");
    for _ in 0..3 {
        assert!(n.rt.start(&a.id).await.is_err());
    }
    n.sim.clear_failures();

    // Block until cancelled by the caller (a timeout drops the call).
    n.sim.block(Verb::Remove, Some("vm-a"));
    let res = tokio::time::timeout(Duration::from_millis(50), n.rt.remove(&a.id)).await;
    assert!(res.is_err(), "blocked call timed out");
    assert_eq!(
        n.sim.blocked(Verb::Remove),
        0,
        "dropped calls stop counting"
    );
    n.rt.inspect(&a.id).await.expect("not removed");

    // Block, observe, then release or cancel.
    let rt = n.rt.clone();
    let id = a.id.clone();
    let waiting = tokio::spawn(async move { rt.remove(&id).await });
    assert!(n.sim.wait_blocked(Verb::Remove, 1, WAIT).await);
    n.sim.cancel_blocked(Verb::Remove);
    let err = waiting.await.expect("join").expect_err("cancelled");
    assert!(matches!(err, RuntimeError::Cancelled(_)), "{err:?}");

    n.sim.block(Verb::Remove, None);
    let rt = n.rt.clone();
    let id = a.id.clone();
    let waiting = tokio::spawn(async move { rt.remove(&id).await });
    assert!(n.sim.wait_blocked(Verb::Remove, 1, WAIT).await);
    n.sim.unblock(Verb::Remove);
    waiting.await.expect("join").expect("proceeds");
    assert!(
        n.rt.inspect(&a.id)
            .await
            .expect_err("removed")
            .is_vm_not_found()
    );

    let removes = n.sim.calls_of(Verb::Remove);
    assert_eq!(removes.len(), 3);
    assert!(
        removes
            .iter()
            .all(|c| c.targets.contains(&"vm-a".to_owned()))
    );
    assert_eq!(n.sim.call_count(Verb::Run), 1);
    let run = &n.sim.calls_of(Verb::Run)[0];
    assert_eq!(run.args["name"], "vm-a");
    assert_eq!(run.args["image"], IMAGE);
}

#[tokio::test]
async fn net_resize_start_and_crashes() {
    let n = node();
    let a = boot(&n, "vm-a").await;
    n.rt.net_resize(&a.id, 0).await.expect("drop NIC");
    assert!(
        n.rt.inspect(&a.id)
            .await
            .expect("vm")
            .network_configs
            .is_empty()
    );
    n.rt.snapshot_save("vm-a", &a.id)
        .await
        .expect("save without NIC");
    assert_eq!(n.rt.snapshot_inspect("vm-a").await.expect("snap").nics, 0);
    n.rt.net_resize(&a.id, 2).await.expect("add NICs");
    assert_eq!(
        n.rt.inspect(&a.id).await.expect("vm").network_configs.len(),
        2
    );

    n.sim.break_net_resize_until_start("vm-a").expect("break");
    assert!(n.rt.net_resize(&a.id, 1).await.is_err());
    n.sim.crash("vm-a", CrashKind::Error).expect("crash");
    let crashed = n.rt.inspect(&a.id).await.expect("vm");
    assert_eq!((crashed.state.as_str(), crashed.pid), ("error", 0));
    let token = n.sim.guest_token("vm-a").expect("token");
    n.rt.start(&a.id).await.expect("start");
    let up = n.rt.inspect(&a.id).await.expect("vm");
    assert!(up.is_running() && up.pid > 0 && up.pid != a.pid);
    assert_eq!(
        n.sim.guest_token("vm-a").expect("token"),
        token,
        "disk kept"
    );
    n.rt.net_resize(&a.id, 1).await.expect("fixed by start");

    let mut fc = run_req("vm-fc");
    fc.backend = Some(cocoon_api::contract::Backend::Firecracker);
    let fc = n.rt.run(fc).await.expect("fc");
    assert!(matches!(
        n.rt.net_resize(&fc.id, 2).await,
        Err(RuntimeError::Unsupported(_))
    ));
}

#[tokio::test]
async fn latencies_respect_cancellation_and_stale_creates_are_collectable() {
    let n = node();
    n.rt.ensure_image(IMAGE, false).await.expect("pull");
    n.sim.set_latencies(Latencies {
        run: Duration::from_secs(3600),
        ..Latencies::default()
    });
    let res = tokio::time::timeout(Duration::from_millis(100), n.rt.run(run_req("vm-slow"))).await;
    assert!(
        res.is_err(),
        "the create was still waiting out its latency when it was dropped"
    );
    let stuck = n.rt.inspect("vm-slow").await.expect("left behind");
    assert_eq!(stuck.state, "creating", "a killed create leaves its record");
    assert_eq!(
        n.rt.reconcile_stale_create(&stuck.id)
            .await
            .expect("collect"),
        StaleCreateOutcome::Collected
    );
    assert!(
        n.rt.inspect("vm-slow")
            .await
            .expect_err("collected")
            .is_vm_not_found()
    );

    // While the create is still in flight it is busy.
    let rt = n.rt.clone();
    let slow = tokio::spawn(async move { rt.run(run_req("vm-slow")).await });
    assert!(wait_for(|| n.sim.vm_info("vm-slow").is_ok()).await);
    let id = n.sim.vm_info("vm-slow").expect("info").id;
    assert_eq!(
        n.rt.reconcile_stale_create(&id).await.expect("busy"),
        StaleCreateOutcome::Busy
    );
    slow.abort();
    n.sim.set_latencies(Latencies::default());
    let a = n.rt.run(run_req("vm-a")).await.expect("run");
    assert_eq!(
        n.rt.reconcile_stale_create(&a.id).await.expect("x"),
        StaleCreateOutcome::NotCreating
    );
    assert_eq!(
        n.rt.reconcile_stale_create("nope").await.expect("x"),
        StaleCreateOutcome::NotFound
    );
    n.sim.script_stale_create(StaleCreateOutcome::Busy);
    assert_eq!(
        n.rt.reconcile_stale_create(&a.id).await.expect("x"),
        StaleCreateOutcome::Busy
    );
}

#[tokio::test]
async fn images_import_logs_and_stats() {
    let n = node();
    let h = n.rt.image_import("win11:24h2").await.expect("import");
    let mut qcow = b"QFI\xfb\x00\x00\x00\x03".to_vec();
    qcow.resize(70_000, 9);
    h.write_all(&qcow).await.expect("qcow2 accepted");
    n.rt.image_present("win11:24h2").await.expect("by name");
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&qcow))
    );
    n.rt.image_present(&digest).await.expect("by digest");
    let err =
        n.rt.image_import("bad")
            .await
            .expect("start")
            .write_all(b"garbage")
            .await;
    assert!(err.is_err());
    assert!(
        n.rt.image_present("bad")
            .await
            .expect_err("absent")
            .is_image_not_found()
    );

    let mut req = run_req("win");
    req.image = "win11:24h2".into();
    let vm = n.rt.run(req).await.expect("run cloud image");
    assert_eq!(vm.config.image_type, "cloudimg");
    let info = n.sim.vm_info("win").expect("info");
    assert!(info.disk_path.ends_with("overlay.qcow2"));
    assert!(
        info.disk_path
            .starts_with(n.sim.root().join("run/cloudhypervisor"))
    );

    let logs = String::from_utf8(n.rt.logs("win", None).await.expect("logs")).expect("utf8");
    assert!(logs.contains("first boot of win"), "{logs}");
    exec_capture(&*n.rt, "win", &["true"], None)
        .await
        .result
        .expect("exec");
    let tail = String::from_utf8(n.rt.logs("win", Some(1)).await.expect("logs")).expect("utf8");
    assert_eq!(tail.lines().count(), 1);
    assert!(tail.contains("exec"), "{tail}");

    assert!(
        wait_for(|| n
            .sim
            .stats("win")
            .map(|s| s.cpu_time_ns > 0)
            .unwrap_or(false))
        .await
    );
    let st = n.rt.vm_stats(&vm).await.expect("stats");
    assert_eq!(st.pid, vm.pid);
    assert!(st.rss_bytes > 0);
    assert_eq!(st.taps.len(), 1);
    assert_eq!(st.taps[0].tap, vm.network_configs[0].tap);
    assert_eq!(
        (st.taps[0].rx_bytes, st.taps[0].tx_bytes),
        (0, 0),
        "an idle guest moves no bytes"
    );
    n.sim.crash("win", CrashKind::Stopped).expect("stop");
    assert_eq!(n.rt.vm_stats(&vm).await.expect("stats").pid, 0);
}

#[tokio::test]
async fn dropping_a_completion_aborts_the_transfer_like_killing_the_cli() {
    let n = node();
    n.sim.set_disk(DiskSpec {
        size: 4 << 20,
        fill: DiskFill::Filled,
    });
    let a = boot(&n, "vm-a").await;
    n.rt.snapshot_save("vm-a", &a.id).await.expect("save");
    let full =
        n.rt.snapshot_export("vm-a")
            .await
            .expect("export")
            .read_to_end()
            .await
            .expect("tar");

    // Export: the stream ends early once its completion is gone.
    let h = n.rt.snapshot_export("vm-a").await.expect("export");
    let (mut stream, done) = (h.stream, h.done);
    drop(done);
    let mut got = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut got)
        .await
        .expect("read");
    assert!(
        got.len() < full.len(),
        "{} of {} bytes",
        got.len(),
        full.len()
    );
    assert!(
        wait_for(|| n.sim.snapshot_holds().is_empty()).await,
        "hold released"
    );

    // Import: the name never appears, and the pending reservation goes away.
    let h = n.rt.snapshot_import("dropped").await.expect("import");
    let (mut sink, done) = (h.sink, h.done);
    drop(done);
    let _ = tokio::io::AsyncWriteExt::write_all(&mut sink, &full).await;
    drop(sink);
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        match n.rt.snapshot_remove_if_exists("dropped").await {
            Ok(()) => break,
            Err(RuntimeError::InUse(_)) if tokio::time::Instant::now() < end => {
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("pending import never cleared: {e}"),
        }
    }
    assert!(
        n.rt.snapshot_inspect("dropped")
            .await
            .expect_err("absent")
            .is_snapshot_not_found()
    );
}

/// Issue 40: `stop` shuts a guest down (record `stopped`, then `start` boots it again), is a
/// no-op on a stopped VM, says `VmNotFound` for a missing one, and a guest set to ignore it
/// keeps the call pending until the caller's deadline.
#[tokio::test]
async fn stop_shuts_the_guest_down_unless_it_ignores_the_request() {
    let n = node();
    let vm = boot(&n, "vk-stop").await;
    n.rt.stop(&vm.id, Duration::from_secs(5))
        .await
        .expect("stop");
    let after = n.rt.inspect(&vm.id).await.expect("inspect");
    assert_eq!(after.state, "stopped");
    assert_eq!(after.pid, 0);
    n.rt.stop(&vm.id, Duration::from_secs(5))
        .await
        .expect("stopping a stopped VM");
    let stops = n.sim.calls_of(Verb::Stop);
    assert_eq!(stops.len(), 2);
    assert_eq!(stops[0].args["timeout_secs"], 5);
    assert!(
        n.rt.stop("vk-nosuch", Duration::from_secs(1))
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );

    n.rt.start(&vm.id).await.expect("start");
    n.sim.ignore_shutdown("vk-stop", true);
    let pending = tokio::time::timeout(
        Duration::from_millis(300),
        n.rt.stop(&vm.id, Duration::from_secs(1)),
    )
    .await;
    assert!(pending.is_err(), "an ignoring guest never answers");
    assert!(n.rt.inspect(&vm.id).await.expect("inspect").is_running());
    n.sim.ignore_shutdown("vk-stop", false);
    n.rt.stop(&vm.id, Duration::from_secs(1))
        .await
        .expect("stop");
    n.rt.remove(&vm.id).await.expect("remove");
}
