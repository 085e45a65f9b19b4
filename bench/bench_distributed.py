"""Benchmark: 1 worker vs 2 FSDP2 workers, and the hybrid engine vs a separate rollout copy.

Two measurements, side by side in one run, each configuration in fresh processes:

``step_time``
    ``RLTrainer.fit()`` of the main job's GRPO step (8 prompts x 4 samples, same global
    batch and mini-batch) with one worker (``trainer.n_gpus_per_node=1``: local backend,
    single-process engine, all cores) and with two workers (``n_gpus_per_node=2``: Ray
    backend, two FSDP2 ranks over gloo, one core each). Reported: median ``timing_s/step``
    of the steps after the first (warm-up, which also loads the models), and the time to
    construct the trainer (with Ray: starting Ray and the worker actors).

``memory``
    Two ranks (``torch.multiprocessing`` + ``init_distributed``, gloo) each build the real
    :class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker` with an FSDP2 actor and
    run one warm-up step and one measured step: generate, old log-probs, one PPO update.

    - ``hybrid``: the worker as shipped. Generation runs inside
      ``engine.gathered_params()``: the full weights exist only while generating.
    - ``separate``: the naive design. The worker also keeps a full, unsharded copy of the
      policy for its rollout engine and, before each generation, all-gathers the actor's
      full state dict into it (the weight sync a separate rollout engine needs).

    Peak RSS is sampled every 2 ms by a thread in each rank, per phase. The ranks run with
    ``MALLOC_MMAP_THRESHOLD_=65536`` and call ``malloc_trim`` between phases, so RSS tracks
    live tensor memory rather than allocator caches. Reported per rank: peak over the
    measured step, RSS between steps, and the tensors' own sizes for reference.

On a 2-core CPU two ranks with one thread each are not expected to be faster than one
process with two threads (FACTS.md): the step-time ratio shows the cost of sharding and
gloo collectives here, not the speed-up on real devices.

    python bench/bench_distributed.py                  # SmolLM2-135M (embedded), ~6 min
    python bench/bench_distributed.py --model tiny     # tiny random Qwen2, ~1 min
    python bench/bench_distributed.py --only memory
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


def _overrides(model_dir: str, out: Path, world: int, steps: int) -> list[str]:
    """The quick job's GRPO step (examples/grpo_smollm2_arithmetic_quick.yaml), no validation."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "data.arithmetic.digits=1",
        'data.arithmetic.ops=["+","*"]',
        "data.arithmetic.train_size=256",
        "data.arithmetic.val_size=8",
        "data.train_batch_size=8",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
        "actor_rollout_ref.actor.optim.lr=2e-5",
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.device=cpu",
        "trainer.logger=[jsonl]",
        f"trainer.n_gpus_per_node={world}",
        f"trainer.default_local_dir={out}",
        f"trainer.log_dir={out}",
    ]


# --------------------------------------------------------------------------- step time


def _child_steps(args: argparse.Namespace) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    out = Path(tempfile.mkdtemp(prefix="bench_dist_"))
    cfg = load_config(overrides=_overrides(args.model_dir, out, args.world, args.steps))
    start = time.perf_counter()
    trainer = RLTrainer(cfg)
    construct_s = time.perf_counter() - start
    try:
        backend = trainer.placement.backend
        trainer.fit()
        times = [h["timing_s/step"] for h in trainer.history if "timing_s/step" in h]
    finally:
        trainer.close()
    timed = times[1:] or times
    return {
        "workers": args.world,
        "backend": backend,
        "construct_s": round(construct_s, 2),
        "step_s": [round(t, 2) for t in times],
        "median_step_s": round(statistics.median(timed), 2),
    }


# --------------------------------------------------------------------------- memory


