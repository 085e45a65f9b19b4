"""The linear and cosine KL coefficient schedules, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from verl.algorithms.kl import (
    KL_CONTROLLERS,
    CosineKLController,
    LinearKLController,
    get_kl_controller,
)


def _values(ctrl, steps: int) -> list[float]:
    out = [ctrl.value]
    for _ in range(steps):
        ctrl.update(current_kl=123.0, n_steps=64)  # the observed KL never moves a schedule
        out.append(ctrl.value)
    return out


def test_linear_ramp_0_01_to_0_1_over_4_steps_then_held():
    ctrl = get_kl_controller("linear", kl_coef=0.01, final_kl_coef=0.1, schedule_steps=4)
    assert isinstance(ctrl, LinearKLController)
    # 0.01 + 0.09 * t/4 for t = 0..4, then 0.1
    want = [0.01, 0.0325, 0.055, 0.0775, 0.1, 0.1, 0.1]
    assert _values(ctrl, 6) == pytest.approx(want)


def test_cosine_ramp_is_flat_at_both_ends():
    ctrl = get_kl_controller("cosine", kl_coef=0.01, final_kl_coef=0.1, schedule_steps=4)
    assert isinstance(ctrl, CosineKLController)
    # 0.01 + 0.09 * (1 - cos(pi t/4)) / 2
    half = (1 - math.cos(math.pi / 4)) / 2  # 0.1464
    want = [0.01, 0.01 + 0.09 * half, 0.055, 0.01 + 0.09 * (1 - half), 0.1, 0.1]
    assert _values(ctrl, 5) == pytest.approx(want)
    assert want[1] - want[0] < want[2] - want[1]  # slow start


def test_decreasing_ramp_and_resume_mid_ramp():
    ctrl = get_kl_controller("linear", kl_coef=0.2, final_kl_coef=0.0, schedule_steps=2)
    assert _values(ctrl, 3) == pytest.approx([0.2, 0.1, 0.0, 0.0])
    first = get_kl_controller("linear", kl_coef=0.01, final_kl_coef=0.1, schedule_steps=4)
    first.update(0.0, 1)
    resumed = get_kl_controller("linear", kl_coef=0.01, final_kl_coef=0.1, schedule_steps=4)
    resumed.load_state_dict(first.state_dict())
    first.update(0.0, 1)
    resumed.update(0.0, 1)
    assert resumed.value == first.value == pytest.approx(0.055)


def test_registered_and_bad_settings_name_the_key():
    assert {"fixed", "adaptive", "linear", "cosine"} <= set(KL_CONTROLLERS.names())
    with pytest.raises(ValueError, match=r"final_kl_coef=None .*algorithm.kl_ctrl.final_kl_coef"):
        get_kl_controller("cosine", kl_coef=0.01, schedule_steps=4)
    with pytest.raises(ValueError, match=r"schedule_steps=0 .*algorithm.kl_ctrl.schedule_steps"):
        get_kl_controller("linear", kl_coef=0.01, final_kl_coef=0.1, schedule_steps=0)
