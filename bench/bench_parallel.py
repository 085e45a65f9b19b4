"""Benchmark: where a training step's memory goes per rank, with data, sequence and tensor
parallelism over the same ranks.

One training step of the fsdp2 engine (``verl.engine``) on a fixed global batch of ``G``
sequences of ``--tokens`` tokens each (``G`` = the number of ranks times
``--micro-batches``), one sequence per micro-batch: forward, backward and the AdamW step of PPO's clipped loss
(``compute_policy_loss_vanilla``, token mean, advantages +1 / -1 per sequence) on
``compute_response_log_probs`` of each sequence's second half (packed). Every
configuration does the same work and takes the same update (its gradient norm is printed):

``one``
    one process, the single engine, all ``G`` sequences in ``G`` micro-batches.
``data=N``
    ``N`` ranks, FSDP2 over all of them; each rank trains ``G / N`` sequences.
``sequence=N``
    ``N`` ranks, Ulysses (``sequence_parallel_size=N``); every rank takes all ``G``
    micro-batches, each split along its tokens over the ranks.
``tensor=N``
    ``N`` ranks, ``tensor_parallel_size=N``; every rank takes all ``G`` micro-batches with
    its ``1 / N`` of every layer's weights and of the vocabulary.

Each configuration runs in new processes (``_common.spawn_ranks``, forked from the driver
after it imported the code, gloo), one thread per process. A warm-up step on 16-token sequences allocates the AdamW state first; the measured
step is the next one. Reported per rank (the largest over the ranks):

- ``weights / grads / AdamW``: bytes of this rank's parameters, gradients (after the
  backward) and optimizer state, counted from the tensors' local shards;
- ``peak``: peak RSS over the measured step (a thread samples ``/proc/self/statm`` every
  2 ms) minus the RSS after the imports and the process group, before the model is built;
- ``rest``: ``peak`` minus the three counted parts: activations, gathered weights,
  communication buffers;
- ``step s``: the measured step's wall time. With the ranks sharing the machine's cores the
  absolute times say little: compare the ratios, which are against ``data=N`` of the same
  run.

Workloads (``--workload``):

``wide``
    a randomly initialised Qwen2 built from a config (4 layers, hidden 512, 8 query / 2
    key-value heads, MLP 1,408, the tiny tokenizer's 724-token vocabulary), 2 ranks,
    4,096-token sequences: activations dominate.
``smollm2``
    SmolLM2-135M (the embedded model: 30 layers, hidden 576, 9 query / 3 key-value heads,
    49,152-token vocabulary), 3 ranks, 512-token sequences: the weights dominate.

    python bench/bench_parallel.py                      # both workloads, 11 min on 2 shared cores
    python bench/bench_parallel.py --workload smollm2 --tokens 1024
    python bench/bench_parallel.py --workload smollm2 --micro-batches 2
    python bench/bench_parallel.py --tiny               # seconds: a 64-wide model, 128 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from _common import MiB, PeakSampler, local_nbytes, rss_bytes, spawn_ranks, trim_heap

WARMUP_TOKENS = 16
RANKS = {"wide": 2, "smollm2": 3, "tiny": 2}
TOKENS = {"wide": 4096, "smollm2": 512, "tiny": 128}
MODELS = {
    "wide": dict(
        hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=1408
    ),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
}
CONFIGS = ("one", "data", "sequence", "tensor")


# --------------------------------------------------------------------------- one rank


def preload() -> None:
    """Import what a rank runs, so that its baseline RSS includes the code (the driver
    calls it before forking the ranks, which then import nothing)."""
    import torch.distributed.tensor.parallel  # noqa: F401
    import transformers.models.llama.modeling_llama
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    import verl.algorithms.policy_loss
    import verl.engine.fsdp
    import verl.kernels.torch_functional
    import verl.models.loading
    import verl.models.tiny  # noqa: F401


def _build_model(workload: str, tokens: int):
    if workload == "smollm2":
        from verl.models.embedded import embedded_model_dir
        from verl.models.loading import load_causal_lm

        return load_causal_lm(embedded_model_dir())
    from verl.models.tiny import build_tiny_model

    return build_tiny_model(**MODELS[workload], max_position_embeddings=tokens, seed=0)


def _rows(count: int, tokens: int, vocab: int, seed: int):
    """``count`` sequences of random ids in ``[3, vocab)``: (ids, mask, position ids)."""
    import torch

    ids = torch.randint(3, vocab, (count, tokens), generator=torch.Generator().manual_seed(seed))
    return ids, torch.ones_like(ids), torch.arange(tokens).expand(count, tokens)


def _loss_fn(response_len: int):
    def loss_fn(module, mb):
        """PPO's clipped loss at ratio 1 (old log-probs = the current ones, detached)."""
        import torch

        from verl.algorithms.policy_loss import compute_policy_loss_vanilla
        from verl.kernels.torch_functional import compute_response_log_probs

        ids, mask, pos, sign = mb
        log_prob, _ = compute_response_log_probs(
            module, ids, mask, pos, response_len, chunk_size=512, pack=True
        )
        advantages = torch.full_like(log_prob, sign)
        resp = mask[:, -response_len:].to(log_prob.dtype)
        loss, _ = compute_policy_loss_vanilla(log_prob.detach(), log_prob, advantages, resp)
        return loss, {}

    return loss_fn


