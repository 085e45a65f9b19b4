"""Weight-only int4 storage for inference-only roles (reference policy, reward model).

The same design as :mod:`verl.models.fp8`, at about 60% of its size:
:func:`quantize_model_int4_` replaces every eligible ``nn.Linear`` (not the head,
embeddings or value/score heads) by an :class:`Int4Linear`. Each row of the weight is cut
into groups of ``group_size`` input features (default 32); a group stores its minimum and
a step ``(max - min) / 15`` (both fp16) and each value as the nearest of the 16 levels
``min + q * step``, ``q`` in 0..15, two per byte: the asymmetric block format GGUF calls
Q4_1. At compute the layer unpacks and dequantises the weight into the activations' dtype
and runs an ordinary matmul, so it runs on any device, CPU included, with no int4 kernels;
the saving is in storage: 0.625 byte per weight at ``group_size=32``, against 4 for fp32
and about 1 for fp8.

Accuracy is bounded in ``tests/models/test_int4.py``; the measured errors are in
``docs/precision.md``. Trainable roles never use this: int4 weights have no gradient path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from verl.models.fp8 import replace_linears_

__all__ = ["INT4_GROUP_SIZE", "Int4Linear", "is_int4_model", "quantize_model_int4_"]

INT4_GROUP_SIZE = 32
_LEVELS = 15  # q in 0..15


def _group_size(in_features: int, group_size: int) -> int:
    """``group_size`` when it divides ``in_features``, else the whole row (one group)."""
    return group_size if in_features % group_size == 0 else in_features


class Int4Linear(nn.Module):
    """A frozen linear layer whose weight is stored as packed int4 with per-group steps.

    ``packed``: ``(out_features, in_features // 2)`` uint8, two levels ``q`` per byte (low
    nibble first); ``step`` and ``low``: ``(out_features, in_features // group)`` fp16; the
    weight is ``low + q * step`` per group.
    """

    def __init__(
        self,
        packed: torch.Tensor,
        step: torch.Tensor,
        low: torch.Tensor,
        bias: torch.Tensor | None,
        in_features: int,
        orig_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if packed.dtype != torch.uint8 or packed.shape[1] * 2 != in_features:
            raise ValueError(
                f"packed must be uint8 of shape (out, in_features/2) = (*, {in_features // 2}),"
                f" got {packed.dtype} {tuple(packed.shape)}"
            )
        if (
            step.shape != low.shape
            or step.shape[0] != packed.shape[0]
            or in_features % step.shape[1]
        ):
            raise ValueError(
                f"step {tuple(step.shape)} and low {tuple(low.shape)} do not fit a "
                f"({packed.shape[0]}, {in_features}) weight"
            )
        self.out_features, self.in_features = packed.shape[0], in_features
        self.register_buffer("packed", packed)
        self.register_buffer("step", step)
        self.register_buffer("low", low)
        self.register_buffer("bias", bias)
        self.orig_dtype = orig_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = INT4_GROUP_SIZE) -> Int4Linear:
        """Quantize ``linear``'s weight per group of ``group_size`` inputs; bias kept as is."""
        out_f, in_f = linear.weight.shape
        if in_f % 2:
            raise ValueError(f"int4 packing needs an even in_features, got {in_f}")
        g = _group_size(in_f, group_size)
        w = linear.weight.detach().float().reshape(out_f, in_f // g, g)
        low = w.amin(dim=-1).half()
        step = ((w.amax(dim=-1) - low.float()) / _LEVELS).half()
        step = torch.where(step > 0, step, torch.ones_like(step))  # a constant group
        q = torch.round((w - low.float()[..., None]) / step.float()[..., None])
        nibbles = q.clamp(0, _LEVELS).to(torch.uint8).reshape(out_f, in_f)
        packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(packed, step, low, bias, in_f, orig_dtype=linear.weight.dtype)

    def levels(self) -> torch.Tensor:
        """The stored levels ``q`` (``(out, in)`` uint8, in 0..15)."""
        both = torch.stack([self.packed & 0x0F, self.packed >> 4], dim=-1)
        return both.reshape(self.out_features, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight as ``low + q * step`` in ``dtype`` (default: the original dtype)."""
        dtype = dtype or self.orig_dtype
        groups = self.step.shape[1]
        q = self.levels().reshape(self.out_features, groups, -1).to(dtype)
        w = self.low.to(dtype)[..., None] + q * self.step.to(dtype)[..., None]
        return w.reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        group = self.in_features // self.step.shape[1]
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 g{group}"


def quantize_model_int4_(module: nn.Module, group_size: int = INT4_GROUP_SIZE) -> nn.Module:
    """Replace the eligible ``nn.Linear`` layers of a frozen ``module`` by
    :class:`Int4Linear`, in place (see :func:`verl.models.fp8.replace_linears_`)."""
    if group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even number >= 2, got {group_size}")
    return replace_linears_(module, lambda lin: Int4Linear.from_linear(lin, group_size), "int4")


def is_int4_model(module: nn.Module) -> bool:
    """Whether ``module`` contains an :class:`Int4Linear`."""
    return any(isinstance(m, Int4Linear) for m in module.modules())
