"""vLLM's CPU attention kernels lack some head sizes: such a model is refused before the
engine starts, naming the model, its head size, the supported sizes and rollout.name=native
(vLLM itself failed at the first generation with a 150-line traceback)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl.rollout.vllm_rollout import CPU_HEAD_SIZES, check_head_size, model_head_size

ROOT = Path(__file__).resolve().parents[2]


def test_check_head_size():
    tiny = SimpleNamespace(_name_or_path="/m/tiny", hidden_size=64, num_attention_heads=4)
    assert model_head_size(tiny) == 16
    with pytest.raises(ValueError) as err:
        check_head_size(tiny, CPU_HEAD_SIZES)
    assert str(err.value) == (
        "rollout.name=vllm: the model '/m/tiny' has attention head size 16, and vLLM's CPU "
        "attention kernels support only 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512; "
        "use actor_rollout_ref.rollout.name=native (or hf) for this model"
    )
    smollm2 = SimpleNamespace(hidden_size=576, num_attention_heads=9)  # head size 64
    check_head_size(smollm2, CPU_HEAD_SIZES)
    explicit = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=128)
    assert model_head_size(explicit) == 128
    check_head_size(explicit, CPU_HEAD_SIZES)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_refuses_the_tiny_model_before_its_engine_starts(tmp_path):
    """In a child process (importing vLLM seeds and binds the process): the list read from
    the installed vLLM is CPU_HEAD_SIZES, and the tiny model (head size 16) is refused by
    VLLMRollout's constructor, no engine started."""
    code = """
import sys
from vllm.platforms import current_platform
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
from verl.rollout import vllm_rollout
sizes = vllm_rollout._cpu_head_sizes()
assert sizes == vllm_rollout.CPU_HEAD_SIZES or not current_platform.is_cpu(), sizes
started = []
vllm_rollout.VLLMRollout._start_engine = lambda *a, **k: started.append(1)
tok = build_tiny_tokenizer()
try:
    vllm_rollout.VLLMRollout(build_tiny_model(tokenizer=tok), tok)
except ValueError as exc:
    assert not started
    print(exc)
    sys.exit(0)
sys.exit("not refused")
"""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has attention head size 16" in done.stdout
    assert "rollout.name=native" in done.stdout
