#!/usr/bin/env bash
# image.sh -- builds the cocoon-operator image from Containerfile with Debian's podman: a release
# binary statically linked against glibc (-C target-feature=+crt-static), Debian's CA bundle and
# a non-root user (65532), FROM scratch. Tags it NAME:vVERSION and NAME:vVERSION-REVISION
# (the workspace version and the short git revision) and prints the built references, one a
# line, on stdout.
#   --name NAME          image name (default ghcr.io/cocoonstack/cocoon-operator-rs)
#   --push HOST[/PATH]   also push both tags to HOST[/PATH]/cocoon-operator-rs (the last path
#                        element of NAME) and print those references instead
#   --insecure           push over plain HTTP / without TLS verification (a local registry)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

name=ghcr.io/cocoonstack/cocoon-operator-rs
push=""
tls_verify=true
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --name=*) name=${1#--name=}; shift ;;
    --push) push=${2:?--push needs a registry}; shift 2 ;;
    --push=*) push=${1#--push=}; shift ;;
    --insecure) tls_verify=false; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '==> %s\n' "$*" >&2; }
for tool in podman ldd strip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "image.sh: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done
cacerts=/etc/ssl/certs/ca-certificates.crt
[ -s "$cacerts" ] || { echo "image.sh: $cacerts is missing; run scripts/setup.sh (ca-certificates)" >&2; exit 1; }

# shellcheck source=scripts/static-build.sh
. "$root/scripts/static-build.sh"
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
full_revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)

log "building cocoon-operator $version ($revision), release, static ($triple)"
bin=$(static_binary cocoon-operator)

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/etc/ssl/certs"
strip -o "$ctx/cocoon-operator" "$bin"
chmod 0755 "$ctx/cocoon-operator"
install -m 0644 "$cacerts" "$ctx/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/etc/group"
chmod 0644 "$ctx/etc/passwd" "$ctx/etc/group"

tag="v$version"
refs=("$name:$tag" "$name:$tag-$revision")
log "podman build ${refs[*]}"
# Measured here: podman 4.3 needs runc (crun fails on hybrid cgroups) and explicit rlimits.
podman --runtime runc build --quiet \
  --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  --build-arg "VERSION=$tag" --build-arg "REVISION=$full_revision" \
  -f "$root/Containerfile" -t "${refs[0]}" -t "${refs[1]}" "$ctx" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "${refs[0]}")
log "image size: $size bytes ($(( size / 1024 / 1024 )) MiB)"

if [ -z "$push" ]; then
  printf '%s\n' "${refs[@]}"
  exit 0
fi
repo=${name##*/}
for ref in "${refs[@]}"; do
  dest="${push%/}/$repo:${ref##*:}"
  log "podman push $dest"
  podman tag "$ref" "$dest"
  podman push --quiet --tls-verify="$tls_verify" "$dest"
  echo "$dest"
done
