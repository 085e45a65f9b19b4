#!/usr/bin/env bash
# The device check: one command, on a machine with one CUDA GPU (or, with --device cpu, on
# any machine; CI runs that mode). Needs a Python that already has torch, transformers,
# peft, pyarrow and safetensors, and no network: verl itself is installed without its
# dependencies when it is not importable yet. Arguments go to scripts/gpu_check.py
# (--device, --steps, --json, --only); see its docstring for the checks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python}"
cd "$root"
if ! "$py" -c "import verl" 2>/dev/null; then
    echo "[gpu_check] installing verl (editable, no dependencies)"
    "$py" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$root"
fi
exec "$py" "$root/scripts/gpu_check.py" "$@"
