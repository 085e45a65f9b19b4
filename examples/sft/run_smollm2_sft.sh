#!/usr/bin/env bash
# Supervised fine-tuning of the embedded SmolLM2-135M-Instruct on the built-in arithmetic
# chats ("What is 3 * 4? ..." -> "12"; 192 train / 32 validation rows generated when
# data.train_files is empty), loss on the assistant's tokens only. CPU, a few minutes.
# Your own data: data.train_files=chats.jsonl (a `messages` column, or `prompt`/`response`;
# docs/data.md and docs/sft_dpo.md).
#   bash examples/sft/run_smollm2_sft.sh
#   bash examples/sft/run_smollm2_sft.sh trainer.total_training_steps=2
# Extra arguments are more overrides and win over the ones below. PYTHON picks the
# interpreter (default python3). Output: runs/verl/sft_smollm2_arith/,
# checkpoints/verl/sft_smollm2_arith/huggingface/.
set -euo pipefail
python="${PYTHON:-python3}"
exec "$python" -m verl.trainer.main_sft \
    data.builtin=arithmetic \
    data.train_batch_size=8 \
    data.micro_batch_size_per_device=4 \
    data.max_length=512 \
    model.path=smollm2-135m-instruct \
    optim.lr=1e-5 \
    optim.warmup_style=cosine \
    trainer.total_epochs=1 \
    'trainer.logger=[console,jsonl]' \
    trainer.experiment_name=sft_smollm2_arith \
    "$@"
