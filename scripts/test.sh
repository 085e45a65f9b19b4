#!/usr/bin/env bash
# Set up the environment (idempotent) and run lint + the whole test suite, slow tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
venv="${VERL_VENV:-$root/.venv}"
cd "$root"
"$venv/bin/ruff" check verl tests bench
"$venv/bin/ruff" format --check verl tests bench
"$venv/bin/python" -m pytest -q "$@"
