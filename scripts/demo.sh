#!/usr/bin/env bash
# demo.sh -- one command from a fresh machine to a running local cocoon cluster: installs what is
# missing, builds the workspace, starts the real control plane + registry, installs the CRDs and a
# sample CocoonSet, shows it, and stays up until Ctrl-C (or exits at once with --no-wait).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
wait_forever=1
[ "${1:-}" = "--no-wait" ] && wait_forever=0

"$root/scripts/setup.sh"
echo "==> building cocoon" >&2
cargo build --quiet -p cocoon-testenv -p cocoon-operator -p kubectl-cocoon
target="${CARGO_TARGET_DIR:-$root/target}/debug"

work=$(mktemp -d)
envpid=""
cleanup() {
  if [ -n "$envpid" ] && kill -0 "$envpid" 2>/dev/null; then
    echo "==> tearing the cluster down" >&2
    kill -TERM "$envpid" 2>/dev/null || true
    wait "$envpid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "==> starting the local control plane and registry" >&2
"$target/cocoon-testenv" up --env-file "$work/env" >"$work/testenv.log" 2>&1 &
envpid=$!
for _ in $(seq 1 600); do
  [ -s "$work/env" ] && break
  kill -0 "$envpid" 2>/dev/null || { cat "$work/testenv.log" >&2; exit 1; }
  sleep 0.2
done
[ -s "$work/env" ] || { echo "cluster did not come up in time" >&2; cat "$work/testenv.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$work/env"
kubectl="$TESTENV_BIN/kubectl"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step "$kubectl" get crd cocoonsets.cocoonset.cocoonstack.io cocoonhibernations.cocoonset.cocoonstack.io
step "$kubectl" apply -f manifests/samples/cocoonset.yaml
step "$kubectl" get cocoon -o wide
step "$kubectl" get cs demo -o yaml

cat <<INFO

The local cluster is up. In another shell:
  export KUBECONFIG=$TESTENV_KUBECONFIG
  alias kubectl=$kubectl
  kubectl get cocoon            # CocoonSets and CocoonHibernations
  kubectl explain cocoonset.spec
Registry: http://$TESTENV_REGISTRY/v2/
The operator and the node agents join this demo as they are built (see CHANGELOG.md).
INFO

if [ "$wait_forever" = 1 ]; then
  echo "Press Ctrl-C to stop the cluster."
  wait "$envpid"
fi
