"""The API edge: other spellings of verl's names, mapped onto the native ones.

Tutorials and older releases spell things differently: ``from verl.trainer.ppo import
PPOTrainer``, ``DataCollector``, torch dtypes where a precision is named, per-role
``parallel_config`` blocks in YAML, ``set_device_map(dp_config)`` alone. This package holds
the alias tables and the small adapters that accept them, each logging a note naming the
native spelling. It sits above the config, which imports nothing of it: the config loader
and ``TrainerConfig(...)`` ask ``verl.registry.CONFIG_ADAPTERS`` for their input adapters,
whose built-in entries name this package's (``verl.compat.loading`` for YAML trees,
overrides and enumerated values, ``verl.compat.flat_keys`` for the keywords, with
``verl.compat.precision_keys``); ``verl.compat.upstream`` is upstream verl's key table.
The other modules sit on top of the trainer. Names are imported lazily.

See ``docs/tutorials/`` for the tables, one page per tutorial.
"""

from __future__ import annotations

from verl.utils.lazy import lazy_exports

_LAZY = {
    "AliasError": "verl.compat.aliases",
    "translate_flat_kwargs": "verl.compat.aliases",
    "translate_override": "verl.compat.aliases",
    "translate_tree": "verl.compat.aliases",
    "DataCollector": "verl.compat.collector",
    "set_device_map": "verl.compat.device_map",
    "pending_device_map": "verl.compat.device_map",
    "clear_device_map": "verl.compat.device_map",
    "apply_pending_device_map": "verl.compat.device_map",
}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
