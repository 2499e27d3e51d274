#!/usr/bin/env bash
# promtool.sh -- builds Prometheus' promtool (github.com/prometheus/prometheus/cmd/promtool, from
# Go modules) once into a cache outside the repository, for the alert-rule tests. Prints the
# promtool binary's path on stdout. Prometheus 3.x is tagged v0.3xx.y as a Go module
# (v0.316.0 is Prometheus v3.16.0).
set -euo pipefail
PROMTOOL_VERSION=v0.316.0
dir=${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv/promtool/$PROMTOOL_VERSION/bin
if [ ! -x "$dir/promtool" ]; then
  command -v go >/dev/null 2>&1 || { echo "promtool.sh: Go is required to build promtool" >&2; exit 1; }
  echo "building promtool $PROMTOOL_VERSION into $dir (a cold build takes several minutes)" >&2
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  (cd "$tmp" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS= GOBIN="$tmp" \
    nice -n 5 go install -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION")
  mv "$tmp/promtool" "$dir/promtool"
  rmdir "$tmp"
fi
echo "$dir/promtool"
