"""Benchmark: activation memory of one long sequence with and without Ulysses sequence
parallelism (``verl.kernels.ulysses``).

One sequence of ``--tokens`` tokens goes through a randomly initialised Qwen2
(``--layers`` layers, ``--hidden`` wide, 8 query and 2 key/value heads, fp32):
``compute_response_log_probs`` of its second half (packed, 512-token head chunks) and the
backward of their sum. Once in one process, once on 2 ranks (``torch.multiprocessing`` +
gloo) with the model split over a 2-rank sequence group. Each run uses one thread per
process. Reported per process: the growth of peak RSS over the forward and backward (the
activations; the model is built before), and the wall time.

    python bench/bench_ulysses.py                    # 8,192 tokens, ~2 min
    python bench/bench_ulysses.py --tokens 4096
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _model(args: argparse.Namespace) -> torch.nn.Module:
    from verl.models.tiny import build_tiny_model

    return build_tiny_model(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=args.hidden * 11 // 4,
        max_position_embeddings=args.tokens,
        seed=0,
    )


def _measure(model: torch.nn.Module, tokens: int) -> tuple[float, float]:
    """(peak RSS growth in MiB, seconds) of one forward + backward."""
    from verl.kernels.torch_functional import compute_response_log_probs

    ids = torch.randint(3, 700, (1, tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = torch.arange(tokens)[None]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    log_probs, _ = compute_response_log_probs(
        model, ids, mask, pos, tokens // 2, chunk_size=512, pack=True
    )
    log_probs.sum().backward()
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return grown, seconds


def _one(args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    grown, seconds = _measure(_model(args), args.tokens)
    Path(out).write_text(f"{grown:.0f} {seconds:.1f}\n")


def _rank(rank: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    torch.set_num_threads(1)
    from verl.kernels.ulysses import apply_ulysses, build_sequence_parallel
    from verl.utils.distributed import init_distributed

    init_distributed(rank, 2, "127.0.0.1", port, device_type="cpu")
    model = _model(args)
    apply_ulysses(model, build_sequence_parallel("cpu", 2))
    grown, seconds = _measure(model, args.tokens)
    Path(out_dir, f"rank{rank}.txt").write_text(f"{grown:.0f} {seconds:.1f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    import tempfile

    from verl.utils.distributed import find_free_port

    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp, "one.txt")
        proc = mp.get_context("spawn").Process(target=_one, args=(args, str(one)))
        proc.start()
        proc.join()
        mp.start_processes(
            _rank, args=(find_free_port(), args, tmp), nprocs=2, start_method="spawn"
        )
        rows = [("one process", one)] + [
            (f"sp=2 rank {r}", Path(tmp, f"rank{r}.txt")) for r in range(2)
        ]
        print(f"{args.tokens} tokens, {args.layers} layers x {args.hidden}, fp32, 1 thread each")
        print("| process | peak RSS growth | time |\n|---|---|---|")
        for name, path in rows:
            grown, seconds = path.read_text().split()
            print(f"| {name} | {grown} MiB | {seconds} s |")


if __name__ == "__main__":
    main()
