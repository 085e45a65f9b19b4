"""GRPO on two FSDP2 ranks with ``rollout.name=vllm`` (one engine on rank 0); prints one JSON line.

Run in a subprocess by ``tests/rollout/test_vllm_rollout.py`` (vLLM's process-wide side
effects stay out of pytest; this script starts and stops its own Ray session):

    python tests/rollout/vllm_two_ranks_check.py OUT_DIR [OVERRIDE ...]

(extra config overrides: ``tests/rollout/test_vllm_tp.py`` adds vLLM's tensor parallelism)

Two Ray workers shard a tiny Qwen2 (hidden 256, head size 64: vLLM's CPU attention has no
kernel for the smaller default tiny model) with FSDP2 over gloo; rank 0 runs the vLLM engine
for both ranks' prompts, and every update is gathered bucket by bucket and pushed into it.
Step 2 samples with the weights pushed after step 1, so its rollout-vs-trainer log-prob gap
(``rollout/logprob_abs_diff_*``, the trainer's recomputation on both ranks' FSDP2 shards)
shows whether the gathered push reached the engine. After training, both ranks' engine
(rank 0's) generates greedily for 6 prompts split 3 + 3 over the ranks; the driver compares
the responses and log-probs with the native engine over the trained model, gathered into one
HF directory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.rollout.conftest import make_batch
from verl.config import load_config
from verl.controller import ensure_ray, shutdown_ray
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import VLLM_TINY_SHAPE, save_tiny_model_dir
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.trainer.rl.trainer import RLTrainer

PROMPTS = ["1+2=", "what is 3*4", "7-5=", "the sum of 8 and 9 is", "2*2=", "hello"]


def main(out_dir: Path, extra: list[str]) -> None:
    model_dir = save_tiny_model_dir(out_dir / "model", **VLLM_TINY_SHAPE)
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            # 2 buckets of the 5.9 MiB state dict: the ranks gather bucket by bucket
            "actor_rollout_ref.rollout.vllm.weight_sync_bucket_mb=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            # the random model's reward is 0 everywhere: the entropy bonus makes the update move
            "actor_rollout_ref.actor.entropy_coeff=0.05",
            "data.train_batch_size=8",
            "data.max_response_length=12",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=8",
            "trainer.n_gpus_per_node=2",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",  # fp32 engine and trainer (auto: bf16 here)
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out_dir / 'ckpt'}",
            f"trainer.log_dir={out_dir}",
            *extra,
        ]
    )
    ensure_ray(num_cpus=2)
    try:
        start = time.perf_counter()
        trainer = RLTrainer(cfg)
        world_size = trainer.actor_rollout_wg.world_size
        close, trainer.close = trainer.close, lambda: None  # keep the workers for the check
        try:
            result = trainer.fit()
            seconds = time.perf_counter() - start
            greedy = greedy_against_native(trainer, Path(result["hf_dir"]), model_dir)
        finally:
            close()
    finally:
        shutdown_ray()
    keys = (
        "rollout/logprob_abs_diff_mean",
        "rollout/logprob_abs_diff_max",
        "rollout/kl_k1",
        "rollout/weight_sync_seconds",
        "actor/grad_norm",
        "response_length/mean",
    )
    steps = [{k: m.get(k) for k in keys} for m in trainer.history]
    print(json.dumps({"world_size": world_size, "seconds": seconds, "steps": steps, **greedy}))


def greedy_against_native(trainer: RLTrainer, hf_dir: Path, initial_dir: Path) -> dict:
    """Greedy responses of the engine (through both ranks) vs the native engine on hf_dir."""
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    tokenizer.padding_side = "left"
    prompts = make_batch(tokenizer, PROMPTS).select(non_tensor_keys=[], meta_keys=[])
    prompts.meta_info.update(do_sample=False, n=1)
    engine_out = trainer.actor_rollout_wg.generate_sequences(prompts)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    params = SamplingParams(
        n=1,
        do_sample=False,
        max_new_tokens=engine_out.batch["responses"].shape[1],
        stop_token_ids=[eos] if eos is not None else [],
    )
    native = NativeRollout(model, tokenizer).generate(prompts, params)
    got, want = engine_out.batch, native.batch
    # the same responses scored by the initial model: how far a missed push would be
    initial = AutoModelForCausalLM.from_pretrained(initial_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        (stale, *_) = compute_response_log_probs(
            initial,
            got["input_ids"],
            got["attention_mask"],
            got["position_ids"],
            response_len=got["responses"].shape[1],
        )
    stale_diff = ((stale - got["rollout_log_probs"]) * got["response_mask"]).abs().max()
    return {
        "greedy_rows": int(got["responses"].shape[0]),
        "greedy_same_responses": bool(torch.equal(got["responses"], want["responses"])),
        "greedy_same_mask": bool(torch.equal(got["response_mask"], want["response_mask"])),
        "greedy_same_prompts": bool(torch.equal(got["prompts"], want["prompts"])),
        "greedy_max_logprob_diff": float(
            (got["rollout_log_probs"] - want["rollout_log_probs"]).abs().max()
        ),
        "greedy_tokens": int(got["response_mask"].sum()),
        "initial_model_max_logprob_diff": float(stale_diff),
    }


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
