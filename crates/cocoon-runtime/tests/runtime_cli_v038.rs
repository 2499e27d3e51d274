//! The CLI backend against the released `cocoon` CLI v0.3.8, proven on its recorded output.
//!
//! The recordings live outside the repository, in `shared/fixtures/cocoon-cli-v0.3.8/` beside
//! it (the repository's parent directory holds `shared/`; `COCOON_SHARED_DIR` overrides that
//! directory). Each capture is `NAME.out` / `NAME.err` / `NAME.code` (stdout, stderr, exit
//! status); `cli_v038/` reads them and holds the replay stand-in. They are used three ways:
//!
//! * read directly: capability detection on the real help texts, the parsers on every recorded
//!   JSON, the error classifier on every recorded error text, the tar reader on the real
//!   `snapshot export` tar;
//! * through a **replay stand-in** (`cocoon` as a shell script): each invocation that was
//!   recorded answers with that capture's stdout, stderr and exit status byte for byte; an
//!   invocation that was not recorded fails with exit 97 and says so. This sits next to the
//!   scripted stand-in of `runtime_cli.rs`, which models the newer CLI;
//! * a node agent whose `VK_COCOON_BIN` is the replay stand-in, as a Node of the real control
//!   plane: in the node agent's `node_cli_v038.rs`.

mod cli_v038;

use std::path::Path;
use std::time::Duration;

use cocoon_runtime::args::{is_group_help, lists_flag, lists_verb};
use cocoon_runtime::cli::{CliConfig, CliRuntime};
use cocoon_runtime::events::parse_event_line;
use cocoon_runtime::parse::{parse_snapshot, parse_snapshot_list, parse_vm, parse_vm_list};
use cocoon_runtime::tarfmt::read_snapshot_tar;
use cocoon_runtime::{
    Capabilities, CloneRequest, EventKind, ExecRequest, HelpTexts, Runtime, RuntimeError, classify,
    exec_capture,
};
use futures::StreamExt;

use cli_v038::{Replay, VM_ID, VM_NAME, fixture, fixture_text, install_script};

/// What v0.3.8 supports, per its help texts (its `vm --help` lists `stop`).
fn v038_caps() -> Capabilities {
    Capabilities {
        on_demand: true,
        stop: true,
        ..Capabilities::NONE
    }
}

fn help_texts() -> HelpTexts {
    HelpTexts {
        clone: fixture_text("vm_clone_help.out"),
        vm: fixture_text("vm_help.out"),
        exec: None,
        logs: None,
        net: None,
    }
}

// ---- read directly ------------------------------------------------------------------------

#[test]
fn capabilities_of_the_real_help_texts() {
    let clone = fixture_text("vm_clone_help.out");
    let vm = fixture_text("vm_help.out");
    let flags: &[(&str, bool)] = &[
        ("--on-demand", true),
        ("--nics", true),
        ("--name", true),
        ("--pull", true),
        ("--no-direct-io", true),
        ("--network", true),
        ("--restore-mode", false),
        ("--cpu-weight", false),
        ("--cpu-quota-us", false),
        ("--cpu-period-us", false),
        ("--from-dir", false),
        // A prefix of a listed flag is not a flag.
        ("--on", false),
        ("--cpu", true),
    ];
    for (flag, want) in flags {
        assert_eq!(lists_flag(&clone, flag), *want, "clone help: {flag}");
    }
    let verbs: &[(&str, bool)] = &[
        ("clone", true),
        ("inspect", true),
        ("list", true),
        ("rm", true),
        ("run", true),
        ("start", true),
        ("status", true),
        ("exec", false),
        ("logs", false),
        ("net", false),
        ("reconcile-stale-create", false),
        // Words of the usage and flag lines are not verbs.
        ("cocoon", false),
        ("-h,", false),
    ];
    for (verb, want) in verbs {
        assert_eq!(lists_verb(&vm, verb), *want, "vm help: {verb}");
    }
    assert!(is_group_help(&vm));
    assert!(
        is_group_help(&fixture_text("vm_exec.out")),
        "a missing verb's answer"
    );
    assert!(!is_group_help(&clone));

    assert_eq!(Capabilities::from_help(&help_texts()), v038_caps());
    // Even a verb help that is the group help (what `vm exec --help` prints) adds nothing.
    let mut help = help_texts();
    help.exec = Some(fixture_text("vm_exec.out"));
    help.logs = Some(fixture_text("vm_help.out"));
    help.net = Some(fixture_text("vm_help.out"));
    assert_eq!(Capabilities::from_help(&help), v038_caps());
    // Were the verbs listed, their group-help answers would still not count.
    help.vm.push_str("\n  exec  x\n  logs  y\n  net  z\n");
    assert_eq!(Capabilities::from_help(&help), v038_caps());
}

