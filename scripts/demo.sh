#!/usr/bin/env bash
# demo.sh -- one command from a fresh machine to a running local cocoon cluster: installs what is
# missing, builds, starts the real control plane + registry, the operator and two node agents on
# the simulated runtime, applies a sample CocoonSet, and walks through suspend, resume, migrate
# and hibernating one pod with the plugin, then checkpoints the main and forks two copies of it,
# timing each transition.
#   --keep   leave everything running at the end and print how to use it (Ctrl-C stops it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
keep=0
for a in "$@"; do
  case "$a" in
    --keep) keep=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

# The first run builds the upstream control plane from Go modules (5-10 min on two cores) and
# cocoon (5-10 min); both are cached, so a later run starts in well under a minute.
"$root/scripts/setup.sh" --demo
echo "==> building cocoon (first run: 5-10 min on two cores; later runs: seconds)" >&2
cargo build --quiet -p cocoon-testenv -p cocoon-bin -p kubectl-cocoon
target="${CARGO_TARGET_DIR:-$root/target}/debug"

work=$(mktemp -d)
pids=()
cleanup() {
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo "==> starting the local control plane and registry (10-30 s)" >&2
"$target/cocoon-testenv" up --env-file "$work/env" >"$work/testenv.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
  [ -s "$work/env" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/testenv.log" >&2; exit 1; }
  sleep 0.2
done
[ -s "$work/env" ] || { echo "cluster did not come up in time" >&2; cat "$work/testenv.log" >&2; exit 1; }
# shellcheck disable=SC1091
. "$work/env"
export KUBECONFIG="$TESTENV_KUBECONFIG"
kubectl="$TESTENV_BIN/kubectl"
cocoon() { "$target/kubectl-cocoon" "$@"; }

echo "==> starting cocoon-operator" >&2
OCI_REGISTRY="$TESTENV_REGISTRY" LEADER_ELECT=false METRICS_ADDR=127.0.0.1:0 PROBE_ADDR=127.0.0.1:0 \
  "$target/cocoon-operator" run >"$work/operator.log" 2>&1 &
pids+=($!)
for node in cocoon-node-a cocoon-node-b; do
  echo "==> starting node agent $node (simulated runtime)" >&2
  mkdir -p "$work/$node"
  VK_NODE_NAME=$node VK_NODE_POOL=default VK_NODE_IP=127.0.0.1 VK_KUBELET_PORT=0 \
  VK_METRICS_ADDR=127.0.0.1:0 VK_RUNTIME=sim VK_SIM_ROOT="$work/$node" COCOON_ROOT_DIR="$work/$node" \
  VK_LEASES_PATH="$work/$node/leases.json" VK_SIM_IMAGES=ubuntu:24.04 VK_NODE_PODS=16 \
  OCI_REGISTRY="$TESTENV_REGISTRY" VK_CLIENT_CA_FILE="$TESTENV_RUN_DIR/pki/ca.crt" \
    "$target/cocoon-operator" node >"$work/$node.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 300); do
  n=$("$kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}' 2>/dev/null | { grep -o '=True' || true; } | wc -l)
  [ "$n" -ge 2 ] && break
  sleep 0.2
done

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
timed() {
  step "$@"
  local t0 t1
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  local ms=$(( (t1 - t0) / 1000000 ))
  printf '    took %d.%03ds\n' $((ms / 1000)) $((ms % 1000))
}

step kubectl get nodes
"$kubectl" get nodes -o wide
step kubectl apply -f manifests/samples/cocoonset-demo.yaml
"$kubectl" apply -f manifests/samples/cocoonset-demo.yaml
timed "$kubectl" wait --for=jsonpath='{.status.phase}'=Running cocoonset/demo --timeout=120s
step kubectl cocoon status demo
cocoon status demo
timed cocoon suspend demo --timeout 3m
cocoon status demo
timed cocoon resume demo --timeout 5m
main_node=$("$kubectl" get pod demo-0 -o jsonpath='{.spec.nodeName}')
other=cocoon-node-b; [ "$main_node" = cocoon-node-b ] && other=cocoon-node-a
timed cocoon migrate demo --to "$other" --timeout 5m
cocoon status demo
timed cocoon hibernate demo-tb --timeout 3m
timed cocoon wake demo-tb --timeout 5m
# Checkpoints and forks: save the running main under a name (it keeps running), then start two
# independent copies of it.
timed cocoon checkpoint cocoonset/demo --name demo-ckpt --timeout 3m
timed cocoon fork demo-ckpt --count 2 --timeout 5m
step kubectl get ckpt
"$kubectl" get ckpt
step kubectl cocoon status
cocoon status

if [ "$keep" = 1 ]; then
  cat <<INFO

The demo cluster is still up. In another shell:
  export KUBECONFIG=$TESTENV_KUBECONFIG
  alias kubectl=$kubectl
  $target/kubectl-cocoon status -A
Logs: $work/*.log   Registry: http://$TESTENV_REGISTRY/v2/
Press Ctrl-C to stop everything.
INFO
  wait "${pids[0]}"
fi
