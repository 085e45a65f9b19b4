"""Benchmark: padded vs length-grouped vs packed log-prob and update passes, W3-shaped.

W3 is SmolLM2-135M (hidden 576, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab 49,152,
tied embeddings; random weights here, the shapes are what cost), 8 prompts x 4 samples:
32 rows of a ~40-46 token chat prompt and a response of up to 48 tokens (lengths drawn
like a sampled run's: many short, a quarter cut at the limit). The micro-batches are the
workers' own (``verl.workers.micro_batching.split_micro_batches``):

- ``padded``: 4 rows per micro-batch in batch order, each cut to its longest prompt and
  response (the default before sequence packing);
- ``grouped``: the token-budget split (rows sorted by length, rows x longest <= budget);
- ``packed``: 4 rows per micro-batch, real tokens packed end to end
  (``compute_response_log_probs(pack=True)``);
- ``packed_budget``: packed, micro-batches by a budget of real tokens.

``logprob`` is the no-grad pass (old / reference log-probs); ``update`` is forward +
backward of the summed response log-probs (the actor update without the optimizer step).
Configurations alternate within each repeat; medians and ratios to ``padded`` are printed
as a table and JSON. Times are the process's CPU seconds (all its threads), which other
tenants of a shared machine inflate far less than wall time.

    python bench/bench_packing.py                 # W3 shape, 3 repeats
    python bench/bench_packing.py --layers 4 --repeats 1   # quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from verl.protocol import DataProto
from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.micro_batching import split_micro_batches

CONFIGS = ("padded", "grouped", "packed", "packed_budget")


def _model(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _batch(rows: int, prompt: int, response: int, seed: int) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(prompt - 6, prompt + 1, (rows,), generator=gen)
    r_lens = torch.randint(6, response + 1, (rows,), generator=gen)
    r_lens[torch.rand(rows, generator=gen) < 0.25] = response  # truncated at the limit
    mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for i in range(rows):
        mask[i, prompt - int(p_lens[i]) : prompt + int(r_lens[i])] = 1
    ids = torch.randint(3, 49152, mask.shape, generator=gen) * mask
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": mask[:, prompt:].float(),
    }
    return DataProto.from_dict(tensors=tensors)


def _micro(data: DataProto, response: int, config: str, budget: int):
    if config in ("padded", "packed"):
        return split_micro_batches(data, response, micro_batch_size=4)
    return split_micro_batches(
        data, response, max_token_len=budget, packed=config == "packed_budget"
    )


def _run(model, data: DataProto, response: int, config: str, mode: str, budget: int) -> float:
    micro = _micro(data, response, config, budget)
    start = time.process_time()
    for mb in micro:
        b = mb.data.batch
        with torch.set_grad_enabled(mode == "update"):
            lp, _ = compute_response_log_probs(
                model,
                b["input_ids"],
                b["attention_mask"],
                b["position_ids"],
                response_len=mb.response_len,
                chunk_size=512,
                pack=config.startswith("packed"),
            )
            if mode == "update":
                (lp * b["response_mask"]).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=46)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--budget", type=int, default=4 * (46 + 48), help="token budget")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: CPU time is not inflated by threads spinning on a busy machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = _model(args.layers)
    data = _batch(args.rows, args.prompt, args.response, seed=1)
    real = int(data.batch["attention_mask"].sum())
    times: dict[tuple[str, str], list[float]] = {}
    for mode in ("logprob", "update"):
        model.train(mode == "update")
        _run(model, data, args.response, "padded", mode, args.budget)  # warm-up
        for _ in range(args.repeats):
            for config in CONFIGS:
                t = _run(model, data, args.response, config, mode, args.budget)
                times.setdefault((mode, config), []).append(t)
                print(f"  {mode} {config}: {t:.3f} s", file=sys.stderr, flush=True)
    computed = {
        "padded": sum(
            mb.data.batch["input_ids"].numel()
            for mb in _micro(data, args.response, "padded", args.budget)
        ),
        "grouped": sum(
            mb.data.batch["input_ids"].numel()
            for mb in _micro(data, args.response, "grouped", args.budget)
        ),
    }
    rows = []
    for mode in ("logprob", "update"):
        base = statistics.median(times[(mode, "padded")])
        for config in CONFIGS:
            median = statistics.median(times[(mode, config)])
            rows.append(
                {
                    "mode": mode,
                    "config": config,
                    "median_s": round(median, 3),
                    "vs_padded": round(median / base, 3),
                    "runs": [round(t, 3) for t in times[(mode, config)]],
                }
            )
    print(f"{args.rows} rows, {real} real tokens; padded computes {computed['padded']}, ")
    print(f"grouped {computed['grouped']} (packed: real tokens + bin tails)")
    print(f"{'mode':8} {'config':14} {'cpu s':>9} {'vs padded':>10}")
    for row in rows:
        print(f"{row['mode']:8} {row['config']:14} {row['median_s']:9.3f} {row['vs_padded']:10.3f}")
    print(json.dumps({"args": vars(args), "real_tokens": real, "computed": computed, "rows": rows}))


if __name__ == "__main__":
    main()