#[test]
fn every_recorded_json_parses() {
    let vms = parse_vm_list("vm list", &fixture("vm_list.out")).expect("vm list");
    let got: Vec<(&str, &str, &str, i64)> = vms
        .iter()
        .map(|v| (v.id.as_str(), v.name(), v.state.as_str(), v.pid))
        .collect();
    assert_eq!(
        got,
        [
            (VM_ID, VM_NAME, "running", 0),
            ("BOHGFOVZQ5LGOTIQWSXMZTOKLW", "m-4294967296", "error", 0),
            ("HXU7QM3K7JFWFKE2BJ2W5ATZLD", "runtest", "error", 0),
        ]
    );
    let first = &vms[0];
    assert_eq!(first.hypervisor, "cloud-hypervisor");
    assert_eq!(first.config.cpu, 2);
    assert_eq!(first.config.memory, 1_073_741_824);
    assert_eq!(first.config.image, "tinyimg");
    assert_eq!(first.config.image_type, "cloudimg");
    assert_eq!(first.storage_configs.len(), 2);
    assert_eq!(first.mac(), "", "v0.3.8 records without NICs");
    assert!(first.created_at.is_some() && first.updated_at.is_some());

    let vm = parse_vm("vm inspect", &fixture("vm_inspect.out")).expect("vm inspect");
    assert_eq!(
        (vm.id.as_str(), vm.state.as_str()),
        (VM_ID, "stopped (stale)")
    );
    assert!(!vm.is_running());
    assert_eq!(vm.socket_path, first.socket_path);

    let events: Vec<(EventKind, String, String)> = fixture_text("events.out")
        .lines()
        .map(|l| {
            parse_event_line(l)
                .expect("not blank")
                .expect("event decodes")
        })
        .map(|e| (e.kind, e.vm.id, e.vm.state))
        .collect();
    let want: Vec<(EventKind, String, String)> = [
        (EventKind::Added, VM_ID, "stopped (stale)"),
        (EventKind::Added, "BOHGFOVZQ5LGOTIQWSXMZTOKLW", "error"),
        (EventKind::Added, "HXU7QM3K7JFWFKE2BJ2W5ATZLD", "error"),
        (EventKind::Added, "I76YXQV4OXD5GKLL6AOW7H5YHW", "created"),
        (EventKind::Deleted, "I76YXQV4OXD5GKLL6AOW7H5YHW", "created"),
    ]
    .into_iter()
    .map(|(k, i, s)| (k, i.to_owned(), s.to_owned()))
    .collect();
    assert_eq!(events, want);

    let snaps = parse_snapshot_list("snapshot list", &fixture("snap_list.out")).expect("list");
    assert_eq!(snaps.len(), 1);
    let snap = parse_snapshot("snapshot inspect", &fixture("snap_inspect.out")).expect("one");
    assert_eq!(snaps[0], snap);
    assert_eq!(
        (snap.id.as_str(), snap.name.as_str(), snap.image.as_str()),
        ("STOE2JMJYVLXROSPTAMTC3MSQ3", "vk-a", "tinyimg")
    );
    assert_eq!(
        (
            snap.image_type.as_str(),
            snap.hypervisor.as_str(),
            snap.nics
        ),
        ("cloudimg", "cloud-hypervisor", 1)
    );
    assert!(
        snap.image_blob_ids
            .contains("1b7af784841125887e688254229e282829e17245d0e47fe7280da9b68a30d9e1")
    );
    assert_eq!(
        snap.image_digest,
        "sha256:1b7af784841125887e688254229e282829e17245d0e47fe7280da9b68a30d9e1"
    );

    // `image inspect` has no record type: the JSON is well-formed and not a miss.
    let image: serde_json::Value =
        serde_json::from_slice(&fixture("image_inspect.out")).expect("image inspect");
    assert_eq!(image["name"], "tinyimg");
    assert!(!classify(fixture_text("image_inspect.out")).is_image_not_found());

    // The empty texts, even in JSON mode.
    assert!(
        parse_snapshot_list("snapshot list", &fixture("snap_list_empty.out"))
            .expect("empty")
            .is_empty()
    );
    assert_eq!(
        fixture_text("snap_list_empty.out").trim(),
        "No snapshots found."
    );
    // README: "`vm list -o json` with no VMs prints the text `No VMs found.`" (not captured).
    assert!(
        parse_vm_list("vm list", b"No VMs found.\n")
            .expect("empty")
            .is_empty()
    );
}

