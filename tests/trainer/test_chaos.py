"""Chaos: a GRPO run SIGKILLed at 20 seeded points and resumed each time ends bit-identical
to an uninterrupted run (issue 20, item 9).

Kill points are drawn from five phases, each just before or just after the n-th call (in
that process) of: the rollout (``generate_and_score``), the policy update
(``update_policy``), validation, the actor's part of a checkpoint save (the other roles and
the manifest are not written yet), and the metric log. After every kill: nothing the run
started is alive within 10 s, and every published checkpoint verifies. At the end: the
final checkpoint's weights and optimizer state equal the uninterrupted run's bit for bit,
and ``metrics.jsonl`` holds exactly one row per step, equal to the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from verl.config import to_yaml
from verl.testing import assert_bitwise, assert_same_metrics, checkpoint_tensors
from verl.trainer.checkpoint import complete_checkpoints, read_manifest
from verl.trainer.ppo_trainer import RLTrainer
from verl.utils.lifetime import kill_processes_with_env, wait_until_gone

pytestmark = pytest.mark.slow

KILLS = 20
STEPS = 30
MARK = "VERL_CHAOS_TEST"
PHASES = ("rollout", "update", "validation", "save", "log")

RUN = (
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=1",
    "trainer.test_freq=3",
    "trainer.val_before_train=false",
    "data.arithmetic.train_size=10",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.optim.warmup_style=cosine",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
)

REWARD = (
    "def varied(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return {'score': (len(solution_str) % 5) / 4.0, 'acc': float(len(solution_str) % 2)}\n"
)

CHILD = """
import functools, os, signal, sys
from verl.config import load_config
from verl.trainer import ppo_trainer, tracking
from verl.workers import ActorRolloutRefWorker

phase, nth, when = sys.argv[2], int(sys.argv[3]), sys.argv[4]
targets = {
    "rollout": (ppo_trainer.RLTrainer, "generate_and_score"),
    "update": (ppo_trainer.RLTrainer, "update_policy"),
    "validation": (ppo_trainer.RLTrainer, "validate"),
    "save": (ActorRolloutRefWorker, "save_checkpoint"),
    "log": (tracking.Tracker, "log"),
}
owner, name = targets[phase]
real = getattr(owner, name)
calls = 0


def wrapped(*args, **kwargs):
    global calls
    calls += 1
    if calls == nth and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    out = real(*args, **kwargs)
    if calls == nth and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return out


setattr(owner, name, functools.wraps(real)(wrapped))  # keeps the dispatch registration
ppo_trainer.RLTrainer(load_config(sys.argv[1])).fit()
"""


def _config(rl_config, tmp_path: Path, run_dir: Path):
    (tmp_path / "reward.py").write_text(REWARD)
    return rl_config(
        *RUN,
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "custom_reward_function.name=varied",
        f"trainer.num_threads={torch.get_num_threads()}",  # the same float reductions
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
    )


def _kill_plan(seed: int) -> list[tuple[str, int, str]]:
    rng = random.Random(seed)
    return [
        (rng.choice(PHASES), rng.randint(1, 2), rng.choice(("before", "after")))
        for _ in range(KILLS)
    ]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_twenty_kills_and_resumes_end_bit_identical(rl_config, tmp_path):
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(_config(rl_config, tmp_path, straight_dir))
    straight.fit()

    run_dir = tmp_path / "chaos"
    config_file = tmp_path / "chaos.yaml"
    config_file.write_text(to_yaml(_config(rl_config, tmp_path, run_dir)))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    killed = []
    try:
        for phase, nth, when in [*_kill_plan(seed=20), ("rollout", 0, "never")]:
            child = subprocess.run(
                [sys.executable, str(script), str(config_file), phase, str(nth), when],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=tmp_path,
                timeout=300,
            )
            point = f"{when} {phase} call {nth}"
            if child.returncode == -signal.SIGKILL:
                killed.append(point)
            else:
                assert child.returncode == 0, f"{point}: {child.stderr.decode()[-3000:]}"
            assert not wait_until_gone(MARK, mark, 10), f"{point}: processes left behind"
            for _, step_dir in complete_checkpoints(run_dir):
                read_manifest(step_dir, verify=True)  # raises on a damaged file
    finally:
        kill_processes_with_env(MARK, mark)

    assert len(killed) == KILLS, f"the run ended before every kill point: {killed}"
    final = f"global_step_{STEPS}"
    assert_bitwise(checkpoint_tensors(run_dir / final), checkpoint_tensors(straight_dir / final))
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    strip = {"step", "time"}
    got = [{k: v for k, v in r.items() if k not in strip} for r in rows]
    assert_same_metrics(got, straight.history)
