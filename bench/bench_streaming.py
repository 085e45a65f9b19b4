"""Benchmark: synchronous vs one-step-off vs streaming GRPO on a long-tail workload, side by
side in one run.

Workload: the W2 tiny Qwen2 (random init, hidden 256, 4 layers; ``bench_async.py``'s),
``--prompts`` prompts x 4 samples per step, at most ``--max-response-length`` (256) new
tokens, fp32, GRPO, one update per batch, the native rollout with ``decode_slots``
(``--slots``, so the rollout runs with continuous batching in every configuration, and the
streaming rollouter's calls take the next queued batch into their free slots when its
weights allow, ``verl/trainer/rl/rollout_feed.py``). A scripted stop (installed in the
child process where every native engine draws a sample: the stop token forced at the
sample's target length, forbidden before) gives ``--long-fraction`` (15%) of the samples a
length in [128, 256] and the rest one in [4, 32]; the target is a hash of the prompt's
tokens and the sample's index, so every configuration generates the same lengths for the
same prompts whatever the weights, a batch fed into another call's slots included.

Configurations, each in a fresh process, ``--steps`` steps, alternating over ``--repeats``:

- ``sync``          generate, then train, on one thread;
- ``one_step_off``  ``trainer.async_rollout=true`` (``max_staleness=1``): batch k+1 generates
  on the rollout copy, on a thread of the driver, while batch k trains;
- ``streaming``     ``trainer.rollout_mode=streaming`` (``max_staleness=1``, the default
  buffer of 2 batches): the copy fills a buffer of groups, each group as soon as its samples
  stop; a step takes the oldest ``--prompts`` groups;
- ``streaming_continue`` / ``streaming_resume``  streaming with ``trainer.partial_rollout``:
  each step's weights reach the call in flight between two decode steps; its rows decode
  on over their caches (continue) or are prefilled again under the new weights (resume).

``--configs`` picks a subset (comma-separated); ``--max-staleness`` sets
``trainer.max_staleness`` of the asynchronous configurations, ``--buffer-batches`` the
streaming buffer (``trainer.stream_buffer_groups``) in batches.

``--engine vllm`` runs the same configurations with ``rollout.name=vllm`` (partial rollouts
excluded: they need the native engine): the rollout copy's own vLLM engine, streaming its
groups as vLLM finishes their requests. vLLM takes no logits processor here, so the
scripted lengths become per-request ``max_tokens`` (stop tokens never hit the random model
in practice): one length per prompt, shared by its 4 samples, drawn as above from the
prompt's hash; the W2 model's head size (64) is one vLLM's CPU attention supports.

Reported per configuration (medians over repeats; steps after the first): trained samples
per second of training-loop wall time, the generating engine's busy and idle time over that
window (idle: the engine was not inside ``generate``), the trainer's wait for samples per
step (``timing_s/gen``: the whole generation in sync), the groups streaming dropped as
stale, the ratios to sync, and for partial rollouts the mid-call weight swaps, the tokens
prefilled again (resume) per generated token, the mean staleness of the trained samples
(by their oldest token), the batches fed into a running call (``fed``), and over the whole
run the engine's rows per decode step (``rows/step``: how full the slots were) and generated
tokens per second inside its calls (``gen tok/s``). The output
starts with the command, the machine (``nproc``, CPU model) and the load average before and
after, and ends with the samples/s ratios to sync.

``--threads`` sets the training thread's torch (OpenMP) intra-op threads (and sync's
generation's); ``--rollout-threads`` the rollout copy's thread in the asynchronous modes
(``trainer.rollout_num_threads``; default: ``--threads``), so the two sides can split the
cores instead of oversubscribing them.

``--plot PATH`` draws a PNG: per configuration, the trained samples and the step's batch
accuracy (``reward/acc``, else ``critic/score/mean``) against wall time since the end of
the first step (the random-init model scores ~0: the samples panel is the one to read).

    python bench/bench_streaming.py --threads 2      # ~5 minutes on 2 idle cores
    python bench/bench_streaming.py --steps 4 --prompts 8 --slots 16 --threads 1 \
        --rollout-threads 1 --configs sync,one_step_off,streaming,streaming_continue
    python bench/bench_streaming.py --steps 4 --repeats 1
    python bench/bench_streaming.py --threads 1 --rollout-threads 1 --plot stream.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from _common import cpu_model, grpo_run_overrides, w2_model_dir

SAMPLES = 4  # rollout.n of grpo_run_overrides
ASYNC = ["trainer.async_rollout=true", "actor_rollout_ref.actor.rollout_is_threshold=2.0"]
CONFIGS = {
    "sync": [],
    "one_step_off": ASYNC,
    "streaming": [*ASYNC, "trainer.rollout_mode=streaming"],
    "streaming_continue": [
        *ASYNC,
        "trainer.rollout_mode=streaming",
        "trainer.partial_rollout=continue",
    ],
    "streaming_resume": [
        *ASYNC,
        "trainer.rollout_mode=streaming",
        "trainer.partial_rollout=resume",
    ],
}


def _install_scripted_stop(
    args, intervals: list[tuple[float, float]], counts: dict[str, float]
) -> None:
    """Every native engine of this process: the long-tail scripted stop, the wall
    intervals of its ``generate`` calls recorded in ``intervals`` and its generated and
    re-prefilled tokens (and the batches fed into its calls' free slots) summed in
    ``counts``.

    The stop is applied where each sample is drawn (``NativeRollout._sample``), with the
    lengths of the batch the sample belongs to: a call's own (registered by ``generate``
    under its seed) or a queued batch fed into a running call (registered when the
    rollouter's feed hands it over, ``QueueFeed.next_batch``)."""
    import torch

    from verl.rollout.native import NativeRollout
    from verl.trainer.rl.rollout_feed import QueueFeed

    targets: dict[int | None, torch.Tensor] = {}  # call seed -> per-row scripted length

    def register(prompts, n: int, max_new: int, seed: int | None) -> None:
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        lengths = []
        for row in range(ids.shape[0]):
            key = ids[row][mask[row]].numpy().tobytes()
            for sample in range(n):
                lengths.append(min(_target_length(key, sample, args.long_fraction), max_new))
        targets[seed] = torch.tensor(lengths)

    original = NativeRollout.generate
    original_sample = NativeRollout._sample
    original_feed = QueueFeed.next_batch

    def generate(self, prompts, params):
        register(prompts, params.n, params.max_new_tokens, params.seed)
        start = time.perf_counter()
        try:
            return original(self, prompts, params)
        finally:
            intervals.append((start, time.perf_counter()))
            for key in (
                "generated_tokens",
                "reprefill_tokens",
                "weight_swaps",
                "fed_batches",
                "decode_steps",
                "decode_row_steps",
            ):
                counts[key] = counts.get(key, 0.0) + self.last_stats.get(key, 0.0)

    def sample(self, logits, rows, steps, params, seed):
        if not isinstance(steps, torch.Tensor):
            steps = torch.full_like(rows, steps)
        stops = params.stop_token_ids if params.stop_token_ids else self.eos_token_ids
        at_end = steps + 1 >= targets[params.seed].to(rows.device)[rows]
        logits = logits.clone()
        logits[:, int(stops[0])] = torch.where(at_end, 1e4, -1e4)
        return original_sample(self, logits, rows, steps, params, seed)

    def next_batch(self, accept):
        fed = original_feed(self, accept)
        if fed is not None:
            register(fed.prompts, SAMPLES, args.max_response_length, fed.prompts.meta_info["seed"])
        return fed

    NativeRollout.generate = generate
    NativeRollout._sample = sample
    QueueFeed.next_batch = next_batch


def _target_length(key: bytes, sample: int, long_fraction: float) -> int:
    """The scripted length of sample ``sample`` of the prompt whose token bytes are ``key``."""
    h = zlib.crc32(key + sample.to_bytes(2, "little"))
    if (h & 0xFFFF) / 0x10000 < long_fraction:
        return 128 + (h >> 16) % 129
    return 4 + (h >> 16) % 29


def _install_vllm_lengths(
    args, intervals: list[tuple[float, float]], counts: dict[str, float]
) -> None:
    """Every vLLM engine of this process: the long-tail lengths as per-request ``max_tokens``
    (a prompt's length is its sample 0's above), the wall intervals of the rollout's calls
    (whole or streamed) in ``intervals`` and the generated tokens in ``counts``."""
    import numpy as np
    import vllm

    import verl.rollout.vllm_stream as vllm_stream
    from verl.rollout.vllm_rollout import VLLMRollout

    def per_request(requests, params):
        out = []
        for request in requests:
            key = np.asarray(request["prompt_token_ids"], dtype=np.int64).tobytes()
            p = params.clone()
            p.max_tokens = min(_target_length(key, 0, args.long_fraction), params.max_tokens)
            out.append(p)
        return out

    for name in ("generate", "enqueue"):
        original = getattr(vllm.LLM, name)

        def scripted(self, prompts, sampling_params=None, *a, _original=original, **kw):
            return _original(self, prompts, per_request(prompts, sampling_params), *a, **kw)

        setattr(vllm.LLM, name, scripted)

    def timed(call):
        def run(*a, **kw):
            rollout = a[0]
            start = time.perf_counter()
            try:
                return call(*a, **kw)
            finally:
                intervals.append((start, time.perf_counter()))
                counts["generated_tokens"] = counts.get("generated_tokens", 0.0) + (
                    rollout.last_stats.get("response_tokens", 0.0)
                )

        return run

    VLLMRollout.generate = timed(VLLMRollout.generate)
    vllm_stream.generate_streaming = timed(vllm_stream.generate_streaming)


def _child(args) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(args.threads)
    rollout_threads = args.rollout_threads or args.threads
    extra = [f"trainer.rollout_num_threads={rollout_threads}"] if CONFIGS[args.config] else []
    if args.max_staleness is not None and CONFIGS[args.config]:
        extra.append(f"trainer.max_staleness={args.max_staleness}")
    if args.buffer_batches and args.config.startswith("streaming"):
        extra.append(f"trainer.stream_buffer_groups={args.buffer_batches * args.prompts}")
    intervals: list[tuple[float, float]] = []
    counts: dict[str, float] = {}
    if args.engine == "vllm":
        _install_vllm_lengths(args, intervals, counts)
    else:
        _install_scripted_stop(args, intervals, counts)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            overrides=[
                *grpo_run_overrides(
                    args.model_dir,
                    tmp,
                    args.prompts,
                    args.max_response_length,
                    args.prompts * (args.steps + 4),
                    args.steps,
                ),
                f"actor_rollout_ref.rollout.decode_slots={args.slots}",
                "trainer.mixed_precision=none",
                f"actor_rollout_ref.rollout.name={args.engine}",
                *CONFIGS[args.config],
                *extra,
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
    # the window: from the end of the first step (warm-up) to the end of the last
    start, end = ends[0], ends[-1]
    busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
    history = trainer.history[1:]
    samples = sum(args.prompts * 4 for _ in history)
    curve = [  # (seconds since the first step ended, trained samples, batch accuracy)
        (t - start, args.prompts * 4 * (i + 1), _accuracy(row))
        for i, (t, row) in enumerate(zip(ends[1:], history))
    ]
    return {
        "samples_per_s": samples / (end - start),
        "wall_per_step_s": (end - start) / len(history),
        "gen_busy_s": busy,
        "gen_idle_s": (end - start) - busy,
        "gen_idle_fraction": 1 - busy / (end - start),
        "wait_per_step_s": statistics.median(row["timing_s/gen"] for row in history),
        # streaming: groups generated but dropped as staler than max_staleness
        "dropped_groups": float(trainer.history[-1].get("stream/dropped_groups_total", 0.0)),
        "staleness_mean": statistics.mean(row.get("async/staleness_mean", 0.0) for row in history),
        "midcall_swaps": counts.get("weight_swaps", 0.0),
        # batches a running call took into its free slots (continuous batching across calls)
        "fed_batches": counts.get("fed_batches", 0.0),
        "reprefill_per_token": counts.get("reprefill_tokens", 0.0)
        / max(counts.get("generated_tokens", 0.0), 1.0),
        # the engine's efficiency over the whole run (first step included): rows decoded per
        # forward (slots a compaction dropped not counted) and generated tokens per second
        # inside the engine's calls
        "rows_per_decode_step": counts.get("decode_row_steps", 0.0)
        / max(counts.get("decode_steps", 0.0), 1.0),
        "tokens_per_gen_s": counts.get("generated_tokens", 0.0)
        / max(sum(b - a for a, b in intervals), 1e-9),
        "mean_response_length": statistics.mean(
            row.get("response_length/mean", float("nan")) for row in history
        ),
        "curve": curve,
    }


def _accuracy(row: dict) -> float:
    for key in ("reward/acc", "critic/score/mean"):
        if key in row:
            return float(row[key])
    return float("nan")


def _plot(path: str, results: dict[str, list[dict]]) -> None:
    """Trained samples and batch accuracy against wall time, per configuration (first
    repeat)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for name, runs in results.items():
        t, samples, acc = zip(*runs[0]["curve"], strict=True) if runs[0]["curve"] else ([], [], [])
        top.plot(t, samples, marker="o", label=name)
        bottom.plot(t, acc, marker="o", label=name)
    top.set_ylabel("trained samples")
    bottom.set_ylabel("batch accuracy")
    bottom.set_xlabel("wall time since the first step ended (s)")
    top.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rollout-threads", type=int, default=None)
    parser.add_argument("--plot", default=None, help="write a PNG of samples/accuracy vs time")
    parser.add_argument("--max-response-length", type=int, default=256)
    parser.add_argument("--long-fraction", type=float, default=0.15)
    parser.add_argument("--configs", default=None, help="default: all (vllm: no partial)")
    parser.add_argument(
        "--max-staleness", type=int, default=None, help="asynchronous configurations (default 1)"
    )
    parser.add_argument(
        "--buffer-batches",
        type=int,
        default=None,
        help="streaming: trainer.stream_buffer_groups in batches (default: max_staleness + 1)",
    )
    parser.add_argument("--engine", choices=("native", "vllm"), default="native")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    if args.configs is None:
        partial = {name for name, keys in CONFIGS.items() if any("partial" in k for k in keys)}
        args.configs = ",".join(c for c in CONFIGS if args.engine == "native" or c not in partial)
    chosen = [name for name in args.configs.split(",") if name]
    unknown = sorted(set(chosen) - set(CONFIGS))
    if unknown or "sync" not in chosen:
        raise SystemExit(f"--configs: unknown {unknown} or no sync; choose from {list(CONFIGS)}")
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = w2_model_dir(Path(tmp))
        names = chosen
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                cmd = [sys.executable, __file__, "--child", "--config", name]
                cmd += ["--model-dir", model_dir, "--steps", str(args.steps)]
                cmd += ["--prompts", str(args.prompts), "--threads", str(args.threads)]
                cmd += ["--slots", str(args.slots), "--long-fraction", str(args.long_fraction)]
                cmd += ["--max-response-length", str(args.max_response_length)]
                cmd += ["--engine", args.engine]
                if args.buffer_batches:
                    cmd += ["--buffer-batches", str(args.buffer_batches)]
                if args.max_staleness is not None:
                    cmd += ["--max-staleness", str(args.max_staleness)]
                if args.rollout_threads:
                    cmd += ["--rollout-threads", str(args.rollout_threads)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"{name} failed")
                results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                row = results[name][-1]
                print(
                    f"  {name}: {row['samples_per_s']:.2f} samples/s, "
                    f"generation idle {row['gen_idle_fraction']:.0%}",
                    file=sys.stderr,
                )
    if args.plot:
        _plot(args.plot, results)
    summary = {
        name: {
            key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "curve"
        }
        for name, runs in results.items()
    }
    sync = summary["sync"]
    load_after = os.getloadavg()
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: nproc {os.cpu_count()}, {cpu_model()}")
    print(
        "load average (1/5/15 min): "
        + " -> ".join("/".join(f"{x:.1f}" for x in load) for load in (load_before, load_after))
    )
    print(
        f"engine {args.engine}, "
        f"{args.prompts} prompts x 4 samples, slots {args.slots}, threads {args.threads}, "
        f"rollout threads {args.rollout_threads or args.threads}"
    )
    header = ("samples/s", "vs sync", "wall s/step", "gen busy s", "gen idle s", "idle %")
    header += ("wait s/step", "dropped", "staleness", "swaps", "reprefill", "fed")
    header += ("rows/step", "gen tok/s")
    print(f"{'config':<13}" + "".join(f"{h:>12}" for h in header))
    for name, row in summary.items():
        cells = (
            f"{row['samples_per_s']:12.2f}",
            f"{row['samples_per_s'] / sync['samples_per_s']:12.2f}",
            f"{row['wall_per_step_s']:12.2f}",
            f"{row['gen_busy_s']:12.1f}",
            f"{row['gen_idle_s']:12.1f}",
            f"{100 * row['gen_idle_fraction']:12.0f}",
            f"{row['wait_per_step_s']:12.2f}",
            f"{row['dropped_groups']:12.0f}",
            f"{row['staleness_mean']:12.2f}",
            f"{row['midcall_swaps']:12.0f}",
            f"{row['reprefill_per_token']:12.2f}",
            f"{row['fed_batches']:12.0f}",
            f"{row.get('rows_per_decode_step', float('nan')):12.1f}",
            f"{row.get('tokens_per_gen_s', float('nan')):12.0f}",
        )
        print(f"{name:<13}" + "".join(cells))
    ratios = ", ".join(
        f"{name} {row['samples_per_s'] / sync['samples_per_s']:.2f}x"
        for name, row in summary.items()
        if name != "sync"
    )
    print(f"samples/s vs sync: {ratios}")
    print(
        json.dumps(
            {
                "args": vars(args),
                "nproc": os.cpu_count(),
                "cpu": cpu_model(),
                "load_before": load_before,
                "load_after": load_after,
                "summary": summary,
            }
        )
    )


if __name__ == "__main__":
    main()
