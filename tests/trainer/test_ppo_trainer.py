"""Integration tests: the RL loop runs real training steps on a tiny random model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.models.tiny import save_tiny_model_dir
from verl.trainer.rl.trainer import RLTrainer

REQUIRED_KEYS = {
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "reward/acc",
    "response_length/mean",
    "actor/pg_loss",
    "actor/clipfrac",
    "actor/approx_kl",
    "actor/grad_norm",
    "actor/lr",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput_tokens_per_s",
    "rollout/logprob_abs_diff_mean",
    "actor/entropy",
}


def _finite(metrics: dict) -> None:
    for key, value in metrics.items():
        if isinstance(value, float):
            assert math.isfinite(value), f"{key}={value}"


def test_grpo_runs_logs_and_saves_reloadable_actor(rl_config, tmp_path):
    cfg = rl_config(
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
    )
    trainer = RLTrainer(cfg)
    result = trainer.fit()

    assert trainer.global_step == 2
    assert len(trainer.history) == 2
    for metrics in trainer.history:
        missing = (REQUIRED_KEYS | {"actor/kl_loss", "actor/entropy_loss"}) - set(metrics)
        assert not missing, missing
        _finite(metrics)
        assert metrics["actor/grad_norm"] > 0
    # Same weights sampled and scored: the rollout's log-probs match the trainer's.
    assert trainer.history[0]["rollout/logprob_abs_diff_mean"] < 1e-4

    # metrics reach the jsonl log, one line per step plus validation lines
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "actor/pg_loss" in x] == [1, 2]
    assert "val_before" in result and "val/acc/arithmetic" in result["val_after"]

    # the saved actor reloads with plain transformers and equals the trained module
    hf_dir = Path(result["hf_dir"])
    reloaded = AutoModelForCausalLM.from_pretrained(hf_dir)
    trained = trainer.actor_rollout_wg.workers[0].engine.module
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, trained(ids).logits)


def test_override_config_reaches_actor_reference_and_critic(rl_config):
    trainer = RLTrainer(
        rl_config(
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "critic.ppo_mini_batch_size=2",
            "critic.ppo_micro_batch_size_per_device=2",
            "actor_rollout_ref.model.override_config={rms_norm_eps: 0.125}",
            "critic.model.override_config={rms_norm_eps: 0.25}",
        )
    )
    try:
        actor = trainer.actor_rollout_wg.workers[0]
        assert actor.engine.module.config.rms_norm_eps == 0.125
        assert actor.ref_engine.module.config.rms_norm_eps == 0.125
        critic = trainer.critic_wg.workers[0]
        assert critic.engine.module.model.config.rms_norm_eps == 0.25
    finally:
        trainer.close()


def test_token_budget_micro_batches_give_the_same_update(rl_config, monkeypatch):
    """use_dynamic_bsz packs micro-batches by tokens and trims their padding; the loss
    weights keep the update equal to the fixed-size split's (float rounding aside)."""
    import verl.workers.common as common

    counts = []
    split = common.split_micro_batches

    def counting_split(*args, **kwargs):
        parts = split(*args, **kwargs)
        if kwargs.get("max_token_len") is not None:
            counts.append(len(parts))
        return parts

    monkeypatch.setattr(common, "split_micro_batches", counting_split)
    common_overrides = (
        "algorithm.adv_estimator=gae",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "critic.optim.weight_decay=0.0",
    )
    weights, metrics = [], []
    for dynamic in ("false", "true"):
        trainer = RLTrainer(
            rl_config(
                *common_overrides,
                f"actor_rollout_ref.actor.use_dynamic_bsz={dynamic}",
                f"critic.use_dynamic_bsz={dynamic}",
                "actor_rollout_ref.actor.ppo_max_token_len_per_device=140",
                "critic.ppo_max_token_len_per_device=140",
            )
        )
        metrics.append(trainer.fit()["last_metrics"])
        actor = trainer.actor_rollout_wg.workers[0].engine.module
        critic = trainer.critic_wg.workers[0].engine.module
        weights.append({**actor.state_dict(), **critic.state_dict()})
        trainer.close()
    assert counts and max(counts) > 1, f"the budget never split a batch: {counts}"
    assert metrics[0]["response_length/mean"] == metrics[1]["response_length/mean"]
    for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-6), key
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=1e-5, msg=name)