def _separate_copy_worker_cls():
    """The worker with a naive rollout: its own full copy of the policy, synced each step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from verl.models.loading import load_causal_lm
    from verl.rollout import build_rollout
    from verl.workers.actor_rollout import sampling_params
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.common import to_device

    class SeparateRolloutCopyWorker(ActorRolloutRefWorker):
        def init_model(self, total_steps: int) -> None:
            super().init_model(total_steps)
            spec = self.spec
            self.rollout_module = load_causal_lm(spec.model.path).eval().requires_grad_(False)
            self.rollout = build_rollout(spec.rollout.name, self.rollout_module, self.tokenizer)

        def generate_sequences(self, prompts):
            self._generate_calls += 1
            full = get_model_state_dict(
                self.engine.module, options=StateDictOptions(full_state_dict=True)
            )
            self.rollout_module.load_state_dict(full)
            del full
            params = sampling_params(
                self.spec.rollout,
                prompts.meta_info,
                eos_token_id=self.tokenizer.eos_token_id,
                max_new_tokens=self.spec.max_response_length,
                generate_calls=self._generate_calls,
                rank=self.rank,
            )
            out = self.rollout.generate(to_device(prompts, self.device), params).to("cpu")
            out.meta_info["temperature"] = params.logprob_temperature
            return out

    return SeparateRolloutCopyWorker


def _memory_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch

    from verl.config import load_config
    from verl.utils.distributed import init_distributed
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.specs import actor_rollout_ref_spec

    torch.set_num_threads(1)
    torch.manual_seed(rank)
    sampler = PeakSampler()
    init_distributed(rank, world, "127.0.0.1", port)
    work = Path(out).parent
    cfg = load_config(overrides=_overrides(args.model_dir, work, world, 2))
    cls = ActorRolloutRefWorker if args.variant == "hybrid" else _separate_copy_worker_cls()
    worker = cls(
        actor_rollout_ref_spec(cfg, role="actor_rollout"),
        rank=rank,
        world_size=world,
        master_addr="127.0.0.1",
        master_port=port,
    )
    worker.init_model(total_steps=4)
    prompts = prompt_batch(worker.tokenizer, cfg.data.train_batch_size // world)

    def step() -> None:
        sampler.phase("generate")
        gen = worker.generate_sequences(prompts)
        sampler.phase("log_prob")
        gen = gen.union(worker.compute_log_prob(gen))
        mask = gen.batch["response_mask"]
        signs = torch.randint(0, 2, (len(gen), 1), dtype=torch.float32) * 2 - 1
        gen.batch["advantages"] = signs * mask
        sampler.phase("update")
        worker.update_actor(gen)
        sampler.phase("idle")

    trim_heap()
    sampler.phase("warmup")
    step()
    trim_heap()
    sampler.phase("between_steps")
    between = rss_bytes()
    step()
    peaks = sampler.close()
    engine = worker.engine
    shard_bytes = sum(
        p.to_local().numel() * p.element_size() if hasattr(p, "to_local") else p.nbytes
        for p in engine.module.parameters()
    )
    full_bytes = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    result = {
        "rank": rank,
        "rss_between_steps_mib": round(between / MiB, 1),
        "peak_step_mib": round(
            max(peaks[k] for k in ("generate", "log_prob", "update", "idle")) / MiB, 1
        ),
        "peak_by_phase_mib": {
            k: round(peaks[k] / MiB, 1) for k in ("generate", "log_prob", "update")
        },
        "actor_shard_mib": round(shard_bytes / MiB, 1),
        "actor_full_mib": round(full_bytes / MiB, 1),
    }
    Path(out).write_text(json.dumps(result))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _child_memory(args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    from verl.utils.distributed import find_free_port

    work = Path(tempfile.mkdtemp(prefix="bench_mem_"))
    outs = [str(work / f"rank{r}.json") for r in range(args.world)]
    port = find_free_port()
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_memory_rank, args=(r, args.world, port, args, outs[r]))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise RuntimeError(f"memory ranks exited with {codes}")
    ranks = [json.loads(Path(o).read_text()) for o in outs]
    return {"variant": args.variant, "ranks": ranks}


# --------------------------------------------------------------------------- driver


def _run_child(mode: str, extra: list[str], args: argparse.Namespace) -> dict:
    return run_child(__file__, mode, extra, args.model_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--steps", type=int, default=4, help="steps per step-time run")
    parser.add_argument("--only", choices=("step_time", "memory"), default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="hybrid", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child == "steps":
        print(json.dumps(_child_steps(args)))
        return
    if args.child == "memory":
        print(json.dumps(_child_memory(args)))
        return

    workdir = Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    args.model_dir = model_dir_for(args.model, workdir)
    summary: dict = {
        "bench": "distributed",
        "model": args.model,
        "cpus": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
    }
    if args.only in (None, "step_time"):
        runs = [
            _run_child("steps", ["--world", str(w), "--steps", str(args.steps)], args)
            for w in (1, 2)
        ]
        summary["step_time"] = {
            "runs": runs,
            "ratio_2_vs_1": round(runs[1]["median_step_s"] / runs[0]["median_step_s"], 3),
        }
    if args.only in (None, "memory"):
        variants = [
            _run_child("memory", ["--world", "2", "--variant", v], args)
            for v in ("hybrid", "separate")
        ]
        hybrid, separate = (max(r["peak_step_mib"] for r in v["ranks"]) for v in variants)
        summary["memory"] = {
            "variants": variants,
            "peak_ratio_hybrid_vs_separate": round(hybrid / separate, 3),
        }
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(summary))
    _print_table(summary)


def _print_table(summary: dict) -> None:
    print()
    if "step_time" in summary:
        st = summary["step_time"]
        print(f"{'workers':>7} {'backend':8} {'construct_s':>11} {'median step_s':>14}  steps")
        for r in st["runs"]:
            print(
                f"{r['workers']:>7} {r['backend']:8} {r['construct_s']:11.1f} "
                f"{r['median_step_s']:14.2f}  {r['step_s']}"
            )
        print(f"2 workers / 1 worker step time: {st['ratio_2_vs_1']:.2f}x")
        print()
    if "memory" in summary:
        mem = summary["memory"]
        print(
            f"{'variant':9} {'rank':>4} {'peak step MiB':>14} {'between steps':>14} "
            f"{'generate':>9} {'log_prob':>9} {'update':>9} {'shard':>7} {'full':>7}"
        )
        for v in mem["variants"]:
            for r in v["ranks"]:
                ph = r["peak_by_phase_mib"]
                print(
                    f"{v['variant']:9} {r['rank']:>4} {r['peak_step_mib']:14.1f} "
                    f"{r['rss_between_steps_mib']:14.1f} {ph['generate']:9.1f} "
                    f"{ph['log_prob']:9.1f} {ph['update']:9.1f} {r['actor_shard_mib']:7.1f} "
                    f"{r['actor_full_mib']:7.1f}"
                )
        print(
            f"hybrid / separate peak RSS (max over ranks): {mem['peak_ratio_hybrid_vs_separate']:.2f}x"
        )


if __name__ == "__main__":
    main()
