#!/usr/bin/env bash
# Starts the builds of the real engines the end-to-end tests use (the shared tools beside this repository, cached in
# ~/.cache) in the background and returns at once. Their first build takes 6 to 15 minutes; started before the install
# and the unit tests, it is done (or nearly) when the tests that need an engine come. Each build holds a lock that a
# test needing the engine waits for (tests/e2e/real_engine.py, build_lock), so the two never build side by side.
# MEMCI_PREBUILD_ENGINES=0 leaves the builds to the tests. Logs: $TMPDIR/memci-build-NAME.log.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${MEMCI_PREBUILD_ENGINES:-1}" != "0" ] || exit 0
command -v flock >/dev/null 2>&1 || exit 0
TMP="${TMPDIR:-/tmp}"

prebuild() {  # NAME SCRIPT
  [ -f "$2" ] || return 0
  local lock="$TMP/memci-build-$(basename "$2" .sh).lock"
  echo "building $1 in the background (log: $TMP/memci-build-$1.log)"
  (flock "$lock" timeout 1800 bash "$2" >"$TMP/memci-build-$1.log" 2>&1 || true) </dev/null >/dev/null 2>&1 &
}

prebuild llm "${MEMCI_REAL_LLM_SCRIPT:-../shared/tools/real-llm.sh}"
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then  # SGLang's CPU operators need one of them
  prebuild sglang "${MEMCI_REAL_SGLANG_SCRIPT:-../shared/tools/real-sglang.sh}"
fi
