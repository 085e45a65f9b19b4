"""Benchmark: synchronous vs one-step-off asynchronous GRPO steps, side by side in one run.

The same workload both ways: a tiny Qwen2 built locally (random init, hidden 256, 4 layers,
4 heads / 2 KV heads, MLP 1024, tied embeddings; W2 of issue 14), 16 prompts x 4 samples,
32 new tokens (``--response-length``), GRPO, one update per batch, fp32, the built-in
arithmetic prompts, the native rollout, one torch thread per process (``--threads``).
``async`` adds ``trainer.async_rollout=true`` (with ``actor.rollout_is_threshold=2.0``,
which it requires): batch k+1 generates on the rollout copy while batch k trains, on a
thread of the driver (``--backend local``) or in a Ray actor of its own (``--backend ray``,
where the actor is a Ray actor too). Each configuration trains ``--steps`` steps through
``RLTrainer`` in a fresh process; the configurations alternate over ``--repeats`` rounds.

Reported per configuration (medians over steps after the first, then over repeats): the
step time (``timing_s/step``: for async, the wait for the rollout thread plus scoring, the
passes and the update), the wall time of the training loop per step (what a user waits
for), and the stages; with async/sync ratios, as a table and JSON.

    python bench/bench_async.py                 # a few minutes on 2 shared cores
    python bench/bench_async.py --backend ray   # actor and rollout copy in Ray processes
    python bench/bench_async.py --steps 4 --repeats 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import grpo_run_overrides, w2_model_dir

CONFIGS = {
    "sync": [],
    "async": ["trainer.async_rollout=true", "actor_rollout_ref.actor.rollout_is_threshold=2.0"],
}


def _child(args) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            overrides=[
                *grpo_run_overrides(
                    args.model_dir,
                    tmp,
                    args.prompts,
                    args.response_length,
                    args.prompts * args.steps,
                    args.steps,
                ),
                f"trainer.backend={args.backend}",
                *CONFIGS[args.config],
            ]
        )
        trainer = RLTrainer(cfg, tracker=Tracker([]))
        ends: list[float] = []
        real_step = trainer.train_step

        def timed_step(*a, **kw):
            out = real_step(*a, **kw)
            ends.append(time.perf_counter())
            return out

        trainer.train_step = timed_step
        trainer.fit()
    history = trainer.history[1:] or trainer.history
    stages = sorted({k for row in history for k in row if k.startswith(("timing_s/", "async/"))})
    walls = [b - a for a, b in itertools.pairwise(ends)] or [history[0]["timing_s/step"]]
    return {
        "step_s": statistics.median(row["timing_s/step"] for row in history),
        "wall_per_step_s": statistics.median(walls),
        "stages": {k: statistics.median(row.get(k, 0.0) for row in history) for k in stages},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: the rollout copy on a thread of the driver; ray: in a Ray actor",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = w2_model_dir(Path(tmp))
        for _ in range(args.repeats):
            for name in CONFIGS:
                cmd = [sys.executable, __file__, "--child", "--config", name]
                cmd += ["--model-dir", model_dir, "--steps", str(args.steps)]
                cmd += ["--prompts", str(args.prompts), "--threads", str(args.threads)]
                cmd += ["--backend", args.backend, "--response-length", str(args.response_length)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"{name} failed")
                results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                r = results[name][-1]
                print(
                    f"  {name}: {r['step_s']:.2f} s/step, {r['wall_per_step_s']:.2f} s wall/step",
                    file=sys.stderr,
                )
    summary = {}
    for name, runs in results.items():
        stages = sorted({k for r in runs for k in r["stages"]})
        summary[name] = {
            "step_s": statistics.median(r["step_s"] for r in runs),
            "wall_per_step_s": statistics.median(r["wall_per_step_s"] for r in runs),
            "stages": {k: statistics.median(r["stages"].get(k, 0.0) for r in runs) for k in stages},
        }
    sync, asyn = summary["sync"], summary["async"]
    print(f"{'metric':28} {'sync':>9} {'async':>9} {'async/sync':>11}")
    for label, key in (("step s", "step_s"), ("wall s per step", "wall_per_step_s")):
        print(f"{label:28} {sync[key]:9.2f} {asyn[key]:9.2f} {asyn[key] / sync[key]:11.2f}")
    for key in sorted(set(sync["stages"]) | set(asyn["stages"])):
        s, a = sync["stages"].get(key, 0.0), asyn["stages"].get(key, 0.0)
        ratio = f"{a / s:11.2f}" if s else f"{'-':>11}"
        print(f"{key:28} {s:9.2f} {a:9.2f} {ratio}")
    load = {"before": load_before, "after": os.getloadavg()[0]}
    print(json.dumps({"args": vars(args), "load_avg_1min": load, "summary": summary}))


if __name__ == "__main__":
    main()
