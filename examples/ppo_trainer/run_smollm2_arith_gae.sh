#!/usr/bin/env bash
# PPO with a critic (GAE advantages) on the embedded SmolLM2-135M-Instruct, built-in
# one-digit + and * problems. The critic is a second SmolLM2 body with a scalar value head
# (critic.model.path defaults to the actor's model), so a step costs about twice a GRPO
# step and the process holds two models with their optimizers (about 3 GiB more RSS).
#   bash examples/ppo_trainer/run_smollm2_arith_gae.sh
#   bash examples/ppo_trainer/run_smollm2_arith_gae.sh trainer.total_training_steps=2
# Extra arguments are more overrides and win over the ones below. PYTHON picks the
# interpreter (default python3). Output: runs/verl/ppo_smollm2_arith_gae/,
# checkpoints/verl/ppo_smollm2_arith_gae/huggingface/.
set -euo pipefail
python="${PYTHON:-python3}"
exec "$python" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=0.95 \
    data.builtin=arithmetic \
    data.arithmetic.digits=1 \
    'data.arithmetic.ops=["+","*"]' \
    data.arithmetic.train_size=512 \
    data.arithmetic.val_size=64 \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=8 \
    actor_rollout_ref.model.path=smollm2-135m-instruct \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8 \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    critic.optim.lr=1e-5 \
    critic.ppo_mini_batch_size=8 \
    critic.ppo_micro_batch_size_per_device=8 \
    critic.forward_micro_batch_size_per_device=16 \
    trainer.total_training_steps=16 \
    trainer.test_freq=4 \
    'trainer.logger=[console,jsonl]' \
    trainer.experiment_name=ppo_smollm2_arith_gae \
    "$@"
