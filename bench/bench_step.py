"""Benchmark: whole GRPO steps before and after the lean-step defaults, in one run.

W2 of issue 14: a tiny Qwen2 built locally (random init, hidden 256, 4 layers, 4 heads / 2
KV heads, MLP 1024, tied embeddings), 32 prompts x 8 samples, 32 new tokens, GRPO, no KL,
one update per batch (``ppo_mini_batch_size`` = ``train_batch_size``), fp32, the built-in
arithmetic prompts. Each configuration trains ``--steps`` steps through ``RLTrainer`` in a
fresh process (default glibc malloc settings, as a user runs it); the configurations
alternate over ``--repeats`` rounds.

- ``before``: the old-log-prob pass recomputed (``recompute_old_log_prob=true``), padded
  rows (``pack_sequences=false``), no memory released between phases;
- ``unshared``: the defaults but every row computes its prompt
  (``share_prompt_prefix=false``: packed sequences without shared-prompt packing);
- ``after``: the defaults (pass skipped when safe, packed sequences with each GRPO group's
  prompt computed once, memory released).

Reported: median step time after the first step, the median of each stage
(``timing_s/*``), and the process's peak RSS over the run, with after/before and
after/unshared ratios, as a table and JSON.

    python bench/bench_step.py                 # ~5 min on 2 shared cores
    python bench/bench_step.py --steps 3 --repeats 1
    python bench/bench_step.py --configs unshared after   # this change alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import MiB, PeakSampler, w2_model_dir

CONFIGS = {
    "before": [
        "actor_rollout_ref.actor.recompute_old_log_prob=true",
        "actor_rollout_ref.actor.pack_sequences=false",
    ],
    "unshared": ["actor_rollout_ref.actor.share_prompt_prefix=false"],
    "after": [],
}


def _child(args) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(args.threads)
    if args.config == "before":
        import verl.workers.actor_rollout_ref as worker_module

        worker_module.release_memory = lambda: None
    sampler = PeakSampler()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            overrides=[
                f"actor_rollout_ref.model.path={args.model_dir}",
                "algorithm.adv_estimator=grpo",
                "data.train_batch_size=32",
                "data.max_response_length=32",
                f"data.arithmetic.train_size={32 * args.steps}",
                "data.arithmetic.val_size=4",
                "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                f"trainer.total_training_steps={args.steps}",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "trainer.logger=[]",
                f"trainer.default_local_dir={tmp}",
                f"trainer.log_dir={tmp}",
                "trainer.device=cpu",
                "trainer.mixed_precision=none",  # fp32 (the default, auto, is bf16 here)
                *CONFIGS[args.config],
            ]
        )
        trainer = RLTrainer(cfg, tracker=Tracker([]))
        trainer.fit()
    peak = max(sampler.close().values())
    history = trainer.history[1:] or trainer.history
    stages = sorted({k for row in history for k in row if k.startswith("timing_s/")})
    return {
        "step_s": statistics.median(row["timing_s/step"] for row in history),
        "stages": {k: statistics.median(row.get(k, 0.0) for row in history) for k in stages},
        "peak_rss_mib": peak / MiB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="subset to run"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="after", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    results: dict[str, list[dict]] = {name: [] for name in args.configs}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = w2_model_dir(Path(tmp))
        for _ in range(args.repeats):
            for name in args.configs:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--config",
                    name,
                    "--model-dir",
                    model_dir,
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"{name} failed")
                results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"  {name}: {results[name][-1]['step_s']:.2f} s/step", file=sys.stderr)
    summary = {}
    for name, runs in results.items():
        stages = sorted({k for r in runs for k in r["stages"]})
        summary[name] = {
            "step_s": statistics.median(r["step_s"] for r in runs),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
            "stages": {k: statistics.median(r["stages"].get(k, 0.0) for r in runs) for k in stages},
        }
    names = list(summary)
    last = names[-1]  # ratios: the last configuration (normally "after") over each other
    others = names[:-1]
    print(
        f"{'metric':28} "
        + " ".join(f"{n:>9}" for n in names)
        + " "
        + " ".join(f"{last + '/' + n:>15}" for n in others)
    )

    def line(label: str, values: list[float]) -> None:
        ratios = [f"{values[-1] / v:15.2f}" if v else f"{'-':>15}" for v in values[:-1]]
        print(f"{label:28} " + " ".join(f"{v:9.2f}" for v in values) + " " + " ".join(ratios))

    for label, key in [("step s", "step_s"), ("peak RSS MiB", "peak_rss_mib")]:
        line(label, [summary[n][key] for n in names])
    for key in sorted({k for n in names for k in summary[n]["stages"]}):
        line(key, [summary[n]["stages"].get(key, 0.0) for n in names])
    print(json.dumps({"args": vars(args), "summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
