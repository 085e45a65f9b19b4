"""Benchmark: chunked response log-probs vs the naive full-logits computation.

``naive``  : ``model(...)`` -> logits for every position (batch, seq, vocab), slice the
             response positions, ``log_softmax(logits.float() / T)`` and gather.
``chunked``: :func:`verl.kernels.torch_functional.compute_response_log_probs` (base model,
             LM head only on the response positions, ``chunk_size`` tokens at a time, head
             checkpointed under grad).

Modes: ``infer`` is a no-grad forward (old / reference log-probs); ``train`` is forward +
backward of ``sum(log_probs)`` (the actor update).

Memory: each (method, mode, precision) runs once in a fresh subprocess and reports its
peak RSS (``resource.getrusage``) above the RSS after the model and inputs were built. The
subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors go back to the OS
and the peak RSS tracks the peak of live tensor memory rather than allocator caching.

Time: one subprocess per (mode, precision) alternates naive and chunked runs (after a
warm-up of each) and reports the median of ``--repeats``, so load from other processes
hits both methods alike.

    python bench/bench_logprob.py                       # vocab 32k, batch 16, seq 256
    python bench/bench_logprob.py --batch 4 --repeats 1 # quicker
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from verl.kernels.torch_functional import DEFAULT_CHUNK_SIZE

METHODS = ("naive", "chunked")
SHAPE_ARGS = ("vocab", "hidden", "layers", "batch", "seq", "chunk_size", "repeats")


def _build(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[: args.batch // 2, : args.seq // 8] = 0  # half the prompts left-padded
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return model, input_ids, attention_mask, position_ids


def _make_runner(args, model, input_ids, attention_mask, position_ids):
    import torch

    from verl.kernels.torch_functional import compute_response_log_probs

    response_len, temperature = args.seq // 2, 0.9
    train = args.mode == "train"
    model.train(train)

    def naive():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits
        logits = logits[:, -response_len - 1 : -1].float() / temperature
        labels = input_ids[:, -response_len:]
        return torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)

    def chunked():
        log_probs, _ = compute_response_log_probs(
            model,
            input_ids,
            attention_mask,
            position_ids,
            response_len,
            temperature,
            args.chunk_size,
        )
        return log_probs

    fns = {"naive": naive, "chunked": chunked}

    def run(method: str):
        grad = torch.enable_grad() if train else torch.no_grad()
        amp = contextlib.nullcontext()
        if args.precision == "bf16":
            amp = torch.autocast("cpu", dtype=torch.bfloat16)
        with grad, amp:
            out = fns[method]()
        if train:
            out.sum().backward()
            model.zero_grad(set_to_none=True)
        return out.detach()

    return run


def _worker(args) -> dict:
    import torch

    run = _make_runner(args, *_build(args))
    result = {"mode": args.mode, "precision": args.precision}
    if args.measure == "mem":
        base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        torch.save(run(args.method), args.out)
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return result | {"method": args.method, "peak_mib": (peak_kib - base_kib) / 1024}
    times = {m: [] for m in METHODS}
    for method in METHODS:
        run(method)  # warm-up
    for _ in range(args.repeats):
        for method in METHODS:
            start = time.perf_counter()
            run(method)
            times[method].append(time.perf_counter() - start)
    return result | {
        "time_s": {m: statistics.median(t) for m, t in times.items()},
        "threads": torch.get_num_threads(),
    }


def _spawn(args, extra: list[str], env: dict[str, str] | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker"]
    cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in SHAPE_ARGS]
    proc = subprocess.run(
        cmd + extra, capture_output=True, text=True, check=True, env=env or os.environ.copy()
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_table(rows: list[dict]) -> None:
    print(
        f"{'precision':9} {'mode':5} {'method':8} {'time_s':>8} {'peak_MiB':>9} "
        f"{'time_x':>7} {'mem_x':>7} {'max|diff|':>10}"
    )
    for row in rows:
        for method in METHODS:
            t, m = row["time_s"][method], row["peak_mib"][method]
            time_x = t / row["time_s"]["naive"]
            mem_x = m / max(row["peak_mib"]["naive"], 1e-9)
            diff = f"{row['max_abs_diff']:10.2e}" if method == "chunked" else f"{'-':>10}"
            print(
                f"{row['precision']:9} {row['mode']:5} {method:8} {t:8.3f} {m:9.1f} "
                f"{time_x:7.2f} {mem_x:7.2f} {diff}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256, help="prompt + response; R = seq / 2")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument(
        "--precisions",
        default="fp32",
        help="comma list of fp32,bf16 (bf16 matmuls are emulated, slow, on CPUs without "
        "AVX-512 BF16)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", default="time", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="chunked", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="infer", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(_worker(args)))
        return

    import torch

    shape = {k: getattr(args, k) for k in SHAPE_ARGS}
    shape["response_len"] = args.seq // 2
    mem_env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions.split(","):
            for mode in args.modes.split(","):
                common = [f"--mode={mode}", f"--precision={precision}"]
                row = {"mode": mode, "precision": precision, "peak_mib": {}}
                outs = {}
                for method in METHODS:
                    outs[method] = os.path.join(tmp, f"{method}.pt")
                    extra = [
                        *common,
                        "--measure=mem",
                        f"--method={method}",
                        f"--out={outs[method]}",
                    ]
                    row["peak_mib"][method] = _spawn(args, extra, mem_env)["peak_mib"]
                diff = (torch.load(outs["naive"]) - torch.load(outs["chunked"])).abs().max()
                row["max_abs_diff"] = float(diff)
                timing = _spawn(args, [*common, "--measure=time"])
                row["time_s"], row["threads"] = timing["time_s"], timing["threads"]
                rows.append(row)

    print(json.dumps({"shape": shape, "results": rows}))
    print()
    _print_table(rows)


if __name__ == "__main__":
    main()
