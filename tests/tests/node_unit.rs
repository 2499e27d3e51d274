//! The node agent's systemd unit (manifests/node/cocoon-node.service): the hardening it carries,
//! the sandbox options it must not carry (they would break the `cocoon` CLI or the VMs'
//! survival of an agent restart), and `systemd-analyze verify` where the host has it.

use std::collections::BTreeMap;
use std::process::Command;

use cocoon_e2e::workspace_root;

fn unit_text() -> String {
    std::fs::read_to_string(workspace_root().join("manifests/node/cocoon-node.service"))
        .expect("read the unit")
}

/// `section -> key -> values` of a unit file (comments and blank lines skipped).
fn parse(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').expect("key=value");
        out.entry(section.clone())
            .or_default()
            .entry(key.trim().to_string())
            .or_default()
            .push(value.trim().to_string());
    }
    out
}

#[test]
fn the_unit_is_hardened_without_breaking_the_runtime() {
    let unit = parse(&unit_text());
    let service = &unit["Service"];
    let one = |key: &str| -> &str {
        match service.get(key).map(Vec::as_slice) {
            Some([v]) => v,
            other => panic!("[Service] {key}: want exactly one value, have {other:?}"),
        }
    };
    assert_eq!(one("ExecStart"), "/usr/local/bin/cocoon-operator node");
    assert_eq!(one("EnvironmentFile"), "/etc/cocoon/node.env");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("LimitNOFILE"), "1048576");
    assert_eq!(one("Restart"), "always");
    assert_eq!(one("RestartSec"), "5s");
    assert_eq!(one("TasksMax"), "infinity");
    // The hypervisors are processes of this unit: stopping the agent must not stop them.
    assert_eq!(one("KillMode"), "process");
    assert_eq!(unit["Unit"]["StartLimitIntervalSec"], ["0"]);
    // READY=1 / WATCHDOG=1 / STOPPING=1 from the agent itself, never from its children.
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("NotifyAccess"), "main");
    assert_eq!(one("WatchdogSec"), "60s");
    // Only a deny list of capabilities: every one the CLI uses stays.
    let caps = one("CapabilityBoundingSet");
    let dropped: Vec<&str> = caps
        .strip_prefix('~')
        .expect("CapabilityBoundingSet= is a deny list (~...)")
        .split_whitespace()
        .collect();
    for needed in [
        "CAP_SYS_ADMIN",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_SYS_MODULE",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_NICE",
        "CAP_IPC_LOCK",
        "CAP_MKNOD",
        "CAP_SYS_CHROOT",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_DAC_OVERRIDE",
        "CAP_CHOWN",
        "CAP_FOWNER",
        "CAP_KILL",
        "CAP_SYS_PTRACE",
        "CAP_BPF",
    ] {
        assert!(
            !dropped.contains(&needed),
            "{needed} must stay: the cocoon CLI, the hypervisors or CNI use it"
        );
    }

    // Each of these breaks the cocoon CLI (KVM, TAP, sysctls, cgroups, root) or puts the unit
    // in a mount namespace of its own, where the CLI's /run/netns bind mounts never reach the
    // host or the next agent.
    for key in [
        "PrivateDevices",
        "DevicePolicy",
        "DeviceAllow",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "User",
        "DynamicUser",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateMounts",
        "ReadWritePaths",
        "ReadOnlyPaths",
        "InaccessiblePaths",
        "BindPaths",
        "TemporaryFileSystem",
        "MountFlags",
        "PrivateNetwork",
    ] {
        assert!(
            !service.contains_key(key),
            "[Service] {key}= must stay out of the node unit (see its header)"
        );
    }
}

/// `systemd-analyze` (package systemd, installed by scripts/setup.sh), failing clearly when
/// absent.
fn systemd_analyze() -> Command {
    let probe = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "systemd-analyze is missing: run scripts/setup.sh (it installs the systemd package)"
    );
    Command::new("systemd-analyze")
}

/// `systemd-analyze verify`: the unit parses, every key is known to this systemd and the rest
/// of it checks out. ExecStart points at an executable that exists here, since the installed
/// path does not.
#[test]
fn systemd_analyze_verifies_the_unit() {
    let _ = systemd_analyze();
    let dir = tempfile::tempdir().expect("temp dir");
    let stand_in = std::env::current_exe().expect("own path");
    let text = unit_text().replace(
        "ExecStart=/usr/local/bin/cocoon-operator node",
        &format!("ExecStart={} node", stand_in.display()),
    );
    assert_ne!(text, unit_text(), "ExecStart was rewritten");
    let path = dir.path().join("cocoon-node.service");
    std::fs::write(&path, text).expect("write the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// The exposure score `systemd-analyze security --offline=true` gives the unit, as documented
/// in its header and manifests/node/INSTALL.md. Lower is better; a change that raises it must
/// update both (and say why in the unit's comments).
const DOCUMENTED_EXPOSURE: f64 = 8.5;

#[test]
fn the_units_security_exposure_is_no_worse_than_documented() {
    let path = workspace_root().join("manifests/node/cocoon-node.service");
    let out = systemd_analyze()
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .expect("run systemd-analyze security");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!(
                "no score: {}\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable score line {line:?}"));
    assert!(
        score <= DOCUMENTED_EXPOSURE,
        "exposure {score} is worse than the documented {DOCUMENTED_EXPOSURE}: {line}"
    );
    let unit = unit_text();
    let install = std::fs::read_to_string(workspace_root().join("manifests/node/INSTALL.md"))
        .expect("read INSTALL.md");
    let documented = format!("{DOCUMENTED_EXPOSURE:.1}");
    for (doc, text) in [("the unit", &unit), ("INSTALL.md", &install)] {
        assert!(
            text.contains(&format!("exposure {documented}")),
            "{doc} documents the exposure score {documented}"
        );
    }
}
