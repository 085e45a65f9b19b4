"""Two Ray nodes on this machine (issue 20, item 9; ``ray_nodes.py``): a token-protected
head and a worker node, each started by ``ray start`` with one CPU, joined by the driver
with ``trainer.ray_address``; a two-rank FSDP2 GRPO run gets one rank on each node (one CPU
each: the placement groups of ``trainer.nnodes=2`` cannot share a node). Killing the
worker node's raylet mid-run fails the driver with ``WorkerDiedError`` naming the role, the
rank and the node (IP and Ray node id). SFT with ``trainer.nnodes=2`` places its two ranks
the same way, saves a two-rank checkpoint and resumes from it. The two tests share one
cluster (the SFT test first: the other kills the worker node).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl.config import to_yaml
from verl.trainer.lifecycle.checkpoint import complete_checkpoints, read_manifest
from verl.utils.lifetime import processes_with_env

from .ray_nodes import TwoNodes, two_ray_nodes

# one xdist worker runs both tests, in file order: they share the cluster
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray_two_nodes")]

MARK = "VERL_RAY_TWO_NODES_TEST"
# Documented in docs/reliability.md (Ray, two nodes): the driver's error after the raylet
# of a rank's node is SIGKILLed.
NODE_DEATH_REPORTED_S = 30.0

RUN = (
    "trainer.backend=ray",
    "trainer.device=cpu",
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.total_training_steps=3",
    "trainer.save_freq=1",
    "trainer.val_before_train=false",
    "algorithm.adv_estimator=grpo",
    "custom_reward_function.name=varied",
)

# argv: config, raylet pid to kill at the 2nd update ("0": none)
CHILD = """
import json, os, signal, sys, time
import psutil
import ray
from verl.config import load_config
from verl.controller import ensure_ray, ray_calls
from verl.trainer.rl import trainer as ppo_trainer

cfg = load_config(sys.argv[1])
victim = int(sys.argv[2])
ensure_ray(address=cfg.trainer.ray_address)
deadline = time.monotonic() + 60
while sum(n["Alive"] for n in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.2)
real = ray_calls.RayPending.wait
calls = 0


def wait(self, timeout=None):
    global calls
    if self._method == "update_actor" and victim:
        calls += 1
        if calls == 2:  # submitted: the ranks are running the update of step 2
            workers = psutil.Process(victim).children()
            os.kill(victim, signal.SIGKILL)
            print(f"KILLED {time.time()!r}", file=sys.stderr, flush=True)
            # a tiny run could end before the node's workers notice: go on once they did
            psutil.wait_procs(workers, timeout=30)
    return real(self, timeout)


ray_calls.RayPending.wait = wait
trainer = ppo_trainer.RLTrainer(cfg)
print("NODES " + json.dumps(trainer.actor_rollout_wg.nodes), file=sys.stderr, flush=True)
try:
    trainer.fit()
except BaseException:
    print(f"FAILED {time.time()!r}", file=sys.stderr, flush=True)
    raise
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[TwoNodes]:
    """The two nodes, started once for this module's tests (their drivers too are forked
    from one prewarmed parent); at the end nothing carrying the module's mark is left."""
    mark = uuid.uuid4().hex
    with two_ray_nodes(tmp_path_factory.mktemp("nodes"), MARK, mark) as nodes:
        yield nodes
    assert not processes_with_env(MARK, mark)