def _micro_batches(setup: dict, engine, tokens: int, vocab: int) -> list[tuple]:
    """This rank's micro-batches of the global batch: one sequence each. The ranks of a
    sequence or tensor group take the same rows; data-parallel ranks different ones."""
    dp = engine.data_parallel_size
    dp_rank = setup["rank"] // (setup["world"] // dp)
    count = setup["ranks"] * setup["micro_batches"]
    ids, mask, pos = _rows(count, tokens, vocab, seed=tokens)
    return [
        (ids[i : i + 1], mask[i : i + 1], pos[i : i + 1], 1.0 if i % 2 == 0 else -1.0)
        for i in range(count)
        if i % dp == dp_rank
    ]


def _rank(rank: int, world: int, port: int, out: str, setup: dict) -> None:
    import torch
    import torch.distributed as dist

    from verl.engine import OptimSpec, build_engine
    from verl.utils.distributed import init_distributed

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # FSDP2 warns that the grouped embedding/head unit returns views (verl adds in place
    # nowhere after it)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    setup = dict(setup, rank=rank, world=world)
    sampler = PeakSampler()
    if world > 1:
        init_distributed(rank, world, "127.0.0.1", port, device_type="cpu")
    preload()  # a no-op when forked from the driver, which preloaded
    trim_heap()
    base = rss_bytes()
    tokens = setup["tokens"]
    model = _build_model(setup["workload"], tokens)
    vocab = int(model.config.vocab_size)
    mode, n = setup["config"], world
    options = {"sequence": {"sequence_parallel_size": n}, "tensor": {"tensor_parallel_size": n}}
    engine = build_engine(
        "single" if mode == "one" else "fsdp2",
        model,
        OptimSpec(lr=1e-5),
        **options.get(mode, {}),
    )
    del model
    # warm-up: AdamW state and FSDP's buffers exist after the first step
    engine.forward_backward(
        _micro_batches(setup, engine, WARMUP_TOKENS, vocab), _loss_fn(WARMUP_TOKENS // 2)
    )
    engine.optimizer_step()
    batch = _micro_batches(setup, engine, tokens, vocab)
    trim_heap()
    resident = rss_bytes()
    sampler.phase("step")
    start = time.perf_counter()
    metrics = engine.forward_backward(batch, _loss_fn(tokens // 2))
    grads = sum(local_nbytes(p.grad) for p in engine.module.parameters() if p.grad is not None)
    step = engine.optimizer_step()
    step_s = time.perf_counter() - start
    peaks = sampler.close()
    params = sum(local_nbytes(p) for p in engine.module.parameters())
    optim = sum(
        local_nbytes(v)
        for state in engine.optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    result = {
        "rank": rank,
        "rows": len(batch),
        "params_mib": params / MiB,
        "grads_mib": grads / MiB,
        "optim_mib": optim / MiB,
        "resident_mib": (resident - base) / MiB,
        "peak_mib": (peaks["step"] - base) / MiB,
        "step_s": step_s,
        "loss": sum(m["loss"] for m in metrics) / len(metrics),
        "grad_norm": step["grad_norm"],
    }
    Path(out).write_text(json.dumps(result))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


# --------------------------------------------------------------------------- driver


def run_config(workload: str, config: str, tokens: int, micro_batches: int) -> dict:
    """One configuration's per-rank results and their worst rank (``per_rank``)."""
    ranks = RANKS[workload]
    world = 1 if config == "one" else ranks
    setup = {
        "workload": workload,
        "config": config,
        "tokens": tokens,
        "ranks": ranks,
        "micro_batches": micro_batches,
    }
    results = spawn_ranks(_rank, world, (setup,), start_method="fork")
    worst = {k: max(r[k] for r in results) for k in results[0] if k.endswith(("_mib", "_s"))}
    worst["state_mib"] = max(r["params_mib"] + r["grads_mib"] + r["optim_mib"] for r in results)
    worst["rest_mib"] = max(
        r["peak_mib"] - r["params_mib"] - r["grads_mib"] - r["optim_mib"] for r in results
    )
    name = "one" if config == "one" else f"{config}={ranks}"
    return {
        "name": name,
        "processes": world,
        "per_rank": worst,
        "grad_norm": results[0]["grad_norm"],
        "ranks": results,
    }


def run_workload(workload: str, tokens: int, micro_batches: int = 1) -> dict:
    rows = [run_config(workload, config, tokens, micro_batches) for config in CONFIGS]
    ref = next(r for r in rows if r["name"].startswith("data="))["per_rank"]
    for row in rows:
        row["vs_data"] = {
            k: round(row["per_rank"][k] / ref[k], 3) if ref[k] else None
            for k in ("params_mib", "state_mib", "rest_mib", "peak_mib", "step_s")
        }
    return {
        "workload": workload,
        "tokens": tokens,
        "sequences": RANKS[workload] * micro_batches,
        "micro_batches_per_data_rank": micro_batches,
        "rows": rows,
    }


def format_table(result: dict) -> str:
    """The workload's rows as a markdown table, ratios against ``data=N``."""
    lines = [
        f"{result['workload']}: {result['sequences']} sequences x {result['tokens']} tokens "
        f"per step, one per micro-batch ({result['micro_batches_per_data_rank']} per data "
        "rank); MiB per rank (the largest rank)",
        "| config | processes | weights | grads | AdamW | peak | rest | step s | grad norm "
        "| weights+grads+AdamW vs data | rest vs data | peak vs data | step vs data |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        p, v = row["per_rank"], row["vs_data"]
        lines.append(
            f"| {row['name']} | {row['processes']} | {p['params_mib']:.1f} | "
            f"{p['grads_mib']:.1f} | {p['optim_mib']:.1f} | {p['peak_mib']:.0f} | "
            f"{p['rest_mib']:.0f} | {p['step_s']:.1f} | {row['grad_norm']:.4g} | "
            f"{v['state_mib']:.2f}x | {v['rest_mib']:.2f}x | {v['peak_mib']:.2f}x | "
            f"{v['step_s']:.2f}x |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("all", "wide", "smollm2"), default="all")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per sequence")
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=1,
        help="micro-batches (sequences) per data-parallel rank; the global batch is the "
        "ranks times this",
    )
    parser.add_argument("--tiny", action="store_true", help="a 64-wide model, 128 tokens")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.tokens is not None and args.tokens < 2 * WARMUP_TOKENS:
        parser.error(f"--tokens {args.tokens}: use at least {2 * WARMUP_TOKENS}")
    if args.micro_batches < 1:
        parser.error(f"--micro-batches {args.micro_batches}: use at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    preload()
    if args.tiny:
        workloads = ["tiny"]
    else:
        workloads = ["wide", "smollm2"] if args.workload == "all" else [args.workload]
    summary: dict[str, Any] = {
        "bench": "parallel",
        "cpus": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "workloads": [
            run_workload(w, args.tokens or TOKENS[w], args.micro_batches) for w in workloads
        ],
    }
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    for result in summary["workloads"]:
        print()
        print(format_table(result))


if __name__ == "__main__":
    main()
