#!/usr/bin/env bash
# krew.sh -- builds the real krew (sigs.k8s.io/krew, from Go modules) once into a cache outside
# the repository, for the plugin install test. Prints the krew binary's path on stdout.
set -euo pipefail
KREW_VERSION=v0.4.3
dir=${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv/krew/$KREW_VERSION/bin
if [ ! -x "$dir/krew" ]; then
  command -v go >/dev/null 2>&1 || { echo "krew.sh: Go is required to build krew" >&2; exit 1; }
  echo "building krew $KREW_VERSION into $dir" >&2
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  (cd "$tmp" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS= GOBIN="$tmp" \
    go install -trimpath -ldflags "-s -w" "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION")
  mv "$tmp/krew" "$dir/krew"
  rmdir "$tmp"
fi
echo "$dir/krew"
