#!/usr/bin/env bash
# make bench: every benchmark, printed as a table with ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MOONGRAD_BIN:-build/moongrad}
echo "== bench/recompute.lua (time and memory of a training step, ratios to plain)"
"$BIN" bench/recompute.lua "$@"
