//! The two `cocoon` CLI releases the runtime supports (issue 40): v0.3.8 (recorded help of
//! `vm` and `vm clone`, the other verbs' help derived from source) and v0.5.9 (derived from
//! source, not recorded; `tests/fixtures/cocoon-v0.5.9/README.md`).
//!
//! * every flag of every argv the runtime builds appears in that verb's help, for the
//!   capabilities detected on each release;
//! * capability detection from each release's help texts, through a stand-in that serves them;
//! * v0.5.x's records (new fields, `null` NIC entries, `[]`, a record that does not decode);
//! * cocoon's own exec failures are runtime errors, the guest's exit 1 stays `ExitCode(1)`;
//! * `vm stop --timeout` reaches both releases; snapshot names follow v0.5.x's rule.

mod cli_v038;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cocoon_api::contract::Backend;
use cocoon_runtime::args::{self, lists_flag, lists_verb};
use cocoon_runtime::cli::{CliConfig, CliRuntime};
use cocoon_runtime::parse::parse_vm_list;
use cocoon_runtime::{
    Capabilities, CloneRequest, CloneSource, CpuPolicy, HelpTexts, RunRequest, Runtime,
    RuntimeError, exec_capture,
};

use cli_v038::install_script;

fn derived(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
}

/// A supported release and where its help texts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    V038,
    V059,
}

const RELEASES: [Release; 2] = [Release::V038, Release::V059];

impl Release {
    /// `cocoon <group> [<verb>] --help`, from the recording where there is one.
    fn help(self, group: &str, verb: Option<&str>) -> Option<String> {
        let name = match verb {
            Some(v) => format!("{group}_{v}_help.out"),
            None => format!("{group}_help.out"),
        };
        let path = match self {
            Release::V038 if name == "vm_help.out" || name == "vm_clone_help.out" => {
                cli_v038::fixtures().join(&name)
            }
            Release::V038 => derived("cocoon-v0.3.8-derived").join(&name),
            Release::V059 => derived("cocoon-v0.5.9").join(&name),
        };
        std::fs::read_to_string(path).ok()
    }

    fn help_texts(self) -> HelpTexts {
        let vm = self.help("vm", None).expect("vm help");
        let verb = |v: &str| {
            lists_verb(&vm, v)
                .then(|| self.help("vm", Some(v)))
                .flatten()
        };
        HelpTexts {
            clone: self.help("vm", Some("clone")).expect("clone help"),
            exec: verb("exec"),
            logs: verb("logs"),
            net: verb("net"),
            vm,
        }
    }

    /// What each release has, per its sources.
    fn expected_caps(self) -> Capabilities {
        match self {
            Release::V038 => Capabilities {
                on_demand: true,
                stop: true,
                ..Capabilities::NONE
            },
            Release::V059 => Capabilities {
                on_demand: false,
                ..Capabilities::ALL
            },
        }
    }
}

