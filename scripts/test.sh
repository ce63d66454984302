#!/usr/bin/env bash
# The default test run (README "Tests", CI's): the quick tests on two pytest-xdist workers, each pinned to a core
# of its own (tests/conftest.py), then the end-to-end tests marked `slow` one at a time, since each of their flows
# sizes its threads to every core. Both parts run even when the first fails; the exit status is the first failure's.
#
#   --fast   the contributor tier: the quick tests less those marked `engine` (no engine, cluster, server or CLI
#            run starts; every module is still imported, tests/test_module_imports.py); a few minutes on 2 cores
#
# Other arguments go to the pytest calls (e.g. -x, -k name, tests/test_cli.py).
set -uo pipefail
cd "$(dirname "$0")/.."
fast=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else args+=("$arg"); fi
done
workers=2
if [ "$(nproc)" -lt 2 ]; then workers=1; fi
if [ "$fast" -eq 1 ]; then
  echo "[tests] contributor tier on $workers pytest-xdist workers (-m 'not slow and not extended and not engine')"
  exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup -m "not slow and not extended and not engine" "${args[@]}"
fi
echo "[tests] quick tests on $workers pytest-xdist workers (-m 'not slow and not extended')"
.venv/bin/python -m pytest -n "$workers" --dist loadgroup -m "not slow and not extended" "${args[@]}"
quick=$?
echo "[tests] end-to-end tests one at a time (-m 'slow and not extended')"
.venv/bin/python -m pytest -m "slow and not extended" "${args[@]}"
slow=$?
# pytest's 5 is "no test collected": fine for one part (a path may hold only quick or only slow tests), not both
if [ "$quick" -eq 5 ] && [ "$slow" -eq 5 ]; then exit 5; fi
if [ "$quick" -ne 0 ] && [ "$quick" -ne 5 ]; then exit "$quick"; fi
if [ "$slow" -ne 5 ]; then exit "$slow"; fi
exit 0
