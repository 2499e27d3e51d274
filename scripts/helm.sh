#!/usr/bin/env bash
# helm.sh -- builds the real Helm v3 CLI (helm.sh/helm/v3, from Go modules) once into a cache
# outside the repository, for the chart tests. Prints the helm binary's path on stdout.
set -euo pipefail
HELM_VERSION=v3.22.0
dir=${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv/helm/$HELM_VERSION/bin
if [ ! -x "$dir/helm" ]; then
  command -v go >/dev/null 2>&1 || { echo "helm.sh: Go is required to build helm" >&2; exit 1; }
  echo "building helm $HELM_VERSION into $dir (a cold build takes several minutes)" >&2
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  (cd "$tmp" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS= GOBIN="$tmp" \
    nice -n 5 go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  mv "$tmp/helm" "$dir/helm"
  rmdir "$tmp"
fi
echo "$dir/helm"