/// Every argv the runtime builds, with every optional flag it can emit under `caps`.
fn every_argv(caps: &Capabilities) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut clone = CloneRequest::from_snapshot("vk-a", "vk-b");
    clone.network = "cocoon".into();
    clone.no_direct_io = true;
    clone.pull = true;
    clone.nics = Some(2);
    clone.cpu_policy = CpuPolicy {
        weight: 100,
        quota_us: 50_000,
        period_us: 100_000,
    };
    for mode in ["copy", "ondemand", "mmap"] {
        clone.restore_mode = mode.into();
        out.push(args::clone_args(&clone, caps).expect("clone").argv);
    }
    if caps.from_dir {
        clone.from = CloneSource::Dir(PathBuf::from("/var/lib/cocoon/golden"));
        out.push(args::clone_args(&clone, caps).expect("clone dir").argv);
    }
    for (os, backend) in [
        ("linux", Backend::Firecracker),
        ("windows", Backend::CloudHypervisor),
    ] {
        let run = RunRequest {
            image: "ghcr.io/cocoonstack/cocoon/ubuntu:24.04".into(),
            name: "vk-r".into(),
            cpu: 2,
            memory: "1Gi".into(),
            storage: "10Gi".into(),
            network: "cocoon".into(),
            os: os.into(),
            backend: Some(backend),
            no_direct_io: true,
            cpu_policy: clone.cpu_policy,
        };
        out.push(args::run_args(&run, caps).expect("run").argv);
    }
    let id = "K4N2QZ7YB3D5FJ6M8P0R1S2T3U";
    if caps.exec {
        let env: BTreeMap<String, String> = [("A".to_owned(), "1".to_owned())].into();
        let guest = ["sh".to_owned(), "-c".to_owned(), "true --x".to_owned()];
        out.push(args::exec_args(id, &guest, &env, caps.exec_stdin).expect("exec"));
    }
    if caps.logs {
        out.push(args::logs_args(id, Some(10).filter(|_| caps.logs_tail)).expect("logs"));
    }
    if caps.net && caps.net_nics {
        out.push(args::net_resize_args(id, 0).expect("net"));
    }
    if caps.reconcile_stale_create {
        out.push(args::reconcile_stale_create_args(id).expect("reconcile"));
    }
    if caps.stop {
        out.push(args::stop_args(id, 7).expect("stop"));
    }
    out.extend([
        args::inspect_args(id).expect("inspect"),
        args::list_args(),
        args::remove_args(id).expect("rm"),
        args::start_args(id).expect("start"),
        args::watch_args(),
        args::snapshot_save_args("vk-a", id).expect("save"),
        args::snapshot_rm_args("vk-a").expect("snapshot rm"),
        args::snapshot_inspect_args("vk-a").expect("snapshot inspect"),
        args::snapshot_list_args(),
        args::snapshot_import_args("vk-a").expect("import"),
        args::snapshot_export_args("vk-a").expect("export"),
        args::image_pull_args("ghcr.io/x/y:1", true).expect("pull"),
        args::image_inspect_args("ghcr.io/x/y:1").expect("image inspect"),
        args::image_import_args("local-img").expect("image import"),
    ]);
    out
}

/// `(group, verb, flags)` of an argv: the two leading words, then every token that starts
/// with `-` up to the first `--` (what follows it is a positional or the guest's argv); a lone
/// `-` is a value (`-o -`: stdout).
fn split(argv: &[String]) -> (&str, &str, Vec<&str>) {
    let flags = argv[2..]
        .iter()
        .take_while(|t| *t != "--")
        .filter(|t| t.starts_with('-') && t.len() > 1)
        .map(String::as_str)
        .collect();
    (&argv[0], &argv[1], flags)
}

#[test]
fn every_flag_we_build_is_in_its_verbs_help_on_both_releases() {
    for release in RELEASES {
        let caps = Capabilities::from_help(&release.help_texts());
        let mut checked = 0;
        for argv in every_argv(&caps) {
            let (group, verb, flags) = split(&argv);
            let group_help = release
                .help(group, None)
                .or_else(|| (group != "vm").then(String::new))
                .expect("group help");
            if group == "vm" {
                assert!(
                    lists_verb(&group_help, verb),
                    "{release:?}: `cocoon vm --help` does not list {verb} ({argv:?})"
                );
            }
            let help = release
                .help(group, Some(verb))
                .unwrap_or_else(|| panic!("{release:?}: no help for {group} {verb}"));
            for flag in flags {
                assert!(
                    lists_flag(&help, flag),
                    "{release:?}: `cocoon {group} {verb} --help` does not list {flag} ({argv:?})"
                );
                checked += 1;
            }
        }
        assert!(checked > 30, "{release:?}: only {checked} flags checked");
    }
}

/// The check above can fail: a flag a release lacks is caught.
#[test]
fn a_flag_missing_from_the_help_is_caught() {
    let v038 = Release::V038;
    let clone = v038.help("vm", Some("clone")).expect("help");
    assert!(!lists_flag(&clone, "--restore-mode"));
    assert!(!lists_flag(&clone, "--from-dir"));
    let v059 = Release::V059;
    let clone = v059.help("vm", Some("clone")).expect("help");
    assert!(!lists_flag(&clone, "--on-demand"), "v0.5.x dropped it");
    // Forcing v0.5.x's restore mode on v0.3.8 builds a flag its help lacks.
    let argv = args::clone_args(
        &CloneRequest {
            restore_mode: "mmap".into(),
            ..CloneRequest::from_snapshot("vk-a", "vk-b")
        },
        &Capabilities::ALL,
    )
    .expect("clone")
    .argv;
    let (_, _, flags) = split(&argv);
    let clone = v038.help("vm", Some("clone")).expect("help");
    assert!(flags.iter().any(|f| !lists_flag(&clone, f)), "{argv:?}");
}

