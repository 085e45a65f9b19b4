"""Benchmark: the native engine's decode step eager vs ``torch.compile``-d, fp32 vs bf16.

Side by side in one process, on issue 14's workloads (chat prompts "What is a + b?",
temperature 1.0, no stop token, so every method generates the same number of tokens):

- ``W1``: the tiny Qwen2 (hidden 256, 4 layers, random weights), 16 prompts x 4, 16 tokens;
- ``W2``: the same model, 32 prompts x 8 samples, 32 new tokens;
- ``W3``: the embedded SmolLM2-135M-Instruct, 8 prompts x 4 samples, 48 new tokens;
- ``main``: the main job's shape (SmolLM2, 8 prompts x 4 samples, 8 new tokens).

Methods: ``eager`` and ``compiled`` (``NativeRollout(compile_decode=True)``, inductor), each
in fp32 and under bf16 autocast (what the actor worker wraps generation in when the actor
computes in bf16: ``trainer.mixed_precision=bf16``, or ``auto`` on a CPU with avx512_bf16).
Each method runs once untimed (the compiled ones compile there: reported as
``first_call_s``), then ``--repeats`` times in rotating order. ``compile_s`` = first call -
median call; ``payoff_steps`` = compile_s / (eager median - compiled median), the number of
generations (training steps) after which compiling has paid for itself.

Also reported, per precision: the rollout-vs-trainer log-prob gap of one generation, i.e.
``rollout/logprob_abs_diff_mean`` / ``_max`` (``verl.algorithms.rollout_correction``) of the
rollout's log-probs against a forward over prompt + response in the trainer's numerics
(fp32 rollout vs fp32 trainer; bf16 rollout vs the bf16-autocast trainer, the main job's
pair; and bf16 rollout vs an fp32 trainer, for scale).

    python bench/bench_rollout_compile.py --workloads W1 W2 W3 --repeats 3
    python bench/bench_rollout_compile.py --workloads W3 --engines eager   # fp32 vs bf16 only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import W2_MODEL_KWARGS, prompt_batch

WORKLOADS = {
    "W1": {"model": "tiny", "prompts": 16, "n": 4, "max_new_tokens": 16},
    "W2": {"model": "tiny", "prompts": 32, "n": 8, "max_new_tokens": 32},
    "W3": {"model": "smollm2", "prompts": 8, "n": 4, "max_new_tokens": 48},
    "main": {"model": "smollm2", "prompts": 8, "n": 4, "max_new_tokens": 8},
}


def _load(kind: str):
    if kind == "tiny":
        from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(tokenizer=tokenizer, **W2_MODEL_KWARGS)
    else:
        from verl.models import load_causal_lm, load_tokenizer

        model = load_causal_lm("smollm2-135m-instruct")
        tokenizer = load_tokenizer("embedded:smollm2")
    return model.eval(), tokenizer


def _gap(model, out, precision: str, torch) -> dict[str, float]:
    from verl.algorithms.rollout_correction import rollout_mismatch_metrics
    from verl.kernels.torch_functional import compute_response_log_probs

    mask = out.batch["response_mask"]
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )
    with torch.no_grad(), autocast:
        trainer = compute_response_log_probs(
            model,
            out.batch["input_ids"],
            out.batch["attention_mask"],
            out.batch["position_ids"],
            response_len=mask.shape[1],
        )[0]
    metrics = rollout_mismatch_metrics(trainer, out.batch["rollout_log_probs"], mask)
    keep = ("rollout/logprob_abs_diff_mean", "rollout/logprob_abs_diff_max", "rollout/kl_k3")
    return {k.split("/")[1]: float(f"{metrics[k]:.3g}") for k in keep}


def run_workload(name: str, repeats: int, torch, kinds: list[str]) -> dict:
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout

    work = WORKLOADS[name]
    model, tokenizer = _load(work["model"])
    batch = prompt_batch(tokenizer, work["prompts"])
    params = SamplingParams(
        n=work["n"], max_new_tokens=work["max_new_tokens"], temperature=1.0, stop_token_ids=[]
    )
    engines = {
        kind: NativeRollout(model, tokenizer, compile_decode=kind == "compiled") for kind in kinds
    }

    def precision_ctx(precision: str):
        if precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    methods = {
        f"{engine}_{prec}": (engines[engine], prec)
        for engine in engines
        for prec in ("fp32", "bf16")
    }
    first: dict[str, float] = {}
    outs = {}
    for method, (engine, prec) in methods.items():
        torch.manual_seed(0)
        start = time.perf_counter()
        with precision_ctx(prec):
            outs[method] = engine.generate(batch, params)
        first[method] = time.perf_counter() - start
    times: dict[str, list[float]] = {m: [] for m in methods}
    decode: dict[str, list[float]] = {m: [] for m in methods}
    names = list(methods)
    for rep in range(repeats):
        for method in names[rep % len(names) :] + names[: rep % len(names)]:
            engine, prec = methods[method]
            torch.manual_seed(rep + 1)
            start = time.perf_counter()
            with precision_ctx(prec):
                engine.generate(batch, params)
            times[method].append(time.perf_counter() - start)
            decode[method].append(engine.last_stats["decode_s"])
    results = {}
    for method in names:
        med = statistics.median(times[method])
        results[method] = {
            "median_s": round(med, 3),
            "decode_median_s": round(statistics.median(decode[method]), 3),
            "first_call_s": round(first[method], 2),
            "compile_s": round(first[method] - med, 2),
        }
    for prec in ("fp32", "bf16") if len(engines) == 2 else ():
        saved = results[f"eager_{prec}"]["median_s"] - results[f"compiled_{prec}"]["median_s"]
        comp = results[f"compiled_{prec}"]
        comp["payoff_steps"] = round(comp["compile_s"] / saved, 1) if saved > 0 else None
    gaps = {  # the eager engine's, and the compiled one's in fp32
        "fp32_rollout_vs_fp32_trainer": _gap(model, outs["eager_fp32"], "fp32", torch),
        "bf16_rollout_vs_bf16_trainer": _gap(model, outs["eager_bf16"], "bf16", torch),
        "bf16_rollout_vs_fp32_trainer": _gap(model, outs["eager_bf16"], "fp32", torch),
    }
    if "compiled" in engines:
        gaps["compiled_fp32_vs_fp32_trainer"] = _gap(model, outs["compiled_fp32"], "fp32", torch)
    mask = batch.batch["attention_mask"]
    return {
        "workload": name,
        **work,
        "params": model.num_parameters(),
        "prompt_len": int(mask.shape[1]),
        "prompt_pad_fraction": round(1 - float(mask.float().mean()), 3),
        "results": results,
        "logprob_gap": gaps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["W2"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--engines", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"]
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if "eager" not in args.engines:
        parser.error("--engines must include eager (the baseline and the gaps)")
    records = [run_workload(n, args.repeats, torch, args.engines) for n in args.workloads]
    summary = {
        "bench": "rollout_compile",
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "workloads": records,
    }
    print(json.dumps(summary))
    print()
    print(
        f"{'wl':3} {'method':14} {'median_s':>8} {'decode_s':>8} {'first_s':>8} "
        f"{'compile_s':>9} {'payoff':>7}"
    )
    for rec in records:
        for method, r in rec["results"].items():
            payoff = r.get("payoff_steps")
            print(
                f"{rec['workload']:3} {method:14} {r['median_s']:8.3f} "
                f"{r['decode_median_s']:8.3f} {r['first_call_s']:8.2f} {r['compile_s']:9.2f} "
                f"{'-' if payoff is None else payoff:>7}"
            )
        for pair, gap in rec["logprob_gap"].items():
            print(f"{rec['workload']:3} gap {pair:32} {json.dumps(gap)}")


if __name__ == "__main__":
    main()
