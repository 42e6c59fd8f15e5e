#!/usr/bin/env bash
# spec/fuzz/repro.sh [FILE.lua ...]: runs the minimal reproducers of
# spec/fuzz/FINDINGS.md (default: all of spec/fuzz/repro/*.lua) under the
# sanitizer interpreter and prints "<file>: <check.sh result>"; "ok" means
# fixed. Exits 1 when any is not ok. FUZZ_BIN and FUZZ_TIMEOUT as for check.sh
# (the timeout defaults to 10 s here).
set -u
cd "$(dirname "$0")/../.." || exit 2
export FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-10}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moongrad-repro.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
[ $# -gt 0 ] || set -- spec/fuzz/repro/*.lua
bad=0
for f in "$@"; do
  cp "$f" "$tmp/prog.lua"
  res=$(FUZZ_TMP=$tmp bash spec/fuzz/check.sh "$tmp/prog.lua")
  printf '%-48s %s\n' "$(basename "$f"):" "$res"
  case $res in ok*) ;; *) bad=1;; esac
done
exit $bad
