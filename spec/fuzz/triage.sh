#!/usr/bin/env bash
# spec/fuzz/triage.sh [FUZZ_OUT]: one minimised program per distinct signature.
# For each signature among the findings in FUZZ_OUT (default
# build-asan/fuzz-findings), takes the shortest of its programs, minimises it
# with reduce.lua and writes FUZZ_OUT/min/<n>.lua, headed by the signature and
# the seed. Prints "<n> <count> <signature>" per signature.
set -u
cd "$(dirname "$0")/../.." || exit 2
out=${1:-${FUZZ_OUT:-build-asan/fuzz-findings}}
mkdir -p "$out/min"
n=0
for f in "$out"/*/signature; do
  [ -e "$f" ] || continue
  printf '%s\t%s\t%s\n' "$(cat "$f")" "$(wc -l < "$(dirname "$f")/prog.lua")" "$(dirname "$f")"
done | sort -t$'\t' -k1,1 -k2,2n | awk -F'\t' '$1 != last {print; last = $1}' > "$out/min/index.tsv"

while IFS=$'\t' read -r sig _ dir; do
  n=$((n + 1))
  count=$(grep -lxF "$sig" "$out"/*/signature | wc -l)
  seed=$(basename "$dir" | cut -d- -f1)
  case $sig in hang*) export FUZZ_TIMEOUT=10;; *) unset FUZZ_TIMEOUT;; esac
  { echo "-- $sig"; echo "-- seed $seed ($count findings with this signature)"
    lua5.4 spec/fuzz/reduce.lua "$dir/prog.lua" 2>/dev/null; } > "$out/min/$n.lua"
  echo "$n $count $sig"
done < "$out/min/index.tsv"
