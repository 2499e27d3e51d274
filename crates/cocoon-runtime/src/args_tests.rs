//! Unit tests of [`crate::args`]: the cocoon argv each request builds, per capability.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cocoon_api::contract::Backend;

use super::args::*;
use super::error::{Result, RuntimeError};
use super::types::{CloneRequest, CloneSource, CpuPolicy, RunRequest};

fn argv(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

fn clone_req() -> CloneRequest {
    CloneRequest::from_snapshot("snap-a", "vm-a")
}

#[test]
fn clone_examples_from_the_spec() {
    // {from: snap-a, to: vm-a, backend: cloud-hypervisor}
    let mut req = clone_req();
    req.backend = Some(Backend::CloudHypervisor);
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm", "clone", "--output", "json", "--name", "vm-a", "--", "snap-a"
        ])
    );
    assert!(got.warnings.is_empty());

    // from_dir → --pull --from-dir DIR
    let mut req = clone_req();
    req.to = "vm-f".into();
    req.from = CloneSource::Dir(PathBuf::from("/var/lib/cocoon/snaps/foo"));
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
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

    // A CPU policy goes right before the positional argument.
    let mut req = clone_req();
    req.cpu_policy = CpuPolicy {
        weight: 20,
        quota_us: 200_000,
        period_us: 100_000,
    };
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-a",
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
}

#[test]
fn clone_flag_order_with_everything_set() {
    let mut req = clone_req();
    req.network = "cocoon-dhcp".into();
    req.no_direct_io = true;
    req.pull = true;
    req.restore_mode = "mmap".into();
    req.nics = Some(2);
    req.cpu_policy.weight = 79;
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-a",
            "--network",
            "cocoon-dhcp",
            "--no-direct-io",
            "--pull",
            "--restore-mode",
            "mmap",
            "--nics",
            "2",
            "--cpu-weight",
            "79",
            "--",
            "snap-a"
        ])
    );
}

#[test]
fn clone_pull_once_when_both_requested_and_from_dir() {
    let mut req = clone_req();
    req.pull = true;
    req.from = CloneSource::Dir(PathBuf::from("/d"));
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(got.argv.iter().filter(|a| *a == "--pull").count(), 1);
}

#[test]
fn clone_nics_zero_is_explicit_and_none_is_absent() {
    let mut req = clone_req();
    req.nics = Some(0);
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert!(got.argv.windows(2).any(|w| w == ["--nics", "0"]));
    req.nics = None;
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert!(!got.argv.contains(&"--nics".to_owned()));
}

#[test]
fn clone_firecracker_drops_restore_mode_and_nics_only() {
    let mut req = clone_req();
    req.backend = Some(Backend::Firecracker);
    req.restore_mode = "copy".into();
    req.nics = Some(1);
    req.cpu_policy.weight = 5;
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-a",
            "--cpu-weight",
            "5",
            "--",
            "snap-a"
        ])
    );
    // An empty backend means cloud-hypervisor: both flags stay.
    req.backend = None;
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert!(got.argv.contains(&"--restore-mode".to_owned()));
    assert!(got.argv.contains(&"--nics".to_owned()));
}

#[test]
fn clone_cpu_flags_only_when_positive() {
    let mut req = clone_req();
    req.cpu_policy = CpuPolicy {
        weight: 1,
        quota_us: 0,
        period_us: 0,
    };
    let got = clone_args(&req, &Capabilities::ALL).expect("args");
    assert!(got.argv.windows(2).any(|w| w == ["--cpu-weight", "1"]));
    assert!(!got.argv.contains(&"--cpu-quota-us".to_owned()));
    assert!(!got.argv.contains(&"--cpu-period-us".to_owned()));
}

#[test]
fn clone_without_capabilities_warns_or_fails() {
    let mut req = clone_req();
    req.restore_mode = "ondemand".into();
    req.cpu_policy.weight = 20;
    let got = clone_args(&req, &Capabilities::NONE).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm", "clone", "--output", "json", "--name", "vm-a", "--", "snap-a"
        ])
    );
    assert_eq!(got.warnings.len(), 2);

    req.from = CloneSource::Dir(PathBuf::from("/d"));
    let err = clone_args(&req, &Capabilities::NONE).expect_err("from-dir needs support");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
}

#[test]
fn run_example_from_the_spec() {
    let req = RunRequest {
        image: "ubuntu:24.04".into(),
        cpu: 2,
        memory: "4Gi".into(),
        storage: "20Gi".into(),
        network: "cocoon-dhcp".into(),
        ..RunRequest::default()
    };
    let got = run_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "run",
            "--output",
            "json",
            "--cpu",
            "2",
            "--memory",
            "4294967296",
            "--storage",
            "21474836480",
            "--network",
            "cocoon-dhcp",
            "--",
            "ubuntu:24.04"
        ])
    );
}

