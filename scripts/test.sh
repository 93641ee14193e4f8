#!/usr/bin/env bash
# Installs what the tests need (a virtualenv with the package and its test extras; redis-server when missing
# and this user may install it), then runs the whole test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MEMCI_VENV:-.venv}"
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing redis-server (Debian package)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server not found: tests that need a real Redis will be skipped (set REDIS_URL to use one)"
  fi
fi
# The real engines' first builds (6 to 15 minutes) start now, in the background, beside the install and the unit tests.
bash scripts/prebuild-engines.sh
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
exec "$VENV/bin/python" -m pytest "$@"
