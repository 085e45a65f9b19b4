"""One serving engine on rank 0 for two FSDP2 ranks (``verl.rollout.rank_zero``), over gloo.

Two spawned processes (``rank_zero_check.py``, in a subprocess) shard the tiny model with FSDP2; rank 0 holds a fake serving engine
with its own copy of the weights (``fake_sglang``). Checked: each rank gets the samples of its
own prompts (prompt widths differing between the ranks), the push gathers the shards bucket by
bucket into the engine, and a stalled engine fails the push on both ranks instead of leaving
rank 1 in a gather.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two processes with torch and transformers: ~20 s here


def test_one_engine_on_rank_zero_serves_both_ranks_and_takes_the_gathered_weights(
    tmp_path, tokenizer
):
    from verl.models.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", arch="qwen2", tokenizer=tokenizer)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "tests/rollout/rank_zero_check.py"),
            str(model_dir),
            str(tmp_path),
        ],
        env=dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rows"], r1["rows"]) == (4, 6)  # each rank: its own prompts x n=2
    for r in (r0, r1):
        assert r["same_prompts"] and r["same_input_ids"] and r["same_responses"], r
        assert r["logprob_diff"] < 1e-5, r
        assert r["same_after_push"] and r["logprob_diff_after_push"] < 1e-5, r
        assert r["buckets"] >= 3
        assert r["stall_seconds"] < 10, r
    assert (
        r0["start_error"]
        == "ValueError: weight_sync_bucket_mb=256.0 and weight_sync_timeout_s=0 must be > 0"
    )
    assert r1["start_error"] == (
        "RuntimeError: actor_rollout_ref: the rollout engine on rank 0 failed to start: "
        "ValueError: weight_sync_bucket_mb=256.0 and weight_sync_timeout_s=0 must be > 0"
    )
    assert r0["stall_is_timeout"] and "timed out after 2 s" in r0["stall_error"]
    assert r1["stall_error"].startswith(
        "WeightSyncError: actor_rollout_ref rank 1: the weight push on rank 0 failed after"
    )
