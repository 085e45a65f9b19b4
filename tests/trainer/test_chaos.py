"""Chaos: a GRPO run SIGKILLed at 10 points (every phase, just before and just after its
call) and resumed each time ends bit-identical to an uninterrupted run; and the same, at
fewer points, for a one-step-off asynchronous run (its in-flight batch is part of every
checkpoint) and for a multi-turn run with tools (its config, tools included, is written into
every checkpoint, and the run resumes from one).

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
import time
import uuid
from pathlib import Path

import pytest
import torch

from verl.config import to_yaml
from verl.testing import assert_bitwise, assert_same_metrics, checkpoint_tensors
from verl.trainer.lifecycle.checkpoint import complete_checkpoints, read_manifest
from verl.trainer.rl.trainer import RLTrainer
from verl.utils.lifetime import kill_processes_with_env, processes_with_env

from . import tool_model
from .prewarmed import Prewarmed

pytestmark = pytest.mark.slow

# (phase, n-th call in that process, before/after): each of the five phases both before and
# after its call, at its first call in a resumed process or at its second (after a whole
# step there; validation runs every 3 steps, so its second call is 6 steps in). Each step
# runs rollout, update, validation (on schedule), log, save. After each kill the newest
# complete checkpoint is the one in KILLED_AT; the resumed run then trains steps 12-16.
KILL_PLAN = (
    ("update", 1, "before"),
    ("update", 2, "after"),
    ("log", 2, "after"),
    ("validation", 2, "before"),
    ("rollout", 1, "after"),
    ("rollout", 2, "before"),
    ("validation", 2, "after"),
    ("save", 1, "before"),
    ("save", 1, "after"),  # the actor's part written, the step's checkpoint incomplete
    ("log", 1, "before"),
)
KILLED_AT = (0, 1, 2, 5, 5, 6, 11, 11, 11, 11)
KILLS = len(KILL_PLAN)
STEPS = 16
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

# What every child imports: its prewarmed parent imports them once.
CHILD_IMPORTS = (
    "verl.config",
    "verl.trainer.lifecycle.tracking",
    "verl.trainer.rl.trainer",
    "verl.workers",
)

CHILD = """
import functools, os, signal, sys
from verl.config import load_config
from verl.trainer.lifecycle import tracking
from verl.trainer.rl import trainer as ppo_trainer
from verl.workers import ActorRolloutRefWorker

