"""verl's side of ``bench_convergence_vs_trl.py``: train for a wall-clock budget, or evaluate.

``train``: builds the trainer ``python -m verl.trainer.main_ppo --config FILE KEY=VALUE...``
would build (the same config loader, the same :class:`~verl.trainer.rl.trainer.RLTrainer`)
and runs its steps (``RLTrainer.run_step``, exactly the main job's step) until the training
clock (``_budget_clock.BudgetClock``) reaches the budget. At the first step end past each
mark it saves the policy as a HuggingFace directory (``RLTrainer.save_hf``) with the clock
paused. Only the loop around the step differs from ``main_ppo``: no validation, checkpoint
or export inside the budget. Writes one JSON object to ``--out``: the setup time (process
start to the first step), per step its end on the training clock and its metrics, and per
snapshot its mark, training time, step and directory.

``eval``: verl's own validation (``trainer.val_only=true``: greedy ``rollout.val_kwargs``
generation of ``data.val_files``, scored by the data source's scorer) of each model
directory in turn, under the same config; writes ``{model dir: validation metrics}``.

    python bench/_verl_convergence_side.py train --config examples/grpo_smollm2_arithmetic.yaml \
        --budget-s 600 --marks-s 60 120 --snapshots DIR --out verl.json -- KEY=VALUE ...
    python bench/_verl_convergence_side.py eval --config FILE --models A B --out eval.json \
        --workdir DIR -- KEY=VALUE ...
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from _budget_clock import BudgetClock

START = time.perf_counter()
logger = logging.getLogger("bench.verl_convergence")

# per-step metrics kept in the record (the rest stays in the run's metrics.jsonl)
STEP_KEYS = (
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
    "critic/score/mean",
    "response_length/mean",
)


def _train(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    transformers.utils.logging.disable_progress_bar()
    cfg = load_config(args.config, args.overrides)
    trainer = RLTrainer(cfg)
    setup_s = time.perf_counter() - START
    clock = BudgetClock(args.budget_s, args.marks_s)
    args.snapshots.mkdir(parents=True, exist_ok=True)
    steps: list[dict] = []
    snapshots: list[dict] = []
    try:
        clock.start()
        while not clock.done():
            trainer.global_step += 1
            metrics = trainer.run_step()
            trainer.log(metrics, trainer.global_step)
            end_s = clock.elapsed()
            steps.append(
                {"step": trainer.global_step, "end_s": round(end_s, 3)}
                | {k: metrics[k] for k in STEP_KEYS if k in metrics}
            )
            due = clock.due_marks()
            if due:
                out = args.snapshots / f"verl_t{due[-1]:.0f}s"
                with clock.paused():
                    trainer.save_hf(out)
                snapshots.append(
                    {"marks_s": due, "train_s": round(end_s, 3), "step": trainer.global_step}
                    | {"dir": str(out)}
                )
                logger.info("snapshot at %.1f s (step %d): %s", end_s, trainer.global_step, out)
    finally:
        trainer.close()
    return {
        "side": "verl",
        "setup_s": round(setup_s, 2),
        "train_s": round(clock.elapsed(), 3),
        "paused_s": round(clock.paused_s, 3),
        "steps": steps,
        "snapshots": snapshots,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _evaluate(args: argparse.Namespace) -> dict:
    import transformers

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    transformers.utils.logging.disable_progress_bar()
    results: dict[str, dict] = {}
    for i, model in enumerate(args.models):
        run = args.workdir / f"eval_{i}"
        overrides = [
            *args.overrides,
            f"actor_rollout_ref.model.path={model}",
            "trainer.val_only=true",
            "trainer.resume_mode=disable",
            "trainer.logger=[]",
            f"trainer.default_local_dir={run}",
            f"trainer.log_dir={run}",
        ]
        t0 = time.perf_counter()
        trainer = RLTrainer(load_config(args.config, overrides))
        metrics = trainer.fit()["val_only"]  # fit() closes the trainer
        results[str(model)] = {k: float(v) for k, v in metrics.items()}
        results[str(model)]["eval_s"] = round(time.perf_counter() - t0, 2)
        logger.info("%s: val/acc %.4f", model, metrics.get("val/acc", float("nan")))
    return results


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train for --budget-s, snapshot at --marks-s")
    train.add_argument("--budget-s", type=float, required=True)
    train.add_argument("--marks-s", type=float, nargs="+", required=True)
    train.add_argument("--snapshots", type=Path, required=True)
    evaluate = sub.add_parser("eval", help="verl's validation of each --models directory")
    evaluate.add_argument("--models", nargs="+", required=True)
    evaluate.add_argument("--workdir", type=Path, required=True)
    for p in (train, evaluate):
        p.add_argument("--config", required=True, help="the preset (main_ppo's --config)")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()  # the KEY=VALUE overrides come last, after "--"
    result = _train(args) if args.command == "train" else _evaluate(args)
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