#[test]
fn every_recorded_error_text_is_classified() {
    #[derive(Debug, PartialEq)]
    enum Class {
        Vm,
        Snapshot,
        Image,
        Exists(Option<&'static str>),
        Unsupported,
    }
    let cases: &[(&str, Class)] = &[
        ("vm_inspect_missing", Class::Vm),
        ("vm_rm_missing", Class::Vm),
        ("vm_start_missing", Class::Vm),
        ("snap_save_novm", Class::Vm),
        ("snap_inspect_missing", Class::Snapshot),
        ("snap_rm_missing", Class::Snapshot),
        ("vm_clone_missing", Class::Snapshot),
        ("image_inspect_missing", Class::Image),
        ("snap_save_dup", Class::Exists(None)),
        ("vm_create_dup", Class::Exists(None)),
        (
            "snap_import_dup",
            Class::Exists(Some("STOE2JMJYVLXROSPTAMTC3MSQ3")),
        ),
        ("vm_exec_i", Class::Unsupported),
        ("vm_logs", Class::Unsupported),
        ("vm_net", Class::Unsupported),
    ];
    for (name, want) in cases {
        assert_eq!(fixture_text(&format!("{name}.code")).trim(), "1", "{name}");
        assert!(fixture(&format!("{name}.out")).is_empty(), "{name}: stdout");
        // As the backend words it: `<label>: exit status 1 (stderr: <trimmed stderr>)`.
        let text = format!(
            "cocoon x: exit status 1 (stderr: {})",
            fixture_text(&format!("{name}.err")).trim()
        );
        let got = match classify(text.clone()) {
            RuntimeError::VmNotFound(_) => Class::Vm,
            RuntimeError::SnapshotNotFound(_) => Class::Snapshot,
            RuntimeError::ImageNotFound(_) => Class::Image,
            RuntimeError::AlreadyExists { holder, .. } => {
                Class::Exists(holder.map(|h| &*Box::leak(h.into_boxed_str())))
            }
            RuntimeError::Unsupported(_) => Class::Unsupported,
            other => panic!("{name}: unclassified {other:?}"),
        };
        assert_eq!(got, *want, "{name}: {text}");
    }
}

#[test]
fn the_real_export_tar_is_read() {
    let tar = fixture("snapshot-export.tar");
    let dest = tempfile::tempdir().expect("tmp");
    let env = read_snapshot_tar(std::io::Cursor::new(&tar), dest.path()).expect("read tar");
    check_export(&env, dest.path());
}

fn check_export(env: &cocoon_runtime::tarfmt::Envelope, dir: &Path) {
    assert_eq!(env.version, 1);
    assert_eq!(env.config.name, VM_NAME);
    assert_eq!(env.config.id, "PS2CQ7PGR4JDLPWXTCXLWR5QVD");
    assert_eq!(env.config.hypervisor, "cloud-hypervisor");
    assert_eq!(env.config.image_type, "cloudimg");
    assert_eq!(env.config.nics, 1);
    assert!(env.config.created_at.is_none());
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "memory-ranges",
            "overlay.qcow2",
            "state.json"
        ]
    );
    assert_eq!(
        std::fs::read(dir.join("config.json")).expect("read"),
        b"{}\n"
    );
    assert_eq!(
        std::fs::read(dir.join("state.json")).expect("read"),
        b"{}\n"
    );
    assert!(
        std::fs::read(dir.join("memory-ranges"))
            .expect("read")
            .is_empty()
    );
    // The sparse overlay: logical size from COCOON.sparse.size, data at the three extents of
    // COCOON.sparse.map, zeros elsewhere.
    let overlay = std::fs::read(dir.join("overlay.qcow2")).expect("read");
    assert_eq!(overlay.len(), 196_616);
    assert_eq!(&overlay[..4], b"QFI\xfb");
    let extents = [(0usize, 4096usize), (65_536, 4096), (131_072, 4096)];
    for (i, b) in overlay.iter().enumerate() {
        if *b != 0 {
            assert!(
                extents.iter().any(|(o, l)| (*o..o + l).contains(&i)),
                "non-zero byte at {i}, outside the data extents"
            );
        }
    }
    assert!(
        extents
            .iter()
            .all(|(o, l)| overlay[*o..o + l].iter().any(|b| *b != 0)),
        "every extent carries data"
    );
}

