"""Benchmark: the fp32 GEMMs of a training update through MKL (plain torch) vs oneDNN.

On a CPU without native bf16, precision ``auto`` trains in fp32 and the update is bound by the
fp32 matmul rate. torch's CPU wheel sends fp32 ``F.linear`` / ``mm`` to MKL's sgemm; the wheel
also carries oneDNN, reachable for dense fp32 tensors through these routes:

``mkl``      : ``F.linear(x, W)``, ``dy @ W``, ``dy.T @ x`` (what autograd runs today).
``onednn``   : ``torch.ops.mkldnn._linear_pointwise`` on dense tensors: ``lp(x, W)``,
               ``lp(dy, W.T)`` (the transposed weight made once per step, not timed) and
               ``lp(dy.T, x.T)`` (strided views).
``packed``   : forward only, ``lp(x, P)`` with ``P = _reorder_linear_weight(W)`` (oneDNN's
               blocked weight layout, made once per step, not timed).
``layout``   : oneDNN's own tensor layout (``to_mkldnn``): ``mkldnn_linear``,
               ``mkldnn_linear_backward_input`` / ``_weights``, counting the conversions of
               the activations to and from the layout (the weight's once per step, not timed).

Every GEMM of SmolLM2-135M's linears is timed at training token counts (the LM head on its
``--head-tokens`` chunks, as the chunked log-probs run it): the forward (``fwd``), the
gradient of the input (``gin``) and of the weight (``gw``). Routes alternate in one process,
rotating the order each repeat, so load from other processes hits them alike; a ratio is the
median over repeats of the paired ``t_mkl / t_route`` (> 1: the route is faster), printed as
``wall/cpu`` (wall clock / the process's CPU time, the steadier of the two on a loaded
machine). ``err`` is each route's max abs difference from an fp64 reference over the
reference's max abs value. The summary weighs each shape by how often an update runs it (30
layers of 7 linears, one LM head) and gives the update's GEMM time through MKL over that
through each route, through the fastest route per GEMM (``best``: an upper bound, the minimum
of noisy medians) and through ``packed`` on the LM head's forward alone.

    nice -n 10 python bench/bench_fp32_gemm.py                 # tokens 512 2048, threads 1 2
    nice -n 10 python bench/bench_fp32_gemm.py --quick         # tokens 512, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# SmolLM2-135M: hidden 576, MLP 1536, 9 query heads / 3 KV heads of 64, vocab 49152 (LM head
# tied to the embedding), 30 layers. (name, in_features, out_features, count per update).
LAYERS = 30
SHAPES = (
    ("q/o", 576, 576, 2 * LAYERS),
    ("k/v", 576, 192, 2 * LAYERS),
    ("gate/up", 576, 1536, 2 * LAYERS),
    ("down", 1536, 576, LAYERS),
    ("lm_head", 576, 49152, 1),
)
GEMMS = ("fwd", "gin", "gw")
ROUTES = ("mkl", "onednn", "packed", "layout")


def flops(tokens: int, k: int, n: int) -> int:
    """Multiply-adds times two of one (tokens x k) @ (k x n) GEMM; the same for all three."""
    return 2 * tokens * k * n


def routes_for(gemm: str) -> tuple[str, ...]:
    """The packed weight layout only serves the forward (the backward uses W.T)."""
    return ROUTES if gemm == "fwd" else tuple(r for r in ROUTES if r != "packed")


def paired_ratio(base: list[float], other: list[float]) -> float:
    """Median of ``base[i] / other[i]``: > 1 when ``other`` is faster."""
    return statistics.median(b / max(o, 1e-9) for b, o in zip(base, other, strict=True))


def update_ratio(rows: list[dict], route: str, key: str = "seconds", only=None) -> float:
    """The update's GEMM time through MKL over its time with ``route`` on the ``(shape,
    gemm)`` pairs in ``only`` (all where None; MKL elsewhere and where ``route`` lacks the
    GEMM). ``route="best"`` takes each GEMM's fastest route. Each row counts per token
    (seconds / rows) times its shape's count per update; ``key`` picks ``seconds`` (wall)
    or ``cpu_seconds``."""
    counts = {name: count for name, _, _, count in SHAPES}
    mkl = other = 0.0
    for r in rows:
        t = r[key]
        chosen = t["mkl"]
        if only is None or (r["shape"], r["gemm"]) in only:
            chosen = min(t.values()) if route == "best" else t.get(route, t["mkl"])
        mkl += counts[r["shape"]] * t["mkl"] / r["rows"]
        other += counts[r["shape"]] * chosen / r["rows"]
    return mkl / other


def _make_ops(torch, x, w, dy):
    """One zero-argument callable per (gemm, route); step-constant weight forms made here."""
    import torch.nn.functional as F

    lp = torch.ops.mkldnn._linear_pointwise
    t = x.shape[0]
    w_t = w.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, t)
    w_m = w.to_mkldnn()
    aten = torch.ops.aten

    def layout_gw():
        g, _ = aten.mkldnn_linear_backward_weights(dy.to_mkldnn(), x.to_mkldnn(), w, False)
        return g.to_dense()

    return {
        ("fwd", "mkl"): lambda: F.linear(x, w),
        ("fwd", "onednn"): lambda: lp(x, w, None, "none", [], ""),
        ("fwd", "packed"): lambda: lp(x, packed, None, "none", [], ""),
        ("fwd", "layout"): lambda: aten.mkldnn_linear(x.to_mkldnn(), w_m).to_dense(),
        ("gin", "mkl"): lambda: dy @ w,
        ("gin", "onednn"): lambda: lp(dy, w_t, None, "none", [], ""),
        ("gin", "layout"): lambda: aten.mkldnn_linear_backward_input(
            list(x.shape), dy.to_mkldnn(), w
        ).to_dense(),
        ("gw", "mkl"): lambda: dy.t() @ x,
        ("gw", "onednn"): lambda: lp(dy.t(), x.t(), None, "none", [], ""),
        ("gw", "layout"): layout_gw,
    }


def _reference(torch, gemm, x, w, dy):
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    return {"fwd": x64 @ w64.t(), "gin": dy64 @ w64, "gw": dy64.t() @ x64}[gemm]


def gemm_tokens(name: str, tokens: int, head_tokens: int) -> int:
    """Rows of the GEMM: the LM head runs on chunks of ``head_tokens`` response tokens."""
    return min(tokens, head_tokens) if name == "lm_head" else tokens


def measure(tokens: int, threads: int, repeats: int, shapes=SHAPES, head_tokens=128) -> list[dict]:
    import torch

    torch.set_num_threads(threads)
    rows = []
    for name, k, n, _ in shapes:
        gen = torch.Generator().manual_seed(0)
        m = gemm_tokens(name, tokens, head_tokens)
        x = torch.randn(m, k, generator=gen)
        w = torch.randn(n, k, generator=gen) * k**-0.5
        dy = torch.randn(m, n, generator=gen) * n**-0.5
        ops = _make_ops(torch, x, w, dy)
        for gemm in GEMMS:
            routes = routes_for(gemm)
            ref = _reference(torch, gemm, x, w, dy)
            scale = ref.abs().max().item()
            err = {r: (ops[gemm, r]().double() - ref).abs().max().item() / scale for r in routes}
            del ref
            for r in routes:  # warm-up (oneDNN primitive creation, page faults)
                ops[gemm, r]()
            times: dict[str, list[float]] = {r: [] for r in routes}
            cpu: dict[str, list[float]] = {r: [] for r in routes}
            for i in range(repeats):
                order = routes[i % len(routes) :] + routes[: i % len(routes)]
                for r in order:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    ops[gemm, r]()
                    cpu[r].append(time.process_time() - start_cpu)
                    times[r].append(time.perf_counter() - start)
            fl = flops(m, k, n)
            rows.append(
                {
                    "shape": name,
                    "in": k,
                    "out": n,
                    "tokens": tokens,
                    "rows": m,
                    "threads": threads,
                    "gemm": gemm,
                    "seconds": {r: statistics.median(v) for r, v in times.items()},
                    "gflops": {r: fl / statistics.median(v) / 1e9 for r, v in times.items()},
                    "cpu_gflops": {
                        r: fl / max(statistics.median(v), 1e-9) / 1e9 for r, v in cpu.items()
                    },
                    "ratio_vs_mkl": {r: paired_ratio(times["mkl"], v) for r, v in times.items()},
                    "cpu_seconds": {r: statistics.median(v) for r, v in cpu.items()},
                    "cpu_ratio_vs_mkl": {r: paired_ratio(cpu["mkl"], v) for r, v in cpu.items()},
                    "rel_err_vs_fp64": err,
                }
            )
    return rows


HEAD_FWD = {("lm_head", "fwd")}


def summarize(rows: list[dict], key: str = "seconds") -> dict[str, dict[str, float]]:
    """Per (tokens, threads): :func:`update_ratio` of each route over all GEMMs, of the best
    route per GEMM, and of the packed route on the LM head's forward alone."""
    out: dict[str, dict[str, float]] = {}
    for tokens, threads in sorted({(r["tokens"], r["threads"]) for r in rows}):
        sel = [r for r in rows if (r["tokens"], r["threads"]) == (tokens, threads)]
        ratios = {route: update_ratio(sel, route, key) for route in (*ROUTES[1:], "best")}
        ratios["packed head fwd only"] = update_ratio(sel, "packed", key, HEAD_FWD)
        out[f"tokens={tokens} threads={threads}"] = {k: round(v, 3) for k, v in ratios.items()}
    return out