#[test]
fn capabilities_of_both_releases_from_their_help() {
    for release in RELEASES {
        assert_eq!(
            Capabilities::from_help(&release.help_texts()),
            release.expected_caps(),
            "{release:?}"
        );
    }
}

/// A stand-in `cocoon` serving one release's help texts (any other call exits 97), logging
/// its calls.
fn help_stand_in(dir: &Path, release: Release) -> PathBuf {
    let mut arms = String::new();
    let mut files = vec![("vm --help".to_owned(), release.help("vm", None))];
    for verb in [
        "clone",
        "exec",
        "logs",
        "net",
        "stop",
        "rm",
        "run",
        "start",
        "status",
        "reconcile-stale-create",
    ] {
        files.push((format!("vm {verb} --help"), release.help("vm", Some(verb))));
    }
    for (i, (call, text)) in files.into_iter().enumerate() {
        let Some(text) = text else { continue };
        let file = dir.join(format!("help{i}"));
        std::fs::write(&file, text).expect("write help");
        arms.push_str(&format!("  \"{call}\") cat '{}' ;;\n", file.display()));
    }
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\ncase \"$*\" in\n{arms}  \"vm stop --timeout \"*) echo stopped; exit 0 ;;\n  *) echo \"no such call: $*\" >&2; exit 97 ;;\nesac\n",
        log = dir.join("calls").display()
    );
    install_script(dir, "cocoon", &script)
}

#[tokio::test]
async fn capability_detection_reads_both_releases() {
    for release in RELEASES {
        let dir = tempfile::tempdir().expect("tmp");
        let bin = help_stand_in(dir.path(), release);
        let rt = CliRuntime::detect(CliConfig::new(&bin)).await;
        assert_eq!(rt.capabilities(), release.expected_caps(), "{release:?}");
        // The stop reaches both releases as `vm stop --timeout N -- <id>`.
        rt.stop("vk-a", Duration::from_secs(7)).await.expect("stop");
        let calls = std::fs::read_to_string(dir.path().join("calls")).expect("calls");
        assert_eq!(
            calls.lines().last(),
            Some("vm stop --timeout 7 -- vk-a"),
            "{release:?}"
        );
    }
}

#[tokio::test]
async fn a_cli_without_vm_stop_is_unsupported_before_running() {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = install_script(dir.path(), "cocoon", "#!/bin/sh\nexit 97\n");
    let caps = Capabilities {
        stop: false,
        ..Capabilities::ALL
    };
    let rt = CliRuntime::with_capabilities(CliConfig::new(bin), caps);
    let err = rt
        .stop("vk-a", Duration::from_secs(3))
        .await
        .expect_err("no stop");
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    // A zero timeout still asks for one second: cocoon reads 0 as its configured default.
    assert_eq!(
        args::stop_args("vk-a", 0).expect("args"),
        ["vm", "stop", "--timeout", "1", "--", "vk-a"]
    );
}

fn v059(name: &str) -> Vec<u8> {
    std::fs::read(derived("cocoon-v0.5.9").join(name)).expect("fixture")
}

