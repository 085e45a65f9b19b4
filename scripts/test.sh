#!/usr/bin/env bash
# Set up the environment (idempotent) and run lint + the whole test suite, slow tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`. Tests run in
# VERL_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this process), handed out
# longest first as workers free up; the tests on the session's Ray clusters run in two groups
# (loadgroup, a cluster each: see tests/conftest.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
venv="${VERL_VENV:-$root/.venv}"
cd "$root"
# Python may cache compiled modules: every test and every process a test starts (ranks, Ray
# workers, child drivers) imports verl's modules, which without the cache are compiled again
# each time (about 0.5 s a process), and pytest rewrites every test module on each worker.
unset PYTHONDONTWRITEBYTECODE
"$venv/bin/ruff" check verl tests bench
"$venv/bin/ruff" format --check verl tests bench
# --durations: the 25 slowest tests at the end of the log, where suite time is lost.
# --no-loadscope-reorder: xdist hands out the work units in the order tests/conftest.py gives
# them (longest first), not sorted by how many tests each holds.
"$venv/bin/python" -m pytest -q -n "${VERL_TEST_WORKERS:-2}" --dist loadgroup \
    --no-loadscope-reorder --durations=25 "$@"