phase, nth, when = sys.argv[2], int(sys.argv[3]), sys.argv[4]
targets = {
    "rollout": (ppo_trainer.RLTrainer, "generate_and_score"),
    "score": (ppo_trainer.RLTrainer, "score_responses"),
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


def _config(rl_config, tmp_path: Path, run_dir: Path, *extra: str):
    (tmp_path / "reward.py").write_text(REWARD)
    return rl_config(
        *RUN,
        *extra,
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "custom_reward_function.name=varied",
        f"trainer.num_threads={torch.get_num_threads()}",  # the same float reductions
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
    )


def _kill_plan(seed: int, kills: int, phases=PHASES) -> list[tuple[str, int, str]]:
    rng = random.Random(seed)
    return [
        (rng.choice(phases), rng.randint(1, 2), rng.choice(("before", "after")))
        for _ in range(kills)
    ]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _left_alive(mark: str, parent: int, seconds: float) -> dict[int, str]:
    """The processes carrying ``mark`` other than the prewarmed parent (whose environment
    every child shares) still alive after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = {pid: cmd for pid, cmd in processes_with_env(MARK, mark).items() if pid != parent}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _kill_and_resume(tmp_path: Path, config, plan, steps: int) -> list[tuple[str, int]]:
    """Run ``config`` in child processes (forked from one parent that imported the trainer:
    ``prewarmed.py``) killed at each point of ``plan``, then once more to the end; check
    after each that nothing is left alive and every checkpoint verifies.
    Returns the points where a child was killed, each with the step of the newest complete
    checkpoint after the kill (0: none; the next child resumes from it)."""
    run_dir = Path(config.trainer.default_local_dir)
    config_file = tmp_path / "chaos.yaml"
    config_file.write_text(to_yaml(config))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    killed = []
    try:
        with Prewarmed(CHILD_IMPORTS, env, tmp_path) as parent:
            for phase, nth, when in [*plan, ("rollout", 0, "never")]:
                child = parent.run(
                    [script, config_file, phase, nth, when],
                    cwd=tmp_path,
                    stderr=tmp_path / "child.err",
                    timeout=300,
                )
                point = f"{when} {phase} call {nth}"
                if child.returncode != -signal.SIGKILL:
                    assert child.returncode == 0, f"{point}: {child.stderr.decode()[-3000:]}"
                left = _left_alive(mark, parent.pid, 10)
                assert not left, f"{point}: processes left behind: {left}"
                complete = complete_checkpoints(run_dir)
                for _, step_dir in complete:
                    read_manifest(step_dir, verify=True)  # raises on a damaged file
                if child.returncode == -signal.SIGKILL:
                    killed.append((point, complete[-1][0] if complete else 0))
    finally:
        kill_processes_with_env(MARK, mark)
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    return killed


def _same_run(run_dir: Path, straight_dir: Path, straight: RLTrainer, steps: int) -> None:
    """The final checkpoint and every step's metrics equal the uninterrupted run's."""
    final = f"global_step_{steps}"
    assert_bitwise(checkpoint_tensors(run_dir / final), checkpoint_tensors(straight_dir / final))
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    strip = {"step", "time"}
    got = [{k: v for k, v in r.items() if k not in strip} for r in rows]
    assert_same_metrics(got, straight.history)


def test_ten_kills_and_resumes_end_bit_identical(rl_config, tmp_path):
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(_config(rl_config, tmp_path, straight_dir))
    straight.fit()

    run_dir = tmp_path / "chaos"
    config = _config(rl_config, tmp_path, run_dir)
    assert {(phase, when) for phase, _, when in KILL_PLAN} == {
        (phase, when) for phase in PHASES for when in ("before", "after")
    }
    killed = _kill_and_resume(tmp_path, config, list(KILL_PLAN), STEPS)
    assert len(killed) == KILLS, f"the run ended before every kill point: {killed}"
    assert tuple(step for _, step in killed) == KILLED_AT, killed
    _same_run(run_dir, straight_dir, straight, STEPS)


ASYNC_STEPS = 8
ASYNC_KILLS = 6


def test_async_run_killed_and_resumed_ends_bit_identical(rl_config, tmp_path):
    asynchronous = (
        "trainer.async_rollout=true",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        f"trainer.total_training_steps={ASYNC_STEPS}",
    )
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(_config(rl_config, tmp_path, straight_dir, *asynchronous))
    straight.fit()
    assert all("async/staleness_mean" in m for m in straight.history)

    run_dir = tmp_path / "chaos"
    config = _config(rl_config, tmp_path, run_dir, *asynchronous)
    phases = ("score", "update", "validation", "save", "log")  # async never calls the rollout
    killed = _kill_and_resume(tmp_path, config, _kill_plan(8, ASYNC_KILLS, phases), ASYNC_STEPS)
    assert len(killed) == ASYNC_KILLS, f"the run ended before every kill point: {killed}"
    _same_run(run_dir, straight_dir, straight, ASYNC_STEPS)


# Four kills in step 1 of a fresh start (before and after the rollout, before and after
# the actor's part of the save), then one in step 2 after step 1's checkpoint is complete:
# the last child, and the final run, resume a multi-turn run from its checkpoint.
TOOL_PLAN = (
    ("rollout", 1, "before"),
    ("rollout", 1, "after"),
    ("save", 1, "before"),
    ("save", 1, "after"),
    ("log", 2, "before"),
)
TOOL_STEPS = 2


def _tool_config(rl_config, model_dir: Path, tmp_path: Path, run_dir: Path):
    data = tmp_path / "train.jsonl"
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": a},
        }
        for q, a in tool_model.QUESTIONS.items()
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
    (tmp_path / "tool_reward.py").write_text(tool_model.REWARD)
    return rl_config(
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files=[{data}]",
        f"data.val_files=[{data}]",
        "data.max_prompt_length=512",
        "data.max_response_length=96",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
        "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        "actor_rollout_ref.rollout.temperature=0.7",
        # the tool reward can be equal within every group of a step (grad_norm 0.0 at step 2
        # without it): the entropy bonus gives every step an update to compare
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        f"custom_reward_function.path={tmp_path / 'tool_reward.py'}",
        "custom_reward_function.name=score",
        f"trainer.total_training_steps={TOOL_STEPS}",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "trainer.val_before_train=false",
        f"trainer.num_threads={torch.get_num_threads()}",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
    )


def test_multi_turn_run_with_tools_killed_and_resumed_ends_bit_identical(
    rl_config, tool_model_dir, tmp_path
):
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(_tool_config(rl_config, tool_model_dir, tmp_path, straight_dir))
    straight.fit()
    # the run really goes through tool calls, whose results are in the context
    assert all(m["multi_turn/tool_calls"] > 0 for m in straight.history)
    assert all(m["actor/grad_norm"] > 0 for m in straight.history), straight.history

    run_dir = tmp_path / "chaos"
    config = _tool_config(rl_config, tool_model_dir, tmp_path, run_dir)
    killed = _kill_and_resume(tmp_path, config, list(TOOL_PLAN), TOOL_STEPS)
    assert [step for _, step in killed] == [0, 0, 0, 0, 1], killed
    _same_run(run_dir, straight_dir, straight, TOOL_STEPS)
