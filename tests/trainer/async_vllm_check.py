"""A 2-step asynchronous GRPO run with ``rollout.name=vllm``; prints one JSON line.

Run in a subprocess by ``tests/trainer/test_async_vllm.py`` (vLLM seeds, binds threads and
builds a torch.distributed group in the process that starts it):

    python tests/trainer/async_vllm_check.py MODE OUT_DIR

``MODE``: ``one_step_off`` (``max_staleness=1``), ``streaming`` (``max_staleness=1``),
``streaming0`` (``max_staleness=0``), ``streaming_ray`` (``max_staleness=1``, the copy in a
Ray actor) or ``sync`` (``trainer.async_rollout=false``). A tiny
Qwen2 (head size 64: vLLM's CPU attention has no kernel for the smaller default tiny model),
fp32 on both sides (the log-prob gap is then the engine's fidelity). The JSON holds each
step's metrics and the responses each update trained on.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import verl.rollout.vllm_stream as vllm_stream
from verl.config import load_config
from verl.controller import ensure_ray, shutdown_ray
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import VLLM_TINY_SHAPE, save_tiny_model_dir
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer

MODES = {
    "one_step_off": ["trainer.async_rollout=true", "trainer.max_staleness=1"],
    "streaming": [
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
    ],
    "streaming0": [
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=0",
    ],
    "sync": [],
    # the rollout copy in a Ray actor of its own (its calls return whole: no streaming)
    "streaming_ray": [
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        "trainer.backend=ray",
    ],
}
KEYS = (
    "rollout/logprob_abs_diff_mean",
    "rollout/logprob_abs_diff_max",
    "actor/pg_loss",
    "actor/grad_norm",
    "async/staleness_mean",
    "async/staleness_max",
    "async/stale_sample_fraction",
    "async/weight_sync_seconds",
    "timing_s/async_weight_sync",
    "stream/dropped_groups",
    "response_length/mean",
)


def main(mode: str, out_dir: Path) -> None:
    model_dir = save_tiny_model_dir(out_dir / "model", **VLLM_TINY_SHAPE)
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.seed=11",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            # the random model's reward is 0 everywhere: the entropy bonus makes updates move
            "actor_rollout_ref.actor.entropy_coeff=0.05",
            "data.train_batch_size=4",
            "data.max_response_length=12",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=4",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",
            f"trainer.total_training_steps={3 if mode == 'one_step_off' else 2}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            f"trainer.default_local_dir={out_dir / 'ckpt'}",
            *MODES[mode],
        ]
    )
    if mode.endswith("_ray"):
        ensure_ray(num_cpus=2)
    try:
        result = _fit(cfg, model_dir)
    finally:
        if mode.endswith("_ray"):
            shutdown_ray()
    print(json.dumps({"mode": mode, **result}))


def _fit(cfg, model_dir: Path) -> dict:
    streamed = []  # (call, prompt index) of each group the copy's vLLM engine streamed
    streaming_generate = vllm_stream.generate_streaming

    def counting(rollout, prompts, params, sink):
        if sink is None:  # one-step-off: the same step loop, no groups handed over
            return streaming_generate(rollout, prompts, params, None)
        call = len({c for c, _ in streamed})

        def counted(prompt, group, p):
            streamed.append((call, prompt))
            sink(prompt, group, p)

        return streaming_generate(rollout, prompts, params, counted)

    vllm_stream.generate_streaming = counting
    trainer = RLTrainer(cfg, tracker=Tracker([]))
    trained = []
    update = trainer.update_policy

    snapshots = []  # the actor's weights after k updates, at index k
    scorer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def recording_update(gen):
        snapshots.append(trainer.actor_rollout_wg.state_dict_for_save()[0])
        versions = [int(v) for v in gen.non_tensor_batch.get("rollout_policy_version", [])]
        # the rollout's log-probs against the policy version recorded as having sampled them
        # (the synchronous run: the current one): how far they are shows which weights the
        # engine held
        scorer.load_state_dict(snapshots[versions[0] if versions else len(snapshots) - 1])
        b = gen.batch
        with torch.no_grad():
            (log_probs, *_) = compute_response_log_probs(
                scorer,
                b["input_ids"],
                b["attention_mask"],
                b["position_ids"],
                response_len=b["responses"].shape[1],
            )
        gap = ((log_probs - b["rollout_log_probs"]) * b["response_mask"]).abs().max()
        trained.append(
            {
                "responses": b["responses"].tolist(),
                "versions": versions,
                "gap_to_recorded_version": float(gap),
            }
        )
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    steps = [{k: m.get(k) for k in KEYS} for m in trainer.history]
    threads = [t.name for t in threading.enumerate() if t.name.startswith("verl-rollout")]
    return {"steps": steps, "trained": trained, "streamed": streamed, "threads": threads}


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
