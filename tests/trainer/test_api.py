"""The short Python API: make_trainer_config + Trainer, PPOTrainer, and a learning curve."""

from __future__ import annotations

import math
import multiprocessing

import pytest

from verl.config import ConfigError
from verl.models.tiny import save_tiny_model_dir
from verl.trainer.api import PPOTrainer, Trainer, make_trainer_config
from verl.trainer.rl.trainer import RLTrainer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


def digit_fraction(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """Fraction of the response's characters that are digits (a dense, learnable reward)."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)


def _common(tmp_path, steps: int = 2) -> list[str]:
    return [
        "trainer.logger=[]",
        f"trainer.default_local_dir={tmp_path}",
        f"trainer.log_dir={tmp_path}",
        "data.arithmetic.train_size=16",
        "data.arithmetic.val_size=4",
        f"trainer.total_training_steps={steps}",
    ]


def test_make_trainer_config_maps_knobs(tiny_model_dir, tmp_path):
    cfg = make_trainer_config(
        "ppo",
        model=str(tiny_model_dir),
        train_batch_size=4,
        n=2,
        lr=1e-4,
        clip_eps=0.3,
        vf_coef=0.5,
        actor_micro_batch_size=2,
        ppo_mini_batch_size=2,
        overrides=_common(tmp_path),
    )
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.critic.enable is True
    assert cfg.critic.loss_coef == 0.5
    assert cfg.actor_rollout_ref.actor.clip_ratio == 0.3
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-4
    assert cfg.actor_rollout_ref.rollout.n == 2
    with pytest.raises(ValueError, match="algo='sac'"):
        make_trainer_config("sac")
    # the same validation as the YAML path: a mini-batch that does not divide the batch
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        make_trainer_config("grpo", train_batch_size=4, ppo_mini_batch_size=3)


def test_trainer_collect_and_update(tiny_model_dir, tmp_path):
    cfg = make_trainer_config(
        "grpo",
        model=str(tiny_model_dir),
        train_batch_size=4,
        n=2,
        max_response_length=5,
        actor_micro_batch_size=4,
        ppo_mini_batch_size=4,
        overrides=_common(tmp_path),
    )
    trainer = Trainer(cfg, reward_fn=digit_fraction)
    try:
        prompts = ["a", [{"role": "user", "content": "b"}], {"prompt": "c"}, "d"]
        batch = trainer.collect_data(prompts)
        assert len(batch) == 8  # 4 prompts x n=2
        for key in ("responses", "old_log_probs", "advantages", "token_level_scores"):
            assert key in batch.batch
        # the two responses of one prompt share a uid
        uids = batch.non_tensor_batch["uid"]
        assert uids[0] == uids[1] and uids[1] != uids[2]
        metrics = trainer.update_policy(batch)
        assert "reward" in metrics and math.isfinite(metrics["reward"])
        assert math.isfinite(metrics["actor/pg_loss"])
        scorers = [p for p in multiprocessing.active_children() if p.name == "verl-reward-worker"]
        assert scorers  # the scoring function ran in reward worker processes...
    finally:
        trainer.close()
    assert not [p for p in scorers if p.is_alive()]  # ...which close() stopped


def test_ppo_trainer_fit_with_custom_reward_and_clipping(tiny_model_dir, tmp_path):
    cfg = make_trainer_config(
        "grpo",
        model=str(tiny_model_dir),
        train_batch_size=4,
        n=2,
        max_response_length=4,
        actor_micro_batch_size=4,
        ppo_mini_batch_size=4,
        overrides=_common(tmp_path),
    )
    trainer = PPOTrainer(
        cfg,
        reward_fn=lambda **kw: 10.0,
        reward_normalization=False,
        reward_clip_range=(-5.0, 5.0),
        log_with="jsonl",
    )
    assert cfg.trainer.logger == []  # the caller's config is not mutated
    trainer.fit()
    assert (tmp_path / "metrics.jsonl").exists()
    # every score was 10, clipped to 5 before it reached the advantages
    assert trainer.history[-1]["critic/score/mean"] == pytest.approx(5.0)
    # validation scores are raw (no clipping); a scorer without "acc" counts its score
    assert trainer.validation_history[-1]["val/score"] == pytest.approx(10.0)
    assert trainer.validation_history[-1]["val/acc"] == pytest.approx(10.0)


@pytest.mark.slow
def test_grpo_learns_dense_reward_on_tiny_model(tmp_path):
    """Reward rises clearly: mean of the last 5 steps well above the first 5."""
    model_dir = save_tiny_model_dir(tmp_path / "m", arch="qwen2", hidden_size=64, num_layers=2)
    cfg = make_trainer_config(
        "grpo",
        model=str(model_dir),
        train_batch_size=8,
        n=4,
        max_response_length=8,
        lr=5e-3,
        actor_micro_batch_size=32,
        ppo_mini_batch_size=8,
        seed=0,
        overrides=_common(tmp_path, steps=30),
    )
    trainer = Trainer(cfg, reward_fn=digit_fraction)
    prompts = [f"Say a number {i}" for i in range(8)]
    rewards = []
    try:
        for _ in range(30):
            rewards.append(trainer.update_policy(trainer.collect_data(prompts))["reward"])
    finally:
        trainer.close()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_make_trainer_config_knob_sets_its_keys(algo):
    cfg = make_trainer_config(
        algo,
        model="smollm2-135m-instruct",
        train_batch_size=4,
        n=2,
        max_prompt_length=32,
        max_response_length=8,
        lr=2e-6,
        critic_lr=3e-5,
        actor_micro_batch_size=2,
        critic_micro_batch_size=1,
        ppo_mini_batch_size=2,
        ppo_epochs=2,
        clip_eps=0.25,
        vf_coef=0.5,
        kl_coef=0.02,
        entropy_coeff=0.01,
        temperature=0.7,
        total_training_steps=3,
        seed=5,
    )
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (4, 32)
    assert (cfg.data.max_response_length, arr.rollout.n, arr.rollout.temperature) == (8, 2, 0.7)
    assert (arr.actor.optim.lr, critic.optim.lr) == (2e-6, 3e-5)
    assert arr.actor.ppo_micro_batch_size_per_device == 2
    assert critic.ppo_micro_batch_size_per_device == 1
    assert arr.actor.ppo_mini_batch_size == critic.ppo_mini_batch_size == 2
    assert arr.actor.ppo_epochs == critic.ppo_epochs == 2
    assert (arr.actor.clip_ratio, critic.loss_coef, arr.actor.entropy_coeff) == (0.25, 0.5, 0.01)
    assert (cfg.trainer.total_training_steps, cfg.trainer.seed) == (3, 5)
    if algo == "ppo":  # the KL penalty goes into the reward
        assert cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_ctrl.kl_coef == 0.02
        assert not arr.actor.use_kl_loss
    else:  # the KL term goes into the actor loss
        assert arr.actor.use_kl_loss and arr.actor.kl_loss_coef == 0.02
        assert not cfg.algorithm.use_kl_in_reward


# --- the tokenizer of a model passed as an object -----------------------------------------


def _grpo_config(tmp_path, **knobs):
    return make_trainer_config(
        "grpo",
        train_batch_size=4,
        n=2,
        max_response_length=4,
        actor_micro_batch_size=4,
        ppo_mini_batch_size=4,
        overrides=_common(tmp_path),
        **knobs,
    )


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """A tiny model with its own ~700-token tokenizer and 60,000 embedding rows: more than
    the default model's tokenizer has ids, so the vocabulary check alone cannot tell."""
    from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("wide") / "model"
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer=tok)
    model.resize_token_embeddings(60_000)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_model_object_trains_with_its_own_tokenizer(wide_model_dir, tmp_path):
    from verl.models import load_causal_lm

    module = load_causal_lm(str(wide_model_dir))
    assert module.get_input_embeddings().num_embeddings == 60_000
    cfg = _grpo_config(tmp_path)  # no model path: the default model's would be 49,152 ids
    trainer = Trainer(cfg, actor_model=module, reward_fn=digit_fraction)
    try:
        assert trainer.tokenizer.name_or_path == str(wide_model_dir.resolve())
        assert len(trainer.tokenizer) < 1000  # the tiny tokenizer, not SmolLM2's
        ids = trainer.prompts_to_batch(["1+1="]).batch["input_ids"]
        assert int(ids.max()) < len(trainer.tokenizer)  # the prompts use its ids
        assert "1+1=" in trainer.tokenizer.decode(ids[0], skip_special_tokens=True)
    finally:
        trainer.close()