#[test]
fn run_full_flag_order() {
    let req = RunRequest {
        image: "win11".into(),
        name: "vm-w".into(),
        cpu: 4,
        memory: "lots".into(),
        storage: String::new(),
        network: String::new(),
        os: "Windows".into(),
        backend: Some(Backend::Firecracker),
        no_direct_io: true,
        cpu_policy: CpuPolicy {
            weight: 20,
            quota_us: 200_000,
            period_us: 100_000,
        },
    };
    let got = run_args(&req, &Capabilities::ALL).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "run",
            "--output",
            "json",
            "--name",
            "vm-w",
            "--cpu",
            "4",
            "--cpu-weight",
            "20",
            "--cpu-quota-us",
            "200000",
            "--cpu-period-us",
            "100000",
            // Unparsable quantities pass through unchanged.
            "--memory",
            "lots",
            "--windows",
            "--fc",
            "--no-direct-io",
            "--",
            "win11"
        ])
    );
    let got = run_args(&req, &Capabilities::NONE).expect("args");
    assert!(!got.argv.contains(&"--cpu-weight".to_owned()));
    assert_eq!(got.warnings.len(), 1);
}

#[test]
fn exec_argv_rules() {
    let env: BTreeMap<String, String> = [("Z", "1"), ("A", "x=y")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(
        exec_args("vm1", &argv(&["sh", "-c", "true"]), &env, true).expect("args"),
        argv(&[
            "vm", "exec", "-i", "-e", "A=x=y", "-e", "Z=1", "vm1", "--", "sh", "-c", "true"
        ])
    );
    // No stdin → no -i; a leading -- in argv is preserved.
    assert_eq!(
        exec_args("vm1", &argv(&["--", "ls"]), &BTreeMap::new(), false).expect("args"),
        argv(&["vm", "exec", "vm1", "--", "--", "ls"])
    );
    assert!(exec_args("", &argv(&["ls"]), &BTreeMap::new(), false).is_err());
    assert!(exec_args("vm1", &[], &BTreeMap::new(), false).is_err());
}

#[test]
fn simple_invocations() {
    let ok = |r: Result<Vec<String>>| r.expect("valid arguments");
    let cases: Vec<(Vec<String>, &[&str])> = vec![
        (ok(inspect_args("i")), &["vm", "inspect", "--", "i"]),
        (list_args(), &["vm", "list", "-o", "json"]),
        (ok(remove_args("i")), &["vm", "rm", "--force", "--", "i"]),
        (ok(start_args("i")), &["vm", "start", "--", "i"]),
        (
            ok(logs_args("i", Some(50))),
            &["vm", "logs", "--tail", "50", "--", "i"],
        ),
        (ok(logs_args("i", None)), &["vm", "logs", "--", "i"]),
        (
            ok(net_resize_args("i", 0)),
            &["vm", "net", "--nics", "0", "--", "i"],
        ),
        (
            ok(snapshot_save_args("n", "i")),
            &["snapshot", "save", "--name", "n", "--", "i"],
        ),
        (ok(snapshot_rm_args("n")), &["snapshot", "rm", "--", "n"]),
        (
            ok(snapshot_inspect_args("n")),
            &["snapshot", "inspect", "--", "n"],
        ),
        (snapshot_list_args(), &["snapshot", "list", "-o", "json"]),
        (
            ok(snapshot_import_args("n")),
            &["snapshot", "import", "--name", "n"],
        ),
        (
            ok(snapshot_export_args("n")),
            &["snapshot", "export", "-o", "-", "--", "n"],
        ),
        (
            ok(image_pull_args("r", true)),
            &["image", "pull", "--force", "--", "r"],
        ),
        (
            ok(image_pull_args("r", false)),
            &["image", "pull", "--", "r"],
        ),
        (
            ok(image_inspect_args("r")),
            &["image", "inspect", "--", "r"],
        ),
        (ok(image_import_args("r")), &["image", "import", "--", "r"]),
        (
            watch_args(),
            &["vm", "status", "--event", "--format", "json"],
        ),
        (
            ok(reconcile_stale_create_args("i")),
            &["vm", "reconcile-stale-create", "-o", "json", "--", "i"],
        ),
        (verb_help_args("exec"), &["vm", "exec", "--help"]),
    ];
    for (got, want) in cases {
        assert_eq!(got, argv(want));
    }
}

#[test]
fn values_that_could_read_as_flags_never_reach_argv() {
    let long = "a".repeat(64);
    // (kind, value, accepted)
    let rows: &[(ArgKind, &str, bool)] = &[
        (ArgKind::Vm, "vk-a-demo-0-1a2b3c", true),
        (ArgKind::Vm, "TMZ7IBM3A3KJGYMV6K3ZZMS2EZ", true),
        (ArgKind::Vm, "--force", false),
        (ArgKind::Vm, "-rf", false),
        (ArgKind::Vm, "", false),
        (ArgKind::Vm, "a b", false),
        (ArgKind::Vm, "a/b", false),
        (ArgKind::Vm, long.as_str(), false),
        (ArgKind::Snapshot, "ubuntu:24.04", true),
        (ArgKind::Snapshot, "fork-vk-a", true),
        (ArgKind::Snapshot, "-o", false),
        (ArgKind::Snapshot, "x\ny", false),
        (ArgKind::Image, "ghcr.io/o/img:1", true),
        (ArgKind::Image, "https://cloud.example/img.qcow2", true),
        (ArgKind::Image, "sha256:1b7af784", true),
        (ArgKind::Image, "--force", false),
        (ArgKind::Image, "img --pull", false),
        (ArgKind::Image, "img\t", false),
        (ArgKind::Image, "img\u{7f}", false),
        (ArgKind::Network, "cocoon-dhcp", true),
        (ArgKind::Network, "--bridge=cni0", false),
        (ArgKind::Dir, "/srv/snaps/x", true),
        (ArgKind::Dir, "-x", false),
        (ArgKind::Dir, "/srv/\0x", false),
    ];
    for (kind, value, accepted) in rows {
        let got = check_arg("cocoon test", *kind, value);
        assert_eq!(got.is_ok(), *accepted, "{kind:?} {value:?}: {got:?}");
        if let Err(e) = got {
            assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{e:?}");
            assert!(
                e.to_string().contains("refused before running cocoon"),
                "{e}"
            );
        }
    }
    // Every builder refuses, none builds an argv.
    assert!(remove_args("--all").is_err());
    assert!(inspect_args("-h").is_err());
    assert!(snapshot_rm_args("--help").is_err());
    assert!(snapshot_save_args("-x", "vm").is_err());
    assert!(snapshot_save_args("n", "--force").is_err());
    assert!(snapshot_import_args("-n").is_err());
    assert!(image_pull_args("--force", false).is_err());
    assert!(exec_args("-i", &argv(&["true"]), &BTreeMap::new(), false).is_err());
    let mut req = clone_req();
    req.from = CloneSource::Snapshot("--from-dir=/etc".into());
    assert!(clone_args(&req, &Capabilities::ALL).is_err());
    let mut req = clone_req();
    req.network = "--bridge=cni0".into();
    assert!(clone_args(&req, &Capabilities::ALL).is_err());
    let mut req = clone_req();
    req.to = "-x".into();
    assert!(clone_args(&req, &Capabilities::ALL).is_err());
    let req = RunRequest {
        image: "--windows".into(),
        ..RunRequest::default()
    };
    assert!(run_args(&req, &Capabilities::ALL).is_err());
}

#[test]
fn quantities() {
    let cases: &[(&str, Option<i64>)] = &[
        ("4Gi", Some(4 * 1024 * 1024 * 1024)),
        ("20Gi", Some(21_474_836_480)),
        ("512Mi", Some(536_870_912)),
        ("1G", Some(1_000_000_000)),
        ("1.5Gi", Some(1_610_612_736)),
        ("100", Some(100)),
        ("1e3", Some(1000)),
        ("1500m", Some(2)),
        ("0.1", Some(1)),
        ("-1Ki", Some(-1024)),
        ("", None),
        ("Gi", None),
        ("4GB", None),
        ("1.2.3", None),
        ("99999999Ei", None),
    ];
    for (raw, want) in cases {
        assert_eq!(quantity_bytes(raw), *want, "{raw}");
    }
    assert_eq!(size_arg(" 4Gi "), "4294967296");
    assert_eq!(size_arg("0"), "0");
    assert_eq!(size_arg("huge"), "huge");
    assert_eq!(size_arg("  "), "");
}

fn help(clone: &str, vm: &str, verbs: [Option<&str>; 3]) -> HelpTexts {
    let [exec, logs, net] = verbs.map(|v| v.map(str::to_owned));
    HelpTexts {
        clone: clone.to_owned(),
        vm: vm.to_owned(),
        exec,
        logs,
        net,
    }
}

#[test]
fn capabilities_from_help_text() {
    let new_clone = "Flags:\n  --restore-mode string\n  --on-demand\n  --cpu-weight int\n  --cpu-quota-us int\n  --cpu-period-us int\n  --from-dir string\n";
    let new_vm = "Available Commands:\n  exec    run\n  logs    console log\n  net     resize\n  reconcile-stale-create\n  stop    Stop running VM(s)\n";
    let caps = Capabilities::from_help(&help(
        new_clone,
        new_vm,
        [
            Some("Flags:\n  -e, --env stringArray\n  -i, --interactive   keep stdin open\n"),
            Some("Flags:\n      --tail int   last N lines\n"),
            Some("Flags:\n      --nics int\n"),
        ],
    ));
    assert_eq!(caps, Capabilities::ALL);
    let caps = Capabilities::from_help(&help(
        "Flags:\n  --name string\n  --cpu-weight int\n",
        "",
        [None, None, None],
    ));
    assert_eq!(caps, Capabilities::NONE);
}

#[test]
fn verbs_need_a_listing_and_a_help_of_their_own() {
    let group = "Manage\n\nUsage:\n  cocoon vm [command]\n\nAvailable Commands:\n  clone  Clone\n";
    let leaf = |flags: &str| format!("Usage:\n  cocoon vm x [flags]\n\nFlags:\n{flags}");
    // vm help, the three verb helps, and [exec, -i, logs, --tail, net, --nics].
    type Case = (&'static str, [Option<String>; 3], [bool; 6]);
    let cases: &[Case] = &[
        // Listed, own help with every flag.
        (
            "  exec  a\n  logs  b\n  net  c\n",
            [
                Some(leaf("  -i, --interactive\n")),
                Some(leaf("      --tail int\n")),
                Some(leaf("      --nics int\n")),
            ],
            [true, true, true, true, true, true],
        ),
        // Listed, but the flags are missing (or only mentioned in prose).
        (
            "  exec  a\n  logs  b\n  net  c\n",
            [
                Some(leaf("  -e, --env stringArray   like -i elsewhere\n")),
                Some(leaf("      --tailing\n")),
                Some(leaf("      --nics-max int\n")),
            ],
            [true, false, true, false, true, false],
        ),
        // Not listed: a help text alone does not count.
        (
            "  clone  a\n",
            [
                Some(leaf("  -i\n")),
                Some(leaf("  --tail int\n")),
                Some(leaf("  --nics int\n")),
            ],
            [false; 6],
        ),
        // Listed, but the verb's help is the group help: the verb is missing.
        (
            "  exec  a\n  logs  b\n  net  c\n",
            [
                Some(group.to_owned()),
                Some(group.to_owned()),
                Some(group.to_owned()),
            ],
            [false; 6],
        ),
        // Listed, help unreadable: the verb, none of its flags.
        (
            "  exec  a\n  logs  b\n  net  c\n",
            [None, None, None],
            [true, false, true, false, true, false],
        ),
        // A word in a description line is not a command.
        ("  list   exec logs net\n", [None, None, None], [false; 6]),
        // Outside the commands section, an indented word is not a command.
        (
            "Usage:\n  exec [flags]\n\nAvailable Commands:\n  logs  b\n\nFlags:\n  net\n",
            [None, None, None],
            [false, false, true, false, false, false],
        ),
    ];
    for (vm, verbs, want) in cases {
        let [exec, logs, net] = verbs.clone();
        let caps = Capabilities::from_help(&HelpTexts {
            clone: String::new(),
            vm: (*vm).to_owned(),
            exec,
            logs,
            net,
        });
        let got = [
            caps.exec,
            caps.exec_stdin,
            caps.logs,
            caps.logs_tail,
            caps.net,
            caps.net_nics,
        ];
        assert_eq!(got, *want, "vm help {vm:?}, verbs {verbs:?}");
    }
}

#[test]
fn restore_mode_rules() {
    let valued = Capabilities::ALL;
    let boolean = Capabilities {
        restore_mode: false,
        ..Capabilities::ALL
    };
    let neither = Capabilities::NONE;
    let cases: &[(&Capabilities, &str, RestoreModeFlag)] = &[
        (&valued, "ondemand", RestoreModeFlag::Valued),
        (&valued, "mmap", RestoreModeFlag::Valued),
        (&boolean, "ondemand", RestoreModeFlag::OnDemand),
        (&boolean, "copy", RestoreModeFlag::Default),
        (&boolean, "mmap", RestoreModeFlag::Dropped),
        (&neither, "ondemand", RestoreModeFlag::Dropped),
        (&neither, "copy", RestoreModeFlag::Dropped),
    ];
    for (caps, mode, want) in cases {
        assert_eq!(restore_mode_flag(mode, caps), *want, "{mode} with {caps:?}");
    }
    // In the argv: `--on-demand` where `--restore-mode` would go, before `--nics`.
    let mut req = clone_req();
    req.restore_mode = "ondemand".into();
    req.nics = Some(1);
    let got = clone_args(&req, &boolean).expect("args");
    assert_eq!(
        got.argv,
        argv(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "vm-a",
            "--on-demand",
            "--nics",
            "1",
            "--",
            "snap-a"
        ])
    );
    assert!(got.warnings.is_empty());
    // Firecracker: no restore mode at all.
    req.backend = Some(Backend::Firecracker);
    let got = clone_args(&req, &boolean).expect("args");
    assert!(!got.argv.contains(&"--on-demand".to_owned()));
}
