#!/usr/bin/env bash
# setup.sh -- installs everything the demo and the tests need on a fresh machine, idempotently:
# Debian packages (podman, runc and skopeo for the operator image; containerd for the test
# env's kubelet node; gcc and libc6-dev for its static pause binary), Debian's docker-registry
# (extracted, not started), and the upstream Kubernetes control plane, kubelet, krew and helm built
# from Go modules into a cache outside the repository. containerd is only installed, never
# started as a service by the tests: cocoon-testenv runs a private one per kubelet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

log() { printf '==> %s\n' "$*" >&2; }

need_pkgs=()
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
command -v htpasswd >/dev/null 2>&1 || need_pkgs+=(apache2-utils)
command -v dpkg-deb >/dev/null 2>&1 || need_pkgs+=(dpkg)
command -v strip >/dev/null 2>&1 || need_pkgs+=(binutils)
command -v podman >/dev/null 2>&1 || need_pkgs+=(podman)
command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
command -v skopeo >/dev/null 2>&1 || need_pkgs+=(skopeo)
command -v containerd >/dev/null 2>&1 || need_pkgs+=(containerd)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
[ -x /usr/lib/cni/loopback ] || need_pkgs+=(containernetworking-plugins)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need_pkgs+=(ca-certificates)
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

log "upstream control plane and kubelet (cached; a cold build takes several minutes)"
"$root/crates/cocoon-testenv/upstream/build.sh" >/dev/null

log "krew (cached)"
"$root/scripts/krew.sh" >/dev/null

log "helm (cached)"
"$root/scripts/helm.sh" >/dev/null
