#!/usr/bin/env bash
# GRPO on Qwen3-0.6B with GSM8K on one CUDA GPU, the vLLM rollout and bf16 compute: the
# upstream-verl example in this project's keys (docs/quickstart_gpu.md).
#
#   MODEL_PATH  local HuggingFace directory of Qwen3-0.6B (or any causal LM), required:
#               huggingface-cli download Qwen/Qwen3-0.6B --local-dir /models/Qwen3-0.6B
#   GSM8K_DIR   directory with GSM8K's train.jsonl and test.jsonl (question, answer), e.g.
#               git clone https://github.com/openai/grade-school-math; then
#               GSM8K_DIR=grade-school-math/grade_school_math/data. Converted once with
#               `verl data gsm8k` into DATA_DIR (default data/gsm8k) as train/test.parquet.
#               Not needed when DATA_DIR already holds both parquet files.
#   PYTHON      interpreter (default python3); needs `pip install -e '.[vllm]'` (CUDA).
#
#   MODEL_PATH=/models/Qwen3-0.6B GSM8K_DIR=/data/gsm8k bash examples/grpo_trainer/run_qwen3-0.6b_gsm8k.sh
# Extra arguments are more overrides and win over the ones below (e.g. a smoke run:
# trainer.total_training_steps=2 data.train_batch_size=16). vLLM runs on one actor rank
# only (docs/rollout.md), hence one GPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_qwen3_model.sh"
data_dir="${DATA_DIR:-data/gsm8k}"
for split in train test; do
    if [ ! -f "$data_dir/$split.parquet" ]; then
        src="${GSM8K_DIR:-}/$split.jsonl"
        if [ -z "${GSM8K_DIR:-}" ] || [ ! -f "$src" ]; then
            echo "$(basename "$0"): no $data_dir/$split.parquet and no GSM8K file at" \
                "GSM8K_DIR='${GSM8K_DIR:-}' ($src): set GSM8K_DIR to the directory with" \
                "GSM8K's train.jsonl and test.jsonl (github.com/openai/grade-school-math," \
                "grade_school_math/data)" >&2
            exit 2
        fi
        "$python" -m verl.cli data gsm8k --input "$src" --out "$data_dir/$split.parquet"
    fi
done
exec "$python" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    "data.train_files=[$data_dir/train.parquet]" \
    "data.val_files=[$data_dir/test.parquet]" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.truncation=drop \
    actor_rollout_ref.model.path="$model" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_device=24576 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.vllm.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_device=32 \
    trainer.mixed_precision=bf16 \
    trainer.n_gpus_per_node=1 \
    trainer.total_epochs=15 \
    trainer.test_freq=5 \
    trainer.save_freq=20 \
    'trainer.logger=[console,jsonl]' \
    trainer.experiment_name=grpo_qwen3-0.6b_gsm8k \
    "$@"
