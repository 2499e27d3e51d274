//! Build script of both binary crates (`cocoon-bin`, `kubectl-cocoon`, whose Cargo.toml
//! name it): embeds the git revision the binary is built from as `COCOON_GIT_REVISION` (`git
//! rev-parse --short HEAD`; `unknown` outside a git checkout). Setting `COCOON_GIT_REVISION` in
//! the environment overrides it, for builds from a source archive.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=COCOON_GIT_REVISION");
    let revision = match std::env::var("COCOON_GIT_REVISION") {
        Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
        _ => git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into()),
    };
    // A path inside the package, which cargo keeps relative to the package root: a fresh
    // checkout (its files newer than the last run) reruns this script even when the target
    // dir is shared with another checkout, whose git files below are recorded by absolute path
    // and have not moved (a worktree's git paths are absolute).
    println!("cargo:rerun-if-changed=Cargo.toml");
    // Rebuild when HEAD moves: HEAD itself, the branch it points at, and packed refs. Only
    // existing files: cargo reruns a build script on every build for a missing one.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rustc-env=COCOON_GIT_REVISION={revision}");
}
