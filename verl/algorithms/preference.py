"""Offline preference losses (DPO, IPO, KTO) as pure tensor functions, registered by name.

Every loss works on *sequence* log-probabilities: the sum over the completion's tokens of
``log pi(token | prefix)`` (see :func:`sequence_log_probs`), under the policy being trained
and under the frozen reference policy. The implicit reward of a completion is

    r = beta * (log pi_theta(y | x) - log pi_ref(y | x))

Paired losses (``dpo``, ``ipo``; registry info ``paired=True``) take the log-probs of a
chosen and a rejected completion of the same prompt::

    loss_fn(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
            ref_rejected_logps, beta=0.1, label_smoothing=0.0) -> PreferenceLoss

Unpaired losses (``kto``; ``paired=False``) take one completion per row with a
desirable / undesirable label::

    loss_fn(policy_logps, ref_logps, labels, beta=0.1, desirable_weight=1.0,
            undesirable_weight=1.0, kl=None) -> PreferenceLoss

All inputs are ``(batch,)`` float tensors (``labels``: ``(batch,)`` bool). A loss must accept
(and may ignore) extra keyword arguments: the trainer passes every coefficient of its kind. The result holds
per-row losses ``(batch,)`` (the training loss is their mean) and the detached rewards of
the chosen / desirable and rejected / undesirable completions, from which
:func:`preference_metrics` computes ``rewards/chosen``, ``rewards/rejected``,
``rewards/margins`` and ``rewards/accuracies``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from verl.algorithms.registry import Registry

__all__ = [
    "PREFERENCE_LOSSES",
    "PreferenceLoss",
    "compute_dpo_loss",
    "compute_ipo_loss",
    "compute_kto_loss",
    "get_preference_loss",
    "is_paired_loss",
    "kto_reference_point",
    "preference_metrics",
    "register_preference_loss",
    "sequence_log_probs",
]


class PreferenceLoss(NamedTuple):
    """What a preference loss returns.

    Attributes:
        losses: ``(batch,)`` per-row loss (already weighted, for KTO); minimise the mean.
        chosen_rewards: detached ``beta * log-ratio`` of the chosen (paired: ``(batch,)``,
            aligned with ``rejected_rewards``) or desirable (KTO: ``(n_desirable,)``) rows.
        rejected_rewards: the same for the rejected / undesirable rows.
        kl: KTO's reference point ``z_ref`` (0-dim, detached); ``None`` for paired losses.
    """

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    kl: torch.Tensor | None = None


PreferenceLossFn = Callable[..., PreferenceLoss]
PREFERENCE_LOSSES: Registry[PreferenceLossFn] = Registry("preference loss")


def register_preference_loss(name: str, *aliases: str, paired: bool, **info):
    """Decorator adding a preference loss under ``name``.

    ``paired=True``: the loss takes chosen/rejected pairs (DPO signature);
    ``paired=False``: it takes single labelled completions (KTO signature).
    """
    return PREFERENCE_LOSSES.register(name, *aliases, paired=paired, **info)


def get_preference_loss(name: str) -> PreferenceLossFn:
    """The preference loss registered as ``name`` (raises listing the available names)."""
    return PREFERENCE_LOSSES.get(name)


def is_paired_loss(name: str) -> bool:
    """Whether the loss ``name`` consumes chosen/rejected pairs (else labelled singles)."""
    return bool(PREFERENCE_LOSSES.info(name)["paired"])


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the log-probs of the masked (completion) tokens of each row.

    Args:
        token_log_probs: ``(batch, response_len)`` log-probs of the sampled tokens.
        mask: ``(batch, response_len)`` 1/True for completion tokens, 0 for padding.

    Returns:
        ``(batch,)`` float32. Masked positions contribute exactly 0, even when their
        log-prob is -inf or nan (padding scored against a banned token).
    """
    if token_log_probs.shape != mask.shape:
        raise ValueError(
            f"token_log_probs shape {tuple(token_log_probs.shape)} does not match mask shape "
            f"{tuple(mask.shape)}"
        )
    zeros = torch.zeros_like(token_log_probs, dtype=torch.float32)
    return torch.where(mask.bool(), token_log_probs.float(), zeros).sum(-1)


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or any(len(s) != 1 for s in shapes.values()):
        raise ValueError(f"expected tensors of one shape (batch,), got {shapes}")


def _paired_rewards(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h, chosen_rewards, rejected_rewards)`` with ``h`` the difference of log-ratios."""
    _check_same_shape(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    h = chosen_logratios - rejected_logratios
    return h, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


@register_preference_loss("dpo", "sigmoid", paired=True)
def compute_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    **kwargs,
) -> PreferenceLoss:
    """DPO (Rafailov et al. 2023), sigmoid loss with optional label smoothing (cDPO).

    With ``h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))``::

        loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

    ``eps = label_smoothing`` in ``[0, 0.5)`` is the assumed probability that a pair's
    labels are flipped; ``eps = 0`` is plain DPO.

    Args:
        policy_chosen_logps / policy_rejected_logps: ``(batch,)`` sequence log-probs under
            the policy (differentiable).
        ref_chosen_logps / ref_rejected_logps: ``(batch,)`` the same under the reference.
        beta: inverse temperature of the implicit reward (> 0).
        label_smoothing: ``eps`` above.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5)")
    h, chosen_rewards, rejected_rewards = _paired_rewards(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    logits = beta * h
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits)
    if label_smoothing:
        losses = losses - label_smoothing * F.logsigmoid(-logits)
    return PreferenceLoss(losses, chosen_rewards, rejected_rewards)


