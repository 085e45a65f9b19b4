"""Registries: the one place that says which estimators, losses, KL kinds, aggregation modes,
PF-PPO reweight methods, reward scorers, reward managers and rollout backends exist, and what each one needs,
and which adapters of other spellings the config loader applies (``CONFIG_ADAPTERS``) and
which checks it runs on each config class (``CONFIG_CHECKS``).

The bottom layer of the package: it imports nothing of verl (built-in entries are lazy
``"module:attr"`` strings), so the config layer can ask it whether ``adv_estimator=gae``
needs a critic without importing torch. See :mod:`verl.registry.core` for the
:class:`Registry` type and its duplicate-name rule, and :mod:`verl.registry.builtin` for
the extension points.
"""

from verl.registry.builtin import (
    ADVANTAGE_ESTIMATORS,
    CONFIG_ADAPTERS,
    CONFIG_CHECKS,
    DISTILL_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    PF_PPO_WEIGHTS,
    POLICY_LOSSES,
    REWARD_MANAGERS,
    REWARD_SCORERS,
    ROLLOUT_BACKENDS,
)
from verl.registry.core import Entry, Registry, UnknownNameError, did_you_mean

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "CONFIG_ADAPTERS",
    "CONFIG_CHECKS",
    "DISTILL_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PF_PPO_WEIGHTS",
    "POLICY_LOSSES",
    "REWARD_MANAGERS",
    "REWARD_SCORERS",
    "ROLLOUT_BACKENDS",
    "Entry",
    "Registry",
    "UnknownNameError",
    "did_you_mean",
]
