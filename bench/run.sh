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
OB=/usr/lib/x86_64-linux-gnu/openblas-openmp
cc -O2 bench/gemm_ceiling.c -ldnnl -L$OB -Wl,-rpath,$OB -lopenblas -fopenmp -o build/gemm_ceiling 2>/dev/null \
  || echo "(no OpenBLAS: the sgemm ceiling is skipped)"
cc -O2 -shared -fPIC -I/usr/include/lua5.4 bench/lua_floor.c -o build/lua_floor.so \
  || echo "(no lua_floor.so: the seed chain's Lua share is skipped)"
cc -O2 bench/gemm_bf16_ceiling.c -ldnnl -fopenmp -o build/gemm_bf16_ceiling 2>/dev/null \
  || echo "(no oneDNN bfloat16 ceiling: the bfloat16 GEMM table runs without it)"
cc -O2 bench/gemm_shapes.c -ldnnl -L$OB -Wl,-rpath,$OB -lopenblas -fopenmp -o build/gemm_shapes 2>/dev/null \
  || echo "(no OpenBLAS: the GEMM shape table is skipped)"

# OpenBLAS' kernels for this CPU in every process (moongrad, PyTorch, the raw
# libraries), whatever the machine's environment says (bench/util.lua)
export OPENBLAS_CORETYPE=$("$BIN" -e 'package.path = "./?.lua;" .. package.path; print(require("bench.util").openblas_core())')
echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"

echo "== bench/bench.lua: moongrad vs PyTorch"
"$BIN" bench/bench.lua "$ROUNDS" || exit 1
# this machine's section of RESULTS.md, which the tables below join
section=$("$BIN" -e 'package.path = "./?.lua;" .. package.path; print(require("bench.util").results_path())')
add () { printf '\n' >> "$section"; tee -a "$section"; }
echo
echo "== bench/recompute.lua: time and memory of a training step, ratios to plain"
"$BIN" bench/recompute.lua 1024 2048 16 3
echo
echo "== bench/gemm.lua: mg.matmul against oneDNN and OpenBLAS on a training step's shapes"
[ -x build/gemm_shapes ] && "$BIN" bench/gemm.lua 3 | add
echo
echo "== bench/conv.lua: convolution and pooling steps, and a CNN step"
"$BIN" bench/conv.lua 3 9 | add
echo
echo "== bench/epoch.lua: one Fashion-MNIST epoch of the example's CNN"
"$BIN" bench/epoch.lua 2 | add
echo
echo "== bench/gpt.lua: a GPT training step, plain and recomputed per block"
"$BIN" bench/gpt.lua 3 5 | add
echo
echo "== bench/autocast.lua: bfloat16 autocast against float32 and PyTorch's autocast"
"$BIN" bench/autocast.lua 3 | add
echo
echo "== bench/estimate.lua: mg.memory.estimate against the measured peak"
"$BIN" bench/estimate.lua | add
echo
echo "== bench/busy.lua: training steps beside busy processes, the default threads against one"
"$BIN" bench/busy.lua 5 | add
echo
"$BIN" bench/assemble.lua
