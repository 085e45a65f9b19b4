"""bf16 linear layers over weights packed once for oneDNN, for a CPU decode under autocast.

Under CPU autocast to bf16 a ``Linear`` with float32 master weights computes
``linear(x.bf16(), w.bf16())``: autocast casts the weight once per autocast region (its cast
cache) and each call hands the bf16 weight to oneDNN, which takes it in the plain
``(out, in)`` layout. A decode step multiplies a few rows by every weight of the model, so
it is a pass over the weights: on the 2-core EPYC host that pass ran at about 4 GB/s with
the plain layout (SmolLM2's 211 weights, 1 row: 51 ms) and about 6 GB/s with the same
weights reordered once into oneDNN's blocked layout (34 ms), fp32 weights 57 ms.

:func:`packed_linears` does that reorder once per ``generate`` call
(``torch.ops.mkldnn._reorder_linear_weight``, one read of the fp32 weights and one write of
their bf16 copy: what autocast's cast cache costs) and, until it exits, every
``torch.nn.Linear`` of the module computes ``torch.ops.mkldnn._linear_pointwise`` on the
packed weight with its input in bf16. Nothing is kept between calls: every call packs the
weights as they are then. A version counter cannot tell whether a weight changed since an
earlier call (the fused AdamW kernel updates parameters in place without bumping it, nor
does a write through ``.data``), so a copy kept across calls could silently serve old
weights. The products are oneDNN's bf16 matmul with fp32
accumulation either way, so the outputs equal autocast's (bit for bit on SmolLM2's shapes,
``tests/kernels/test_packed_linear.py``).

Only exact ``torch.nn.Linear`` modules are swapped (a LoRA wrapper keeps its own forward
and calls its base layer, which is swapped). The packed weights are a snapshot: a weight
changed in place while the context is open is not seen, so the native rollout does not pack
when weights may arrive mid-call (:mod:`verl.rollout.partial`). The swap sets an instance
attribute ``forward`` on each layer and removes it on exit; no other code may run the
module meanwhile (the rollout engine owns it for the call).

:func:`pack` and :func:`packed_linear` also take fp32 (:func:`fp32_available`: outside
autocast): oneDNN's fp32 matmul over a weight reordered once, which the fp32 lean forward
(:mod:`verl.rollout.lean_forward`) uses for calls of many decode rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["available", "fp32_available", "pack", "packed_linear", "packed_linears"]


def available(device: torch.device) -> bool:
    """Whether :func:`packed_linears` applies: a CPU module under autocast to bf16, with
    oneDNN's bf16 kernels (an AVX-512 bf16 / AMX CPU) and its packing ops in this torch."""
    if device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return False
    if torch.get_autocast_dtype("cpu") != torch.bfloat16:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    return bool(ops._is_mkldnn_bf16_supported())


def fp32_available(device: torch.device) -> bool:
    """Whether :func:`pack` / :func:`packed_linear` take fp32 weights here: a CPU module
    outside autocast, with oneDNN and its packing ops in this torch (its fp32 kernels need
    no particular CPU)."""
    if device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def _packed_forward(layer: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None):
    linear = torch.ops.mkldnn._linear_pointwise
    plain = torch.nn.Linear.forward.__get__(layer)

    def forward(x: torch.Tensor) -> torch.Tensor:
        # A block that turns autocast off (a layer kept in fp32) gets the plain layer.
        if not torch.is_autocast_enabled("cpu"):
            return plain(x)
        # The input's leading dims are kept; the op takes (..., in) bf16.
        return linear(x.to(torch.bfloat16), weight, bias, "none", [], "")

    return forward


def pack(
    weights: list[torch.Tensor], batch_hint: int = 1, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """One oneDNN-packed weight in ``dtype`` (bf16, or fp32 for an fp32 forward) for the
    ``(out_i, in)`` weights stacked along their output dim (a fused projection: q/k/v,
    gate/up), made from their current values: each is converted into its rows of one
    buffer, which is reordered once (a copy: later writes to the weights are not seen).
    Conditions as for :func:`packed_linears` (bf16) or :func:`fp32_available`."""
    if len(weights) == 1:
        return torch.ops.mkldnn._reorder_linear_weight(
            weights[0].detach().to(dtype), max(1, batch_hint)
        )
    rows = sum(w.shape[0] for w in weights)
    buffer = torch.empty(rows, weights[0].shape[1], dtype=dtype)
    start = 0
    for w in weights:
        buffer[start : start + w.shape[0]].copy_(w.detach())
        start += w.shape[0]
    return torch.ops.mkldnn._reorder_linear_weight(buffer, max(1, batch_hint))


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x (..., in) @ weight.T + bias`` over a weight from :func:`pack`, in its dtype
    (``x`` converted to it, ``bias`` in it or None). bf16: a bf16 output with fp32
    accumulation (what autocast computes); fp32: oneDNN's fp32 matmul, which may differ from
    ``torch.nn.functional.linear``'s (MKL) in the last bits."""
    return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, bias, "none", [], "")


@contextlib.contextmanager
def packed_linears(module: torch.nn.Module, batch_hint: int = 1) -> Iterator[int]:
    """Within the context every ``torch.nn.Linear`` of ``module`` (float32 or bf16 weights
    in a plain CPU tensor) computes in bf16 on a oneDNN-packed copy of its weight, made on
    entry from the weight as it is then; yields how many layers were swapped.
    ``batch_hint``: the rows the layers will mostly see (oneDNN picks the blocked layout for
    it; any row count works). Call under ``torch.no_grad`` (the packed op has no backward)
    and only where :func:`available` is True."""
    reorder = torch.ops.mkldnn._reorder_linear_weight
    swapped: list[torch.nn.Module] = []
    packed: dict[int, torch.Tensor] = {}  # tied weights: packed once
    hint = max(1, batch_hint)
    try:
        for layer in module.modules():
            if type(layer) is not torch.nn.Linear or "forward" in layer.__dict__:
                continue
            weight = layer.weight.detach()
            # plain CPU tensors only: a DTensor shard (tensor parallelism) keeps its forward
            if type(weight) is not torch.Tensor or weight.device.type != "cpu":
                continue
            if weight.dtype not in (torch.float32, torch.bfloat16):
                continue
            key = id(layer.weight)
            if key not in packed:
                packed[key] = reorder(weight.to(torch.bfloat16), hint)
            bias = layer.bias
            bias = None if bias is None else bias.detach().to(torch.bfloat16)
            layer.forward = _packed_forward(layer, packed[key], bias)
            swapped.append(layer)
        yield len(swapped)
    finally:
        for layer in swapped:
            del layer.forward
