//! Where the harness finds its binaries: the upstream control plane built by
//! `upstream/build.sh` and the registry extracted by `fetch-registry.sh`.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The tools module pin, embedded at compile time so the bin dir follows `go.mod`.
const GO_MOD: &str = include_str!("../upstream/go.mod");

/// Script that builds the upstream binaries.
pub const BUILD_SCRIPT: &str = "crates/cocoon-testenv/upstream/build.sh";
/// Script that extracts Debian's docker-registry.
pub const FETCH_REGISTRY_SCRIPT: &str = "crates/cocoon-testenv/fetch-registry.sh";

/// Upstream binaries the control plane needs.
pub const UPSTREAM_BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// Upstream binaries only the optional kubelet node needs (built by the same script).
pub const KUBELET_BINARIES: [&str; 2] = ["kubelet", "pause"];

/// The Kubernetes version pinned in `upstream/go.mod` (`k8s.io/kubernetes vX.Y.Z`).
pub fn k8s_version() -> &'static str {
    parse_k8s_version(GO_MOD).unwrap_or("unknown")
}

/// Finds `k8s.io/kubernetes <version>` either inside a `require (...)` block or on a
/// single-line `require`.
fn parse_k8s_version(go_mod: &str) -> Option<&str> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let mut first = words.next()?;
        if first == "require" {
            first = words.next()?;
        }
        if first != "k8s.io/kubernetes" {
            return None;
        }
        words.next().filter(|v| v.starts_with('v'))
    })
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv`, the same root the scripts use.
pub fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("cocoon-testenv")
}

/// The upstream bin dir: `$TESTENV_BIN`, else the build script's cache directory.
pub fn default_bin_dir() -> PathBuf {
    match std::env::var_os("TESTENV_BIN").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_root().join(k8s_version()).join("bin"),
    }
}

/// The registry binary: `$TESTENV_REGISTRY_BIN`, else the fetch script's cache path,
/// else the system package's path (the first that exists; the cache path if none does).
pub fn default_registry_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TESTENV_REGISTRY_BIN").filter(|v| !v.is_empty()) {
        return PathBuf::from(bin);
    }
    let cached = cache_root().join("registry/usr/bin/docker-registry");
    let system = PathBuf::from("/usr/bin/docker-registry");
    if !is_executable(&cached) && is_executable(&system) {
        system
    } else {
        cached
    }
}

/// Checks that every upstream binary exists in `dir`.
pub fn check_bin_dir(dir: &Path) -> Result<()> {
    for name in UPSTREAM_BINARIES {
        let path = dir.join(name);
        if !is_executable(&path) {
            return Err(Error::MissingBinary {
                what: name.to_string(),
                path,
                script: BUILD_SCRIPT,
            });
        }
    }
    Ok(())
}

/// Checks that the registry binary exists.
pub fn check_registry_bin(path: &Path) -> Result<()> {
    if is_executable(path) {
        Ok(())
    } else {
        Err(Error::MissingBinary {
            what: "docker-registry".to_string(),
            path: path.to_path_buf(),
            script: FETCH_REGISTRY_SCRIPT,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The snapshot fixtures recorded from cocoon-common v0.3.0
/// (`shared/fixtures/cocoon-common-v0.3.0-snapshots`), found in a `shared` directory beside
/// or above the workspace. Panics when they are not there.
pub fn snapshot_fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for up in here.ancestors() {
        for shared in [up.join("shared"), up.join("../shared")] {
            let p = shared.join("fixtures/cocoon-common-v0.3.0-snapshots");
            if p.join("README.md").exists() {
                return p;
            }
        }
    }
    panic!("fixtures/cocoon-common-v0.3.0-snapshots not found above {here:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_block_and_single_line_requires() {
        let block = "module x\n\nrequire (\n\tfoo v1\n\tk8s.io/kubernetes v1.36.3 // indirect\n)\n";
        assert_eq!(parse_k8s_version(block), Some("v1.36.3"));
        assert_eq!(
            parse_k8s_version("require k8s.io/kubernetes v1.37.2\n"),
            Some("v1.37.2")
        );
        assert_eq!(
            parse_k8s_version("replace k8s.io/api => k8s.io/api v0.36.3"),
            None
        );
    }

    #[test]
    fn embedded_pin_is_found() {
        assert!(k8s_version().starts_with("v1."), "{}", k8s_version());
    }
}
