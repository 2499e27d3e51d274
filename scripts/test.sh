#!/usr/bin/env bash
# test.sh -- the project's test command: set-up, lint, then every test of the workspace against
# ONE shared local control plane + registry (started here, torn down at exit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

"$root/scripts/setup.sh"

echo "==> cargo fmt --check" >&2
cargo fmt --all -- --check
echo "==> cargo clippy" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "==> build" >&2
cargo build --workspace --all-targets --quiet

work=$(mktemp -d)
envpid=""
cleanup() {
  status=$?
  if [ -n "$envpid" ] && kill -0 "$envpid" 2>/dev/null; then
    kill -TERM "$envpid" 2>/dev/null || true
    wait "$envpid" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT INT TERM

echo "==> starting the shared test environment" >&2
"${CARGO_TARGET_DIR:-$root/target}/debug/cocoon-testenv" up --env-file "$work/env" >"$work/testenv.log" 2>&1 &
envpid=$!
for _ in $(seq 1 600); do
  [ -s "$work/env" ] && break
  if ! kill -0 "$envpid" 2>/dev/null; then
    echo "test environment failed to start:" >&2; cat "$work/testenv.log" >&2; exit 1
  fi
  sleep 0.2
done
[ -s "$work/env" ] || { echo "test environment did not come up in time" >&2; cat "$work/testenv.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$work/env"
grep -E 'started in|RSS' "$work/testenv.log" >&2 || true

echo "==> cargo test" >&2
cargo test --workspace --no-fail-fast "$@"
