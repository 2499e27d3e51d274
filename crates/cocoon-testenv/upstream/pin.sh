#!/usr/bin/env bash
# pin.sh vX.Y.Z -- (re)writes go.mod/go.sum so that `go build` from here builds the upstream
# Kubernetes control-plane binaries and the etcd that release pins, from Go modules only.
set -euo pipefail
K8S=${1:?kubernetes version, e.g. v1.36.3}
STAGING="v0.${K8S#v1.}"
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
cd "$(dirname "$0")"
[ -f go.mod ] || go mod init testenv.local/k8s-binaries
MODFILE=$(go mod download -json "k8s.io/kubernetes@${K8S}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
MODS=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$MODFILE")
[ -n "$MODS" ] || MODS=$(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print $1}' "$MODFILE")
for m in $MODS; do go mod edit -replace="${m}=${m}@${STAGING}"; done
if grep -q '^godebug' "$MODFILE"; then
  go mod edit -godebug="$(sed -n 's/^godebug[[:space:]]*//p' "$MODFILE" | head -1)"
fi
go mod edit -require="k8s.io/kubernetes@${K8S}"
for t in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  go mod edit -tool="k8s.io/kubernetes/cmd/$t"
done
go mod edit -tool=go.etcd.io/etcd/server/v3
go mod tidy
go list -m k8s.io/kubernetes go.etcd.io/etcd/server/v3
