//! Usage errors the plugin binary reports before it talks to any cluster: exit code 2 and a
//! message naming the flag, never a panic.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-cocoon");
    assert!(
        out.stdout.is_empty(),
        "usage errors print nothing on stdout"
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn out_of_range_durations_are_usage_errors_naming_the_flag() {
    let huge_digits = format!("{}s", "9".repeat(400));
    for (flag, value) in [
        ("--timeout", "99999999999999999999h"),
        ("--timeout", huge_digits.as_str()),
        ("--failure-grace", "99999999999999999999h"),
        ("--request-timeout", "99999999999999999999h"),
    ] {
        let (code, stderr) = run(&["suspend", "demo", flag, value]);
        assert_eq!(code, Some(2), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("out of range"),
            "{flag} {value}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn until_takes_only_phases_of_the_targets_kind_and_only_where_it_applies() {
    for args in [
        &["hibernate", "x", "--until", "Suspended"][..],
        &["suspend", "x", "--until", "Hibernated"],
        &["resume", "x", "--until", "Active"],
        &["wake", "cocoonset/x", "--until", "Active"],
        &["wake", "x", "--until", "Running"],
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--until"), "{args:?}: {stderr}");
    }
    for args in [
        &["pin", "demo", "node-a", "--until", "Running"][..],
        &["unpin", "demo", "--until", "Running"],
        &["migrate", "demo", "--to", "n", "--until", "Running"],
        &["status", "--until", "Running"],
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--until'"),
            "{args:?}: {stderr}"
        );
    }
}

/// Targets are checked before any connection: names or `-l`/`-A` (not both, not neither),
/// and `wait`'s kinds and `--for` phase.
#[test]
fn lifecycle_verbs_check_their_targets_before_they_connect() {
    for (args, says) in [
        (&["suspend"][..], "name at least one CocoonSet"),
        (&["resume"], "name at least one CocoonSet"),
        (&["hibernate"], "name at least one pod"),
        (&["wake"], "name at least one pod or cocoonset/NAME"),
        (&["suspend", "demo", "-A"], "not both"),
        (&["hibernate", "demo-0", "-l", "team=a"], "not both"),
        (&["wake", "cocoonset/demo", "-A"], "not both"),
        (&["wait", "cocoonset/x", "--for=Bogus"], "--for"),
        (&["wait", "pod/x", "--for=Suspended"], "--for"),
        (&["wait", "x", "pod/y", "--for=Running"], "--for"),
        (&["wait", "deployment/x", "--for=Running"], "deployment"),
        (&["wait", "--for=Running"], "name at least one target"),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} says {says}: {stderr}");
        assert!(!stderr.contains("kubeconfig"), "{args:?}: {stderr}");
    }
}

#[test]
fn dry_run_needs_an_equals_sign_and_output_formats_follow_the_verb() {
    let (code, stderr) = run(&["suspend", "demo", "--dry-run=sometimes"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--dry-run"), "{stderr}");
    let (code, stderr) = run(&["suspend", "demo", "--wait=maybe"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--wait"), "{stderr}");
    for args in [
        &["suspend", "demo", "-o", "wide"][..],
        &["version", "-o", "name"],
        &["status", "-o", "jsonpath={.items[}"],
        &["status", "-o", "table"],
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--output"), "{args:?}: {stderr}");
    }
}

/// Every on/off flag takes `=true|false` as kubectl's do (`-f=true`, `--no-headers=false`);
/// a bad value is a usage error naming the flag. The accepted forms get past parsing and
/// fail only at the missing kubeconfig, or succeed offline (`version --client=true`).
#[test]
fn every_on_off_flag_takes_true_or_false() {
    let missing = "--kubeconfig=/nonexistent/kubeconfig";
    for args in [
        &[
            "status",
            "-A=true",
            "--no-headers=true",
            "-w=false",
            missing,
        ][..],
        &["status", "--all-namespaces=false", "--watch=false", missing],
        &["logs", "demo", "-f=true", missing],
        &["logs", "demo", "--follow=false", missing],
        &["migrate", "demo", "--cancel=true", missing],
        &[
            "registry",
            "gc",
            "--registry=127.0.0.1:1",
            "--include-latest=true",
            missing,
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .output()
            .expect("run kubectl-cocoon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("failed to read kubeconfig"),
            "{args:?} did not get past parsing: {stderr}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(["version", "--client=true", "-o", "json"])
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-cocoon");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (args, flag) in [
        (&["logs", "demo", "-f=maybe"][..], "--follow"),
        (&["status", "--no-headers=yes"], "--no-headers"),
        (&["status", "-A=1"], "--all-namespaces"),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

/// Output into a pipe that is already closed (`… | head -1` once head exited) ends the plugin
/// quietly, as kubectl does: no panic, no backtrace.
#[test]
fn a_closed_stdout_pipe_ends_the_plugin_quietly() {
    for args in [
        &["completion", "bash"][..],
        &["version", "--client", "-o", "yaml"],
        &["--help"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .args(args)
            .env_remove("KUBECONFIG")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run kubectl-cocoon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
    }
}
