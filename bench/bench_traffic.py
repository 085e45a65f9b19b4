"""Benchmark: bytes that cross the driver/worker boundary in one PPO (GAE, with critic) step.

Runs one ``RLTrainer.train_step`` on the local backend with every worker group watched by
:class:`verl.controller.traffic.TrafficMeter`, and reports per worker method the pickled
bytes each call sends to its workers (what Ray would ship) and gets back, and which batch
keys crossed. Nothing here depends on the model's size: the volume is set by the batch
shape (prompts x samples x prompt and response tokens) and the keys.

    python bench/bench_traffic.py                 # tiny Qwen2, 4 prompts x 2, 6 tokens
    python bench/bench_traffic.py --preset main   # the main job's batch: 8 prompts x 4, 8 tokens
    python bench/bench_traffic.py --preset main --model smollm2-135m-instruct

Prints a table and one JSON line (``{"config": ..., "methods": {...}, "total_sent": ...}``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

PRESETS = {
    # the trainer tests' batch (tests/trainer/conftest.py)
    "tiny": [
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
    ],
    # the quick job's batch (examples/grpo_smollm2_arithmetic_quick.yaml), with a critic (GAE)
    "main": [
        "data.train_batch_size=8",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "data.arithmetic.digits=1",
        "data.arithmetic.ops=['+','*']",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
        "critic.ppo_mini_batch_size=8",
        "critic.ppo_micro_batch_size_per_device=8",
    ],
}


def measure(model: str, preset: str, extra: list[str], out_dir: str) -> dict:
    from verl.config import load_config
    from verl.controller.traffic import TrafficMeter
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "algorithm.adv_estimator=gae",
        "data.arithmetic.train_size=64",
        "data.arithmetic.val_size=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={out_dir}",
        f"trainer.log_dir={out_dir}",
        *PRESETS[preset],
        *extra,
    ]
    trainer = RLTrainer(load_config(overrides=overrides), tracker=Tracker([]))
    try:
        batch = next(iter(trainer.train_loader))
        meter = TrafficMeter()
        with meter.watch(trainer.actor_rollout_wg, trainer.critic_wg, trainer.rm_wg):
            trainer.train_step(batch)
    finally:
        trainer.close()
    methods = {
        name: {
            "calls": row["calls"],
            "sent_bytes": row["sent_bytes"],
            "returned_bytes": row["returned_bytes"],
            "keys": sorted(row["keys"]),
            "meta_keys": sorted(row["meta_keys"]),
        }
        for name, row in meter.by_method().items()
    }
    return {
        "config": {"model": model, "preset": preset, "overrides": extra},
        "methods": methods,
        "total_sent": meter.sent_bytes(),
        "total_returned": meter.returned_bytes(),
        "table": meter.table(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--model", default=None, help="model path (default: a tiny Qwen2)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from verl.models.tiny import save_tiny_model_dir

            model = str(save_tiny_model_dir(Path(tmp) / "model", arch="qwen2"))
        result = measure(model, args.preset, args.overrides, str(Path(tmp) / "run"))
    print(result.pop("table"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
