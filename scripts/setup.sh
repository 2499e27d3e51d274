#!/usr/bin/env bash
# setup.sh -- installs everything the demo and the tests need on a fresh machine, idempotently:
# Debian packages (podman, runc and skopeo for the operator image; containerd for the test
# env's kubelet node; gcc and libc6-dev for its static pause binary), Debian's docker-registry
# (extracted, not started), and the upstream Kubernetes control plane, kubelet, krew and helm built
# from Go modules into a cache outside the repository. containerd is only installed, never
# started as a service by the tests: cocoon-testenv runs a private one per kubelet.
#
#   --demo   only what scripts/demo.sh runs: the control plane (no kubelet, pause, krew, helm)
#            and the registry, without the Debian packages that only the tests use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
demo=0
for a in "$@"; do
  case "$a" in
    --demo) demo=1 ;;
    *) echo "setup.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

log() { printf '==> %s\n' "$*" >&2; }

need_pkgs=()
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
command -v dpkg-deb >/dev/null 2>&1 || need_pkgs+=(dpkg)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need_pkgs+=(ca-certificates)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)   # the Rust build links with cc
if [ "$demo" = 0 ]; then
  command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
  command -v htpasswd >/dev/null 2>&1 || need_pkgs+=(apache2-utils)
  command -v strip >/dev/null 2>&1 || need_pkgs+=(binutils)
  command -v podman >/dev/null 2>&1 || need_pkgs+=(podman)
  command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
  command -v skopeo >/dev/null 2>&1 || need_pkgs+=(skopeo)
  command -v containerd >/dev/null 2>&1 || need_pkgs+=(containerd)
  command -v systemd-analyze >/dev/null 2>&1 || need_pkgs+=(systemd)   # verify and score the node unit
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
  [ -x /usr/lib/cni/loopback ] || need_pkgs+=(containernetworking-plugins)
  command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need_pkgs+=(iproute2)  # the kubelet node's address on lo
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

command -v go >/dev/null 2>&1 || { echo "setup: Go (1.26.x) is required to build the upstream control plane" >&2; exit 1; }
command -v cargo >/dev/null 2>&1 || { echo "setup: a stable Rust toolchain (cargo) is required" >&2; exit 1; }

log "local OCI registry (Debian docker-registry)"
"$root/crates/cocoon-testenv/fetch-registry.sh" >/dev/null

if [ "$demo" = 1 ]; then
  log "upstream control plane (cached; the first build takes 5-10 min on two cores, later runs a second)"
  TESTENV_CONTROL_PLANE_ONLY=1 "$root/crates/cocoon-testenv/upstream/build.sh" >/dev/null
  exit 0
fi

log "upstream control plane and kubelet (cached; a cold build takes 10-15 min on two cores)"
"$root/crates/cocoon-testenv/upstream/build.sh" >/dev/null

log "krew (cached)"
"$root/scripts/krew.sh" >/dev/null

log "helm (cached)"
"$root/scripts/helm.sh" >/dev/null
