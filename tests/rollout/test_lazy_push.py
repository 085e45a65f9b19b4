"""The actor worker's lazy weight push into a rollout engine that keeps its own weights.

An update (or a checkpoint load) only marks such an engine's copy stale; the next
``generate_sequences`` pushes the actor's weights first. With ``trainer.async_rollout=true``
training samples on the rollout copy, so the actor's own engine takes no push until it is
used (validation, ReMax's greedy baseline). The fake engine here is the native sampler over a
deep copy of the module that counts what it is pushed.
"""

from __future__ import annotations

import copy

import pytest
import torch

import verl.workers.actor_rollout_ref as actor_rollout_ref
from verl.config import load_config
from verl.models.tiny import save_tiny_model_dir
from verl.protocol import DataProto
from verl.rollout.native import NativeRollout
from verl.trainer.rl.trainer import RLTrainer

ENGINES: list[CountingRollout] = []

OVERRIDES = (
    "data.train_batch_size=4",
    "data.max_response_length=6",
    "data.arithmetic.train_size=16",
    "data.arithmetic.val_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.rollout_is_threshold=2.0",
    "trainer.async_rollout=true",
    "trainer.val_before_train=false",
    "trainer.logger=[]",
    "trainer.mixed_precision=none",
)


class CountingRollout(NativeRollout):
    """The native sampler over a private copy of the module, loaded only by pushes."""

    owns_weights = True

    def __init__(self, module, tokenizer=None, **kwargs):
        super().__init__(copy.deepcopy(module), tokenizer, **kwargs)
        self.pushes: list[dict[str, torch.Tensor]] = []
        self.generations = 0
        ENGINES.append(self)

    def update_weights(self, named_tensors):
        received = {name: tensor.detach().clone() for name, tensor in named_tensors}
        self.module.load_state_dict(received)
        self.pushes.append(received)
        return {"seconds": 0.01, "buckets": 1.0, "megabytes": 1.0}

    def generate(self, prompts, params):
        self.generations += 1
        return super().generate(prompts, params)


@pytest.fixture
def make_config(tmp_path, monkeypatch):
    """Configs of the native rollout whose workers (the actor's and the rollout copy's)
    build a :class:`CountingRollout` instead: an asynchronous run accepts the native,
    hf and vllm backends only."""
    model_dir = save_tiny_model_dir(tmp_path / "model", arch="qwen2")
    ENGINES.clear()
    monkeypatch.setattr(
        actor_rollout_ref, "build_policy_rollout", lambda spec, world_size: (CountingRollout, False)
    )

    def make(*extra: str):
        return load_config(
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                *OVERRIDES,
                f"trainer.default_local_dir={tmp_path / 'run'}",
                f"trainer.log_dir={tmp_path / 'run'}",
                *extra,
            ]
        )

    return make


def _assert_holds(engine: CountingRollout, module: torch.nn.Module) -> None:
    state = module.state_dict()
    assert set(engine.pushes[-1]) == set(state)
    for name, tensor in state.items():
        assert torch.equal(engine.pushes[-1][name], tensor), name


def test_async_updates_push_nothing_until_the_actor_engine_generates(make_config):
    trainer = RLTrainer(make_config("trainer.total_training_steps=3", "trainer.test_freq=-1"))
    worker = trainer.actor_rollout_wg.workers[0]
    actor = worker.rollout
    seen_at_validation = []
    validate = trainer.validate

    def counting_validate(*args, **kwargs):
        seen_at_validation.append((len(actor.pushes), actor.generations))
        return validate(*args, **kwargs)

    trainer.validate = counting_validate
    trainer.fit()
    assert trainer.global_step == 3
    (copy_engine,) = [e for e in ENGINES if e is not actor]
    # The copy samples every step and takes each update's weights at once; the actor's own
    # engine did not generate during training, so its three updates pushed nothing ...
    assert copy_engine.generations >= 3 and len(copy_engine.pushes) >= 2
    assert seen_at_validation == [(0, 0)]
    for metrics in trainer.history:
        assert metrics["rollout/weight_pushes"] == 0.0
        assert metrics["rollout/weight_sync_seconds"] == 0.0
    # ... and the validation after training took exactly one push, of the latest weights.
    assert actor.generations == 1 and len(actor.pushes) == 1
    _assert_holds(actor, worker.engine.module)

    # Another generation without an update in between takes none.
    enc = worker.tokenizer(["1+1=", "2+3="], return_tensors="pt", padding=True)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "position_ids": (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0),
        },
        meta_info={"do_sample": False, "n": 1},
    )
    assert len(worker.generate_sequences(prompts)) == 2
    assert actor.generations == 2 and len(actor.pushes) == 1


def test_async_validation_pushes_once_before_each_validation(make_config):
    trainer = RLTrainer(make_config("trainer.total_training_steps=3", "trainer.test_freq=2"))
    trainer.fit()
    actor = trainer.actor_rollout_wg.workers[0].rollout
    # validations after steps 2 and 3 (the run always validates at its end): one push each,
    # of the weights of the update just before
    assert actor.generations == 2
    assert len(actor.pushes) == 2
    _assert_holds(actor, trainer.actor_rollout_wg.workers[0].engine.module)
    # the push before step 2's validation is reported by step 3's update
    assert [m["rollout/weight_pushes"] for m in trainer.history] == [0.0, 0.0, 1.0]