def test_a_model_object_from_another_source_than_the_tokenizer_is_refused(
    tiny_model_dir, wide_model_dir, tmp_path
):
    from verl.models import load_causal_lm, load_tokenizer

    module = load_causal_lm(str(wide_model_dir))
    cfg = _grpo_config(tmp_path, model=str(tiny_model_dir))
    with pytest.raises(ValueError) as err:
        Trainer(cfg, actor_model=module, reward_fn=digit_fraction)
    assert str(wide_model_dir.resolve()) in str(err.value)
    assert f"actor_rollout_ref.model.path='{tiny_model_dir}'" in str(err.value)
    # an explicit tokenizer from another directory than the module's
    other = load_tokenizer(str(tiny_model_dir))
    with pytest.raises(ValueError, match="the tokenizer's name_or_path=") as err:
        Trainer(_grpo_config(tmp_path), actor_model=module, tokenizer=other)
    assert str(wide_model_dir.resolve()) in str(err.value)


def test_a_model_object_with_no_known_tokenizer_is_refused(tmp_path):
    from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
    from verl.trainer.rl.build import module_tokenizer

    module = build_tiny_model()  # built in memory: no name_or_path
    with pytest.raises(ValueError, match=r"no name_or_path .* pass tokenizer=") as err:
        Trainer(_grpo_config(tmp_path), actor_model=module, reward_fn=digit_fraction)
    assert "actor_rollout_ref.model.path" in str(err.value)
    # the same guard when the module goes to RLTrainer itself
    with pytest.raises(ValueError, match=r"no name_or_path .* pass tokenizer="):
        RLTrainer(_grpo_config(tmp_path), actor_module=module)
    # an explicit tokenizer is that tokenizer; a configured path is that path's
    tok = build_tiny_tokenizer()
    assert module_tokenizer(_grpo_config(tmp_path), module, tok) is tok
    module.config._name_or_path = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="names no loadable tokenizer"):
        module_tokenizer(_grpo_config(tmp_path), module)
