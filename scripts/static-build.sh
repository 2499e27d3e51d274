# static-build.sh -- sourced by image.sh and release.sh: the workspace version and the one static
# release build of both binaries they share (one feature set, so each reuses the other's build).
# Needs $root (the repository) and a log function; sets $version, $triple and $target_dir.

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
[ -n "$version" ] || { echo "$(basename "$0"): no version in [workspace.package] of Cargo.toml" >&2; exit 1; }
triple=x86_64-unknown-linux-gnu
target_dir=${CARGO_TARGET_DIR:-$root/target}

# static_binary NAME: builds both binaries (release, static, $triple) and prints the path of NAME,
# refusing one that is not statically linked.
static_binary() {
  # --target keeps the static flag off build scripts and proc macros, which must stay dynamic.
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --quiet --locked --release -p cocoon-bin -p kubectl-cocoon --target "$triple" >&2
  local bin="$target_dir/$triple/release/$1"
  if ! ldd "$bin" 2>&1 | grep -Eq 'not a dynamic executable|statically linked'; then
    echo "$(basename "$0"): $bin is not statically linked:" >&2; ldd "$bin" >&2 || true; exit 1
  fi
  printf '%s\n' "$bin"
}
