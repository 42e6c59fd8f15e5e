#!/usr/bin/env bash
# spec/fuzz/harness/run.sh [--replay] [NAME...]: the parsers' libFuzzer harnesses
# (make fuzz and make fuzz-parsers build them into build-fuzz/ and run this).
# NAMEs: safetensors idx csv wire (default: all).
#
#   --replay  runs each harness once on every reproducer (repro/NAME/*, each
#             once a finding) and seed (corpus/NAME/*); exit 1 if one fails
#   (else)    fuzzes each harness for FUZZ_HARNESS_SECONDS, from its seeds and
#             what earlier runs kept (build-fuzz/corpus/NAME), with its
#             dictionary (NAME.dict); a finding (a crash, a sanitizer report, a
#             failed oracle, an input running over 10 s, a leak, over 2 GiB)
#             is saved by libFuzzer as build-fuzz/findings/NAME/crash-<sha1>
#             (or leak-, timeout-, oom-); keep it as repro/NAME/<what>
#
#   FUZZ_HARNESS_SECONDS  a harness (default: FUZZ_SECONDS, else 600)
#   FUZZ_BUILD            the binaries' folder (default build-fuzz)
#
# Replay one finding: build-fuzz/fuzz_NAME FILE (or build/fuzz_replay_NAME FILE,
# built by GCC). Minimise one: build-fuzz/fuzz_NAME -minimize_crash=1 -runs=10000 FILE
# The last line reads "fuzz harnesses: N runs, M findings"; exit 1 when M > 0.
set -u
cd "$(dirname "$0")/../../.." || exit 2
here=spec/fuzz/harness
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
secs=${FUZZ_HARNESS_SECONDS:-${FUZZ_SECONDS:-600}}
replay=0
[ "${1:-}" = --replay ] && { replay=1; shift; }
[ $# -gt 0 ] || set -- safetensors idx csv wire
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1

runs=0 found=0 bad=0
for name in "$@"; do
  bin=$FUZZ_BUILD/fuzz_$name
  [ -x "$bin" ] || { echo "fuzz harnesses: no $bin (make fuzz-build)" >&2; exit 2; }
  if [ $replay = 1 ]; then
    files=$(find "$here/repro/$name" "$here/corpus/$name" -type f ! -name '.*' 2>/dev/null | sort)
    [ -n "$files" ] || { echo "fuzz harnesses: $name has no seeds" >&2; exit 2; }
    n=$(echo "$files" | wc -l)
    if echo "$files" | xargs "$bin" -runs=1 > "$FUZZ_BUILD/replay-$name.log" 2>&1; then
      echo "fuzz harnesses: $name: $n seeds and reproducers, ok"
    else
      echo "fuzz harnesses: $name: a seed or reproducer fails (see $FUZZ_BUILD/replay-$name.log):"
      grep -E "^(Running|==[0-9]+==ERROR|SUMMARY|harness check failed|.*runtime error)" "$FUZZ_BUILD/replay-$name.log" | tail -5
      bad=1
    fi
    continue
  fi
  corpus=$FUZZ_BUILD/corpus/$name out=$FUZZ_BUILD/findings/$name
  mkdir -p "$corpus" "$out"
  dict=()
  [ -f "$here/$name.dict" ] && dict=(-dict="$here/$name.dict")
  log=$FUZZ_BUILD/fuzz-$name.log
  before=$(ls "$out" | wc -l)
  echo "fuzz harnesses: $name for ${secs}s (log $log)"
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/" "${dict[@]}" "$corpus" "$here/corpus/$name" > "$log" 2>&1
  rc=$?
  r=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  runs=$(( runs + ${r:-0} ))
  new=$(( $(ls "$out" | wc -l) - before ))
  echo "fuzz harnesses: $name: ${r:-?} runs, corpus $(ls "$corpus" | wc -l), status $rc, $new new findings"
  if [ $rc -ne 0 ] || [ $new -gt 0 ]; then
    found=$(( found + (new > 0 ? new : 1) ))
    grep -E "^(==[0-9]+==ERROR|SUMMARY|harness check failed|.*runtime error|artifact_prefix|Test unit written)" "$log" | head -5
  fi
done
if [ $replay = 1 ]; then exit $bad; fi
echo "fuzz harnesses: $runs runs, $found findings"
[ "$found" -eq 0 ]
