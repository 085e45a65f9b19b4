"""The registry type of every algorithm extension point (re-exported from :mod:`verl.registry`).

Advantage estimators, policy losses, KL estimators, KL controllers and loss-aggregation
modes are :class:`Registry` instances declared in :mod:`verl.registry.builtin`; adding an
algorithm is one decorated function::

    @register_advantage_estimator("my_estimator", needs_index=True)
    def my_estimator(token_level_rewards, response_mask, index, **kwargs): ...

``get(name)`` raises :class:`UnknownNameError` that lists the registered names and, when the
name looks like a typo, suggests the closest one.
"""

from verl.registry.core import Entry, Registry, UnknownNameError

__all__ = ["Entry", "Registry", "UnknownNameError"]
