"""Asynchronous training with the SGLang backend, through the fake SGLang engine
(``tests/rollout/fake_sglang.py``: SGLang's interface over verl's native sampler; SGLang
itself needs CUDA).

The rollout copy starts an SGLang engine of its own beside the actor's, and every weight
load pushes the actor's weights into it (the bucketed ``update_weights_from_tensor``).
Each trained batch's rollout log-probs equal a recomputation with the weights of the policy
version recorded as having sampled it (fp32), in one-step-off and in streaming mode, so the
copy's engine generated every batch with the weights the pipeline says it did.
"""

from __future__ import annotations

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_tokenizer, save_tiny_model_dir
from verl.rollout import register_rollout
from verl.rollout.registry import ROLLOUT_BACKENDS

from ..rollout.fake_sglang import FakeSGLangEngine
from ..rollout.test_sglang_rollout import FakeBackedSGLang

NAME = "test_async_sglang_fake"
MODES = {
    "one_step_off": [],
    "streaming": ["trainer.rollout_mode=streaming"],
}


@pytest.fixture
def fake_backend():
    register_rollout(NAME, FakeBackedSGLang)
    FakeSGLangEngine.instances.clear()
    try:
        yield
    finally:
        ROLLOUT_BACKENDS.remove(NAME)
        FakeSGLangEngine.instances.clear()


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_async_training_with_sglang_samples_with_the_recorded_weights(mode, fake_backend, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    model_dir = save_tiny_model_dir(
        tmp_path / "model", arch="qwen2", tokenizer=build_tiny_tokenizer()
    )
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.rollout.name={NAME}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.entropy_coeff=0.05",  # the update moves the weights
            "data.train_batch_size=4",
            "data.max_response_length=6",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=4",
            "trainer.total_training_steps=3",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.mixed_precision=none",
            "trainer.async_rollout=true",
            "trainer.max_staleness=1",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path}",
            *MODES[mode],
        ]
    )
    trainer = RLTrainer(cfg)
    scorer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    snapshots: list[dict[str, torch.Tensor]] = []  # the actor after k updates, at index k
    trained: list[tuple[set[int], float]] = []
    update = trainer.update_policy

    def recording_update(gen):
        snapshots.append(trainer.actor_rollout_wg.state_dict_for_save()[0])
        versions = {int(v) for v in gen.non_tensor_batch["rollout_policy_version"]}
        scorer.load_state_dict(snapshots[min(versions)])
        b = gen.batch
        with torch.no_grad():
            (log_probs, *_) = compute_response_log_probs(
                scorer,
                b["input_ids"],
                b["attention_mask"],
                b["position_ids"],
                response_len=b["responses"].shape[1],
            )
        gap = float(((log_probs - b["rollout_log_probs"]) * b["response_mask"]).abs().max())
        trained.append((versions, gap))
        return update(gen)

    trainer.update_policy = recording_update
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_step == 3
    # the actor's engine and the copy's: both SGLang engines, both shut down at the end
    assert len(FakeSGLangEngine.instances) == 2
    assert all(fake.shut_down for fake in FakeSGLangEngine.instances)
    copy_engine = FakeSGLangEngine.instances[1]
    assert any(name == "update_weights_from_tensor" for name, _ in copy_engine.calls)
    assert [len(v) for v, _ in trained] == [1, 1, 1]  # one version per batch
    assert trained[0][0] == {0} and max(trained[-1][0]) >= 1  # a later version reached it
    for versions, gap in trained:
        assert gap < 1e-5, (versions, gap)
    stale = [m["async/staleness_max"] for m in trainer.history]
    assert stale[0] == 0.0 and max(stale) == 1.0
    for metrics in trainer.history:
        assert metrics["actor/grad_norm"] > 0
