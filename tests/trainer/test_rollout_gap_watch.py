"""The synchronous run's watch over the rollout-vs-trainer log-prob gap: numerics stay quiet,
a gap that only other weights explain warns (rate-limited), and the trainer wires it."""

from __future__ import annotations

import logging

from verl.trainer.lifecycle.metrics import RolloutGapWatch

GAP = "rollout/logprob_abs_diff_mean"


def test_numerical_gaps_and_missing_metrics_stay_quiet(caplog):
    watch = RolloutGapWatch()
    with caplog.at_level(logging.WARNING):
        assert not watch({GAP: 3.5e-4}, 1)  # bf16 kernels
        assert not watch({}, 2)  # no rollout log-probs this step
        assert not watch({GAP: float("nan")}, 3)
    assert not caplog.records


def test_a_stale_rollout_gap_warns_once_per_window(caplog):
    watch = RolloutGapWatch(threshold=0.05, every=20)
    with caplog.at_level(logging.WARNING):
        assert watch({GAP: 0.0875}, 2)
        assert not watch({GAP: 0.2}, 3)  # within the window
        assert not watch({GAP: 0.2}, 21)
        assert watch({GAP: 0.2}, 22)
    assert len(caplog.records) == 2
    message = caplog.records[0].getMessage()
    assert "step 2" in message and "0.0875" in message and GAP in message
    assert "current weights" in message


def test_the_trainer_watches_synchronous_runs_only(rl_config):
    from verl.trainer.rl.trainer import RLTrainer

    sync = RLTrainer(rl_config("trainer.val_before_train=false"))
    assert isinstance(sync._gap_watch, RolloutGapWatch)
    off = RLTrainer(rl_config("trainer.val_before_train=false", "trainer.async_rollout=true"))
    assert off._gap_watch is None
