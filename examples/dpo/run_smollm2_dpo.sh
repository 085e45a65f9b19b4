#!/usr/bin/env bash
# DPO on the embedded SmolLM2-135M-Instruct with built-in arithmetic preference pairs (the
# right answer chosen, a wrong one rejected; generated when data.train_files is empty),
# against the frozen initial model. algorithm.loss_type=ipo or kto switches the loss.
# Your own pairs: data.train_files=pairs.jsonl (prompt, chosen, rejected: docs/sft_dpo.md).
#   bash examples/dpo/run_smollm2_dpo.sh
#   bash examples/dpo/run_smollm2_dpo.sh trainer.total_training_steps=2
# Extra arguments are more overrides and win over the ones below. PYTHON picks the
# interpreter (default python3). Output: runs/verl/dpo_smollm2_arith/,
# checkpoints/verl/dpo_smollm2_arith/huggingface/.
set -euo pipefail
python="${PYTHON:-python3}"
exec "$python" -m verl.trainer.main_dpo \
    data.builtin=arithmetic \
    data.train_batch_size=8 \
    model.path=smollm2-135m-instruct \
    algorithm.loss_type=dpo \
    algorithm.beta=0.1 \
    optim.lr=1e-6 \
    trainer.total_epochs=1 \
    'trainer.logger=[console,jsonl]' \
    trainer.experiment_name=dpo_smollm2_arith \
    "$@"
