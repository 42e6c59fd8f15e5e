#!/usr/bin/env bash
# spec/fuzz/check.sh PROG.lua [BIN]: runs one program under the sanitizer
# interpreter and prints one line: "ok" (Lua errors are fine), or the finding
# as "<kind> <signature>", where kind is asan, ubsan, valgrind, leak, signal, hang or
# wrong (an oracle in the program printed FUZZ-WRONG: a silently wrong result) and
# the signature names the place (src/file.c:line) so findings can be grouped.
# Leaves PROG.lua.out and PROG.lua.err (stdout, stderr; the first MiB each).
#
# Environment: FUZZ_BIN (default build-asan/moongrad), FUZZ_TIMEOUT (seconds,
# default 20), FUZZ_TMP (a scratch directory for the program, default: PROG's),
# FUZZ_WRAP (a command BIN runs under: make fuzz-opt's valgrind, whose reports
# exit with status 25).
set -u
prog=$1
bin=${2:-${FUZZ_BIN:-build-asan/moongrad}}
limit=${FUZZ_TIMEOUT:-20}
export FUZZ_TMP=${FUZZ_TMP:-$(dirname "$prog")}
# exitcode 23 (ASan, LSan) and 24 (UBSan) tell the sanitizers apart from a Lua
# error (1); a caller's own ASAN_OPTIONS/UBSAN_OPTIONS come last and win
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:abort_on_error=0:exitcode=23:max_allocation_size_mb=1024:hard_rss_limit_mb=6000:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=24${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OMP_WAIT_POLICY=passive

# absolute paths, and the program runs in FUZZ_TMP: a file it writes under a
# relative name (mg.memory.trace(5, f) writes "5") lands there, not in the checkout
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
prog=$(cd "$(dirname "$prog")" && pwd)/$(basename "$prog")
mkdir -p "$FUZZ_TMP"
export FUZZ_TMP=$(cd "$FUZZ_TMP" && pwd)
# an unsanitised (optimised) build: a cap on its address space stands in for
# ASan's allocation limits above, so that a program's 16 GiB tensor fails at
# once (an out-of-memory error, itself worth testing) instead of paging for
# minutes and counting as a hang. FUZZ_VMEM_KB= sets it, 0: none
cap=0
grep -qa "__asan_init" "$bin" || cap=${FUZZ_VMEM_KB:-8388608}     # (ASan reserves terabytes of shadow)
run () {
  (cd "$FUZZ_TMP" && { [ "$cap" -eq 0 ] || ulimit -v "$cap"; } && exec timeout -k 5 "$limit" "$@" "$bin" "$prog") \
    > "$prog.out" 2> "$prog.err"
}
run ${FUZZ_WRAP:-}
rc=$?
# out of time under the wrapper (valgrind runs 20-50x slower): a hang only
# if the program is out of time without it too (a 10 s program is no hang)
if [ -n "${FUZZ_WRAP:-}" ] && { [ $rc -eq 124 ] || [ $rc -eq 137 ]; }; then
  run
  rc=$?
fi
err=$prog.err
trap 'truncate -s "<1M" "$prog.out" "$prog.err"' EXIT

# the place: a path from src/ (or the function when there is none)
where () { sed -E 's#.*/(src|include)/#\1/#'; }

if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "hang timeout-${limit}s"
elif grep -q "ERROR: AddressSanitizer" "$err"; then
  sum=$(grep -m1 "^SUMMARY: AddressSanitizer" "$err" | sed -E 's/^SUMMARY: AddressSanitizer: //')
  kind=$(echo "$sum" | awk '{print $1}')
  case $sum in hard\ rss*|*rss\ limit*) echo "asan rss-limit"; exit 0;; esac
  loc=$(grep -m1 -E "^ *#[0-9]+ .* (/[^ ]*/)?(src|include)/" "$err" | sed -E 's/.* in ([^ ]+) (.*)$/\2 \1/' | where)
  echo "asan $kind@${loc:-$(echo "$sum" | cut -d' ' -f2- | where)}"
elif grep -q "runtime error:" "$err"; then
  line=$(grep -m1 "runtime error:" "$err")
  loc=$(echo "$line" | sed -E 's/: runtime error:.*//' | where | sed -E 's/:[0-9]+$//')
  msg=$(echo "$line" | sed -E 's/.*runtime error: //; s/[0-9]+/N/g; s/0xN[a-f0-9]*/ADDR/g' | cut -c1-80)
  echo "ubsan $loc: $msg"
elif grep -q "ERROR: LeakSanitizer" "$err"; then
  loc=$(sed -n '/Direct leak\|Indirect leak/,$p' "$err" | grep -E "^ *#[0-9]+ .* (/[^ ]*/)?(src|include)/" \
        | grep -v -E " in (mg_malloc|mg_calloc|mg_alloc|xmalloc)" | head -1 | sed -E 's/.* in ([^ ]+) (.*)$/\2 \1/' | where)
  echo "leak ${loc:-unknown}"
elif [ $rc -eq 25 ] && grep -q "^==[0-9]*== " "$err"; then
  what=$(grep -m1 -E "^==[0-9]+== [A-Z]" "$err" | sed -E 's/^==[0-9]+== //; s/[0-9]+/N/g' | cut -c1-60)
  loc=$(grep -m1 -E "^==[0-9]+== +(at|by) .*/(src|include)/[^ ]*:[0-9]+\)$" "$err" | sed -E 's/.*\(([^()]*)\)$/\1/' | where)
  echo "valgrind ${what// /-}@${loc:-unknown}"
elif grep -q "Sanitizer:DEADLYSIGNAL" "$err" || [ $rc -eq 23 ] || [ $rc -eq 24 ]; then
  echo "asan other-rc$rc:$(grep -m1 -i "sanitizer" "$err" | cut -c1-80)"
elif [ $rc -ge 128 ]; then
  echo "signal $((rc - 128))"
elif grep -q "^FUZZ-WRONG: " "$err"; then
  echo "wrong $(grep -m1 "^FUZZ-WRONG: " "$err" | sed -E 's/^FUZZ-WRONG: ([^ ]*).*/\1/')"
else
  echo "ok rc=$rc"
fi