def table(rows: list[dict]) -> str:
    """Ratios as ``wall/cpu`` (MKL time over the route's; > 1: the route is faster)."""
    head = ["shape", "rows", "thr", "gemm", "mkl GFLOP/s wall/cpu"]
    head += [f"{r} x" for r in ROUTES[1:]] + [f"err {r}" for r in ROUTES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], str(r["rows"]), str(r["threads"]), r["gemm"]]
        cells.append(f"{r['gflops']['mkl']:.0f}/{r['cpu_gflops']['mkl']:.0f}")
        for x in ROUTES[1:]:
            if x in r["ratio_vs_mkl"]:
                cells.append(f"{r['ratio_vs_mkl'][x]:.2f}/{r['cpu_ratio_vs_mkl'][x]:.2f}")
            else:
                cells.append("-")
        err = r["rel_err_vs_fp64"]
        cells += [f"{err[x]:.1e}" if x in err else "-" for x in ROUTES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES])
    p.add_argument("--head-tokens", type=int, default=128, help="LM head chunk (tokens)")
    p.add_argument("--quick", action="store_true", help="tokens 512, 3 repeats")
    p.add_argument("--json", help="write the rows and summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = [512], 3
    shapes = tuple(s for s in SHAPES if s[0] in args.shapes)

    import torch
    from _common import cpu_model

    print(
        f"{cpu_model()}, torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()}"
    )
    rows = []
    for threads in args.threads:
        for tokens in args.tokens:
            rows += measure(tokens, threads, args.repeats, shapes, args.head_tokens)
            print(table(rows[-len(shapes) * len(GEMMS) :]), flush=True)
    summary = {"wall": summarize(rows), "cpu": summarize(rows, "cpu_seconds")}
    print("\nupdate GEMM time, MKL / route (> 1: route faster; model-weighted), wall / cpu:")
    for key, ratios in summary["wall"].items():
        cpu = summary["cpu"][key]
        print(f"  {key}: " + ", ".join(f"{r} {v:.2f}/{cpu[r]:.2f}x" for r, v in ratios.items()))
    print(f"load after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
