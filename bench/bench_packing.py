"""Benchmark: padded vs length-grouped vs packed vs shared-prompt packed log-prob and
update passes, on W3- or W2-shaped GRPO batches.

``--shape w3`` (default) is SmolLM2-135M (hidden 576, 30 layers, 9 heads / 3 KV heads,
MLP 1536, vocab 49,152, tied embeddings; random weights here, the shapes are what cost),
8 prompts x 4 samples: 32 rows of a ~40-46 token chat prompt and a response of up to 48
tokens. ``--shape w2`` is the W2 tiny Qwen2 (``bench/_common.W2_MODEL_KWARGS``: hidden 256,
4 layers), 32 prompts x 8 samples, ~20-25 token prompts, responses of up to 32 tokens.
Response lengths are drawn like a sampled run's (many short, a quarter cut at the limit);
the ``--group`` rows of a prompt share its ids, as ``rollout.n`` samples do. The
micro-batches are the workers' own (``verl.workers.micro_batching.split_micro_batches``):

- ``padded``: ``--micro`` rows per micro-batch in batch order, each cut to its longest
  prompt and response (the default before sequence packing);
- ``grouped``: the token-budget split (rows sorted by length, rows x longest <= budget);
- ``packed``: ``--micro`` rows per micro-batch, real tokens packed end to end
  (``compute_response_log_probs(pack=True)``);
- ``packed_budget``: packed, micro-batches by a budget of real tokens;
- ``shared`` / ``shared_budget``: as ``packed`` / ``packed_budget`` with shared-prompt
  packing (``share_prefix=True``: each group's prompt computed once, group-aware
  micro-batches whose budget counts a prompt once);
- ``shared_budget_masked``: ``shared_budget`` with attention over each bin under its full
  ``(bins, width, width)`` mask instead of block by block (``verl.kernels.block_attention``,
  used by every packed configuration above when the model's attention is ``sdpa``).

``logprob`` is the no-grad pass (old / reference log-probs); ``update`` is forward +
backward of the summed response log-probs (the actor update without the optimizer step).
Configurations alternate within each repeat; medians and ratios to ``padded`` and to
``packed`` are printed as a table and JSON. Times are the process's CPU seconds (all its
threads), which other tenants of a shared machine inflate far less than wall time.

    python bench/bench_packing.py                          # W3 shape, 30 layers, 3 repeats
    python bench/bench_packing.py --layers 4 --repeats 1   # quick
    python bench/bench_packing.py --shape w2               # W2 shape
    python bench/bench_packing.py --autocast bf16 --configs shared_budget shared_budget_masked
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
from _common import W2_MODEL_KWARGS

import verl.kernels.packed_model as pm
from verl.kernels.torch_functional import compute_response_log_probs
from verl.protocol import DataProto
from verl.workers.micro_batching import split_micro_batches

CONFIGS = (
    "padded",
    "grouped",
    "packed",
    "packed_budget",
    "shared",
    "shared_budget",
    "shared_budget_masked",
)
# per shape: rows, prompt, response, group, layers, micro-batch rows, token budget
SHAPES = {
    "w3": dict(rows=32, prompt=46, response=48, group=4, layers=30, micro=4, budget=4 * 94),
    "w2": dict(rows=256, prompt=25, response=32, group=8, layers=4, micro=8, budget=8 * 57),
}


def _model(shape: str, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from verl.models.tiny import build_tiny_model

    if shape == "w2":
        return build_tiny_model(**{**W2_MODEL_KWARGS, "num_layers": layers})

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


def _batch(rows: int, prompt: int, response: int, group: int, vocab: int, seed: int) -> DataProto:
    """``rows`` rows in groups of ``group`` consecutive rows sharing one prompt."""
    gen = torch.Generator().manual_seed(seed)
    prompts = -(-rows // group)
    p_lens = torch.randint(prompt - 6, prompt + 1, (prompts,), generator=gen)
    p_lens = p_lens.repeat_interleave(group)[:rows]
    r_lens = torch.randint(6, response + 1, (rows,), generator=gen)
    r_lens[torch.rand(rows, generator=gen) < 0.25] = response  # truncated at the limit
    mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for i in range(rows):
        mask[i, prompt - int(p_lens[i]) : prompt + int(r_lens[i])] = 1
    ids = torch.randint(3, vocab, mask.shape, generator=gen)
    prompt_ids = torch.randint(3, vocab, (prompts, prompt), generator=gen)
    ids[:, :prompt] = prompt_ids.repeat_interleave(group, 0)[:rows]
    ids = ids * mask
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": mask[:, prompt:].float(),
    }
    return DataProto.from_dict(tensors=tensors)


AUTOCAST: torch.dtype | None = None


@contextlib.contextmanager
def _block_attention_off():
    """Packed passes attend under the bins' full masks (the path before block attention)."""
    real = pm.block_attention_layers
    pm.block_attention_layers = lambda model: 0
    try:
        yield
    finally:
        pm.block_attention_layers = real


