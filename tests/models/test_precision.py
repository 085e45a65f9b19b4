"""Tests for verl/models/precision.py."""

import pytest
import torch
from torch import nn

from verl.models import build_tiny_model, enable_activation_checkpointing, resolve_dtype
from verl.models.precision import is_activation_checkpointing


@pytest.mark.parametrize(
    "name,expected",
    [
        ("fp32", torch.float32),
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("BFloat16", torch.bfloat16),
        ("torch.bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("float16", torch.float16),
        (torch.float16, torch.float16),
    ],
)
def test_resolve_dtype(name, expected):
    assert resolve_dtype(name) is expected


def test_resolve_dtype_errors():
    with pytest.raises(ValueError, match=r"unknown dtype 'fp8'; use one of fp32/float32, bf16"):
        resolve_dtype("fp8")
    with pytest.raises(ValueError, match=r"dtype=torch\.int64 is not a training precision"):
        resolve_dtype(torch.int64)
    with pytest.raises(TypeError, match=r"dtype must be a str or torch\.dtype, got int: 16"):
        resolve_dtype(16)


def _grads(model, ids):
    model.zero_grad()
    model(input_ids=ids, use_cache=False).logits.float().pow(2).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_same_grads():
    ids = torch.randint(3, 700, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = build_tiny_model(seed=2).train()
    ckpt = enable_activation_checkpointing(build_tiny_model(seed=2).train())
    assert is_activation_checkpointing(ckpt) and not is_activation_checkpointing(plain)
    g_plain, g_ckpt = _grads(plain, ids), _grads(ckpt, ids)
    assert g_plain.keys() == g_ckpt.keys()
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], rtol=1e-5, atol=1e-7)


def test_activation_checkpointing_rejects_plain_module():
    with pytest.raises(TypeError, match="Linear has no activation_checkpointing_enable"):
        enable_activation_checkpointing(nn.Linear(2, 2))


def test_resolve_dtype_is_the_one_table_and_passes_none_through():
    from verl.engine import resolve_dtype as engine_resolve_dtype

    assert engine_resolve_dtype is resolve_dtype
    assert resolve_dtype(None) is None
    assert resolve_dtype("bf16") is torch.bfloat16


def test_attention_implementation_falls_back_to_sdpa_on_cpu(caplog):
    import logging

    from verl.models import attention_implementation
    from verl.models import precision as precision_module

    precision_module._ATTENTION_LOGGED.clear()
    assert attention_implementation(False, "cpu") is None
    with caplog.at_level(logging.INFO, logger="verl.models.precision"):
        assert attention_implementation(True, "cpu") == "sdpa"
        assert attention_implementation(True, "cpu") == "sdpa"
    logged = [r for r in caplog.records if "attention runs as sdpa" in r.getMessage()]
    assert len(logged) == 1


def test_null_checkpointing_follows_the_activation_estimate(caplog):
    from verl.models.precision import (
        ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN,
        AUTO_CHECKPOINTING_MIN_BYTES,
        estimated_activation_bytes,
        resolve_activation_checkpointing,
    )

    model = build_tiny_model()  # 2 layers, hidden 64
    per_token = 2 * 64 * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN
    assert estimated_activation_bytes(model, 10) == 10 * per_token
    at_threshold = AUTO_CHECKPOINTING_MIN_BYTES // per_token
    key = "actor_rollout_ref.model.enable_gradient_checkpointing"
    with caplog.at_level("INFO", logger="verl.models.precision"):
        assert resolve_activation_checkpointing(None, model, at_threshold, key) is False
        assert resolve_activation_checkpointing(None, model, at_threshold + 1, key) is True
    assert f"{key}=null: off (a micro-batch of up to {at_threshold} tokens" in caplog.text
    assert f"{key}=null: on (a micro-batch of up to {at_threshold + 1} tokens" in caplog.text
    # a stated choice wins either way; a model without layer/hidden sizes stays off
    assert resolve_activation_checkpointing(True, model, 1, key) is True
    assert resolve_activation_checkpointing(False, model, 10**9, key) is False
    assert estimated_activation_bytes(nn.Linear(2, 2), 10) is None
    assert resolve_activation_checkpointing(None, nn.Linear(2, 2), 10**9, key) is False


def test_the_config_help_states_the_auto_checkpointing_threshold():
    from verl.config.schema_roles import CHECKPOINTING_HELP
    from verl.models.precision import AUTO_CHECKPOINTING_MIN_BYTES

    assert f"estimated above {AUTO_CHECKPOINTING_MIN_BYTES >> 20} MiB" in CHECKPOINTING_HELP
