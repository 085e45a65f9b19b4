#!/usr/bin/env bash
# Set up the environment (idempotent) and run lint + the whole test suite, slow tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`. Tests run in
# VERL_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this process), handed out
# as workers free up; the tests on the session's Ray cluster share one worker (loadgroup).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
venv="${VERL_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check verl tests bench
"$venv/bin/ruff" format --check verl tests bench
# --durations: the 25 slowest tests at the end of the log, where suite time is lost
"$venv/bin/python" -m pytest -q -n "${VERL_TEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
