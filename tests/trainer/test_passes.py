"""The old-log-prob pass: when the trainer skips it, and a tiny run that skips it trains the
same weights as one that runs it."""

from __future__ import annotations

import pytest
import torch

from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.passes import old_log_prob_pass
from verl.trainer.rl.trainer import RLTrainer

from .varied_reward import assert_updates_moved, even_token_reward

ONE_STEP = ("actor_rollout_ref.actor.ppo_mini_batch_size=4",)  # = data.train_batch_size
A = "actor_rollout_ref.actor"


@pytest.mark.parametrize(
    "overrides, runs",
    [
        ((), True),  # two mini-batches per batch
        (ONE_STEP, False),
        ((*ONE_STEP, f"{A}.ppo_epochs=2"), True),
        ((*ONE_STEP, "algorithm.use_kl_in_reward=true"), True),
        ((*ONE_STEP, "algorithm.adv_estimator=optimal_token_baseline"), True),
        ((*ONE_STEP, f"{A}.use_kl_loss=true", f"{A}.rollout_is_threshold=2.0"), False),
        ((*ONE_STEP, f"{A}.recompute_old_log_prob=true"), True),
        ((*ONE_STEP, f"{A}.recompute_old_log_prob=false"), False),
    ],
)
def test_auto_skips_the_pass_only_when_nothing_needs_it(rl_config, overrides, runs):
    assert old_log_prob_pass(rl_config(*overrides)) is runs


def test_forcing_the_skip_where_it_is_wrong_names_the_reason(rl_config):
    cfg = rl_config(
        *ONE_STEP, "algorithm.use_kl_in_reward=true", f"{A}.recompute_old_log_prob=false"
    )
    with pytest.raises(ValueError, match="use_kl_in_reward=true"):
        old_log_prob_pass(cfg)
    with pytest.raises(ValueError, match=r"ppo_mini_batch_size=2 < data\.train_batch_size=4"):
        old_log_prob_pass(rl_config(f"{A}.recompute_old_log_prob=false"))


def _train(cfg) -> tuple[RLTrainer, list[dict], dict[str, torch.Tensor]]:
    # a reward that differs within groups: the default one is 0 on the random model, and
    # two runs of zero updates would agree whatever the pass did
    trainer = RLTrainer(cfg, reward_fn=even_token_reward, tracker=Tracker([]))
    try:
        trainer.fit()
        module = trainer.actor_rollout_wg.workers[0].engine.module
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    finally:
        trainer.close()
    return trainer, trainer.history, weights


@pytest.mark.slow  # two training runs
def test_a_run_without_the_pass_trains_like_one_with_it(rl_config):
    common = (*ONE_STEP, "trainer.val_before_train=false", "trainer.test_freq=-1")
    with_pass, history_with, weights_with = _train(
        rl_config(*common, f"{A}.recompute_old_log_prob=true")
    )
    without, history_without, weights_without = _train(rl_config(*common))
    assert with_pass.old_log_prob_pass and not without.old_log_prob_pass
    assert "timing_s/old_log_prob" in history_with[0]
    assert "timing_s/old_log_prob" not in history_without[0]
    assert_updates_moved(history_with)
    for row_with, row_without in zip(history_with, history_without, strict=True):
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert row_without[key] == pytest.approx(row_with[key], abs=1e-5), key
        assert row_without["rollout/logprob_abs_diff_mean"] < 1e-4
    for name, value in weights_with.items():
        torch.testing.assert_close(weights_without[name], value, atol=1e-6, rtol=0)
