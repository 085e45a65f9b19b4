"""Benchmark: continuous batching vs lock-step waves in the native engine, side by side.

Model: the tiny Qwen2 of ``bench_rollout.py`` (hidden 256, 4 layers, 4 heads / 2 kv heads),
random weights, fp32. Workload: ``--prompts`` chat prompts x ``--n`` samples, up to
``--max-new-tokens`` (256), with a long-tail length mix: a scripted stop (a logits processor
that forces the stop token at each sample's target length and forbids it before) gives
``--long-fraction`` (15%) of the samples a length drawn from [128, 256] and the rest one
from [4, 32]. The targets are a function of the sample's row, so every method generates the
same tokens.

Methods, with the KV cache limited to ``--slots`` rows (``max_num_seqs``), each warmed up
once, then run ``--repeats`` times in rotating order:

- ``lockstep``     ``continuous_batching=False``: waves of ``slots // n`` prompts, each
  decoded until its longest sample ends (finished rows compacted away);
- ``continuous``   the default: a finished sample's slot is refilled with the next prompt;
- ``all_rows``     no slot limit (every row in one lock-step batch): the unbounded-memory
  reference.

Reported: generated tokens/s (total tokens / total time), decode steps, and the ratio to
``lockstep``; the outputs of the three are checked to be identical (greedy).

    python bench/bench_continuous_batching.py
    python bench/bench_continuous_batching.py --prompts 64 --slots 32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--long-fraction", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    import torch

    from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
    from verl.protocol import DataProto
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout

    torch.set_num_threads(args.threads)
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    model = build_tiny_model(
        tokenizer=tokenizer,
        hidden_size=args.hidden,
        num_layers=args.layers,
        intermediate_size=4 * args.hidden,
        num_heads=4,
        num_kv_heads=2,
    )
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: what is {i} + {i * 7 % 13}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(args.prompts)
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    batch = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    )
    rows = args.prompts * args.n
    max_new = args.max_new_tokens
    gen = torch.Generator().manual_seed(0)
    long = torch.rand(rows, generator=gen) < args.long_fraction
    short_len = torch.randint(4, 33, (rows,), generator=gen)
    long_len = torch.randint(max_new // 2, max_new + 1, (rows,), generator=gen)
    target = torch.where(long, long_len, short_len).clamp_max(max_new)
    stop = 2  # the tiny tokenizer's <|im_end|>

    def scripted_stop(logits, sample_rows, steps):
        logits = logits.clone()
        at_end = steps + 1 >= target[sample_rows]
        logits[:, stop] = torch.where(at_end, 1e4, -1e4)
        return logits

    params = SamplingParams(
        n=args.n, max_new_tokens=max_new, do_sample=False, stop_token_ids=[stop]
    )
    common = {"logits_processor": scripted_stop}
    engines = {
        "lockstep": NativeRollout(
            model, tokenizer, max_num_seqs=args.slots, continuous_batching=False, **common
        ),
        "continuous": NativeRollout(model, tokenizer, max_num_seqs=args.slots, **common),
        "all_rows": NativeRollout(model, tokenizer, **common),
    }
    outputs, totals = {}, {name: [0, 0.0, 0.0] for name in engines}
    for name, engine in engines.items():  # warm-up, and the identity check
        outputs[name] = engine.generate(batch, params).batch["responses"]
    for name in engines:
        if not torch.equal(outputs[name], outputs["lockstep"]):
            raise SystemExit(f"{name}: responses differ from lockstep")
    names = list(engines)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            engine = engines[name]
            start = time.perf_counter()
            out = engine.generate(batch, params)
            totals[name][0] += int(out.batch["response_mask"].sum())
            totals[name][1] += time.perf_counter() - start
            totals[name][2] += engine.last_stats["decode_steps"]
    base = totals["lockstep"][0] / totals["lockstep"][1]
    print(
        f"{rows} samples ({int(long.sum())} long), mean length {target.float().mean():.1f}, "
        f"slots {args.slots}, threads {args.threads}, nproc {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'method':<12} {'tokens/s':>10} {'decode steps':>13} {'vs lockstep':>12}")
    records = []
    for name, (tokens, seconds, steps) in totals.items():
        rate = tokens / seconds
        print(f"{name:<12} {rate:>10.0f} {steps / args.repeats:>13.0f} {rate / base:>11.2f}x")
        records.append({"method": name, "tokens_per_s": rate, "ratio": rate / base})
    print(json.dumps({"records": records, "args": vars(args)}))


if __name__ == "__main__":
    main()
