"""Benchmark: LoRA against full fine-tuning on the quick job, and the LoRA rollout merged vs applied.

Two measurements, each configuration in a fresh process (``_common.run_child``):

- ``train``: the quick job (``examples/grpo_smollm2_arithmetic_quick.yaml``: GRPO on the embedded
  SmolLM2-135M-Instruct, 8 prompts x 4 samples, 8 new tokens) for ``--steps`` steps without
  validation, once with full fine-tuning and once with ``lora_rank=--rank`` (all linear
  layers). Reported: median step time after the first step (``timing_s/step`` and its
  stages), the process's peak RSS over the run, and the RSS between steps. ``--kl`` adds
  a KL loss, so the full run also holds a reference copy of the weights (the LoRA run uses
  the actor with its adapters disabled).
- ``rollout``: a LoRA actor with non-zero adapters generates the quick job's prompts
  (8 x 4 samples) in two ways, alternated ``--reps`` times: *applied* (peft computes
  ``x W^T + scale * (x A^T) B^T`` in every adapted layer, what verl does) and *merged*
  (``merge_adapter()`` folds the adapters into the weights before generating and
  ``unmerge_adapter()`` takes them out again; that time is included). Also the largest
  difference of the rollout log-probs of the same greedy samples between the two.

    python bench/bench_lora.py                   # both, ~10 min on 2 quiet cores
    python bench/bench_lora.py --steps 3 --reps 2
    python bench/bench_lora.py --model tiny      # smoke run, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import MiB, PeakSampler, model_dir_for, prompt_batch, rss_bytes, run_child, trim_heap

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_smollm2_arithmetic_quick.yaml"
STAGES = ("gen", "reward", "old_log_prob", "ref_and_values", "adv", "update_actor")


def _lora_overrides(rank: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.lora_rank={rank}",
        f"actor_rollout_ref.model.lora_alpha={2 * rank}",
    ]


def _child_train(args: argparse.Namespace) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    out = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    overrides = [
        f"actor_rollout_ref.model.path={args.model_dir}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
        f"trainer.log_dir={out}",
    ]
    if args.kl:
        overrides.append("actor_rollout_ref.actor.use_kl_loss=true")
    if args.rank > 0:
        overrides += _lora_overrides(args.rank)
    cfg = load_config(EXAMPLE, overrides=overrides)
    sampler = PeakSampler()
    imports = rss_bytes()
    trainer = RLTrainer(cfg)
    trainer.save_hf = lambda path: path  # the final export is not part of a training step
    trainer.fit()
    peaks = sampler.close()
    steps = [h for h in trainer.history if "timing_s/step" in h][1:]  # the first warms up
    median = lambda key: round(statistics.median(h.get(key, 0.0) for h in steps), 2)  # noqa: E731
    return {
        "config": f"lora r={args.rank}" if args.rank else "full",
        "measured_steps": len(steps),
        "step_s": median("timing_s/step"),
        "stages_s": {s: median(f"timing_s/{s}") for s in STAGES},
        "peak_mib": round(max(peaks.values()) / MiB, 1),
        "imports_mib": round(imports / MiB, 1),
        "end_rss_mib": round(rss_bytes() / MiB, 1),
    }


def _child_rollout(args: argparse.Namespace) -> dict:
    import torch

    from verl.config import load_config
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.specs import actor_rollout_ref_spec

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    out = Path(tempfile.mkdtemp(prefix="bench_lora_rollout_"))
    cfg = load_config(
        EXAMPLE,
        overrides=[
            f"actor_rollout_ref.model.path={args.model_dir}",
            *_lora_overrides(args.rank),
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
        ],
    )
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    worker.init_model(total_steps=4)
    module = worker.engine.module
    with torch.no_grad():  # trained-looking adapters: lora_B starts at zero
        for name, param in module.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.02)
    prompts = prompt_batch(worker.tokenizer, cfg.data.train_batch_size)

    def generate(merged: bool, meta: dict) -> tuple[float, object]:
        batch = prompts.select(batch_keys=list(prompts.batch.keys()))
        batch.meta_info.update(meta)
        start = time.perf_counter()
        if merged:
            module.merge_adapter()
        try:
            result = worker.generate_sequences(batch)
        finally:
            if merged:
                module.unmerge_adapter()
        return time.perf_counter() - start, result

    times: dict[str, list[float]] = {"applied": [], "merged": []}
    generate(False, {"seed": 1})  # warm-up
    for rep in range(args.reps):
        order = ("applied", "merged") if rep % 2 == 0 else ("merged", "applied")
        for mode in order:
            seconds, _ = generate(mode == "merged", {"seed": 2 + rep})
            times[mode].append(seconds)
    greedy = {"do_sample": False, "n": 1}
    _, applied = generate(False, greedy)
    _, merged = generate(True, greedy)
    same_tokens = torch.equal(applied.batch["responses"], merged.batch["responses"])
    diff = (applied.batch["rollout_log_probs"] - merged.batch["rollout_log_probs"]).abs().max()
    return {
        "applied_s": [round(t, 3) for t in times["applied"]],
        "merged_s": [round(t, 3) for t in times["merged"]],
        "applied_median_s": round(statistics.median(times["applied"]), 3),
        "merged_median_s": round(statistics.median(times["merged"]), 3),
        "greedy_tokens_identical": bool(same_tokens),
        "greedy_logprob_max_abs_diff": float(diff),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--steps", type=int, default=4, help="training steps per run")
    parser.add_argument("--reps", type=int, default=4, help="rollouts per mode")
    parser.add_argument("--kl", action="store_true", help="add a KL loss (a reference policy)")
    parser.add_argument("--skip", choices=("train", "rollout"), default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "train":
        print(json.dumps(_child_train(args)))
        return
    if args.child == "rollout":
        print(json.dumps(_child_rollout(args)))
        return

    args.model_dir = model_dir_for(args.model, Path(tempfile.mkdtemp(prefix="bench_lora_")))
    summary: dict = {
        "bench": "lora",
        "model": args.model,
        "rank": args.rank,
        "kl": args.kl,
        "cpus": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
    }
    common = ["--steps", str(args.steps)] + (["--kl"] if args.kl else [])
    if args.skip != "train":
        full = _progress(run_child(__file__, "train", [*common, "--rank", "0"], args.model_dir))
        lora = _progress(
            run_child(__file__, "train", [*common, "--rank", str(args.rank)], args.model_dir)
        )
        lora["step_ratio"] = round(lora["step_s"] / full["step_s"], 3)
        lora["peak_ratio"] = round(lora["peak_mib"] / full["peak_mib"], 3)
        summary["train"] = [full, lora]
    if args.skip != "rollout":
        extra = ["--rank", str(args.rank), "--reps", str(args.reps)]
        rollout = _progress(run_child(__file__, "rollout", extra, args.model_dir))
        rollout["merged_over_applied"] = round(
            rollout["merged_median_s"] / rollout["applied_median_s"], 3
        )
        summary["rollout"] = rollout
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    trim_heap()
    print(json.dumps(summary))
    _print_table(summary)


def _progress(result: dict) -> dict:
    """Each configuration's result on stderr as soon as it is measured (a long run that is
    stopped keeps what it measured)."""
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def _print_table(summary: dict) -> None:
    print()
    if "train" in summary:
        print(
            f"{'run':12} {'step s':>7} {'peak MiB':>9} {'end MiB':>8} "
            + " ".join(f"{s:>12}" for s in STAGES)
        )
        for r in summary["train"]:
            stages = " ".join(f"{r['stages_s'][s]:12.2f}" for s in STAGES)
            print(
                f"{r['config']:12} {r['step_s']:7.2f} {r['peak_mib']:9.0f} {r['end_rss_mib']:8.0f} {stages}"
            )
        lora = summary["train"][1]
        print(f"LoRA / full: step {lora['step_ratio']:.2f}x, peak RSS {lora['peak_ratio']:.2f}x")
    if "rollout" in summary:
        r = summary["rollout"]
        print(
            f"rollout (median of {len(r['applied_s'])}): applied {r['applied_median_s']:.2f} s, "
            f"merged {r['merged_median_s']:.2f} s ({r['merged_over_applied']:.2f}x); greedy "
            f"tokens identical: {r['greedy_tokens_identical']}, log-prob max diff "
            f"{r['greedy_logprob_max_abs_diff']:.2e}"
        )


if __name__ == "__main__":
    main()
