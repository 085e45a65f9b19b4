"""TRL's side of ``bench_vs_trl.py``: GRPO with ``trl.GRPOTrainer`` on one workload.

Runs in the benchmark's own TRL virtual environment (TRL is not a dependency of verl), so
it imports nothing from verl: only ``_addition_reward.py`` (standard library), by path.
Writes one JSON object to ``--out``: per optimizer step its wall time (``on_step_begin`` to
``on_step_end``, which spans generation, reward, loss and the optimizer step) and TRL's
logged mean completion length and reward.

    python bench/_trl_side.py --model-dir DIR --data prompts.jsonl --out trl.json \
        --prompts 16 --n 4 --max-new-tokens 16 --steps 6 --setting identical
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path


def _load_reward():
    path = Path(__file__).with_name("_addition_reward.py")
    spec = importlib.util.spec_from_file_location("_addition_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.exact_match


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", required=True, help="jsonl rows: prompt, reward_model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, required=True, help="prompts per step")
    parser.add_argument("--n", type=int, required=True, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument(
        "--setting", choices=("identical", "recommended", "defaults"), required=True
    )
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    start = time.perf_counter()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    exact_match = _load_reward()
    with open(args.data) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]} for r in rows]
    )

    def addition_reward(completions, answer, **_):
        # conversational prompts give completions as [{"role": "assistant", "content": ...}]
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [exact_match(t, a) for t, a in zip(texts, answer, strict=True)]

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict] = []
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append({"step_s": time.perf_counter() - self._t0})

        def on_log(self, args, state, control, logs=None, **kwargs):
            # logging_steps=1: the log after step k describes step k
            if logs and self.steps and "completions/mean_length" in logs:
                self.steps[-1]["mean_completion_len"] = float(logs["completions/mean_length"])
                self.steps[-1]["reward"] = float(logs.get("reward", float("nan")))

    samples = args.prompts * args.n
    # the workload: prompts x n samples per generation, one optimizer step per generation,
    # no KL, the learning rate; everything else is the setting's
    workload = dict(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"),
        num_generations=args.n,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        beta=0.0,  # no KL: no reference model
        learning_rate=args.lr,
        max_steps=args.steps,
        shuffle_dataset=False,  # the same prompts in the same order as verl's side
        seed=args.seed,
        use_cpu=True,
        logging_steps=1,  # the step clock reads every step's log
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    if args.setting == "defaults":
        # TRL's own micro-batch (per_device_train_batch_size), bf16, gradient checkpointing,
        # loss, schedule and weight decay; accumulation makes one step of all the samples
        micro = GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].default
        if samples % micro:
            raise SystemExit(f"{samples} samples per step are not a multiple of TRL's {micro}")
        config = GRPOConfig(**workload, gradient_accumulation_steps=samples // micro)
    else:
        recommended = args.setting == "recommended"
        config = GRPOConfig(
            **workload,
            # one optimizer step per generated batch, the whole batch in one forward/backward
            per_device_train_batch_size=samples,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            top_p=1.0,
            top_k=0,
            epsilon=0.2,
            loss_type="dapo",  # token mean over the batch = verl's loss_agg_mode=token-mean
            scale_rewards="group",
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            max_grad_norm=1.0,
            bf16=recommended,
            gradient_checkpointing=recommended,
            model_init_kwargs={"dtype": torch.float32},
            dataloader_num_workers=0,
        )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=args.model_dir,
        reward_funcs=addition_reward,
        args=config,
        train_dataset=dataset,
        callbacks=[clock],
    )
    setup_s = time.perf_counter() - start
    trainer.train()
    result = {
        "side": "trl",
        "setting": args.setting,
        "config": {
            k: getattr(config, k)
            for k in (
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "steps_per_generation",
                "bf16",
                "gradient_checkpointing",
            )
        },
        "steps": clock.steps,
        "setup_s": round(setup_s, 2),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