#[test]
fn v059_records_decode_without_failing_the_list() {
    let vms = parse_vm_list("cocoon vm list", &v059("vm_list.out")).expect("list");
    assert_eq!(vms.len(), 3, "no record is lost");
    let ch = &vms[0];
    assert_eq!(ch.name(), "vk-ns-demo-0-505043");
    assert_eq!(ch.hypervisor, "cloud-hypervisor");
    assert!(ch.is_running());
    assert_eq!(ch.pid, 41872);
    assert_eq!(
        ch.network_configs.len(),
        1,
        "the null NIC entry carries nothing"
    );
    assert_eq!(ch.mac(), "aa:bb:cc:00:11:22");
    assert_eq!(ch.ip(), "10.88.0.5");
    assert_eq!(ch.extra["transition_generation"], 3);
    assert!(ch.extra.contains_key("vsock_socket"));
    assert_eq!(ch.config.extra["cpu_weight"], 200);
    let fc = &vms[1];
    assert_eq!(fc.hypervisor, "firecracker");
    assert_eq!(fc.state, "stopped");
    assert!(fc.network_configs.is_empty(), "network_configs: null");
    // The record whose config does not decode keeps what the agent needs.
    let broken = &vms[2];
    assert_eq!(broken.id, "Q1W2E3R4T5Y6U7I8O9P0A1S2D3");
    assert_eq!(broken.name(), "vk-ns-demo-2-c0ffee");
    assert_eq!(broken.state, "error");
    assert_eq!(broken.hypervisor, "cloud-hypervisor");
    // An empty list is `[]` on v0.5.x, `No VMs found.` on v0.3.8.
    assert!(
        parse_vm_list("c", &v059("vm_list_empty.out"))
            .expect("[]")
            .is_empty()
    );
    assert!(
        parse_vm_list("c", &cli_v038::fixture("vm_list.out"))
            .expect("v0.3.8 list")
            .iter()
            .all(|vm| !vm.id.is_empty())
    );
    // Not JSON at all still fails the list.
    assert!(parse_vm_list("c", b"Error: boom").is_err());
}

/// A stand-in that plays one capture (`NAME.out`, `.err`, `.code`) of the v0.5.9 fixtures.
fn play(dir: &Path, name: &str) -> PathBuf {
    let fix = derived("cocoon-v0.5.9").join(name);
    let script = format!(
        "#!/bin/sh\ncat '{f}.out'\ncat '{f}.err' >&2\nexit \"$(cat '{f}.code')\"\n",
        f = fix.display()
    );
    install_script(dir, &format!("cocoon-{name}"), &script)
}

#[tokio::test]
async fn cocoons_own_exec_failures_are_runtime_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    for (capture, guest_exit) in [
        ("vm_exec_agent_down", false),
        ("vm_exec_no_vsock", false),
        ("vm_exec_guest_exit1", true),
    ] {
        let bin = play(dir.path(), capture);
        let rt = CliRuntime::with_capabilities(CliConfig::new(bin), Capabilities::ALL);
        let out = exec_capture(&rt, "vk-a", &["cat", "/nope"], None).await;
        let err = out.result.expect_err(capture);
        if guest_exit {
            assert_eq!(err.exit_code(), Some(1), "{capture}: {err:?}");
        } else {
            assert_eq!(err.exit_code(), None, "{capture}: {err:?}");
            assert!(matches!(err, RuntimeError::Other(_)), "{capture}: {err:?}");
            assert!(err.to_string().contains("Error: exec: "), "{err}");
        }
        // The caller still sees everything the CLI printed.
        assert_eq!(
            out.stderr,
            std::fs::read(derived("cocoon-v0.5.9").join(format!("{capture}.err"))).expect("err")
        );
    }
}

#[tokio::test]
async fn v059_logs_are_the_hypervisors_log() {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = play(dir.path(), "vm_logs");
    let rt = CliRuntime::with_capabilities(CliConfig::new(bin), Capabilities::ALL);
    let got = rt.logs("vk-a", Some(2)).await.expect("logs");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "cloud-hypervisor: 0.051904s: <vcpu0> INFO:devices/src/acpi.rs:96 -- ACPI Reboot signalled\n\
         cloud-hypervisor: 12.308115s: <vmm> INFO:vmm/src/lib.rs:2158 -- API request event: VmShutdown\n"
    );
}

#[test]
fn snapshot_names_follow_the_stricter_rule_of_both_releases() {
    for bad in ["repo@sha256:abc", "vk-a@1", "-x", "", &"a".repeat(64)] {
        let err = args::snapshot_save_args(bad, "vk-a").expect_err(bad);
        assert!(
            matches!(err, RuntimeError::InvalidArgument(_)),
            "{bad}: {err:?}"
        );
        assert!(
            err.to_string()
                .contains("^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$"),
            "{err}"
        );
        assert!(args::snapshot_import_args(bad).is_err(), "{bad}");
    }
    for good in [
        "vk-a",
        "ghcr.io/cocoonstack/ubuntu:24.04",
        "fork-vk-a.b_c",
        &"a".repeat(63),
    ] {
        args::snapshot_save_args(good, "vk-a").expect(good);
    }
}