def test_ppo_with_critic_runs(rl_config):
    cfg = rl_config(
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(cfg)
    assert trainer.critic_wg is not None
    trainer.fit()
    for metrics in trainer.history:
        missing = (
            REQUIRED_KEYS | {"critic/vf_loss", "critic/grad_norm", "critic/values/mean"}
        ) - set(metrics)
        assert not missing, missing
        assert "actor/reward_kl_penalty" in metrics
        _finite(metrics)
        assert metrics["critic/grad_norm"] > 0


@pytest.mark.parametrize(
    "override, phrase",
    [
        (
            "actor_rollout_ref.actor.checkpoint.save_contents=[model]",
            "partial checkpoints are not implemented (it lacks optimizer, extra;",
        ),
        (
            "critic.model.lora_rank=4 critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
            "hf_model is not implemented for a LoRA critic (critic.model.lora_rank=4)",
        ),
        (
            "actor_rollout_ref.actor.checkpoint.load_contents=[model]",
            "partial loads are not implemented (it lacks optimizer, extra;",
        ),
    ],
)
def test_unsupported_settings_fail_before_loading(rl_config, override, phrase):
    from verl.trainer.lifecycle.setup import NotSupportedYet

    with pytest.raises(NotSupportedYet, match=re.escape(phrase)):
        RLTrainer(rl_config(*override.split()))


def test_reward_model_scores_replace_rules(rl_config, tmp_path):
    rm_dir = save_tiny_model_dir(tmp_path / "rm", arch="qwen2", num_layers=1, reward_head=True)
    cfg = rl_config(
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(cfg)
    gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
    scores = gen.batch["token_level_scores"]
    # real-valued model scores (not 0/1 rule scores), one per response on its last token
    assert (scores != 0).sum(-1).tolist() == [1] * len(gen)
    assert not torch.all((scores == 0) | (scores == 1))
    last = gen.batch["response_mask"].sum(-1) - 1
    assert torch.all(scores[torch.arange(len(gen)), last] != 0)


def test_custom_reward_file_and_hf_rollout(rl_config, tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        "def length_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': len(solution_str) / 100.0, 'acc': 0.0}\n"
    )
    cfg = rl_config(
        "actor_rollout_ref.rollout.name=hf",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=length_score",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(cfg)
    gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
    texts = trainer.tokenizer.batch_decode(
        [r[m.bool()] for r, m in zip(gen.batch["responses"], gen.batch["response_mask"])],
        skip_special_tokens=True,
    )
    expected = torch.tensor([len(t) / 100.0 for t in texts])
    torch.testing.assert_close(gen.batch["token_level_scores"].sum(-1), expected)
    trainer.close()


def test_lr_schedule_spans_all_optimizer_steps(rl_config):
    # 2 trainer steps x 2 mini-batches = 4 optimizer steps of a cosine schedule to 0:
    # the lr must still be positive in the last trainer step.
    cfg = rl_config(
        "actor_rollout_ref.actor.optim.warmup_style=cosine",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    lrs = [m["actor/lr"] for m in trainer.history]
    assert lrs[0] > lrs[1] > 0


def test_remax_uses_a_greedy_baseline(rl_config):
    cfg = rl_config(
        "algorithm.adv_estimator=remax",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=1",
    )
    trainer = RLTrainer(cfg)
    gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
    baselines = gen.batch["reward_baselines"]
    assert baselines.shape == (len(gen),)
    # the n=2 responses of a prompt share their prompt's greedy baseline
    assert torch.equal(baselines[0::2], baselines[1::2])
    scores = gen.batch["token_level_scores"].sum(-1)
    mask = gen.batch["response_mask"].bool()
    torch.testing.assert_close(
        gen.batch["advantages"], (scores - baselines)[:, None].expand_as(mask) * mask
    )
    trainer.close()
