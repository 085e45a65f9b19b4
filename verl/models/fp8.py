"""Weight-only fp8 storage for inference-only roles (reference policy, reward model).

:func:`quantize_model_fp8_` replaces every ``nn.Linear`` of the transformer blocks by a
:class:`Fp8Linear`: the weight is stored as ``torch.float8_e4m3fn`` (1 byte per element)
with one fp32 scale per output channel, ``scale = max|w_row| / 448`` (448 is the largest
e4m3 value, so every row uses the full fp8 range). At compute the layer dequantises the
weight into the activations' dtype, one layer at a time, and runs an ordinary matmul: the
saving is in storage, not in arithmetic, so it works on any device, CPU included, and needs
no fp8 matmul kernels.

What is not quantized, and why:

- ``lm_head`` and the embeddings: log-probs are read straight off the head's logits, where
  fp8 rounding (3 mantissa bits) would show most; with tied embeddings (SmolLM2, Qwen2
  small models) the head *is* the embedding matrix, so quantizing it alone would save
  nothing anyway;
- norms and biases: tiny.

Accuracy (measured in ``tests/models/test_fp8.py`` on a tiny random Qwen2): per-token
log-probs of the fp8 model differ from the fp32 model's by about as much as bf16 storage
would times ~10 (e4m3 has 3 mantissa bits, bf16 has 7); the test bounds both against fp32.
Trainable roles never use this: fp8 weights have no gradient path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

logger = logging.getLogger(__name__)

__all__ = ["FP8_DTYPE", "Fp8Linear", "is_fp8_model", "quantize_model_fp8_", "replace_linears_"]

FP8_DTYPE = torch.float8_e4m3fn
_FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
_SKIP = ("lm_head", "embed", "score", "v_head", "wte", "wpe")


class Fp8Linear(nn.Module):
    """A frozen linear layer whose weight is stored in fp8 with per-output-channel scales.

    Built from an ``nn.Linear`` with :meth:`from_linear`; ``forward`` computes
    ``x @ (q * scale).T + bias`` in ``x``'s dtype.
    """

    def __init__(
        self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        if qweight.dtype != FP8_DTYPE:
            raise ValueError(f"qweight must be {FP8_DTYPE}, got {qweight.dtype}")
        if scale.shape != (qweight.shape[0],):
            raise ValueError(
                f"scale shape {tuple(scale.shape)} must be (out_features,) = ({qweight.shape[0]},)"
            )
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.orig_dtype = scale.dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """Quantize ``linear``'s weight (per output row); the bias keeps its dtype."""
        w = linear.weight.detach().float()
        amax = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
        scale = amax / _FP8_MAX
        qweight = (w / scale[:, None]).clamp(-_FP8_MAX, _FP8_MAX).to(FP8_DTYPE)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        layer = cls(qweight, scale, bias)
        layer.orig_dtype = linear.weight.dtype
        return layer

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight as ``q * scale`` in ``dtype`` (default: the original weight dtype)."""
        dtype = dtype or self.orig_dtype
        return self.qweight.to(dtype) * self.scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3"


def _should_quantize(name: str, module: nn.Module) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return isinstance(module, nn.Linear) and not any(s in leaf for s in _SKIP)


def replace_linears_(
    module: nn.Module, make: Callable[[nn.Linear], nn.Module], label: str
) -> nn.Module:
    """Replace the eligible ``nn.Linear`` layers of a frozen ``module`` by ``make(linear)``.

    Eligible: every linear layer except the head, embeddings and value/score heads. A
    parameter with ``requires_grad=True`` in a layer to replace raises ``ValueError``, because
    its gradient would silently vanish. Logs the bytes of weights saved (``label`` names the
    format); returns ``module``.
    """
    targets = [(n, m) for n, m in module.named_modules() if _should_quantize(n, m)]
    trainable = [n for n, m in targets if m.weight.requires_grad]
    if trainable:
        raise ValueError(
            f"{label} weight-only storage is for frozen inference models, but "
            f"{len(trainable)} linear layer(s) still require grad (e.g. {trainable[0]!r}); "
            "call module.requires_grad_(False) first"
        )
    before = after = 0
    for name, linear in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        layer = make(linear)
        before += linear.weight.numel() * linear.weight.element_size()
        after += sum(b.numel() * b.element_size() for n, b in layer.named_buffers() if n != "bias")
        setattr(parent, leaf, layer)
    logger.info(
        "%s weight-only: %d linear layers, %.1f MiB -> %.1f MiB",
        label,
        len(targets),
        before / 2**20,
        after / 2**20,
    )
    return module


def quantize_model_fp8_(module: nn.Module) -> nn.Module:
    """Replace the eligible ``nn.Linear`` layers of ``module`` by :class:`Fp8Linear`, in place
    (see :func:`replace_linears_`)."""
    return replace_linears_(module, Fp8Linear.from_linear, "fp8")


def is_fp8_model(module: nn.Module) -> bool:
    """Whether ``module`` contains an :class:`Fp8Linear`."""
    return any(isinstance(m, Fp8Linear) for m in module.modules())
