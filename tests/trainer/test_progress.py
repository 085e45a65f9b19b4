"""The progress bar shows the step just finished: after step k its postfix is step k's."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

import verl.trainer.lifecycle.driver as trainer_loop
from verl.trainer.lifecycle.progress import advance, step_postfix
from verl.trainer.rl.trainer import RLTrainer


def test_step_postfix_formats_known_keys_and_skips_missing():
    metrics = {
        "critic/score/mean": 0.25,
        "reward/acc": 0.5,
        "timing_s/step": 1.234,
        "actor/pg_loss": 3.0,
    }
    assert step_postfix(metrics) == {"reward": "0.250", "acc": "0.500", "step_s": "1.23"}
    assert step_postfix({"train/loss": float("nan"), "reward/acc": "n/a"}) == {"loss": "nan"}


def test_advance_shows_this_steps_values_at_once():
    out = io.StringIO()
    # mininterval large: without the forced redraw, update() would not draw the new postfix
    bar = tqdm(total=3, file=out, mininterval=1000, ascii=True)
    steps = [
        {"critic/score/mean": 0.1, "reward/acc": 0.0, "timing_s/step": 2.0},
        {"critic/score/mean": 0.7, "reward/acc": 0.5, "timing_s/step": 3.5},
    ]
    for k, metrics in enumerate(steps, start=1):
        advance(bar, metrics)
        last_line = out.getvalue().split("\r")[-1]
        assert f"{k}/3" in last_line
        assert f"reward={metrics['critic/score/mean']:.3f}" in last_line
        assert f"acc={metrics['reward/acc']:.3f}" in last_line
        assert f"step_s={metrics['timing_s/step']:.2f}" in last_line
    bar.close()


def test_advance_on_a_disabled_bar_is_silent():
    out = io.StringIO()
    bar = tqdm(total=2, file=out, disable=True)
    advance(bar, {"critic/score/mean": 1.0})
    assert out.getvalue() == ""


@pytest.mark.slow
def test_rl_trainer_bar_after_step_k_shows_step_k(rl_config, monkeypatch):
    shown: dict[int, dict[str, str]] = {}

    class RecordingBar(tqdm):
        def display(self, msg=None, pos=None):
            shown[self.n] = dict(self.postfix_dict)
            return super().display(msg, pos)

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            self.postfix_dict = dict(ordered_dict or {}, **kwargs)
            super().set_postfix(ordered_dict, refresh=refresh, **kwargs)

    RecordingBar.postfix_dict = {}
    monkeypatch.setattr(trainer_loop, "tqdm", RecordingBar)
    trainer = RLTrainer(rl_config("trainer.test_freq=2", "trainer.val_before_train=false"))
    trainer.fit()
    assert len(trainer.history) == 2
    for k, metrics in enumerate(trainer.history, start=1):
        assert shown[k] == step_postfix(metrics)
        assert shown[k]["reward"] == f"{metrics['critic/score/mean']:.3f}"
        assert shown[k]["step_s"] == f"{metrics['timing_s/step']:.2f}"
    assert "val_acc" in shown[2] and "val_acc" not in shown[1]
