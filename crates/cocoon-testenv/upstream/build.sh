#!/usr/bin/env bash
# build.sh -- builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd
# from the Go modules pinned in go.mod, once, into a cache outside the repository keyed by the
# Kubernetes version; then, as a second step so an existing cache only adds them, the kubelet
# (same modules) and a static `pause` (the sandbox binary, from the kubernetes module's own
# build/pause/linux/pause.c, with gcc) for cocoon-testenv's optional kubelet node. Prints the bin
# directory on the last line of stdout. TESTENV_CONTROL_PLANE_ONLY=1 skips the kubelet and pause
# (the demo runs neither).
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
K8S=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
MINOR=$(echo "$K8S" | cut -d. -f2)
OUT=${TESTENV_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv/$K8S/bin}
mkdir -p "$OUT"
need=0
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd; do
  [ -x "$OUT/$b" ] || need=1
done
if [ "$need" = 1 ]; then
  start=$(date +%s)
  echo "building upstream control plane $K8S into $OUT (cold: 5-10 min on two cores)" >&2
  V=k8s.io/component-base/version; C=k8s.io/client-go/pkg/version
  LDF="-s -w -X $V.gitVersion=$K8S -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean \
       -X $V.buildDate=1970-01-01T00:00:00Z -X $C.gitVersion=$K8S -X $C.gitMajor=1 -X $C.gitMinor=$MINOR"
  tmp="$OUT.tmp.$$"; mkdir -p "$tmp"
  go build -trimpath -tags selinux,notest -ldflags "$LDF" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
  go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  mv "$tmp"/* "$OUT/" && rmdir "$tmp"
  echo "upstream build took $(( $(date +%s) - start ))s" >&2
fi
if [ -z "${TESTENV_CONTROL_PLANE_ONLY:-}" ] && { [ ! -x "$OUT/kubelet" ] || [ ! -x "$OUT/pause" ]; }; then
  start=$(date +%s)
  echo "building the upstream kubelet $K8S and pause into $OUT (cold: 5-15 min on two cores)" >&2
  V=k8s.io/component-base/version; C=k8s.io/client-go/pkg/version
  LDF="-s -w -X $V.gitVersion=$K8S -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean \
       -X $V.buildDate=1970-01-01T00:00:00Z -X $C.gitVersion=$K8S -X $C.gitMajor=1 -X $C.gitMinor=$MINOR"
  tmp="$OUT.tmp.$$"; mkdir -p "$tmp"
  go build -trimpath -tags selinux,notest -ldflags "$LDF" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet
  pause_c="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  gcc -Os -static -DVERSION="$K8S" -o "$tmp/pause" "$pause_c"
  strip "$tmp/pause"
  mv "$tmp"/* "$OUT/" && rmdir "$tmp"
  echo "kubelet build took $(( $(date +%s) - start ))s" >&2
fi
"$OUT/kube-apiserver" --version >&2
"$OUT/etcd" --version | sed -n 1p >&2  # sed reads to the end: no SIGPIPE under pipefail
echo "$OUT"
