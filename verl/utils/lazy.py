"""Lazy exports: a package names its public objects without importing their modules.

``import verl`` must stay cheap (no torch, no Ray), yet ``verl.RLTrainer`` and
``verl.controller.RayWorkerGroup`` must work. A package lists ``{name: module}`` and sets
its module-level ``__getattr__`` (PEP 562) to :func:`lazy_exports`'s result::

    _LAZY = {"RayWorkerGroup": "verl.controller.ray_backend"}
    __getattr__ = lazy_exports(__name__, _LAZY)

The first access imports the module and caches the object in the package's namespace, so
later accesses are plain attribute lookups. This module imports nothing of verl.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` for ``package`` resolving ``names`` on first access.

    Args:
        package: the importing module's ``__name__``; named in the ``AttributeError`` for
            an unknown attribute, as Python's own message does.
        names: public name -> dotted module that defines an attribute of that name.
    """
    table = dict(names)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