// ---- through the replay stand-in -----------------------------------------------------------

#[tokio::test]
async fn detection_on_the_replay_finds_what_v038_has() {
    let replay = Replay::new();
    let rt = replay.detect().await;
    assert_eq!(rt.capabilities(), v038_caps());
    // The verbs v0.3.8 does not list are not probed.
    assert_eq!(replay.calls(), ["vm clone --help", "vm --help"]);

    // exec, logs, net: Unsupported before anything runs, never a success or an exit code.
    let res = exec_capture(&rt, VM_ID, &["sh", "-c", "exit 3"], None).await;
    let err = res.result.expect_err("no exec");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(err.exit_code(), None);
    assert!(
        err.to_string()
            .contains("the installed cocoon CLI has no vm exec"),
        "{err}"
    );
    assert!(
        res.stdout.is_empty(),
        "no help text streamed as guest output"
    );
    let mut req = ExecRequest::new(VM_ID, ["cat"]);
    req.stdin = Some(Box::pin(std::io::Cursor::new(b"x".to_vec())));
    let err = rt.exec(req).await.expect_err("no exec");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    let err = rt.logs(VM_ID, Some(10)).await.expect_err("no logs");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("the installed cocoon CLI has no vm logs"),
        "{err}"
    );
    let err = rt.net_resize(VM_ID, 2).await.expect_err("no net");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("the installed cocoon CLI has no vm net"),
        "{err}"
    );
    assert_eq!(replay.calls().len(), 2, "{:?}", replay.calls());

    // Restore mode `ondemand` becomes the boolean `--on-demand` of v0.3.8's clone.
    let mut req = CloneRequest::from_snapshot("nosuchsnap", "vm-c");
    req.restore_mode = "ondemand".into();
    let err = rt.clone_vm(req).await.expect_err("no such snapshot");
    assert!(err.is_snapshot_not_found(), "{err:?}");
    assert_eq!(
        replay.calls()[2],
        "vm clone --output json --name vm-c --on-demand -- nosuchsnap"
    );
}

#[tokio::test]
async fn undetected_capabilities_still_never_read_cli_refusals_as_results() {
    // The help could not be read at startup (the binary appeared only afterwards): the §3.2
    // verbs are assumed, and the CLI's own answers must still not pass for results.
    let replay = Replay::new();
    let late = replay.dir.path().join("late-cocoon");
    let rt = CliRuntime::detect(CliConfig::new(&late)).await;
    assert_eq!(rt.capabilities(), Capabilities::UNDETECTED);
    std::os::unix::fs::symlink(replay.bin(), &late).expect("symlink");

    // `vm exec` prints the `vm` help and exits 0: not a success.
    let res = exec_capture(&rt, VM_ID, &["sh", "-c", "exit 3"], None).await;
    let err = res.result.expect_err("help is no success");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("the installed cocoon CLI has no vm exec"),
        "{err}"
    );
    // `vm exec -i`: `unknown shorthand flag`, exit 1: not a guest exit code.
    let mut req = ExecRequest::new(VM_ID, ["cat"]);
    req.stdin = Some(Box::pin(std::io::Cursor::new(b"x".to_vec())));
    let err = rt.exec(req).await.expect_err("flag refused");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(err.exit_code(), None);
    assert!(err.to_string().contains("unknown shorthand flag"), "{err}");
    // `unknown flag: --tail` / `--nics`.
    let err = rt.logs(VM_ID, Some(10)).await.expect_err("flag refused");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("unknown flag: --tail"), "{err}");
    let err = rt.net_resize(VM_ID, 2).await.expect_err("flag refused");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    assert_eq!(
        replay.calls(),
        [
            format!("vm exec {VM_ID} -- sh -c exit 3"),
            format!("vm exec -i {VM_ID} -- cat"),
            format!("vm logs --tail 10 -- {VM_ID}"),
            format!("vm net --nics 2 -- {VM_ID}"),
        ]
    );
}

