#!/usr/bin/env bash
# GRPO on the embedded SmolLM2-135M-Instruct with the built-in one- and two-digit +, - and *
# problems: the main job (examples/grpo_smollm2_arithmetic.yaml, which `bash scripts/run.sh`
# runs), spelled out as key=value overrides. CPU, about 8 min of training for 48 steps on 2 idle cores;
# no model download, no data files (data.builtin=arithmetic writes them into the run's log
# directory).
#   bash examples/grpo_trainer/run_smollm2_arith.sh
#   bash examples/grpo_trainer/run_smollm2_arith.sh trainer.total_training_steps=2   # a smoke run
# Extra arguments are more overrides and win over the ones below. PYTHON picks the
# interpreter (default python3). Output: runs/verl/grpo_smollm2_arith/ (metrics.jsonl,
# metrics.png), checkpoints/verl/grpo_smollm2_arith/huggingface/ (the trained model).
set -euo pipefail
python="${PYTHON:-python3}"
exec "$python" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.filter_groups.enable=true \
    data.builtin=arithmetic \
    data.arithmetic.digits=1 \
    data.arithmetic.max_digits=2 \
    data.arithmetic.balance_digits=true \
    'data.arithmetic.ops=["+","-","*"]' \
    data.arithmetic.train_size=1024 \
    data.arithmetic.val_size=192 \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=16 \
    actor_rollout_ref.model.path=smollm2-135m-instruct \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=64 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_device=16 \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    trainer.mixed_precision=auto \
    trainer.total_training_steps=48 \
    trainer.test_freq=12 \
    'trainer.val_group_by=[op]' \
    'trainer.logger=[console,jsonl]' \
    trainer.experiment_name=grpo_smollm2_arith \
    "$@"
