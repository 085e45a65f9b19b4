"""One line that says how fast this machine is, printed before the main job trains.

Machines of the same kind differ about 2x in speed (a CPU host's bf16 matmul runs at
350-850 GFLOP/s), so a run's wall time means something only next to the machine's own
rates. :func:`calibrate` measures, in about a second on the current device and threads:

- ``fp32_gflops`` / ``bf16_gflops``: a square matmul (``size`` x ``size``), the best of a
  few repeats after a warm-up, as 2 * size^3 flops per product;
- ``mem_gbs``: a copy of a 256 MiB tensor, read + write bytes per second (the bound a
  decode step that reads every weight once cannot beat);
- ``bf16_native``: whether the CPU has bf16 matmul instructions (``avx512_bf16`` or AMX;
  always true on CUDA). Without them bf16 is emulated at about 1% of the fp32 rate, so it is
  timed on a matrix an eighth the size (a full-size one would take seconds) and the line says
  that precision ``auto`` trains in fp32 there.

``python -m verl.utils.calibrate`` prints the line; ``--json`` the numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from verl.utils.device_probe import cpu_bf16_is_fast_and_correct

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
    native = device.type != "cpu" or cpu_bf16_is_fast_and_correct()
    out["bf16_native"] = native
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        n = size if native or dtype == torch.float32 else max(size // 8, 16)
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        seconds = _best_seconds(lambda a=a, b=b: a @ b, repeats, sync)
        out[f"{name}_gflops"] = 2.0 * n**3 / seconds / 1e9
    src = torch.empty(64 << 20, dtype=torch.float32, device=device).fill_(1.0)  # 256 MiB
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), max(2, repeats // 2), sync)
    out["mem_gbs"] = 2 * src.numel() * src.element_size() / seconds / 1e9
    return out


def calibration_line(rates: dict[str, float | str]) -> str:
    """``machine: cpu, 2 threads, bf16 812 GFLOP/s, fp32 176 GFLOP/s, copy 11.2 GB/s``, with
    ``(bf16 emulated: auto runs fp32)`` appended on a CPU without bf16 instructions."""
    line = (
        f"machine: {rates['device']}, {rates['threads']} threads, bf16 "
        f"{rates['bf16_gflops']:.0f} GFLOP/s, fp32 {rates['fp32_gflops']:.0f} GFLOP/s, "
        f"copy {rates['mem_gbs']:.1f} GB/s"
    )
    if rates.get("bf16_native") is False:
        line += " (bf16 emulated: auto runs fp32)"
    return line


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
