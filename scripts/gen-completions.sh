#!/usr/bin/env bash
# gen-completions.sh -- regenerates the static completion scripts in completions/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build -q -p kubectl-cocoon
bin="${CARGO_TARGET_DIR:-$root/target}/debug/kubectl-cocoon"
"$bin" completion bash > completions/kubectl-cocoon.bash
"$bin" completion zsh > completions/_kubectl-cocoon
"$bin" completion fish > completions/kubectl-cocoon.fish
"$bin" completion powershell > completions/kubectl-cocoon.ps1
echo "completions regenerated" >&2
