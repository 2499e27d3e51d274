#!/usr/bin/env bash
# release.sh -- builds the kubectl-cocoon plugin archive this machine can build (linux/amd64:
# a release binary statically linked against glibc) and renders the krew manifest template
# plugin/.krew.yaml for it with the archive's real sha256, as krew-release-bot would for a tag.
#   --out DIR    where the archive and manifest go (default dist/)
#   --tag TAG    the release tag (default v<workspace version>)
# The archive holds kubectl-cocoon, the kubectl_complete-cocoon shim, completions/ and LICENSE.
# Next to it, the node host archive cocoon-node-<version>-linux-amd64.tar.gz: one directory of
# that name with the static cocoon-operator, the systemd unit cocoon-node.service,
# node.env.example, INSTALL.md (manifests/node/) and LICENSE. Each archive gets a .sha256 file.
# linux/arm64, darwin/amd64 and darwin/arm64 need another builder (no cross toolchains here);
# their entries are left out of the rendered manifest. Prints the manifest path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

out=$root/dist
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --tag=*) tag=${1#--tag=}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { printf '==> %s\n' "$*" >&2; }
for tool in ldd strip tar gzip sha256sum awk; do
  command -v "$tool" >/dev/null 2>&1 || { echo "release.sh: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done

# shellcheck source=scripts/static-build.sh
. "$root/scripts/static-build.sh"
tag=${tag:-v$version}
case "$tag" in
  v[0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "release.sh: --tag $tag is not a vMAJOR.MINOR.PATCH tag" >&2; exit 2 ;;
esac
# The starter alerts' runbook links are pinned to a release tag (README "Monitoring"): refuse a
# tag they do not name, which would ship links to another version's runbooks.
for rules in charts/cocoon/files/prometheus-rules.yaml manifests/components/monitoring/prometheusrule.yaml; do
  if grep 'runbook_url:' "$rules" | grep -vq "/blob/$tag/README\.md#"; then
    echo "release.sh: the runbook links of $rules do not all name $tag (each must read .../blob/$tag/README.md#...)" >&2
    exit 1
  fi
done

log "building kubectl-cocoon $version, release, static ($triple)"
bin=$(static_binary kubectl-cocoon)

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
strip -o "$stage/kubectl-cocoon" "$bin"
chmod 0755 "$stage/kubectl-cocoon"
install -m 0755 plugin/kubectl_complete-cocoon "$stage/kubectl_complete-cocoon"
install -m 0644 LICENSE "$stage/LICENSE"
mkdir -p "$stage/completions"
install -m 0644 completions/* "$stage/completions/"

archive=kubectl-cocoon-linux-amd64.tar.gz
# Reproducible: sorted names, numeric root ownership, the commit's time, no gzip timestamp.
mtime=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - \
  kubectl-cocoon kubectl_complete-cocoon completions LICENSE | gzip -9n >"$out/$archive"
(cd "$out" && sha256sum "$archive" >"$archive.sha256")
log "$out/$archive ($(stat -c %s "$out/$archive") bytes)"

# The node host archive: the same static build (no second compile), unit, env example, guide.
host=cocoon-node-$version-linux-amd64
log "building cocoon-operator $version, release, static ($triple)"
opbin=$(static_binary cocoon-operator)
mkdir -p "$stage/$host"
strip -o "$stage/$host/cocoon-operator" "$opbin"
chmod 0755 "$stage/$host/cocoon-operator"
for f in manifests/node/cocoon-node.service manifests/node/node.env.example \
         manifests/node/INSTALL.md LICENSE; do
  install -m 0644 "$f" "$stage/$host/"
done
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - "$host" |
  gzip -9n >"$out/$host.tar.gz"
(cd "$out" && sha256sum "$host.tar.gz" >"$host.tar.gz.sha256")
log "$out/$host.tar.gz ($(stat -c %s "$out/$host.tar.gz") bytes)"

# Render plugin/.krew.yaml: {{ .TagName }} → the tag; each platform whose archive was built
# gets `uri:` and `sha256:` in place of addURIAndSha; the other platforms are left out.
manifest=$out/cocoon.yaml
awk -v tag="$tag" -v dir="$out" '
  function flush() {
    if (nblock > 0 && keep) for (i = 1; i <= nblock; i++) print block[i]
    if (nblock > 0 && !keep) skipped = skipped " " platform
    nblock = 0
  }
  /^#/ && !started { next }
  { started = 1; gsub(/\{\{ *\.TagName *\}\}/, tag) }
  /^  platforms:/ { print; inplat = 1; next }
  inplat && /^  - selector:/ { flush(); keep = 1; platform = "" }
  inplat && /^        (os|arch):/ { v = $2; platform = platform == "" ? v : platform "/" v }
  inplat && /addURIAndSha/ {
    match($0, /"[^"]*"/); uri = substr($0, RSTART + 1, RLENGTH - 2)
    indent = $0; sub(/[^ ].*/, "", indent)
    file = uri; sub(/.*\//, "", file)
    sha = ""
    cmd = "cd \"" dir "\" 2>/dev/null && [ -f \"" file "\" ] && sha256sum \"" file "\""
    if ((cmd | getline line) > 0) { split(line, f, " "); sha = f[1] }
    close(cmd)
    if (sha == "") { keep = 0; block[++nblock] = $0; next }
    block[++nblock] = indent "uri: " uri
    block[++nblock] = indent "sha256: " sha
    next
  }
  inplat { block[++nblock] = $0; next }
  { print }
  END {
    flush()
    if (skipped != "") print "release.sh: left out (needs another builder):" skipped > "/dev/stderr"
  }
' plugin/.krew.yaml >"$manifest.tmp"
if grep -q '{{' "$manifest.tmp"; then
  echo "release.sh: unrendered template text left in $manifest.tmp" >&2; exit 1
fi
mv "$manifest.tmp" "$manifest"
log "krew manifest $manifest"
echo "$manifest"
