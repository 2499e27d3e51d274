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
        "CapabilityBoundingSet",
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

/// `systemd-analyze verify` where systemd is installed (skipped otherwise): the unit parses,
/// every key is known to this systemd and the rest of it checks out. ExecStart points at an
/// executable that exists here, since the installed path does not.
#[test]
fn systemd_analyze_verifies_the_unit() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: skipped");
        return;
    };
    assert!(probe.status.success(), "systemd-analyze --version failed");
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
