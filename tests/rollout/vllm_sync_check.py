"""Measures the vllm backend against the module it samples from; prints one JSON line.

Run in a subprocess by ``tests/rollout/test_vllm_rollout.py`` so that vLLM's process-wide
side effects (global seed, a torch.distributed group, thread binding) stay out of pytest:

    python tests/rollout/vllm_sync_check.py

On the embedded SmolLM2 (fp32): greedy responses and log-probs of the vllm engine against
the native engine and a forward pass of the module, before and after the module's weights
change and are pushed; sampled responses' log-probs against the forward pass at the
sampling temperature; the error of a push into a stalled engine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from verl.models import load_causal_lm, load_tokenizer
from verl.protocol import DataProto
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.weight_sync import WeightSyncTimeout

QUESTIONS = ["What is 2+3?", "Name a color.", "Count to five.", "What is the capital of France?"]


def forward_log_probs(model, out: DataProto, prompt_len: int, temperature: float) -> torch.Tensor:
    """The trainer's view: log_softmax(logits / T) of the module at the sampled tokens."""
    b = out.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits
    logits = logits[:, prompt_len - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def masked_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return (a - b)[mask.bool()].abs().max().item()


def main() -> None:
    torch.manual_seed(0)
    model = load_causal_lm("smollm2-135m-instruct")
    tokenizer = load_tokenizer("embedded:smollm2")
    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    prompts = DataProto.from_dict(
        tensors={"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
    )
    prompt_len = enc.input_ids.shape[1]
    result: dict = {}

    start = time.perf_counter()
    engine = build_rollout(
        "vllm", model, tokenizer, max_model_len=256, kv_cache_gib=1, weight_sync_bucket_mb=64
    )
    result["startup_seconds"] = time.perf_counter() - start
    result["initial_sync"] = dict(engine.last_stats)
    native = build_rollout("native", model, tokenizer)
    greedy = SamplingParams(n=1, temperature=0, max_new_tokens=24)

    def compare(tag: str) -> DataProto:
        out = engine.generate(prompts, greedy)
        ref = native.generate(prompts, greedy)
        mask = out.batch["response_mask"]
        result[tag] = {
            "same_responses_as_native": torch.equal(out.batch["responses"], ref.batch["responses"]),
            "same_mask_as_native": torch.equal(mask, ref.batch["response_mask"]),
            "max_diff_vs_native": masked_max_diff(
                out.batch["rollout_log_probs"], ref.batch["rollout_log_probs"], mask
            ),
            "max_diff_vs_forward": masked_max_diff(
                out.batch["rollout_log_probs"], forward_log_probs(model, out, prompt_len, 1.0), mask
            ),
            "tokens": int(mask.sum()),
        }
        return out

    before = compare("initial")
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    stale = engine.generate(prompts, greedy)
    result["unsynced_engine_keeps_old_weights"] = torch.equal(
        stale.batch["responses"], before.batch["responses"]
    )
    result["update"] = engine.update_weights(model.state_dict().items())
    after = compare("after_update")
    result["update_changed_outputs"] = not torch.equal(
        after.batch["responses"], before.batch["responses"]
    )

    sampled = SamplingParams(n=3, temperature=0.8, max_new_tokens=24, stop_strings=["."])
    out = engine.generate(prompts, sampled)
    mask = out.batch["response_mask"]
    eos = set(engine.eos_token_ids)
    ends = []
    for row, length in zip(out.batch["responses"], mask.sum(-1).tolist()):
        ids = row[:length].tolist()
        if ids[-1] in eos:
            ends.append("eos" if "." not in tokenizer.decode(ids[:-1]) else "late eos")
        elif "." in tokenizer.decode(ids) and "." not in tokenizer.decode(ids[:-1]):
            ends.append("stop string")
        else:
            ends.append("length" if length == 24 else "unexplained")
    result["sampled"] = {
        "shapes": {k: list(v.shape) for k, v in out.batch.items()},
        "max_diff_vs_forward": masked_max_diff(
            out.batch["rollout_log_probs"], forward_log_probs(model, out, prompt_len, 0.8), mask
        ),
        "zero_past_mask": bool((out.batch["rollout_log_probs"][~mask.bool()] == 0).all()),
        "pad_past_mask": bool((out.batch["responses"][~mask.bool()] == native.pad_token_id).all()),
        "ends": ends,
    }

    # A receiver that never takes the weights: the push must fail, not hang.
    engine.llm.collective_rpc = lambda *args, **kwargs: time.sleep(60)
    engine.timeout_s = 1.0
    start = time.perf_counter()
    try:
        engine.update_weights(model.state_dict().items())
        result["stall_error"] = None
    except WeightSyncTimeout as exc:
        result["stall_error"] = str(exc)
    result["stall_seconds"] = time.perf_counter() - start
    try:
        engine.generate(prompts, greedy)
        result["after_stall_error"] = None
    except RuntimeError as exc:
        result["after_stall_error"] = str(exc)
    model_dir = Path(engine._model_dir)
    result["model_dir_had_config"] = (model_dir / "config.json").is_file()
    engine.close()
    result["model_dir_removed_by_close"] = not model_dir.exists()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
