"""Benchmark: the prompt loader in the driver vs in worker processes, on a large JSON-lines file.

A synthetic prompt file of ``--rows`` chat prompts (a few hundred characters each, verl's row
format) is read through ``PromptDataLoader`` with the embedded SmolLM2 tokenizer (the tiny
test tokenizer when it is not installed) in three ways:

- ``eager``: ``RLHFDataset`` (every row read, checked and tokenized up front) and
  ``num_workers=0``, today's default;
- ``lazy_w0``: ``LazyRLHFDataset`` (rows indexed up front, read and tokenized when their
  batch is due) in the driver process;
- ``lazy_w2``: ``LazyRLHFDataset`` with ``num_workers=2``, ``prefetch_factor=2``.

For each: ``setup_s`` (building the dataset), ``first_batch_s`` (setup to the first batch in
hand), ``batches_s`` (``--batches`` batches of ``--batch-size`` prompts after the first, with
``--step-ms`` of simulated trainer work per batch, a sleep that leaves the cores to the
workers), and ``total_s``. Configurations run one after the other in each repeat; medians
and ratios to ``eager`` are printed as a table and JSON. Wall-clock seconds: on a shared
machine compare the ratios, not the seconds.

    python bench/bench_dataloader.py                       # 50k rows, 3 repeats
    python bench/bench_dataloader.py --rows 5000 --repeats 1 --step-ms 0
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("eager", "lazy_w0", "lazy_w2")
WORDS = ("add", "the", "numbers", "then", "divide", "by", "seven", "and", "report", "a", "sum")


def _tokenizer():
    from verl.models import load_tokenizer
    from verl.models.embedded import embedded_model_dir
    from verl.models.tiny import build_tiny_tokenizer

    try:
        return load_tokenizer(str(embedded_model_dir())), "smollm2"
    except Exception:  # the embedded model is optional
        return build_tiny_tokenizer(), "tiny"


def write_prompts(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(rows):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 120)))
            row = {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": f"Problem {i}: {words}?"}],
                "reward_model": {"style": "rule", "ground_truth": str(i % 97)},
                "extra_info": {"i": i},
            }
            f.write(json.dumps(row) + "\n")


def run(config: str, path: Path, tokenizer, args: argparse.Namespace) -> dict[str, float]:
    from verl.data import LazyRLHFDataset, PromptDataLoader, RLHFDataset

    start = time.perf_counter()
    kind = RLHFDataset if config == "eager" else LazyRLHFDataset
    dataset = kind(str(path), tokenizer, max_prompt_length=512)
    setup = time.perf_counter() - start
    workers = 2 if config == "lazy_w2" else 0
    loader = PromptDataLoader(
        dataset,
        args.batch_size,
        seed=1,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
    )
    stream = iter(loader)
    next(stream)
    first = time.perf_counter() - start
    mark = time.perf_counter()
    for _ in range(args.batches):
        next(stream)
        time.sleep(args.step_ms / 1000)
    batches = time.perf_counter() - mark
    stream.close()
    loader.close()
    return {
        "setup_s": setup,
        "first_batch_s": first,
        "batches_s": batches,
        "total_s": first + batches,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    tokenizer, name = _tokenizer()
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        write_prompts(path, args.rows)
        size_mb = path.stat().st_size / 2**20
        for _ in range(args.repeats):
            for config in CONFIGS:
                results[config].append(run(config, path, tokenizer, args))
    keys = ("setup_s", "first_batch_s", "batches_s", "total_s")
    med = {c: {k: statistics.median(r[k] for r in results[c]) for k in keys} for c in CONFIGS}
    print(
        f"{args.rows} rows ({size_mb:.1f} MiB), tokenizer {name}, batch {args.batch_size}, "
        f"{args.batches} batches, {args.step_ms:g} ms step, median of {args.repeats}"
    )
    print(f"{'config':<10}" + "".join(f"{k:>16}" for k in keys))
    for c in CONFIGS:
        cells = "".join(f"{med[c][k]:>9.2f} ({med[c][k] / med['eager'][k]:.2f}x)" for k in keys)
        print(f"{c:<10}{cells}")
    out = {"args": vars(args), "tokenizer": name, "file_mib": size_mb, "median": med}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
