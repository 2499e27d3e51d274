//! The recorded `cocoon` CLI v0.3.8 and its replay stand-in, shared by the runtime's
//! `runtime_cli_v038.rs` and the node agent's `node_cli_v038.rs`.
//!
//! Runtime tests include it with `mod cli_v038;`, the node agent's test with
//! `#[path = "../../cocoon-runtime/tests/cli_v038/mod.rs"] mod cli_v038;`. Not every includer
//! uses every helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cocoon_runtime::cli::{CliConfig, CliRuntime};

/// The id and name of the VM the captures were made with.
pub const VM_ID: &str = "TMZ7IBM3A3KJGYMV6K3ZZMS2EZ";
pub const VM_NAME: &str = "vk-ns-demo-0";

/// `shared/fixtures/cocoon-cli-v0.3.8` beside the repository (or under `COCOON_SHARED_DIR`).
pub fn fixtures() -> PathBuf {
    let shared = std::env::var_os("COCOON_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("fixtures/cocoon-cli-v0.3.8");
    assert!(
        dir.join("README.md").is_file(),
        "the cocoon CLI v0.3.8 recordings are missing: expected {} (the repository's parent \
         directory must contain shared/fixtures/cocoon-cli-v0.3.8; set COCOON_SHARED_DIR to the \
         shared/ directory if it lives elsewhere)",
        dir.display()
    );
    dir
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = fixtures().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read fixture {}: {e}", path.display()))
}

pub fn fixture_text(name: &str) -> String {
    String::from_utf8(fixture(name)).expect("fixture is UTF-8")
}

/// The replay stand-in: one `case` arm per recorded invocation (ids and names as in the
/// captures). The agent puts `--` before positionals (issue 26); the captures were made
/// without it, which cobra parses to the same arguments, so the arms match the `--` form. A flag the release lacks fails in its flag parser whatever the other
/// arguments, and a verb it lacks (also `<verb> --help`) prints the `vm` help with status 0,
/// so those arms match any arguments.
pub const REPLAY: &str = r#"#!/bin/sh
fix='@FIX@'
printf '%s\n' "$*" >> '@LOG@'
play() {
  cat "$fix/$1.out"
  cat "$fix/$1.err" >&2
  exit "$(cat "$fix/$1.code")"
}
case "$*" in
  "vm --help"|"vm exec --help"|"vm logs --help"|"vm net --help") play vm_help ;;
  "vm clone --help") play vm_clone_help ;;
  "vm list -o json") play vm_list ;;
  "vm inspect -- @ID@"|"vm inspect -- @NAME@") play vm_inspect ;;
  "vm inspect -- nosuchvm") play vm_inspect_missing ;;
  "vm rm --force -- nosuchvm") play vm_rm_missing ;;
  "vm start -- nosuchvm") play vm_start_missing ;;
  "vm exec -i "*) play vm_exec_i ;;
  "vm exec "*) play vm_exec ;;
  "vm logs --tail "*) play vm_logs ;;
  "vm net --nics "*) play vm_net ;;
  "vm clone "*" nosuchsnap") play vm_clone_missing ;;
  "vm status --event --format json")
    cat "$fix/events.out"
    cat "$fix/events.err" >&2
    # The real command keeps watching until it is killed.
    exec sleep 3600 ;;
  "snapshot list -o json") play snap_list ;;
  "snapshot inspect -- vk-a") play snap_inspect ;;
  "snapshot inspect "*) play snap_inspect_missing ;;
  "snapshot rm -- nosuch") play snap_rm_missing ;;
  "snapshot save --name "*" nosuchvm") play snap_save_novm ;;
  "snapshot save --name vk-a "*) play snap_save_dup ;;
  "snapshot import --name vk-a") cat > /dev/null; play snap_import_dup ;;
  "snapshot export -o - -- @NAME@") cat "$fix/snapshot-export.tar"; exit 0 ;;
  "image inspect -- tinyimg") play image_inspect ;;
  "image inspect -- ubuntu:24.04") play image_inspect_missing ;;
  *) echo "cocoon-replay: no v0.3.8 recording for: cocoon $*" >&2; exit 97 ;;
esac
"#;

/// A temp dir holding the replay stand-in and its call log.
pub struct Replay {
    pub dir: tempfile::TempDir,
}

/// Writes an executable through another process (see `runtime_cli.rs`: a file this process
/// held open for writing could be inherited by a concurrently forked child → ETXTBSY).
pub fn install_script(dir: &Path, name: &str, text: &str) -> PathBuf {
    let src = dir.join(format!("{name}.src"));
    std::fs::write(&src, text).expect("write script");
    let dst = dir.join(name);
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&src)
        .arg(&dst)
        .status()
        .expect("run install");
    assert!(status.success(), "install {name}");
    dst
}

impl Replay {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let script = REPLAY
            .replace("@FIX@", &fixtures().display().to_string())
            .replace("@LOG@", &dir.path().join("calls").display().to_string())
            .replace("@ID@", VM_ID)
            .replace("@NAME@", VM_NAME);
        install_script(dir.path(), "cocoon", &script);
        Replay { dir }
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.path().join("cocoon")
    }

    pub fn config(&self) -> CliConfig {
        CliConfig::new(self.bin())
    }

    pub async fn detect(&self) -> CliRuntime {
        CliRuntime::detect(self.config()).await
    }

    /// Every invocation so far, arguments joined by spaces.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}
