"""bench/bench_fp32_gemm.py's pure logic on fake timings (FLOPs, paired ratios, the
update-weighted ratio, the LM head's chunk rows), and one tiny real measurement: every
oneDNN route computes the same three GEMMs as MKL within fp32 rounding."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_fp32_gemm.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fp32_gemm", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _row(shape, gemm, seconds, rows=100, tokens=100, threads=1):
    return {
        "shape": shape,
        "gemm": gemm,
        "rows": rows,
        "tokens": tokens,
        "threads": threads,
        "seconds": seconds,
        "cpu_seconds": seconds,
    }


def test_flops_routes_and_paired_ratio(bench):
    assert bench.flops(10, 20, 30) == 2 * 10 * 20 * 30
    assert bench.routes_for("fwd") == bench.ROUTES
    assert "packed" not in bench.routes_for("gin") and "packed" not in bench.routes_for("gw")
    # pairs, not medians of each side: 2/1, 4/4, 9/3 -> median 2.0
    assert bench.paired_ratio([2.0, 4.0, 9.0], [1.0, 4.0, 3.0]) == 2.0
    assert bench.gemm_tokens("lm_head", 2048, 128) == 128
    assert bench.gemm_tokens("lm_head", 64, 128) == 64
    assert bench.gemm_tokens("down", 2048, 128) == 2048


def test_update_ratio_weights_by_count_and_rows(bench):
    counts = {name: count for name, _, _, count in bench.SHAPES}
    # down runs 30x per update on 100 rows; the LM head once on 50 rows (twice the per-token cost)
    rows = [
        _row("down", "fwd", {"mkl": 1.0, "onednn": 0.5, "packed": 2.0}),
        _row("lm_head", "fwd", {"mkl": 1.0, "onednn": 2.0, "packed": 0.25}, rows=50),
        _row("lm_head", "gw", {"mkl": 1.0, "onednn": 1.0}, rows=50),
    ]
    down, head = counts["down"] / 100, counts["lm_head"] / 50
    mkl = down + 2 * head
    assert bench.update_ratio(rows, "mkl") == pytest.approx(1.0)
    assert bench.update_ratio(rows, "onednn") == pytest.approx(mkl / (0.5 * down + 3 * head))
    # packed has no gw: MKL's time stands there
    assert bench.update_ratio(rows, "packed") == pytest.approx(mkl / (2 * down + 1.25 * head))
    best = mkl / (0.5 * down + 1.25 * head)
    assert bench.update_ratio(rows, "best") == pytest.approx(best)
    only = mkl / (down + 1.25 * head)
    assert bench.update_ratio(rows, "packed", only=bench.HEAD_FWD) == pytest.approx(only)
    summary = bench.summarize(rows)
    assert list(summary) == ["tokens=100 threads=1"]
    assert summary["tokens=100 threads=1"]["packed head fwd only"] == pytest.approx(only, abs=1e-3)


def test_tiny_measurement_routes_agree_with_fp64(bench):
    rows = bench.measure(tokens=16, threads=1, repeats=1, shapes=(("t", 32, 24, 1),))
    assert [r["gemm"] for r in rows] == list(bench.GEMMS)
    for r in rows:
        assert set(r["rel_err_vs_fp64"]) == set(bench.routes_for(r["gemm"]))
        # fp32 products summed over 32 or 24 terms, relative to the largest output
        assert max(r["rel_err_vs_fp64"].values()) < 1e-5, r
        assert set(r["ratio_vs_mkl"]) == set(r["seconds"]) == set(bench.routes_for(r["gemm"]))
