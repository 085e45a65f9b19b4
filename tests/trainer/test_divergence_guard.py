"""`DivergenceGuard` on hand-made step metrics: which bound trips, the streak, the off
switches (the runs: tests/trainer/test_divergence.py)."""

from __future__ import annotations

import math

from verl.config import load_config
from verl.trainer.lifecycle.stopping import DivergenceGuard, divergence_error


def test_bounds_and_streak():
    guard = DivergenceGuard(max_grad_norm=1e5, max_policy_kl=10.0, patience=2)
    assert guard.check({"actor/grad_norm": 3.2, "actor/approx_kl": 0.01}) is None
    reason = guard.check({"actor/grad_norm": 1.6e6, "actor/approx_kl": -0.02})
    assert reason == "actor/grad_norm=1.6e+06 > trainer.divergence_max_grad_norm=100000"
    assert (guard.streak, guard.tripped) == (1, False)
    reason = guard.check({"critic/grad_norm": 2e5, "actor/approx_kl": -1082.0})
    assert reason == (
        "critic/grad_norm=2e+05 > trainer.divergence_max_grad_norm=100000; "
        "|actor/approx_kl|=1082 > trainer.divergence_max_policy_kl=10"
    )
    assert (guard.streak, guard.tripped) == (2, True)
    error = divergence_error(7, reason, guard, None)
    assert str(error).startswith("training diverged at step 7: critic/grad_norm=2e+05")
    assert "no checkpoint was saved before it" in str(error)
    # a step within the bounds ends the streak; non-finite values are not this guard's
    assert guard.check({"actor/grad_norm": math.inf, "actor/approx_kl": math.nan}) is None
    assert (guard.streak, guard.tripped) == (0, False)


def test_zero_turns_a_bound_off_and_defaults_come_from_the_config():
    off = DivergenceGuard(max_grad_norm=0, max_policy_kl=0)
    assert off.check({"actor/grad_norm": 1e30, "actor/approx_kl": 1e30}) is None
    cfg = load_config(None, ["trainer.max_consecutive_divergent_steps=3"])
    guard = DivergenceGuard.from_config(cfg.trainer)
    assert (guard.max_grad_norm, guard.max_policy_kl, guard.patience) == (1e5, 10.0, 3)
