"""Test helpers for partial rollouts' per-token policy versions: a tiny model whose outputs
vary, later weight versions made from it, and the log-probs a trajectory's tokens have under
the version that sampled each of them (a no-cache recomputation)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
from verl.protocol import DataProto


def tiny_tokenizer(pytestconfig: Any) -> Any:
    """The tiny tokenizer, left padding; pytest's cache dir keeps the trained tokenizer across
    runs (absent with ``-p no:cacheprovider``)."""
    cache = getattr(pytestconfig, "cache", None)
    tok = build_tiny_tokenizer(cache_dir=cache.mkdir("tiny_tokenizer") if cache else None)
    tok.padding_side = "left"
    return tok


def varied(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with larger random weights (seeded, norms kept), in eval mode: transformers'
    default init (std 0.02) gives near-uniform logits and greedy outputs that repeat one
    token; these give varied, peaked distributions, a sharper test."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
    return model.eval()


def varied_tiny_model(tokenizer: Any) -> torch.nn.Module:
    """A tiny Qwen2 (hidden 64, 2 layers) with :func:`varied` weights."""
    return varied(build_tiny_model(tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=0))


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """A later weight version: ``model``'s state dict plus seeded noise (std 0.2) on every
    floating-point tensor."""
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def recomputed(module: torch.nn.Module, out: DataProto) -> torch.Tensor:
    """(rows, R) float32 log-probs of each response token (inserted tokens included) by a
    no-cache forward of the output's prompt + response with ``module``."""
    b = out.batch
    with torch.no_grad():
        (log_probs, *_) = compute_response_log_probs(
            module,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            response_len=b["responses"].shape[1],
        )
    return log_probs.float()


def by_version(
    model: torch.nn.Module, weights: dict[int, dict[str, torch.Tensor]], out: DataProto
) -> dict[int, torch.Tensor]:
    """``{version: recomputed(out)}`` for version 0 (``model``) and each of ``weights``
    (``{version: state dict}``, loaded into copies of ``model``)."""
    modules = {0: model}
    for version, state in weights.items():
        modules[version] = copy.deepcopy(model)
        modules[version].load_state_dict(state)
    return {version: recomputed(module, out) for version, module in modules.items()}


def behaviour(log_probs: dict[int, torch.Tensor], versions: torch.Tensor) -> torch.Tensor:
    """(rows, R): each token's log-prob under the version recorded for it (``versions``,
    (rows, R), from ``log_probs`` of :func:`by_version`); 0 where the version is -1."""
    out = torch.zeros_like(next(iter(log_probs.values())))
    for version, lps in log_probs.items():
        out = torch.where(versions == version, lps, out)
    return out
