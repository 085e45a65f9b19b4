"""Multi-turn (agent-loop) rollouts through the streaming rollouter.

The rollout copy runs the worker's agent loop: every turn of a trajectory is generated in
the same call, with the weights the copy loaded before it, so each turn's tokens carry that
call's policy version (``rollout_policy_version``), and the trajectory's group is handed over
when the call ends (the agent loop's per-turn engine calls are not reported as groups).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from verl.trainer.rl.trainer import RLTrainer

from .taken_batches import fit_recording_batches
from .tool_model import calculator_run_overrides


@pytest.mark.slow
def test_streaming_multi_turn_two_steps(rl_config, tool_model_dir, tmp_path):
    cfg = rl_config(
        *calculator_run_overrides(tool_model_dir, tmp_path, repeats=4),
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        "trainer.total_training_steps=2",
    )
    trainer = RLTrainer(cfg)
    taken = fit_recording_batches(trainer)
    assert trainer.global_step == 2
    assert len(taken) == 2
    # a step whose groups all scored alike has zero advantages; the run must train on some
    assert any(m["actor/grad_norm"] > 0 for m in trainer.history)
    for step, (gen, metrics) in enumerate(zip(taken, trainer.history)):
        assert metrics["multi_turn/turns_mean"] > 1.5, metrics["multi_turn/turns_mean"]
        assert math.isfinite(metrics["actor/pg_loss"])
        # whole trajectories of one version each: the version of the weights that generated
        # every turn, at most max_staleness updates old
        versions = gen.non_tensor_batch["rollout_policy_version"]
        assert (versions <= step).all() and (versions >= step - 1).all()
        assert (gen.non_tensor_batch["staleness"] == step - versions).all()
        assert metrics["async/staleness_max"] <= 1
        assert metrics["stream/dropped_groups"] == 0
        # the groups are the trajectories' prompts (uid), each with rollout.n rows together
        uid = gen.non_tensor_batch["uid"]
        n = cfg.actor_rollout_ref.rollout.n
        assert len(np.unique(uid)) * n == len(uid)
        assert max(gen.non_tensor_batch["num_turns"]) >= 2
        # the rollout's per-token log-probs over every turn match the trainer's recomputation
        # with the same version's weights (async: the recomputation has the newer ones at step
        # 2, so only the fresh first step is compared)
        if step == 0:
            assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4


def test_config_takes_multi_turn_in_streaming_only(rl_config):
    from verl.config import ConfigError

    multi = "actor_rollout_ref.rollout.multi_turn.enable=true"
    stream = ("trainer.async_rollout=true", "trainer.rollout_mode=streaming")
    assert rl_config(*stream, multi).actor_rollout_ref.rollout.multi_turn.enable is True
    with pytest.raises(ConfigError, match=r"supported by trainer\.rollout_mode=streaming"):
        rl_config("trainer.async_rollout=true", multi)
    # partial rollouts keep the turns' per-token versions (tests/trainer/test_partial_multi_turn.py)
    partial = ("trainer.partial_rollout=continue", "actor_rollout_ref.rollout.name=native")
    assert rl_config(*stream, *partial, multi).trainer.partial_rollout == "continue"
