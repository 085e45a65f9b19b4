#!/usr/bin/env bash
# GRPO with multi-turn rollouts and a tool: the embedded SmolLM2-135M-Instruct multiplies
# 3-digit numbers and may call the built-in calculator between its turns (the preset
# examples/grpo_smollm2_calculator.yaml; docs/multiturn.md). CPU. Writes the data first
# (`verl data arithmetic --prompt-style tool`) into DATA_DIR (default data/calc) unless it
# is there. No learning curve has been measured for this preset yet.
#   bash examples/grpo_trainer/run_smollm2_calculator.sh
#   bash examples/grpo_trainer/run_smollm2_calculator.sh trainer.total_training_steps=2
# Extra arguments are more overrides and win over the preset. PYTHON picks the interpreter
# (default python3). Output: runs/verl/grpo_smollm2_calculator/,
# checkpoints/verl/grpo_smollm2_calculator/huggingface/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
data_dir="${DATA_DIR:-data/calc}"
if [ ! -f "$data_dir/train.parquet" ] || [ ! -f "$data_dir/test.parquet" ]; then
    "$python" -m verl.cli data arithmetic --out "$data_dir" --digits 3 --ops '*' \
        --prompt-style tool --train-size "${TRAIN_SIZE:-1000}" --val-size "${VAL_SIZE:-64}"
fi
exec "$python" -m verl.trainer.main_ppo --config "$here/../grpo_smollm2_calculator.yaml" \
    "data.train_files=[$data_dir/train.parquet]" \
    "data.val_files=[$data_dir/test.parquet]" \
    "$@"