#[tokio::test]
async fn every_replayed_verb_parses_and_classifies() {
    let replay = Replay::new();
    let rt = replay.detect().await;

    let vms = rt.list().await.expect("list");
    assert_eq!(vms.len(), 3);
    assert_eq!((vms[0].state.as_str(), vms[0].pid), ("running", 0));
    let vm = rt.inspect(VM_ID).await.expect("inspect");
    assert_eq!(vm.state, "stopped (stale)");
    assert!(
        rt.inspect("nosuchvm")
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );
    assert!(
        rt.remove("nosuchvm")
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );
    assert!(
        rt.start("nosuchvm")
            .await
            .expect_err("missing")
            .is_vm_not_found()
    );

    let snaps = rt.snapshot_list().await.expect("snapshot list");
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        rt.snapshot_inspect("vk-a").await.expect("inspect").name,
        "vk-a"
    );
    assert!(
        rt.snapshot_inspect("vk-zzz")
            .await
            .expect_err("missing")
            .is_snapshot_not_found()
    );
    rt.snapshot_remove_if_exists("nosuch")
        .await
        .expect("a missing snapshot counts as removed");

    rt.image_present("tinyimg").await.expect("present");
    let err = rt.image_present("ubuntu:24.04").await.expect_err("missing");
    assert!(err.is_image_not_found(), "{err:?}");

    // The event stream: the recorded lines, then the command keeps running.
    let mut stream = rt.watch_events().await.expect("watch");
    let mut got = Vec::new();
    for _ in 0..5 {
        let ev = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("an event within 30 s")
            .expect("stream open")
            .expect("event");
        got.push((ev.kind, ev.vm.state));
    }
    assert_eq!(got[0], (EventKind::Added, "stopped (stale)".to_owned()));
    assert_eq!(got[4].0, EventKind::Deleted);
    drop(stream);

    // The real export tar through the export pipe and the tar reader.
    let h = rt.snapshot_export(VM_NAME).await.expect("export");
    let tar = h.read_to_end().await.expect("export completes");
    assert_eq!(tar, fixture("snapshot-export.tar"));
    let dest = tempfile::tempdir().expect("tmp");
    let env = read_snapshot_tar(std::io::Cursor::new(&tar), dest.path()).expect("read tar");
    check_export(&env, dest.path());

    assert!(
        replay.calls().iter().all(|c| !c.starts_with("vm exec")),
        "{:?}",
        replay.calls()
    );
}

#[tokio::test]
async fn coloured_stderr_is_stripped_from_errors() {
    // `snapshot import` first removes the name; that `snapshot rm vk-a` was not recorded, so a
    // wrapper answers it as a success and hands everything else to the replay.
    let replay = Replay::new();
    let wrapper = format!(
        "#!/bin/sh\nif [ \"$*\" = 'snapshot rm -- vk-a' ]; then exit 0; fi\nexec '{}' \"$@\"\n",
        replay.bin().display()
    );
    let bin = install_script(replay.dir.path(), "wrapped", &wrapper);
    let rt = CliRuntime::with_capabilities(CliConfig::new(bin), v038_caps());
    let recorded = fixture_text("snap_import_dup.err");
    assert!(recorded.contains('\u{1b}'), "the recording is coloured");

    let h = rt.snapshot_import("vk-a").await.expect("import starts");
    let err = h.write_all(b"tar bytes").await.expect_err("name taken");
    let text = err.to_string();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(
        text.contains("INF importing from stdin ... func=cmd.snapshot.import"),
        "{text:?}"
    );
    match err {
        RuntimeError::AlreadyExists { holder, .. } => {
            assert_eq!(holder.as_deref(), Some("STOE2JMJYVLXROSPTAMTC3MSQ3"))
        }
        other => panic!("unexpected {other:?}"),
    }
}
