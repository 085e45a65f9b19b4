"""KL-divergence estimators between the policy and the reference, and KL coefficient control.

Per-token estimators of ``KL(pi || pi_ref)`` from the log-probs of the *sampled* tokens
(Schulman, "Approximating KL divergence", 2020), with ``log_r = log_prob - ref_log_prob``:

========================= =========================================================
``k1`` (alias ``kl``)      ``log_r``: unbiased, high variance, can be negative
``abs``                    ``|log_r|``
``k2`` (alias ``mse``)     ``0.5 * log_r**2``: biased, low variance, >= 0
``k3`` (``low_var_kl``)    ``exp(-log_r) + log_r - 1``: unbiased, >= 0, clamped to
                           [-10, 10] (log_r first clamped to [-20, 20]) for stability
========================= =========================================================

Appending ``+`` to a name (``k3+``) keeps that estimator's value but takes the gradient of
``k2``, whose gradient is the unbiased KL gradient (a straight-through estimator).

KL is used two ways: as a per-token reward penalty (:func:`apply_kl_penalty`, PPO with a
coefficient from a :class:`FixedKLController`, an :class:`AdaptiveKLController` or a
:class:`ScheduledKLController` ramping it from one value to another over steps), or as an
actor loss term (:func:`compute_kl_loss`, GRPO).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.loss_agg import agg_loss
from verl.registry import KL_CONTROLLERS, KL_ESTIMATORS

__all__ = [
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "CosineKLController",
    "FixedKLController",
    "LinearKLController",
    "ScheduledKLController",
    "apply_kl_penalty",
    "compute_kl_loss",
    "get_kl_controller",
    "kl_penalty",
]

# The estimators, registered in verl.registry.builtin as k1 (kl), abs, k2 (mse), k3 (low_var_kl).


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _abs(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # Written in terms of ref/pi: exp(ref - logp) - (ref - logp) - 1.
    neg = torch.clamp(-log_ratio, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference.

    Args:
        log_prob: policy log-probs of the sampled tokens, ``(batch, response_len)``.
        ref_log_prob: reference log-probs of the same tokens, ``(batch, response_len)``.
        kind: an estimator name from the module docstring, optionally suffixed with ``+``.

    Returns:
        ``(batch, response_len)``; masked positions are *not* zeroed (callers mask).
    """
    straight_through = isinstance(kind, str) and kind.endswith("+")
    estimator = KL_ESTIMATORS.get(kind[:-1] if straight_through else kind)
    log_ratio = log_prob - ref_log_prob
    value = estimator(log_ratio)
    if not straight_through:
        return value
    grad_path = _k2(log_ratio)
    return value.detach() + grad_path - grad_path.detach()


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """KL to the reference as an actor loss term (GRPO's ``use_kl_loss``), a 0-dim tensor.

    The actor adds ``kl_loss_coef *`` this to its policy loss. Shapes as in :func:`kl_penalty`.
    """
    return agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask, loss_agg_mode)


# --------------------------------------------------------------------------- controllers


class FixedKLController:
    """A constant KL coefficient. ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef={kl_coef} must be >= 0")
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """No-op, kept so both controllers are used the same way."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl``.

    From Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences":
    ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + error * n_steps / horizon``. ``n_steps`` is the number of samples the KL
    was measured on (the batch size), ``horizon`` the number of samples over which the
    coefficient may change by about ``e**0.2``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef={init_kl_coef} must be >= 0")
        if target_kl is None or target_kl <= 0:
            raise ValueError(f"target_kl={target_kl} must be > 0 for the adaptive KL controller")
        if horizon is None or horizon <= 0:
            raise ValueError(f"horizon={horizon} must be > 0 for the adaptive KL controller")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Move the coefficient after observing mean KL ``current_kl`` over ``n_steps`` samples."""
        current = float(current_kl)
        error = min(max(current / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient; ``target``/``horizon`` stay as configured for this run."""
        self.value = float(state["value"])


