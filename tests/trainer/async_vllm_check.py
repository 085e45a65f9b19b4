"""A 2-step asynchronous GRPO run with ``rollout.name=vllm``; prints one JSON line.

Run in a subprocess by ``tests/trainer/test_async_vllm.py`` (vLLM seeds, binds threads and
builds a torch.distributed group in the process that starts it):

    python tests/trainer/async_vllm_check.py MODE OUT_DIR

``MODE``: ``one_step_off`` (``max_staleness=1``), ``streaming`` (``max_staleness=1``),
``streaming0`` (``max_staleness=0``), ``streaming_ray`` (``max_staleness=1``, the copy in a
Ray actor), ``streaming_partial`` (``max_staleness=1``, ``trainer.partial_rollout=continue``,
the copy's engine steps slowed by ``PARTIAL_STEP_DELAY_S``) or ``sync``
(``trainer.async_rollout=false``). A tiny
Qwen2 (head size 64: vLLM's CPU attention has no kernel for the smaller default tiny model),
fp32 on both sides (the log-prob gap is then the engine's fidelity). The JSON holds each
step's metrics and the responses each update trained on.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import verl.rollout.vllm_stream as vllm_stream
from verl.config import load_config
from verl.controller import ensure_ray, shutdown_ray
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import VLLM_TINY_SHAPE, save_tiny_model_dir
from verl.rollout.partial import TOKEN_VERSIONS
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout
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
    # new weights between two engine steps of the call in flight (engine steps slowed down,
    # so that the second call is still decoding when the first update's weights are posted)
    "streaming_partial": [
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        "trainer.partial_rollout=continue",
    ],
    # the rollout copy in a Ray actor of its own (the driver polls it for finished groups)
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
    "stream/midcall_weight_swaps_total",
    "timing_s/async_midcall_weight_load_total",
)
#: seconds each engine step of the copy is held back in ``streaming_partial``
PARTIAL_STEP_DELAY_S = 0.5


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
        result = _fit(cfg, model_dir, PARTIAL_STEP_DELAY_S if mode.endswith("_partial") else 0.0)
    finally:
        if mode.endswith("_ray"):
            shutdown_ray()
    print(json.dumps({"mode": mode, **result}))


def _fit(cfg, model_dir: Path, step_delay_s: float) -> dict:
    streamed = []  # (call, prompt index) of each group the copy's vLLM engine streamed
    streaming_generate = vllm_stream.generate_streaming

    def counting(rollout, prompts, params, sink):
        engine = rollout.llm.llm_engine
        if step_delay_s and not hasattr(engine, "verl_plain_step"):
            engine.verl_plain_step = engine.step

            def slow_step():
                time.sleep(step_delay_s)
                return engine.verl_plain_step()

            engine.step = slow_step
        if sink is None:  # one-step-off: the same step loop, no groups handed over
            return streaming_generate(rollout, prompts, params, None)
        call = len({c for c, _ in streamed})

        def counted(prompt, group, p):
            streamed.append((call, prompt))
            sink(prompt, group, p)

        return streaming_generate(rollout, prompts, params, counted)

    vllm_stream.generate_streaming = counting
    # (batch, prompt index) of each group that reached the driver's buffer during its call:
    # in this process's sink, or polled from a copy in a Ray actor
    arrived = []
    plain_sink_for = AsyncRollout._sink_for

    def recording_sink_for(self, item, prompts):
        sink = plain_sink_for(self, item, prompts)

        def recorded(prompt, group, params):
            arrived.append((item.index, prompt))
            sink(prompt, group, params)

        return recorded

    AsyncRollout._sink_for = recording_sink_for
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
        # the tokens of the recorded (oldest) version: with partial rollouts the later ones
        # were sampled by newer weights over a cache partly written by older ones
        mask = b["response_mask"].bool()
        tokens = b.get(TOKEN_VERSIONS, None)
        if tokens is not None and versions:
            mask &= tokens == torch.tensor(versions).unsqueeze(1)
        gap = ((log_probs - b["rollout_log_probs"]) * mask).abs().max()
        record = {
            "responses": b["responses"].tolist(),
            "versions": versions,
            "gap_to_recorded_version": float(gap),
        }
        if tokens is not None:
            valid = tokens[b["response_mask"].bool()]
            record["token_versions"] = sorted(set(valid.tolist()))
            record["mixed_rows"] = sum(
                len(set(row[row >= 0].tolist())) > 1 for row in tokens.unbind(0)
            )
        trained.append(record)
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    steps = [{k: m.get(k) for k in KEYS} for m in trainer.history]
    threads = [t.name for t in threading.enumerate() if t.name.startswith("verl-rollout")]
    return {
        "steps": steps,
        "trained": trained,
        "streamed": streamed,
        "arrived": arrived,
        "threads": threads,
    }


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
