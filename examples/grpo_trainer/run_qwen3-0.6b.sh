#!/usr/bin/env bash
# Tutorial 001's run script: GRPO on Qwen3-0.6B with the FSDP config of
# configs/qwen3-0.6b.yaml, written in the tutorial's own keys (parallel_config, fsdp_init;
# read as the native ones, docs/tutorials/001_fsdp.md): 2 FSDP2 ranks that Ray starts, the
# built-in arithmetic data. For a GPU run on GSM8K with the vLLM rollout in native keys, see
# run_qwen3-0.6b_gsm8k.sh. MODEL_PATH names a local HuggingFace directory of Qwen3-0.6B (or
# of any causal LM). Extra arguments are config overrides, e.g. trainer.total_training_steps=2.
#   MODEL_PATH=/models/Qwen3-0.6B bash examples/grpo_trainer/run_qwen3-0.6b.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_qwen3_model.sh"
exec "$python" -m verl.trainer.main_ppo --config "$here/configs/qwen3-0.6b.yaml" \
    "actor_rollout_ref.model.path=$model" "$@"