class ScheduledKLController:
    """A coefficient ramped from ``kl_coef`` to ``final_kl_coef`` over ``schedule_steps``
    trainer steps, then held (``kl_coef=0.01`` at first, raised to ``0.1``).

    After ``t`` calls of ``update`` (one per trainer step), with ``x = min(t / T, 1)``:
    ``value = kl_coef + (final_kl_coef - kl_coef) * shape(x)``, where ``shape(x) = x``
    (:class:`LinearKLController`) or ``(1 - cos(pi x)) / 2`` (:class:`CosineKLController`,
    flat at both ends). Step 0 uses ``kl_coef``; a decreasing ramp works the same way. The
    observed KL does not move it.
    """

    shape_name = "linear"

    def __init__(self, kl_coef: float, final_kl_coef: float | None, schedule_steps: int) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef={kl_coef} must be >= 0")
        if final_kl_coef is None or final_kl_coef < 0:
            raise ValueError(
                f"final_kl_coef={final_kl_coef} must be >= 0 for the {self.shape_name} KL "
                "schedule (algorithm.kl_ctrl.final_kl_coef: the coefficient it ramps to)"
            )
        if schedule_steps is None or schedule_steps < 1:
            raise ValueError(
                f"schedule_steps={schedule_steps} must be >= 1 for the {self.shape_name} KL "
                "schedule (algorithm.kl_ctrl.schedule_steps: trainer steps of the ramp)"
            )
        self.start = float(kl_coef)
        self.end = float(final_kl_coef)
        self.steps = int(schedule_steps)
        self.step = 0
        self.value = self.start

    @staticmethod
    def shape(x: float) -> float:
        return x

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Advance one trainer step along the ramp (``current_kl``/``n_steps`` unused)."""
        self.step += 1
        x = min(self.step / self.steps, 1.0)
        self.value = self.start + (self.end - self.start) * self.shape(x)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position on the ramp; its ends and length stay as configured."""
        self.step = int(state.get("step", 0))
        self.value = float(state["value"])


class LinearKLController(ScheduledKLController):
    """:class:`ScheduledKLController` with a straight ramp."""


class CosineKLController(ScheduledKLController):
    """:class:`ScheduledKLController` with a half-cosine ramp (slow start and end)."""

    shape_name = "cosine"

    @staticmethod
    def shape(x: float) -> float:
        return (1.0 - math.cos(math.pi * x)) / 2.0


KLController = FixedKLController | AdaptiveKLController | ScheduledKLController


def get_kl_controller(
    type: str,
    kl_coef: float,
    target_kl: float | None = None,
    horizon: float | None = None,
    final_kl_coef: float | None = None,
    schedule_steps: int | None = None,
) -> KLController:
    """Build the controller named ``type``: ``"fixed"``, ``"adaptive"``, ``"linear"`` or
    ``"cosine"`` (or a registered one, built from ``kl_coef`` alone).

    ``target_kl`` and ``horizon`` are required (and > 0) for ``"adaptive"``;
    ``final_kl_coef`` (>= 0) and ``schedule_steps`` (>= 1) for the schedules; each is
    ignored by the others.
    """
    cls = KL_CONTROLLERS.get(type)
    if cls is AdaptiveKLController:
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    if inspect.isclass(cls) and issubclass(cls, ScheduledKLController):
        return cls(kl_coef, final_kl_coef, schedule_steps)
    return cls(kl_coef)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract a per-token KL penalty from the scores and update the controller.

    ``rewards = scores - beta * kl * mask`` with ``beta = kl_ctrl.value`` *before* the update.
    The controller is then updated with the batch KL: the mean over sequences (with at least
    one valid token) of each sequence's mean token KL, with ``n_steps = batch``.

    Args:
        token_level_scores: ``(batch, response_len)``, score on the last valid token.
        old_log_prob, ref_log_prob: ``(batch, response_len)``.
        response_mask: ``(batch, response_len)``.
        kl_ctrl: a KL controller (mutated).
        kind: KL estimator, see :func:`kl_penalty`.

    Returns:
        ``(token_level_rewards, metrics)`` with metrics ``actor/reward_kl_penalty`` (the batch
        KL above) and ``actor/reward_kl_penalty_coeff`` (``beta``), as floats.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, kind)
    kld = torch.where(mask != 0, kld * mask, torch.zeros_like(kld))
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld

    seq_kl = masked_mean(kld, mask, dim=-1)
    current_kl = float(masked_mean(seq_kl, mask.sum(dim=-1) > 0))
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics
