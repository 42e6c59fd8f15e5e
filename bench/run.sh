#!/usr/bin/env bash
# make bench: every benchmark, side by side with PyTorch where it is installed.
# Installs Debian's python3-torch (the peer) and libopenblas-dev (for the
# sgemm ceiling) when missing; without them the peer or ceiling is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${MOONGRAD_BIN:-build/moongrad}
ROUNDS=${ROUNDS:-5}

# the Makefile's deps recipe: nothing when both are there, else apt-get as root or through sudo
BENCH_DEPS="python3-torch libopenblas-dev"
"${MAKE:-make}" -s --no-print-directory deps DEPS="$BENCH_DEPS" \
  || echo "(could not install the benchmark packages ($BENCH_DEPS); going on without)"
cc -O2 bench/gemm_ceiling.c -ldnnl -lopenblas -o build/gemm_ceiling 2>/dev/null \
  || echo "(no OpenBLAS: the sgemm ceiling is skipped)"

echo "== bench/bench.lua: moongrad vs PyTorch"
"$BIN" bench/bench.lua "$ROUNDS" || exit 1
echo
echo "== bench/recompute.lua: time and memory of a training step, ratios to plain"
"$BIN" bench/recompute.lua 1024 2048 16 3
