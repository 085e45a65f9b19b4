"""One line that says how fast this machine is, printed before the main job trains.

Machines of the same kind differ about 2x in speed (a CPU host's bf16 matmul runs at
350-850 GFLOP/s), so a run's wall time means something only next to the machine's own
rates. :func:`calibrate` measures, in about a second on the current device and threads:

- ``fp32_gflops`` / ``bf16_gflops``: a square matmul (``size`` x ``size``), the best of a
  few repeats after a warm-up, as 2 * size^3 flops per product;
- ``mem_gbs``: a copy of a 256 MiB tensor, read + write bytes per second (the bound a
  decode step that reads every weight once cannot beat).

``python -m verl.utils.calibrate`` prints the line; ``--json`` the numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

__all__ = ["calibrate", "calibration_line"]


def _best_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up: allocation, kernel selection
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def calibrate(
    device: str | torch.device = "cpu", size: int = 1024, repeats: int = 5
) -> dict[str, float | str]:
    """The device's fp32 and bf16 matmul rates (GFLOP/s) and copy bandwidth (GB/s), with
    the thread count they were measured with."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[str, float | str] = {"device": str(device), "threads": torch.get_num_threads()}
    flops = 2.0 * size**3
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        out[f"{name}_gflops"] = flops / _best_seconds(lambda a=a, b=b: a @ b, repeats, sync) / 1e9
    src = torch.empty(64 << 20, dtype=torch.float32, device=device).fill_(1.0)  # 256 MiB
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), max(2, repeats // 2), sync)
    out["mem_gbs"] = 2 * src.numel() * src.element_size() / seconds / 1e9
    return out


def calibration_line(rates: dict[str, float | str]) -> str:
    """``machine: cpu, 2 threads, bf16 812 GFLOP/s, fp32 176 GFLOP/s, copy 11.2 GB/s``."""
    return (
        f"machine: {rates['device']}, {rates['threads']} threads, bf16 "
        f"{rates['bf16_gflops']:.0f} GFLOP/s, fp32 {rates['fp32_gflops']:.0f} GFLOP/s, "
        f"copy {rates['mem_gbs']:.1f} GB/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    rates = calibrate(args.device)
    print(json.dumps(rates) if args.json else calibration_line(rates), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
