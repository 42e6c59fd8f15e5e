#!/usr/bin/env bash
# spec/fuzz/run.sh: `make fuzz`. Generates random programs (spec/fuzz/gen.lua),
# runs each under the ASan+UBSan interpreter, and saves every program that
# crashes, trips a sanitizer, leaks or hangs. Lua errors are not findings.
#
#   FUZZ_SECONDS  time bound (default 600)
#   FUZZ_COUNT    program-count bound instead: exactly seeds SEED .. SEED+COUNT-1
#                 (then FUZZ_SECONDS applies only when given explicitly)
#   FUZZ_SEED     first seed (default: from the clock, printed); program i has seed SEED+i
#   FUZZ_BIN      the interpreter (default build-asan/moongrad)
#   FUZZ_OUT      where findings go (default build-asan/fuzz-findings), one
#                 directory per finding: <seed>-<kind>/{prog.lua,stdout,stderr,signature}
#   FUZZ_JOBS     programs run at once (default 2)
#   FUZZ_TIMEOUT  seconds before a program counts as a hang (default 20)
#
# Replay one finding: FUZZ_SEED=<seed> FUZZ_COUNT=1 bash spec/fuzz/run.sh
# Minimise one:       lua5.4 spec/fuzz/reduce.lua <dir>/prog.lua > min.lua
# The last line reads "fuzz: N programs, M findings"; the exit status is 1 when M > 0.
set -u
cd "$(dirname "$0")/../.." || exit 2

seconds_given=${FUZZ_SECONDS+x}
FUZZ_SECONDS=${FUZZ_SECONDS:-600}
FUZZ_COUNT=${FUZZ_COUNT:-0}
FUZZ_SEED=${FUZZ_SEED:-$(( $(date +%s) % 100000 * 10000 ))}
FUZZ_BIN=${FUZZ_BIN:-build-asan/moongrad}
FUZZ_OUT=${FUZZ_OUT:-build-asan/fuzz-findings}
FUZZ_JOBS=${FUZZ_JOBS:-2}
LUA=${LUA:-lua5.4}
export FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-20}

[ -x "$FUZZ_BIN" ] || { echo "fuzz: no interpreter at $FUZZ_BIN (build it: make asan, or set FUZZ_BIN)" >&2; exit 2; }
command -v "$LUA" >/dev/null || { echo "fuzz: $LUA not found (make deps)" >&2; exit 2; }
mkdir -p "$FUZZ_OUT"
work=$(mktemp -d "${TMPDIR:-/tmp}/moongrad-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$(date +%s)
deadline=$(( start + FUZZ_SECONDS ))
if [ "$FUZZ_COUNT" -gt 0 ]; then
  [ -n "$seconds_given" ] || deadline=0
  echo "fuzz: seeds $FUZZ_SEED..$(( FUZZ_SEED + FUZZ_COUNT - 1 )), $FUZZ_JOBS at a time, $FUZZ_BIN, findings in $FUZZ_OUT"
else
  echo "fuzz: seed $FUZZ_SEED, ${FUZZ_SECONDS}s, $FUZZ_JOBS at a time, $FUZZ_BIN, findings in $FUZZ_OUT"
fi

# worker j runs programs j, j+JOBS, j+2*JOBS, ...; writes "<seed> <result>" lines
worker () {
  local j=$1 dir=$work/w$1 i=$1 seed res kind
  mkdir -p "$dir"
  while :; do
    [ "$FUZZ_COUNT" -gt 0 ] && [ "$i" -ge "$FUZZ_COUNT" ] && break
    [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ] && break
    seed=$(( FUZZ_SEED + i ))
    rm -rf "$dir"/*
    if ! "$LUA" spec/fuzz/gen.lua "$seed" > "$dir/prog.lua"; then
      echo "$seed generator-failed" >> "$work/results.$j"
      echo "fuzz: the generator failed for seed $seed" >&2
      i=$(( i + FUZZ_JOBS )); continue
    fi
    res=$(FUZZ_TMP=$dir bash spec/fuzz/check.sh "$dir/prog.lua" "$FUZZ_BIN")
    echo "$seed $res" >> "$work/results.$j"
    kind=${res%% *}
    if [ "$kind" != ok ]; then
      local out=$FUZZ_OUT/$seed-$kind
      mkdir -p "$out"
      cp "$dir/prog.lua" "$out/prog.lua"
      cp "$dir/prog.lua.out" "$out/stdout"
      cp "$dir/prog.lua.err" "$out/stderr"
      echo "$res" > "$out/signature"
      echo "fuzz: FINDING seed $seed: $res  ($out)"
    fi
    i=$(( i + FUZZ_JOBS ))
  done
}

pids=()
for (( j = 0; j < FUZZ_JOBS; j++ )); do worker "$j" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done

cat "$work"/results.* 2>/dev/null | sort -n > "$work/all"
n=$(wc -l < "$work/all")
m=$(awk '$2 != "ok"' "$work/all" | wc -l)
secs=$(( $(date +%s) - start ))
echo "fuzz: $n programs in ${secs}s ($(( secs > 0 ? n * 60 / secs : n )) a minute); exit statuses: $(awk '$2 == "ok" {c[$3]++} END {for (k in c) printf "%s x%d ", k, c[k]}' "$work/all")"
if [ "$m" -gt 0 ]; then
  echo "fuzz: findings by signature (count, first seed, signature):"
  awk '$2 != "ok" {sig = $2; for (i = 3; i <= NF; i++) sig = sig " " $i; if (!(sig in c)) first[sig] = $1; c[sig]++}
       END {for (s in c) printf "  %4d  %s  %s\n", c[s], first[s], s}' "$work/all" | sort -k1,1nr
fi
echo "fuzz: $n programs, $m findings"
[ "$m" -eq 0 ]
