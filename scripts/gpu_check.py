"""One command that checks verl's device path on whatever accelerator this machine has.

Every check builds a tiny model from a config (no network, no hub) and asserts a number:

1. ``autocast_step``: 8 AdamW steps on one batch under bf16 autocast on the device; the
   loss is finite and falls.
2. ``fsdp2_mesh``: a one-process group (NCCL on CUDA, gloo on CPU), a 2-D (data, tensor)
   device mesh of size 1 x 1, the MLPs split column/row-wise over ``tensor`` (DTensor) and
   FSDP2 over ``data``: loss and gradients equal the plain module's within 1e-5 (fp32).
3. ``fp8_weight_only``: the weight-only fp8 reference/reward model's log-probs within the
   documented bound (0.05) of the fp32 model's, on the device.
4. ``native_rollout``: the native engine's greedy tokens equal transformers' ``generate``
   on the device, and its log-probs equal a forward over prompt + response within 1e-4.
5. ``device_vs_cpu``: fp32 log-probs on the device within 1e-4 of the CPU's (TF32 off);
   skipped when the device is the CPU.
6. ``grpo_learns``: GRPO through ``verl.Trainer`` on the device with a dense reward (the
   fraction of digits in the response): the mean reward of the last 5 steps is at least
   0.3 above the first 5.

Prints a table and writes JSON (``--json``, default ``$OUT/gpu_check.json`` when ``OUT`` is
set). Exit status 0 when every check that ran passed. ``--device cpu`` runs the same checks
on the CPU (CI does, so the script cannot rot). See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

LOGPROB_TOL = 1e-4
FP8_LOGPROB_TOL = 0.05  # the bound of docs/precision.md's weight-only fp8 roles
EXACT_TOL = 1e-5


class Skip(Exception):
    """A check that does not apply on this device."""


def _tiny(device: torch.device, seed: int = 0, peaked: bool = True):
    from verl.models import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2, seed=seed)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peaked distributions: greedy outputs vary (std 0.02 is uniform)
        for name, p in model.named_parameters():
            if peaked and "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
    return model.to(device).eval(), tok


def _batch(tok, device: torch.device, texts: list[str]):
    from verl.protocol import DataProto

    tok.padding_side = "left"  # rollout prompts are left-padded
    enc = tok(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"].to(device),
            "attention_mask": mask.to(device),
            "position_ids": ((mask.cumsum(-1) - 1).clamp_min(0)).to(device),
        },
        non_tensors={"uid": [f"u{i}" for i in range(len(texts))]},
    )


def _log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def _ids(device: torch.device, rows: int = 4, length: int = 24) -> torch.Tensor:
    return torch.randint(3, 200, (rows, length), generator=torch.Generator().manual_seed(0)).to(
        device
    )


def check_autocast_step(device: torch.device) -> dict:
    model, _ = _tiny(device)
    model.train()
    ids = _ids(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    ok = all(map(torch.isfinite, map(torch.tensor, losses))) and losses[-1] < losses[0]
    return {"ok": ok, "first_loss": losses[0], "last_loss": losses[-1]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fsdp2_mesh(device: torch.device) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        reference, _ = _tiny(device)
        model = copy.deepcopy(reference)
        mesh = init_device_mesh(device.type, (1, 1), mesh_dim_names=("data", "tensor"))
        plan = {
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        for layer in model.model.layers:
            parallelize_module(layer, mesh["tensor"], plan)
            fully_shard(layer, mesh=mesh["data"])
        fully_shard(model, mesh=mesh["data"])
        ids = _ids(device)
        losses, grads = [], []
        for m in (reference, model):
            m.train()
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(float(loss))
            grads.append(
                {
                    n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                    for n, p in m.named_parameters()
                }
            )
        grad_diff = max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
        loss_diff = abs(losses[0] - losses[1])
        return {
            "ok": loss_diff <= EXACT_TOL and grad_diff <= EXACT_TOL,
            "backend": backend,
            "mesh": "data=1 x tensor=1",
            "loss_diff": loss_diff,
            "grad_max_diff": grad_diff,
        }
    finally:
        dist.destroy_process_group()


def check_fp8_weight_only(device: torch.device) -> dict:
    from verl.models.fp8 import quantize_model_fp8_

    model, _ = _tiny(device, peaked=False)  # the init the bound was set for
    fp8 = quantize_model_fp8_(copy.deepcopy(model).requires_grad_(False))
    ids = _ids(device)
    diff = float((_log_probs(fp8, ids) - _log_probs(model, ids)).abs().max())
    return {"ok": diff < FP8_LOGPROB_TOL, "logprob_max_diff": diff, "bound": FP8_LOGPROB_TOL}


def check_native_rollout(device: torch.device) -> dict:
    from verl.kernels.torch_functional import compute_response_log_probs
    from verl.rollout.base import SamplingParams
    from verl.rollout.native import NativeRollout

    model, tok = _tiny(device)
    texts = ["hello world", "the cat", "one two three four", "a"]
    prompts = _batch(tok, device, texts)
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=12, stop_token_ids=[])
    out = NativeRollout(model, tok).generate(prompts, params)
    responses = out.batch["responses"]
    with torch.no_grad():
        hf = model.generate(
            input_ids=prompts.batch["input_ids"],
            attention_mask=prompts.batch["attention_mask"],
            do_sample=False,
            max_new_tokens=12,
            min_new_tokens=12,
            pad_token_id=tok.pad_token_id,
        )[:, prompts.batch["input_ids"].shape[1] :]
        recomputed = compute_response_log_probs(
            model,
            out.batch["input_ids"],
            out.batch["attention_mask"],
            out.batch["position_ids"],
            responses.shape[1],
        )[0]
    mask = out.batch["response_mask"].bool()
    diff = float((recomputed - out.batch["rollout_log_probs"])[mask].abs().max())
    same = bool(torch.equal(responses, hf))
    return {
        "ok": same and diff <= LOGPROB_TOL,
        "greedy_equals_generate": same,
        "logprob_max_diff": diff,
    }


def check_device_vs_cpu(device: torch.device) -> dict:
    if device.type == "cpu":
        raise Skip("the device is the CPU")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model, _ = _tiny(device)
    ids = _ids(device)
    on_device = _log_probs(model, ids).cpu()
    on_cpu = _log_probs(model.cpu(), ids.cpu())
    diff = float((on_device - on_cpu).abs().max())
    return {"ok": diff <= LOGPROB_TOL, "logprob_max_diff": diff, "bound": LOGPROB_TOL}


def check_grpo_learns(device: torch.device, steps: int) -> dict:
    from verl import Trainer, make_trainer_config
    from verl.models.tiny import save_tiny_model_dir

    def digit_fraction(data_source, solution_str, ground_truth, extra_info=None) -> float:
        return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)

    with tempfile.TemporaryDirectory(prefix="verl-gpu-check-") as tmp:
        model_dir = save_tiny_model_dir(Path(tmp) / "m", hidden_size=64, num_layers=2)
        cfg = make_trainer_config(
            "grpo",
            model=str(model_dir),
            train_batch_size=8,
            n=4,
            max_response_length=8,
            lr=5e-3,
            actor_micro_batch_size=32,
            ppo_mini_batch_size=8,
            seed=0,
            overrides=[
                "trainer.logger=[]",
                f"trainer.default_local_dir={tmp}/ckpt",
                f"trainer.log_dir={tmp}/logs",
                f"trainer.total_training_steps={steps}",
                f"trainer.device={device.type}",
                "trainer.mixed_precision=none",
            ],
        )
        trainer = Trainer(cfg, reward_fn=digit_fraction)
        prompts = [f"Say a number {i}" for i in range(8)]
        rewards = []
        start = time.perf_counter()
        for _ in range(steps):
            rewards.append(trainer.update_policy(trainer.collect_data(prompts))["reward"])
        seconds = time.perf_counter() - start
        close = getattr(trainer, "close", None)
        if callable(close):
            close()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    return {
        "ok": last >= first + 0.3,
        "steps": steps,
        "reward_first5": first,
        "reward_last5": last,
        "seconds_per_step": seconds / steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cuda, cpu")
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps of grpo_learns (>= 10)")
    parser.add_argument("--json", default=None, help="where to write the JSON result")
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks")
    args = parser.parse_args(argv)
    if args.steps < 10:
        parser.error(f"--steps={args.steps}: grpo_learns compares the first and last 5 steps")
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    device = torch.device(name)
    env = {
        "torch": torch.__version__,
        "device": name,
        "device_name": torch.cuda.get_device_name(0) if name == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(0)) if name == "cuda" else None,
    }
    checks: dict[str, Callable[[], dict]] = {
        "autocast_step": lambda: check_autocast_step(device),
        "fsdp2_mesh": lambda: check_fsdp2_mesh(device),
        "fp8_weight_only": lambda: check_fp8_weight_only(device),
        "native_rollout": lambda: check_native_rollout(device),
        "device_vs_cpu": lambda: check_device_vs_cpu(device),
        "grpo_learns": lambda: check_grpo_learns(device, args.steps),
    }
    unknown = set(args.only or []) - set(checks)
    if unknown:
        parser.error(f"--only: unknown checks {sorted(unknown)}; choose from {sorted(checks)}")
    results: dict[str, dict] = {}
    for check, fn in checks.items():
        if args.only and check not in args.only:
            continue
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            result = fn()
            result["status"] = "pass" if result.pop("ok") else "FAIL"
        except Skip as skip:
            result = {"status": "skip", "reason": str(skip)}
        except Exception as exc:  # a crash is a failed check, reported with its traceback
            result = {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        result["seconds"] = round(time.perf_counter() - start, 2)
        results[check] = result
        print(f"{check:16s} {result['status']:5s} {json.dumps(result, default=str)}", flush=True)
    report = {"environment": env, "checks": results}
    print("\n| check | status | details |\n|---|---|---|")
    for check, result in results.items():
        details = ", ".join(f"{k}={v}" for k, v in result.items() if k != "status")
        print(f"| {check} | {result['status']} | {details} |")
    target = args.json or (
        os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None
    )
    if target:
        Path(target).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {target}")
    return 0 if all(r["status"] != "FAIL" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
