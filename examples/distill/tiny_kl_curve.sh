#!/usr/bin/env bash
# On-policy distillation on the tiny random model (CPU): a student (tiny Qwen2, seed 0)
# distils a teacher with the same tokenizer (the same weights, logits scaled 3x)
# on the built-in arithmetic prompts, once with estimator=k1 and once with topk (k=8). Each
# step samples fresh responses from the student, so actor/distill_loss in
# OUT/logs_<estimator>/metrics.jsonl is the reverse KL to the teacher on its current samples.
# Usage: bash examples/distill/tiny_kl_curve.sh OUT [STEPS [key=value ...]] (passed on last)
set -euo pipefail
OUT=${1:?usage: tiny_kl_curve.sh OUT [STEPS [key=value ...]]}
STEPS=${2:-60}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
"$PYTHON" - "$OUT" <<'PY'
import sys
import torch
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
save_tiny_model_dir(f"{sys.argv[1]}/student", arch="qwen2", seed=0)
# the teacher: the student's own weights with its logits scaled 3x (final norm), a sharper
# version of the student: the two share their likely tokens, as a student and a teacher
# that distillation can bring together do (docs/distillation.md has the measured curves)
teacher = build_tiny_model(arch="qwen2", seed=0)
with torch.no_grad():
    teacher.model.norm.weight.mul_(3.0)
teacher.save_pretrained(f"{sys.argv[1]}/teacher")
build_tiny_tokenizer().save_pretrained(f"{sys.argv[1]}/teacher")
PY
for EST in k1 topk; do
  "$PYTHON" -m verl.cli distill \
    --config "$(dirname "$0")/opd_smollm2_arithmetic.yaml" \
    actor_rollout_ref.model.path="$OUT/student" \
    algorithm.distill.teacher_path="$OUT/teacher" \
    algorithm.distill.estimator=$EST algorithm.distill.topk=8 \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    data.max_response_length=8 data.arithmetic.train_size=512 data.arithmetic.val_size=8 \
    trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
    trainer.device=cpu trainer.mixed_precision=none 'trainer.logger=[jsonl]' \
    trainer.log_dir="$OUT/logs_$EST" trainer.default_local_dir="$OUT/ckpt_$EST" "${@:3}"
done
