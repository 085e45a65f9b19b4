#!/usr/bin/env bash
# On-policy distillation on the tiny random models (CPU, about a minute): a student (tiny
# Qwen2, seed 0) distils a teacher with the same tokenizer (tiny Qwen2, seed 3, width 96)
# on the built-in arithmetic prompts; each step samples fresh responses from the student, so
# actor/distill_loss in OUT/logs_<estimator>/metrics.jsonl is the reverse KL to the teacher on
# the student's current samples. Usage: bash examples/distill/tiny_kl_curve.sh OUT [STEPS]
set -euo pipefail
OUT=${1:?usage: tiny_kl_curve.sh OUT [STEPS]}
STEPS=${2:-30}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
"$PYTHON" - "$OUT" <<'PY'
import sys
from verl.models.tiny import save_tiny_model_dir
save_tiny_model_dir(f"{sys.argv[1]}/student", arch="qwen2", seed=0)
save_tiny_model_dir(f"{sys.argv[1]}/teacher", arch="qwen2", seed=3, hidden_size=96)
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
    trainer.log_dir="$OUT/logs_$EST" trainer.default_local_dir="$OUT/ckpt_$EST"
done
