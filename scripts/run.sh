#!/usr/bin/env bash
# Set up the environment (idempotent) and run the main job on its embedded default.
# Extra arguments are config overrides, e.g. `bash scripts/run.sh trainer.total_training_steps=5`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
venv="${VERL_VENV:-$root/.venv}"
cd "$root"
# one line of this machine's rates (bf16/fp32 matmul, copy bandwidth): run times mean
# something only next to them (docs/benchmarks.md)
"$venv/bin/python" -m verl.utils.calibrate
exec "$venv/bin/python" -m verl.trainer.main_ppo --config "$root/examples/grpo_smollm2_arithmetic.yaml" "$@"
