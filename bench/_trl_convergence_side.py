"""TRL's side of ``bench_convergence_vs_trl.py``: ``GRPOTrainer`` for a wall-clock budget.

Runs in the benchmark's TRL virtual environment (``bench_vs_trl.ensure_trl_venv``), so it
imports nothing from verl's packages: its reward is verl's arithmetic scorer executed from
this checkout by path (``_arithmetic_scorer.py``), the clock is ``_budget_clock.py``.

The run: the task's keys (prompts per step, completions per prompt, completion length,
temperature, learning rate, no KL, the prompts in the file's order) and TRL's defaults for
everything else, as the ``defaults`` setting of ``bench_vs_trl.py``: its micro-batch
(``per_device_train_batch_size``, with ``gradient_accumulation_steps`` making one optimizer
step per generated batch), ``bf16``, gradient checkpointing, loss, clipping, weight decay.
Two keys are set for the budget: ``lr_scheduler_type="constant"`` (TRL's default decays
linearly to zero at ``max_steps``, which a wall-clock budget does not have; verl's preset is
constant too) and ``max_steps`` large enough never to end the run first. ``--trl-arg
KEY=VALUE`` (a JSON value, else a string) sets any other ``GRPOConfig`` key.

A ``TrainerCallback`` keeps the training clock: it starts at ``on_train_begin``, and at each
``on_step_end`` (after the optimizer step) saves the policy (``save_pretrained``) when a mark
has passed, with the clock paused, and stops training once the budget is spent. Writes one
JSON object to ``--out``: setup time (process start to ``on_train_begin``), per step its end
on the training clock and TRL's logged reward, and per snapshot its mark, training time,
step and directory.

    python bench/_trl_convergence_side.py --model-dir DIR --data train.jsonl --out trl.json \
        --prompts 8 --n 8 --max-new-tokens 16 --temperature 1.0 --lr 2e-5 \
        --budget-s 600 --marks-s 60 120 --snapshots SNAPDIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _arithmetic_scorer import load_compute_score
from _budget_clock import BudgetClock

START = time.perf_counter()


def parse_trl_args(items: list[str]) -> dict:
    """``KEY=VALUE`` strings as ``GRPOConfig`` keywords (the value as JSON, else a string)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--trl-arg {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", required=True, help="jsonl rows: prompt, reward_model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, required=True, help="prompts per step")
    parser.add_argument("--n", type=int, required=True, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--budget-s", type=float, required=True)
    parser.add_argument("--marks-s", type=float, nargs="+", required=True)
    parser.add_argument("--snapshots", type=Path, required=True)
    parser.add_argument("--trl-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    extra = parse_trl_args(args.trl_arg)

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    compute_score = load_compute_score()
    with open(args.data) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]} for r in rows]
    )

    def arithmetic_reward(completions, answer, **_):
        # conversational prompts give completions as [{"role": "assistant", "content": ...}]
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [compute_score(t, a)["score"] for t, a in zip(texts, answer, strict=True)]

    clock = BudgetClock(args.budget_s, args.marks_s)
    args.snapshots.mkdir(parents=True, exist_ok=True)
    record: dict = {"side": "trl", "steps": [], "snapshots": []}

    class BudgetCallback(TrainerCallback):
        def on_train_begin(self, targs, state, control, **kwargs):
            record["setup_s"] = round(time.perf_counter() - START, 2)
            clock.start()

        def on_step_end(self, targs, state, control, model=None, **kwargs):
            end_s = clock.elapsed()
            record["steps"].append({"step": state.global_step, "end_s": round(end_s, 3)})
            due = clock.due_marks()
            if due:
                out = args.snapshots / f"trl_t{due[-1]:.0f}s"
                with clock.paused():
                    model.save_pretrained(out)
                record["snapshots"].append(
                    {"marks_s": due, "train_s": round(end_s, 3), "step": state.global_step}
                    | {"dir": str(out)}
                )
            if clock.done():
                control.should_training_stop = True
            return control

        def on_log(self, targs, state, control, logs=None, **kwargs):
            # logging_steps=1: the log after step k describes step k
            if logs and record["steps"] and "reward" in logs:
                record["steps"][-1]["reward"] = float(logs["reward"])
                if "completions/mean_length" in logs:
                    length = float(logs["completions/mean_length"])
                    record["steps"][-1]["mean_completion_len"] = length

    samples = args.prompts * args.n
    micro = GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].default
    micro = extra.get("per_device_train_batch_size", micro)
    if samples % micro:
        raise SystemExit(
            f"{samples} samples per step are not a multiple of TRL's micro-batch {micro}"
        )
    keys = dict(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_convergence_"),
        num_generations=args.n,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        beta=0.0,  # no KL: no reference model
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        gradient_accumulation_steps=samples // micro,  # one optimizer step per batch
        max_steps=1_000_000,  # the budget ends the run
        shuffle_dataset=False,  # the file's order, as verl's side reads it
        seed=args.seed,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    config = GRPOConfig(**(keys | extra))
    trainer = GRPOTrainer(
        model=args.model_dir,
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=dataset,
        callbacks=[BudgetCallback()],
    )
    trainer.train()
    record |= {
        "train_s": round(clock.elapsed(), 3),
        "paused_s": round(clock.paused_s, 3),
        "config": {
            k: getattr(config, k)
            for k in (
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "steps_per_generation",
                "bf16",
                "gradient_checkpointing",
                "loss_type",
                "epsilon",
                "epsilon_high",
                "weight_decay",
            )
        }
        | {k: getattr(config, k) for k in extra},
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    Path(args.out).write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    main()
