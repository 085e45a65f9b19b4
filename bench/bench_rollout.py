"""Benchmark: native rollout engine vs transformers ``generate``, side by side in one run.

Model: the tiny Qwen2 of FACTS.md (hidden 256, 4 layers, intermediate 1024, 4 heads / 2 kv
heads, ~4 M params, vocab of the tiny tokenizer), random weights, fp32. Workload: 16 chat
prompts of different lengths (left-padded) x n=4 samples, up to 32 new tokens,
temperature 1.0. Two scenarios:

- ``fixed``: no stop tokens, every sample generates exactly 32 tokens (the same work for
  every method);
- ``early_stop``: every 16th token id is a stop token, so responses end at spread-out
  steps as real ones do (shows batch compaction; ``native_no_compaction`` is the control).

Methods, each warmed up once, then run ``--repeats`` times in rotating order:

- ``native``      ``verl.rollout.native.NativeRollout.generate`` (log-probs included);
- ``hf_backend``  ``verl.rollout.hf.HFRollout.generate`` (generate + logits for log-probs);
- ``hf_generate`` bare ``model.generate(num_return_sequences=n, do_sample=True)``, the
  baseline a transformers user would write.

Reported: new tokens/s (total tokens / total time over the timed runs) and the ratio to
``hf_generate``. Timings on a shared CPU drift; the 1-minute load average is recorded.

    python bench/bench_rollout.py
    python bench/bench_rollout.py --prompts 8 --n 8 --max-new-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _prompts(tokenizer, count: int) -> list[str]:
    questions = [
        "What is 3 + 4?",
        "Tom has 12 apples and buys 7 more. How many apples does he have now?",
        "Compute 45 - 19.",
        "A box holds 6 books. How many books are in 9 boxes? Think step by step.",
        "What is 8 times 7?",
        "Add 123 and 456, then subtract 78. What is the result?",
        "Is 91 a prime number?",
        "The cat has 5 toys and the dog has 3. How many toys in total?",
    ]
    texts = []
    for i in range(count):
        q = questions[i % len(questions)] + (" Answer briefly." if i >= len(questions) else "")
        texts.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
        )
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every method")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--stop-every", type=int, default=16, help="early_stop: every k-th id")
    args = parser.parse_args()

    import torch

    from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
    from verl.protocol import DataProto
    from verl.rollout import SamplingParams
    from verl.rollout.hf import HFRollout
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
    enc = tokenizer(_prompts(tokenizer, args.prompts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    batch = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        }
    )
    n, max_new = args.n, args.max_new_tokens
    vocab = model.config.vocab_size
    # Scenario "early_stop": every 16th id stops a response. The random model's next-token
    # distribution is near uniform, so ~6% of rows end per step and lengths spread from 1 to
    # the cap, like real rollouts where most responses end before max_new_tokens.
    scenarios = {
        "fixed": [],
        "early_stop": list(range(3, vocab, args.stop_every)),
    }
    native = NativeRollout(model, tokenizer)
    native_plain = NativeRollout(model, tokenizer, compaction=False)
    hf_backend = HFRollout(model, tokenizer)
    records = []
    for scenario, stop_ids in scenarios.items():
        params = SamplingParams(
            n=n, max_new_tokens=max_new, temperature=1.0, stop_token_ids=stop_ids
        )

        def run_engine(engine, params=params) -> int:
            return int(engine.generate(batch, params).batch["response_mask"].sum())

        def run_hf_generate(stop_ids=stop_ids) -> int:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=enc["input_ids"],
                    attention_mask=mask,
                    max_new_tokens=max_new,
                    num_return_sequences=n,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    eos_token_id=stop_ids or None,  # None: no stop
                    pad_token_id=tokenizer.pad_token_id,
                )
            gen = out[:, enc["input_ids"].shape[1] :]
            if not stop_ids:
                return gen.numel()
            is_stop = torch.isin(gen, torch.tensor(stop_ids))
            ends = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, gen.shape[1])
            return int(ends.sum())

        methods = {
            "native": lambda: run_engine(native),
            "hf_backend": lambda: run_engine(hf_backend),
            "hf_generate": run_hf_generate,
        }
        if stop_ids:
            methods["native_no_compaction"] = lambda: run_engine(native_plain)
        records.append(_measure(scenario, methods, args.repeats, torch))
        records[-1]["native_stats"] = {k: round(v, 4) for k, v in native.last_stats.items()}

    summary = {
        "bench": "rollout",
        "model": {
            "params": model.num_parameters(),
            "hidden": args.hidden,
            "layers": args.layers,
            "vocab": vocab,
        },
        "workload": {
            "prompts": args.prompts,
            "n": n,
            "max_new_tokens": max_new,
            "prompt_len": int(enc["input_ids"].shape[1]),
            "temperature": 1.0,
        },
        "threads": args.threads,
        "repeats": args.repeats,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "scenarios": records,
    }
    print(json.dumps(summary))
    print()
    print(
        f"{'scenario':11} {'method':21} {'median_s':>9} {'min_s':>7} {'tok/run':>7} "
        f"{'tok/s':>8} {'vs hf_generate':>14}"
    )
    for rec in records:
        for name, r in rec["results"].items():
            print(
                f"{rec['scenario']:11} {name:21} {r['median_s']:9.3f} {r['min_s']:7.3f} "
                f"{r['tokens_per_run']:7.0f} {r['tokens_per_s']:8.1f} {r['speedup_vs_hf_generate']:13.2f}x"
            )


def _measure(scenario: str, methods: dict, repeats: int, torch) -> dict:
    """Warm up each method, then time ``repeats`` rounds in rotating order.

    Responses end at random steps in ``early_stop``, so tokens are counted per run and the
    rate is total tokens / total time over the timed runs.
    """
    for fn in methods.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in methods}
    tokens: dict[str, list[int]] = {name: [] for name in methods}
    names = list(methods)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            torch.manual_seed(rep)
            start = time.perf_counter()
            tokens[name].append(methods[name]())
            times[name].append(time.perf_counter() - start)
    rate = {name: sum(tokens[name]) / sum(times[name]) for name in names}
    results = {}
    for name in names:
        results[name] = {
            "median_s": round(statistics.median(times[name]), 4),
            "min_s": round(min(times[name]), 4),
            "tokens_per_run": round(sum(tokens[name]) / repeats, 1),
            "tokens_per_s": round(rate[name], 1),
            "speedup_vs_hf_generate": round(rate[name] / rate["hf_generate"], 2),
        }
    return {"scenario": scenario, "results": results}


if __name__ == "__main__":
    main()