def _micro(data: DataProto, response: int, config: str, budget: int, micro: int):
    config = config.removesuffix("_masked")
    packed = config != "padded" and config != "grouped"
    share = config.startswith("shared")
    if config in ("padded", "packed", "shared"):
        return split_micro_batches(
            data, response, micro_batch_size=micro, packed=packed, share_prefix=share
        )
    return split_micro_batches(
        data, response, max_token_len=budget, packed=packed, share_prefix=share
    )


def _computed(model, data: DataProto, response: int, config: str, budget: int, micro: int):
    """Token columns the base transformer computes (packing: bins x width)."""
    from verl.kernels.packed_model import pack_batch

    total = 0
    for mb in _micro(data, response, config, budget, micro):
        b = mb.data.batch
        if config in ("padded", "grouped"):
            total += b["input_ids"].numel()
        else:
            total += pack_batch(
                model,
                b["input_ids"],
                b["attention_mask"],
                mb.response_len,
                config.startswith("shared"),
            ).num_tokens
    return total


def _run(
    model, data: DataProto, response: int, config: str, mode: str, budget: int, micro: int
) -> float:
    micro = _micro(data, response, config, budget, micro)
    masked = config.endswith("_masked")
    start = time.process_time()
    for mb in micro:
        b = mb.data.batch
        with (
            torch.set_grad_enabled(mode == "update"),
            _block_attention_off() if masked else contextlib.nullcontext(),
            torch.autocast("cpu", dtype=AUTOCAST, enabled=AUTOCAST is not None),
        ):
            lp, _ = compute_response_log_probs(
                model,
                b["input_ids"],
                b["attention_mask"],
                b["position_ids"],
                response_len=mb.response_len,
                chunk_size=512,
                pack=config not in ("padded", "grouped"),
                share_prefix=config.startswith("shared"),
            )
            if mode == "update":
                (lp * b["response_mask"]).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="w3")
    for key in ("layers", "rows", "prompt", "response", "group", "micro", "budget"):
        parser.add_argument(f"--{key}", type=int, default=None, help="default: the shape's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: CPU time is not inflated by threads spinning on a busy machine)",
    )
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument(
        "--autocast", choices=("fp32", "bf16"), default="fp32", help="bf16: CPU bf16 autocast"
    )
    args = parser.parse_args()
    global AUTOCAST
    AUTOCAST = torch.bfloat16 if args.autocast == "bf16" else None
    for key, value in SHAPES[args.shape].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)
    model = _model(args.shape, args.layers)
    vocab = model.config.vocab_size
    data = _batch(args.rows, args.prompt, args.response, args.group, vocab, seed=1)
    real = int(data.batch["attention_mask"].sum())
    run_args = (args.response, args.budget, args.micro)
    times: dict[tuple[str, str], list[float]] = {}
    for mode in ("logprob", "update"):
        model.train(mode == "update")
        _run(model, data, args.response, "padded", mode, args.budget, args.micro)  # warm-up
        for _ in range(args.repeats):
            for config in args.configs:
                t = _run(model, data, args.response, config, mode, args.budget, args.micro)
                times.setdefault((mode, config), []).append(t)
                print(f"  {mode} {config}: {t:.3f} s", file=sys.stderr, flush=True)
    computed = {c: _computed(model, data, args.response, c, *run_args[1:]) for c in args.configs}
    rows = []
    for mode in ("logprob", "update"):
        base = statistics.median(times[(mode, args.configs[0])])
        packed = times.get((mode, "packed"))
        for config in args.configs:
            median = statistics.median(times[(mode, config)])
            rows.append(
                {
                    "mode": mode,
                    "config": config,
                    "median_s": round(median, 3),
                    f"vs_{args.configs[0]}": round(median / base, 3),
                    "vs_packed": round(median / statistics.median(packed), 3) if packed else None,
                    "computed_tokens": computed[config],
                    "runs": [round(t, 3) for t in times[(mode, config)]],
                }
            )
    print(f"{args.shape}: {args.rows} rows in groups of {args.group}, {real} real tokens")
    print(
        f"{'mode':8} {'config':14} {'cpu s':>9} {'vs ' + args.configs[0]:>12} "
        f"{'vs packed':>10} {'tokens':>8}"
    )
    for row in rows:
        vs_packed = "" if row["vs_packed"] is None else f"{row['vs_packed']:.3f}"
        print(
            f"{row['mode']:8} {row['config']:14} {row['median_s']:9.3f} "
            f"{row[f'vs_{args.configs[0]}']:12.3f} {vs_packed:>10} {row['computed_tokens']:8d}"
        )
    print(json.dumps({"args": vars(args), "real_tokens": real, "rows": rows}))


if __name__ == "__main__":
    main()
