"""The hybrid worker's weight push into a rollout engine that keeps its own copy (as vLLM does).

A backend with ``owns_weights = True`` samples from a private copy of the model; the worker
must send it the actor's weights before the first generation after an update (or a
checkpoint load), and wrap generation in ``wake_up`` / ``sleep``. The fake here is the native sampler over a deep
copy, so a missed push would show as sampling from stale weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from verl.rollout import register_rollout
from verl.rollout.native import NativeRollout
from verl.rollout.registry import ROLLOUT_BACKENDS
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.specs import actor_rollout_ref_spec

from .varied_reward import assert_updates_moved, even_token_reward

EVENTS: list[str] = []
ENGINES: list[OwnCopyRollout] = []


class OwnCopyRollout(NativeRollout):
    """The native sampler over a private copy of the module, loaded only by pushes."""

    owns_weights = True

    def __init__(self, module, tokenizer=None, **kwargs):
        super().__init__(copy.deepcopy(module), tokenizer, **kwargs)
        self.pushes: list[dict[str, torch.Tensor]] = []
        ENGINES.append(self)

    def update_weights(self, named_tensors):
        received = {name: tensor.detach().clone() for name, tensor in named_tensors}
        self.module.load_state_dict(received)
        self.pushes.append(received)
        EVENTS.append("push")
        return {"seconds": 0.01, "buckets": 1.0, "megabytes": 1.0}

    def generate(self, prompts, params):
        EVENTS.append("generate")
        return super().generate(prompts, params)

    def sleep(self):
        EVENTS.append("sleep")

    def wake_up(self):
        EVENTS.append("wake")


@pytest.fixture
def own_copy_backend():
    EVENTS.clear()
    ENGINES.clear()
    register_rollout("test_own_copy", OwnCopyRollout)
    yield
    ROLLOUT_BACKENDS.remove("test_own_copy")


def test_weights_are_pushed_before_the_generation_after_every_update(rl_config, own_copy_backend):
    cfg = rl_config(
        "actor_rollout_ref.rollout.name=test_own_copy",
        "trainer.val_before_train=false",
        "trainer.logger=[]",
    )
    # the default reward is 0 on the random model: the updates would move the weights by
    # weight decay alone (lr x 0.01 a step), which a missed push would barely show in the
    # log-prob gap below
    trainer = RLTrainer(cfg, reward_fn=even_token_reward)
    trainer.fit()
    assert trainer.global_step == 2
    assert_updates_moved(trainer.history)
    (engine,) = ENGINES
    # One push per update, lazily: right before the next generation, inside its wake/sleep
    # (the last generation is the validation after training).
    assert [
        "sleep",
        *["wake", "generate", "sleep"],
        *["wake", "push", "generate", "sleep"] * 2,
    ] == EVENTS
    actor = trainer.actor_rollout_wg.workers[0].engine.module
    final = actor.state_dict()
    assert set(engine.pushes[-1]) == set(final)  # tied lm_head.weight included
    for name, tensor in final.items():
        assert torch.equal(engine.pushes[-1][name], tensor), name
    # The first push differs from the initial copy (the update changed the weights) ...
    assert any(not torch.equal(engine.pushes[0][n], engine.pushes[1][n]) for n in final)
    # Step 2's generation pushed step 1's weights; an update reports the pushes since the
    # previous one.
    assert [m["rollout/weight_pushes"] for m in trainer.history] == [0.0, 1.0]
    assert [m["rollout/weight_sync_seconds"] for m in trainer.history] == pytest.approx([0, 0.01])
    for metrics in trainer.history:
        # ... and step 2 sampled with the pushed weights: same log-probs as the trainer's.
        assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4


def test_resumed_run_pushes_the_loaded_weights_before_sampling(rl_config, own_copy_backend):
    common = (
        "actor_rollout_ref.rollout.name=test_own_copy",
        "trainer.val_before_train=false",
        "trainer.logger=[]",
        "trainer.save_freq=1",
    )
    first = RLTrainer(
        rl_config(*common, "trainer.total_training_steps=1"), reward_fn=even_token_reward
    )
    first.fit()
    assert_updates_moved(first.history)  # the checkpoint's weights are not the initial ones
    EVENTS.clear()
    ENGINES.clear()
    trainer = RLTrainer(
        rl_config(*common, "trainer.total_training_steps=2"), reward_fn=even_token_reward
    )
    trainer.fit()
    assert trainer.global_step == 2
    # The checkpoint's weights reach the engine before its first generation.
    assert EVENTS[:5] == ["sleep", "wake", "push", "generate", "sleep"]
    (engine,) = ENGINES
    actor = trainer.actor_rollout_wg.workers[0].engine.module
    for name, tensor in actor.state_dict().items():
        assert torch.equal(engine.pushes[-1][name], tensor), name


def test_own_copy_engine_on_several_ranks_with_multi_turn_is_refused_at_start(
    rl_config, own_copy_backend
):
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = rl_config(
        "actor_rollout_ref.rollout.name=test_own_copy",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
    )
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg), rank=0, world_size=2)
    with pytest.raises(NotImplementedError, match=r"multi_turn\.enable=true cannot use"):
        worker.init_model(total_steps=2)
    assert worker.engine is None and ENGINES == []  # refused before loading anything
