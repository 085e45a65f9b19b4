"""What this machine's devices can do, asked without importing torch at module import.

The config (``verl.config.precision``) asks these before any model loads: whether CUDA is
there, a GPU's compute capability and name, and whether the CPU computes bf16 natively.
"""

from __future__ import annotations

import functools


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_capability(device: str) -> tuple[int, int]:
    """``(major, minor)`` compute capability of ``device``; ``(0, 0)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(torch.device(device)))


def cuda_name(device: str) -> str:
    """The GPU's name (``device`` itself without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return device
    return torch.cuda.get_device_name(torch.device(device))


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def cpu_bf16_is_fast_and_correct() -> bool:
    """Native bf16 CPU instructions (``avx512_bf16`` or AMX), and a 64x64 bf16 matmul
    within 2% of fp32 (cached). Without them bf16 is emulated and slower than fp32."""
    if not ({"avx512_bf16", "amx_bf16"} & cpu_flags()):
        return False
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    got = (a.bfloat16() @ b.bfloat16()).float()
    return float((got - a @ b).norm() / (a @ b).norm()) < 2e-2
