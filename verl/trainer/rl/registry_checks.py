"""The RL config's keys whose values are registry names, checked against the live
``verl.registry`` (part of ``verl.trainer.rl.config_checks``): a name key must name an entry
(a user's ``register_*`` counts once it ran); an open hyperparameter mapping
(``algorithm.adv_estimator_kwargs``) may hold only the named hyperparameters of the entry
its name key selects (read from the entry's signature).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from verl.config.load import get_path
from verl.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    PF_PPO_WEIGHTS,
    POLICY_LOSSES,
    REWARD_MANAGERS,
    ROLLOUT_BACKENDS,
    Registry,
    did_you_mean,
)
from verl.utils.yaml_text import show

__all__ = ["KWARGS_KEYS", "NULLABLE_KEYS", "REGISTRY_KEYS", "registry_problems"]

REGISTRY_KEYS: dict[str, Registry] = {
    "algorithm.adv_estimator": ADVANTAGE_ESTIMATORS,
    "algorithm.kl_penalty": KL_ESTIMATORS,
    "algorithm.kl_ctrl.type": KL_CONTROLLERS,
    "algorithm.pf_ppo.reweight_method": PF_PPO_WEIGHTS,
    "actor_rollout_ref.actor.policy_loss": POLICY_LOSSES,
    "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG_MODES,
    "actor_rollout_ref.actor.kl_loss_type": KL_ESTIMATORS,
    "actor_rollout_ref.rollout.name": ROLLOUT_BACKENDS,
    "critic.loss_agg_mode": LOSS_AGG_MODES,
    "reward_model.reward_manager": REWARD_MANAGERS,
}
# name keys where null is allowed (it means a default that is resolved elsewhere)
NULLABLE_KEYS = frozenset({"actor_rollout_ref.actor.loss_agg_mode"})
# open hyperparameter mapping -> the name key whose entry it configures
KWARGS_KEYS: dict[str, str] = {
    "algorithm.adv_estimator_kwargs": "algorithm.adv_estimator",
    "actor_rollout_ref.actor.policy_loss_kwargs": "actor_rollout_ref.actor.policy_loss",
}


def registry_problems(cfg: Any, skip: Collection[str] = ()) -> list[tuple[tuple[str, ...], str]]:
    """``(keys, message)`` for every registry-backed key or mapping of ``cfg`` that its
    registry rejects; each message names the key, the value and the allowed names. Name
    keys in ``skip`` are left to the caller."""
    problems: list[tuple[tuple[str, ...], str]] = []
    for path, registry in REGISTRY_KEYS.items():
        if path in skip:
            continue
        value = get_path(cfg, path)
        if registry is KL_ESTIMATORS and isinstance(value, str):
            value = value.removesuffix("+")  # the straight-through variant of an estimator
        if value in registry or (value is None and path in NULLABLE_KEYS):
            continue
        names = registry.names(include_aliases=True)
        close = did_you_mean(value, names)
        hint = f"; did you mean {close}?" if close else ""
        problems.append(
            (
                (path,),
                f"{path}={show(get_path(cfg, path))}: must be one of {', '.join(names)}{hint}",
            )
        )
    for path, name_path in KWARGS_KEYS.items():
        kwargs, name = get_path(cfg, path), get_path(cfg, name_path)
        registry = REGISTRY_KEYS[name_path]
        if not kwargs or name not in registry:
            continue
        try:
            messages = registry.entry(name).kwargs_problems(kwargs, path)
        except ImportError as exc:
            messages = [f"{name_path}={show(name)}: {exc}"]
        problems.extend(((path, name_path), message) for message in messages)
    return problems