@register_preference_loss("ipo", paired=True)
def compute_ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    **kwargs,
) -> PreferenceLoss:
    """IPO (Azar et al. 2023): regress the log-ratio difference onto ``1 / (2 beta)``.

    ``loss = (h - 1 / (2 * beta)) ** 2`` with ``h`` as in :func:`compute_dpo_loss`. Here
    ``beta`` is the regularisation strength (``tau`` in the paper): a smaller beta asks for
    a larger margin. Sequence log-probs are sums over tokens (not per-token means).
    """
    h, chosen_rewards, rejected_rewards = _paired_rewards(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    losses = (h - 1.0 / (2.0 * beta)) ** 2
    return PreferenceLoss(losses, chosen_rewards, rejected_rewards)


def kto_reference_point(policy_logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """KTO's ``z_ref``: ``max(0, mean_i(log pi(y_i|x_i) - log ref(y_i|x_i)))``, detached.

    An estimate of ``KL(pi || ref)`` from the rows at hand (``(batch,)`` each; returns a
    0-dim tensor). The KTO paper averages over *mismatched* pairs ``(x_i, y_j)`` instead,
    which needs an extra forward pass per step and reference log-probs of pairs that change
    with every shuffle; this batch mean needs neither. It is not differentiated through.
    """
    return (policy_logps - ref_logps).detach().mean().clamp(min=0.0)


@register_preference_loss("kto", paired=False)
def compute_kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    kl: torch.Tensor | float | None = None,
    **kwargs,
) -> PreferenceLoss:
    """KTO (Ethayarajh et al. 2024) on single completions labelled desirable or not.

    With ``r_i = log pi(y_i|x_i) - log ref(y_i|x_i)`` and reference point ``z`` (``kl``)::

        desirable:   loss_i = desirable_weight   * (1 - sigmoid(beta * (r_i - z)))
        undesirable: loss_i = undesirable_weight * (1 - sigmoid(beta * (z - r_i)))

    Args:
        policy_logps / ref_logps: ``(batch,)`` sequence log-probs.
        labels: ``(batch,)`` bool, True = desirable.
        beta: reward scale (> 0).
        desirable_weight / undesirable_weight: per-class loss weights (balance the classes
            when one is rarer).
        kl: the reference point ``z``; ``None`` = :func:`kto_reference_point` of this batch.
    """
    _check_same_shape(policy_logps=policy_logps, ref_logps=ref_logps, labels=labels)
    if labels.dtype != torch.bool:
        raise TypeError(f"labels must be a bool tensor (True = desirable), got {labels.dtype}")
    z = kto_reference_point(policy_logps, ref_logps) if kl is None else kl
    z = torch.as_tensor(z, dtype=torch.float32, device=policy_logps.device).detach()
    logratios = policy_logps - ref_logps
    desirable = desirable_weight * (1.0 - torch.sigmoid(beta * (logratios - z)))
    undesirable = undesirable_weight * (1.0 - torch.sigmoid(beta * (z - logratios)))
    losses = torch.where(labels, desirable, undesirable)
    rewards = beta * logratios.detach()
    return PreferenceLoss(losses, rewards[labels], rewards[~labels], z)


def preference_metrics(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, paired: bool
) -> dict[str, float]:
    """``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``.

    Paired: means over pairs, margin = mean(chosen - rejected), accuracy = fraction of
    pairs whose chosen reward is strictly larger. Unpaired (KTO): chosen / rejected are
    the means over desirable / undesirable rows, margin is their difference, accuracy is
    the fraction of rows on the right side of 0 (desirable > 0, undesirable < 0). A key
    whose rows are absent from the batch is left out.
    """
    out: dict[str, float] = {}
    if chosen_rewards.numel():
        out["rewards/chosen"] = float(chosen_rewards.float().mean())
    if rejected_rewards.numel():
        out["rewards/rejected"] = float(rejected_rewards.float().mean())
    if paired:
        if chosen_rewards.shape != rejected_rewards.shape:
            raise ValueError(
                f"paired rewards must align: chosen {tuple(chosen_rewards.shape)} vs "
                f"rejected {tuple(rejected_rewards.shape)}"
            )
        if chosen_rewards.numel():
            out["rewards/margins"] = float((chosen_rewards - rejected_rewards).float().mean())
            out["rewards/accuracies"] = float((chosen_rewards > rejected_rewards).float().mean())
        return out
    if chosen_rewards.numel() and rejected_rewards.numel():
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    total = chosen_rewards.numel() + rejected_rewards.numel()
    if total:
        right = (chosen_rewards > 0).sum() + (rejected_rewards < 0).sum()
        out["rewards/accuracies"] = float(right) / total
    return out
