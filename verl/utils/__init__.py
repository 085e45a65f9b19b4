"""Small shared utilities: devices, torch.distributed set-up, log-prob kernels.

``set_device_map`` is re-exported here from ``verl.compat.device_map`` (the short Python
form of the ``resource_pool`` section; with a ``DataParallelConfig`` alone it also keeps
the map for the trainers built afterwards), imported on first use.
"""

from __future__ import annotations

from verl.utils.lazy import lazy_exports

_LAZY = {"set_device_map": "verl.compat.device_map"}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
