#!/usr/bin/env bash
# fetch-registry.sh -- extracts Debian's docker-registry (distribution 2.8.2) into the testenv
# cache WITHOUT running package scripts (its postinst would start a daemon on :5000).
# Idempotent. Prints the binary path on the last line of stdout.
set -euo pipefail
DEST=${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-testenv/registry
BIN=$DEST/usr/bin/docker-registry
if [ ! -x "$BIN" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # apt-get download writes into the current directory; _apt needs to be able to write there.
  chmod 0777 "$tmp"
  if ! (cd "$tmp" && apt-get download docker-registry >&2); then
    echo "apt-get download failed; running apt-get update and retrying" >&2
    apt-get update >&2
    (cd "$tmp" && apt-get download docker-registry >&2)
  fi
  mkdir -p "$DEST"
  dpkg-deb -x "$tmp"/docker-registry_*.deb "$DEST"
fi
"$BIN" --version >&2 || true
echo "$BIN"
