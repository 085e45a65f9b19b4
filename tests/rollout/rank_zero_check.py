"""Two gloo ranks, FSDP2, one fake serving engine on rank 0; writes rank0.json / rank1.json.

Run by ``tests/rollout/test_rank_zero.py`` in a subprocess:
``python tests/rollout/rank_zero_check.py MODEL_DIR OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        _check(rank, model_dir, out)
        # neither rank tears the group down while the other may still use it. One CI run saw
        # rank 1 abort with "terminate called without an active exception" (SIGABRT) and no
        # Python traceback; a teardown race is the suspected cause, not reproduced in 15 runs
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _check(rank: int, model_dir: str, out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.rollout.conftest import make_batch
    from tests.rollout.fake_sglang import FakeSGLangEngine
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout
    from verl.rollout.rank_zero import RankZeroRollout, build_rank_rollout
    from verl.rollout.sglang_rollout import SGLangRollout
    from verl.rollout.weight_sync import WeightSyncError, WeightSyncTimeout

    class Fake(SGLangRollout):
        engine_factory = FakeSGLangEngine

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    full = AutoModelForCausalLM.from_pretrained(model_dir).eval()  # the unsharded reference
    module = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    fully_shard(module)
    # an engine that fails to start on rank 0: every rank raises, none waits
    try:
        build_rank_rollout(
            Fake, module, tokenizer, {"weight_sync_timeout_s": 0}, rank=rank, world_size=2
        )
        start_error = None
    except (ValueError, RuntimeError) as exc:
        start_error = f"{type(exc).__name__}: {exc}"
    options = {"weight_sync_bucket_mb": 0.1, "weight_sync_timeout_s": 2.0}
    rollout = build_rank_rollout(Fake, module, tokenizer, options, rank=rank, world_size=2)
    assert isinstance(rollout, RankZeroRollout) and (rollout.engine is not None) == (rank == 0)
    result: dict = {"start_error": start_error}
    rollout.update_weights(module.state_dict().items())  # the first push, as the worker does
    # rank 1's prompts are longer: the widths differ between the ranks
    texts = ["1+2=", "hello"] if rank == 0 else ["what is 3*4 plus 5", "7", "the cat has"]
    tokenizer.padding_side = "left"
    prompts = make_batch(tokenizer, texts)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=6, stop_token_ids=[])
    got = rollout.generate(prompts, greedy)
    want = NativeRollout(full, tokenizer).generate(prompts, greedy)
    result["rows"] = got.batch["responses"].shape[0]
    result["same_prompts"] = torch.equal(got.batch["prompts"], want.batch["prompts"])
    result["same_input_ids"] = torch.equal(got.batch["input_ids"], want.batch["input_ids"])
    result["same_responses"] = torch.equal(got.batch["responses"], want.batch["responses"])
    result["logprob_diff"] = float(
        (got.batch["rollout_log_probs"] - want.batch["rollout_log_probs"]).abs().max()
    )
    # an update on the shards reaches the engine only through the gathered push
    with torch.no_grad():
        for p_sharded, p_full in zip(module.parameters(), full.parameters()):
            torch.manual_seed(7)
            noise = torch.randn_like(p_full) * 0.5
            p_full.add_(noise)
            local = p_sharded.to_local()  # FSDP2: rows [rank * ceil(n / 2), ...) of dim 0
            start = rank * -(-p_full.shape[0] // 2)
            local.add_(noise[start : start + local.shape[0]])
    stats = rollout.update_weights(module.state_dict().items())
    result["buckets"] = stats["buckets"]
    got = rollout.generate(prompts, greedy)
    want = NativeRollout(full, tokenizer).generate(prompts, greedy)
    result["same_after_push"] = torch.equal(got.batch["responses"], want.batch["responses"])
    result["logprob_diff_after_push"] = float(
        (got.batch["rollout_log_probs"] - want.batch["rollout_log_probs"]).abs().max()
    )
    # a stalled engine: rank 0 times out, rank 1 hears of it instead of waiting in a gather
    if rank == 0:
        FakeSGLangEngine.instances[-1].stall.set()
    start = time.monotonic()
    try:
        rollout.update_weights(module.state_dict().items())
        result["stall_error"] = None
    except WeightSyncError as exc:
        result["stall_error"] = type(exc).__name__ + ": " + str(exc)
        result["stall_is_timeout"] = isinstance(exc, WeightSyncTimeout)
    finally:
        if rank == 0:
            FakeSGLangEngine.instances[-1].stall.clear()
    result["stall_seconds"] = time.monotonic() - start
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    from tests.ranks import run_ranks  # the test runs this script with the repository on PYTHONPATH

    run_ranks(_rank, (_free_port(), sys.argv[1], sys.argv[2]), 2)
