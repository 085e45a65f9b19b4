#!/usr/bin/env bash
# Tutorial 001's run script: GRPO on Qwen3-0.6B with the FSDP config of
# configs/qwen3-0.6b.yaml (2 FSDP ranks; Ray starts them). Qwen3-0.6B is not shipped:
# MODEL_PATH names a local HuggingFace directory of it (or of any causal LM).
# Extra arguments are config overrides, e.g. trainer.total_training_steps=2.
#   MODEL_PATH=/models/Qwen3-0.6B bash examples/grpo_trainer/run_qwen3-0.6b.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="${MODEL_PATH:-}"
if [ -z "$model" ] || [ ! -d "$model" ]; then
    echo "run_qwen3-0.6b.sh: no model directory at MODEL_PATH='$model'. Qwen3-0.6B is not" \
        "shipped with verl: download it (huggingface-cli download Qwen/Qwen3-0.6B" \
        "--local-dir DIR) and set MODEL_PATH=DIR, or run the embedded SmolLM2 example" \
        "instead: bash scripts/run.sh" >&2
    exit 2
fi
python="${PYTHON:-python}"
exec "$python" -m verl.trainer.main_ppo --config "$here/configs/qwen3-0.6b.yaml" \
    "actor_rollout_ref.model.path=$model" "$@"