def test_sft_on_two_nodes_one_rank_each(tiny_model_dir, cluster, tmp_path):
    """``main_sft`` with ``trainer.nnodes=2``: one FSDP2 rank on each node, a two-rank
    checkpoint, the HF export; then the same run resumed from its checkpoint."""
    from verl.config import load_sft_config

    head_id, worker_id = cluster.head.node_id(), cluster.worker.node_id()
    run_dir = tmp_path / "sft"

    def run(steps: int) -> subprocess.CompletedProcess:
        cfg = load_sft_config(
            overrides=[
                f"model.path={tiny_model_dir}",
                "data.arithmetic.train_size=16",
                "data.arithmetic.val_size=4",
                "data.train_batch_size=4",
                "data.micro_batch_size_per_device=2",
                f"trainer.total_training_steps={steps}",
                "trainer.save_freq=2",
                "trainer.logger=[jsonl]",
                "trainer.device=cpu",
                "trainer.nnodes=2",
                "trainer.n_gpus_per_node=1",
                "engine.strategy=auto",  # fsdp2 on the two ranks
                "trainer.num_threads=1",
                f"trainer.ray_address={cluster.address}",
                f"trainer.default_local_dir={run_dir}",
                f"trainer.log_dir={run_dir}",
            ]
        )
        config_file = tmp_path / "sft.yaml"
        config_file.write_text(to_yaml(cfg))
        return cluster.drive(
            ["-m", "verl.trainer.main_sft", "--config", str(config_file)], tmp_path
        )

    child = run(2)
    assert child.returncode == 0, child.stderr[-3000:]
    placed = re.search(r"sft on 2 FSDP2 ranks \(Ray\), nodes by rank: (.*)", child.stderr)
    assert placed, child.stderr[-3000:]
    ids = sorted(node.split(" id ")[1] for node in placed.group(1).split(", "))
    assert ids == sorted([head_id[:12], worker_id[:12]]), placed.group(0)
    manifest = read_manifest(run_dir / "global_step_2", verify=True)
    assert manifest["roles"]["actor_rollout_ref"]["world_size"] == 2
    assert "actor/worker_state_rank1.json" in manifest["files"]
    assert (run_dir / "huggingface" / "model.safetensors").is_file()

    child = run(3)  # resumes from global_step_2 on the same two nodes
    assert child.returncode == 0, child.stderr[-3000:]
    assert f"resumed from {run_dir / 'global_step_2'}" in child.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2, 3]


def test_two_nodes_one_rank_each_and_a_killed_raylet_is_named(rl_config, cluster, tmp_path):
    """A GRPO job with one rank per node runs to the end; the same job again, the worker
    node's raylet SIGKILLed mid-update, fails naming role, rank and node. Last in this
    module: it leaves the module's worker node dead."""
    (tmp_path / "reward.py").write_text(
        "def varied(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (len(solution_str) % 5) / 4.0\n"
    )
    config_file = tmp_path / "run.yaml"
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def write_config(run_dir: Path) -> None:
        cfg = rl_config(
            *RUN,
            f"trainer.ray_address={cluster.address}",
            f"custom_reward_function.path={tmp_path / 'reward.py'}",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
        )
        config_file.write_text(to_yaml(cfg))

    def drive(victim: int) -> tuple[subprocess.CompletedProcess, float]:
        child = cluster.drive([str(script), str(config_file), str(victim)], tmp_path)
        return child, time.time()

    head_id, worker_id = cluster.head.node_id(), cluster.worker.node_id()
    # 1. a short job across both nodes, to the end
    write_config(tmp_path / "first")
    child, _ = drive(0)
    assert child.returncode == 0, child.stderr[-3000:]
    placed = json.loads(re.search(r"NODES (.*)", child.stderr).group(1))
    assert sorted(n.split(" id ")[1] for n in placed) == sorted([head_id[:12], worker_id[:12]]), (
        f"ranks not one per node: {placed}"
    )
    for _, step_dir in complete_checkpoints(tmp_path / "first"):
        read_manifest(step_dir, verify=True)

    # 2. the same job again (resuming nothing: a fresh directory), the worker node's
    # raylet SIGKILLed while the ranks run the update of step 2
    write_config(tmp_path / "second")
    child, ended = drive(cluster.worker.raylet().pid)
    assert child.returncode not in (0, -signal.SIGKILL), child.stderr[-3000:]
    killed_at = float(re.search(r"KILLED ([0-9.]+)", child.stderr).group(1))
    failed_at = float(re.search(r"FAILED ([0-9.]+)", child.stderr).group(1))
    placed = json.loads(re.search(r"NODES (.*)", child.stderr).group(1))
    rank = next(i for i, n in enumerate(placed) if worker_id[:12] in n)
    died = re.search(
        rf"WorkerDiedError: worker actor_rollout_ref \S* ?rank {rank} died during "
        rf"'\w+': \(pid \d+, node \S+ id {worker_id[:12]}\)[^\n]*",
        child.stderr,
    )
    assert died, child.stderr[-3000:]
    print(died.group(0))
    for _, step_dir in complete_checkpoints(tmp_path / "second"):
        read_manifest(step_dir, verify=True)
    reported = failed_at - killed_at
    print(
        f"raylet killed: fit() raised {reported:.1f}s later, driver gone {ended - killed_at:.1f}s"
    )
    assert reported < NODE_DEATH_REPORTED_S, f"{reported:.1f}s"
