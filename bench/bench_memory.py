"""Benchmark: peak memory and step time of a GRPO step, fp32 vs each memory knob.

Each configuration runs in a fresh process (``_common.run_child``), builds the real
:class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker` (actor, rollout and reference
in one process, the single-process engine) on the embedded SmolLM2-135M-Instruct, and runs
two steps (a warm-up and the measured one):

- ``generate``: the rollout of 4 arithmetic prompts x 4 samples (real, up to 16 tokens);
- ``log_prob``, ``ref``: old and reference log-probs of a fixed training batch of
  8 sequences x (64 prompt + 192 response) tokens (random token ids, so every
  configuration sees the same lengths: real arithmetic answers are a few tokens long and
  would not exercise activation memory);
- ``update``: one GRPO/PPO optimizer step on that batch (one micro-batch of 8 sequences) with
  a KL loss against the reference.

Peak RSS is sampled every 2 ms by a thread; the ratio column is each configuration's peak
over the measured step divided by the fp32 baseline's. ``-imports`` is the same peak minus
the RSS the process had before building the worker (torch, transformers and verl loaded,
~350 MiB that no knob can touch). On a CPU, RSS is the memory; on a
GPU the same knobs act on device memory (not measurable here).

``--learn-steps K`` (default 8) also trains the quick job's GRPO run
(``examples/grpo_smollm2_arithmetic_quick.yaml``) for K steps with the fp32 baseline and with the
recommended combination, and reports validation accuracy before and after: the memory knobs
must not cost learning.

    python bench/bench_memory.py                    # ~15 min on 2 cores
    python bench/bench_memory.py --learn-steps 0    # memory table only, ~6 min
    python bench/bench_memory.py --model tiny --learn-steps 0   # smoke run, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import MiB, PeakSampler, model_dir_for, prompt_batch, rss_bytes, run_child, trim_heap

UNCHUNKED = "actor_rollout_ref.actor.logprob_chunk_size=100000000"
CHUNKED = "actor_rollout_ref.actor.logprob_chunk_size=512"
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing=true"

# name -> overrides on top of the base config; the baseline first.
CONFIGS: dict[str, list[str]] = {
    "fp32 baseline": [UNCHUNKED],
    "chunked log-probs": [CHUNKED],
    "activation checkpointing": [UNCHUNKED, CKPT],
    "reference bf16": [UNCHUNKED, "trainer.model_precision_map={reference: bf16}"],
    "reference fp8": [UNCHUNKED, "trainer.model_precision_map={reference: fp8}"],
    "actor bf16 autocast": [UNCHUNKED, "trainer.model_precision_map={actor: bf16}"],
    "recommended": [CHUNKED, CKPT, "trainer.model_precision_map={reference: fp8}"],
}
PHASES = ("generate", "log_prob", "ref", "update")


def _base_overrides(model_dir: str, out: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_device=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "algorithm.adv_estimator=grpo",
        "trainer.device=cpu",
        "trainer.mixed_precision=none",  # the fp32 baseline (the default, auto, may be bf16)
        # no checkpointing unless a configuration asks (the default, null, turns it on here)
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"trainer.default_local_dir={out}",
        f"trainer.log_dir={out}",
    ]


def _training_batch(vocab: int, rows: int, prompt_len: int, response_len: int):
    import torch

    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (rows, prompt_len), generator=gen)
    responses = torch.randint(0, vocab, (rows, response_len), generator=gen)
    ids = torch.cat([prompts, responses], dim=1)
    signs = torch.randint(0, 2, (rows, 1), generator=gen).float() * 2 - 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(ids.shape[1]).expand(rows, -1).clone(),
            "response_mask": torch.ones_like(responses),
            "advantages": signs.expand(rows, response_len).clone(),
        },
        meta_info={"temperature": 1.0},
    )


def _child_memory(args: argparse.Namespace) -> dict:
    import torch

    from verl.config import load_config
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.specs import actor_rollout_ref_spec

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    sampler = PeakSampler()
    imports = rss_bytes()  # torch, transformers and verl loaded, no model yet
    out = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    cfg = load_config(overrides=[*_base_overrides(args.model_dir, out), *CONFIGS[args.config]])
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    worker.init_model(total_steps=4)
    prompts = prompt_batch(worker.tokenizer, cfg.data.train_batch_size)
    times: list[float] = []

    def step() -> None:
        start = time.perf_counter()
        sampler.phase("generate")
        worker.generate_sequences(prompts)
        sampler.phase("log_prob")
        batch = _training_batch(len(worker.tokenizer), args.rows, 64, args.response_len)
        data = batch.union(worker.compute_log_prob(batch))
        sampler.phase("ref")
        data = data.union(worker.compute_ref_log_prob(data))
        sampler.phase("update")
        worker.update_actor(data)
        sampler.phase("idle")
        times.append(time.perf_counter() - start)

    trim_heap()
    sampler.phase("warmup")
    step()
    trim_heap()
    sampler.phase("between")
    between = rss_bytes()
    step()
    peaks = sampler.close()
    return {
        "config": args.config,
        "peak_mib": round(max(peaks[p] for p in (*PHASES, "idle")) / MiB, 1),
        "imports_mib": round(imports / MiB, 1),
        "between_steps_mib": round(between / MiB, 1),
        "peak_by_phase_mib": {p: round(peaks[p] / MiB, 1) for p in PHASES},
        "step_s": round(times[-1], 2),
        "warmup_step_s": round(times[0], 2),
    }


def _child_learn(args: argparse.Namespace) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    out = Path(tempfile.mkdtemp(prefix="bench_memory_learn_"))
    example = (
        Path(__file__).resolve().parents[1] / "examples" / "grpo_smollm2_arithmetic_quick.yaml"
    )
    overrides = [
        f"actor_rollout_ref.model.path={args.model_dir}",
        # a reference policy in both runs, so the fp8 reference has something to replace
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"trainer.total_training_steps={args.learn_steps}",
        f"trainer.test_freq={args.learn_steps}",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out}",
        f"trainer.log_dir={out}",
        *CONFIGS[args.config],
    ]
    cfg = load_config(example, overrides=overrides)
    trainer = RLTrainer(cfg)
    start = time.perf_counter()
    results = trainer.fit()
    acc_key = next(k for k in results["val_after"] if k.endswith("acc"))
    return {
        "config": args.config,
        "val_key": acc_key,
        "val_before": results["val_before"][acc_key],
        "val_after": results["val_after"][acc_key],
        "median_step_s": round(
            statistics.median(h["timing_s/step"] for h in trainer.history if "timing_s/step" in h),
            2,
        ),
        "minutes": round((time.perf_counter() - start) / 60, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--learn-steps", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--rows", type=int, default=8, help="sequences in the training batch")
    parser.add_argument("--only", nargs="*", default=None, help="configuration names to run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default="fp32 baseline", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child == "memory":
        print(json.dumps(_child_memory(args)))
        return
    if args.child == "learn":
        print(json.dumps(_child_learn(args)))
        return

    args.model_dir = model_dir_for(args.model, Path(tempfile.mkdtemp(prefix="bench_memory_")))
    names = args.only or list(CONFIGS)
    if names[0] != "fp32 baseline":
        names = ["fp32 baseline", *[n for n in names if n != "fp32 baseline"]]
    summary: dict = {
        "bench": "memory",
        "model": args.model,
        "cpus": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    for name in names:
        extra = ["--config", name, "--response-len", str(args.response_len)]
        extra += ["--rows", str(args.rows)]
        summary["runs"].append(run_child(__file__, "memory", extra, args.model_dir))
    base = summary["runs"][0]
    for run in summary["runs"]:
        run["peak_ratio"] = round(run["peak_mib"] / base["peak_mib"], 3)
        # the same without the fixed cost of the loaded libraries (torch, transformers)
        run["peak_above_imports_mib"] = round(run["peak_mib"] - run["imports_mib"], 1)
        run["above_imports_ratio"] = round(
            run["peak_above_imports_mib"] / (base["peak_mib"] - base["imports_mib"]), 3
        )
        run["time_ratio"] = round(run["step_s"] / base["step_s"], 3)
    if args.learn_steps > 0:
        summary["learn"] = [
            run_child(
                __file__,
                "learn",
                ["--config", name, "--learn-steps", str(args.learn_steps)],
                args.model_dir,
            )
            for name in ("fp32 baseline", "recommended")
        ]
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(summary))
    _print_table(summary)


def _print_table(summary: dict) -> None:
    print()
    head = (
        f"{'configuration':26} {'peak MiB':>9} {'vs fp32':>8} {'-imports':>9} {'vs fp32':>8} "
        f"{'step s':>7} {'vs fp32':>8}"
    )
    print(head + "".join(f" {p:>9}" for p in PHASES))
    for r in summary["runs"]:
        line = (
            f"{r['config']:26} {r['peak_mib']:9.0f} {r['peak_ratio']:8.2f} "
            f"{r['peak_above_imports_mib']:9.0f} {r['above_imports_ratio']:8.2f} "
            f"{r['step_s']:7.1f} {r['time_ratio']:8.2f}"
        )
        print(line + "".join(f" {r['peak_by_phase_mib'][p]:9.0f}" for p in PHASES))
    for r in summary.get("learn", []):
        print(
            f"learn {r['config']:20} {r['val_key']}: {r['val_before']:.3f} -> "
            f"{r['val_after']:.3f}  (median step {r['median_step_s']} s, {r['minutes']} min)"
        )


if __name__ == "__main__":
    main()
