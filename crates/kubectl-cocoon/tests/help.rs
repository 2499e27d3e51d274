//! Help text snapshots: what a new user reads first. `UPDATE_SNAPSHOTS=1 cargo test -p
//! kubectl-cocoon --test help` rewrites them after an intended change.

use std::path::PathBuf;

fn snapshot(name: &str, args: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    assert!(out.stderr.is_empty(), "help goes to stdout");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &out.stdout).expect("write snapshot");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(
        want == got,
        "help of {args:?} changed; review and run with UPDATE_SNAPSHOTS=1\n--- want\n{want}\n--- got\n{got}"
    );
}

#[test]
fn top_level_help() {
    snapshot("help.txt", &["--help"]);
}

/// Every verb's help: examples, described arguments, what it waits for, exit codes, and the
/// connection flags under their own heading.
#[test]
fn every_verb_has_a_golden_help() {
    for verb in [
        "status",
        "describe",
        "suspend",
        "resume",
        "hibernate",
        "wake",
        "migrate",
        "pin",
        "unpin",
        "report",
        "logs",
        "wait",
        "checkpoint",
        "fork",
        "registry",
        "version",
        "completion",
    ] {
        snapshot(&format!("{verb}-help.txt"), &[verb, "--help"]);
    }
    snapshot("registry-gc-help.txt", &["registry", "gc", "--help"]);
}

#[test]
fn verb_help_teaches() {
    for verb in [
        "status",
        "describe",
        "suspend",
        "resume",
        "hibernate",
        "wake",
        "migrate",
        "pin",
        "unpin",
        "report",
        "logs",
        "wait",
        "checkpoint",
        "fork",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .args([verb, "--help"])
            .output()
            .expect("run");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("\nExamples:\n"), "{verb}: {help}");
        assert!(help.contains("In CI"), "{verb}: CI example");
        assert!(
            help.contains("\nWaits for: "),
            "{verb}: which phase it waits for"
        );
        assert!(
            help.contains("\nExit codes:\n  0  success"),
            "{verb}: exit codes"
        );
        assert!(
            help.contains("\nConnection options:\n      --kubeconfig"),
            "{verb}: heading"
        );
        let options = help
            .split("\nConnection options:")
            .next()
            .unwrap_or_default();
        assert!(
            !options.contains("--kubeconfig"),
            "{verb}: connection flags apart"
        );
        assert!(!help.contains("-V, --version"), "{verb}: no -V on a verb");
        assert!(
            !help.contains("  [NAMES]...  \n"),
            "{verb}: arguments are described"
        );
    }
}

/// `wait` only reads: its help never claims that something was written.
#[test]
fn wait_help_says_nothing_is_written() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(["wait", "--help"])
        .output()
        .expect("run");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("130  interrupted (Ctrl-C); nothing was written"),
        "{help}"
    );
    assert!(!help.contains("write already happened"), "{help}");
    assert!(!help.contains("written first"), "{help}");
}

#[test]
fn version_flag_only_at_the_top() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
        .args(["suspend", "-V"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn static_completion_scripts_do_not_offer_the_hidden_protocol_verbs() {
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-cocoon"))
            .args(["completion", shell])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(!script.contains("__complete"), "{shell} offers __complete");
        assert!(script.contains("registry"), "{shell}: registry");
        assert!(script.contains("field-manager"), "{shell}: verb flags");
    }
}
