"""Small shared utilities: devices, torch.distributed set-up, log-prob kernels.

``set_device_map`` is re-exported here from ``verl.config.device_map`` (the short Python
form of the ``resource_pool`` section), imported on first use.
"""

from __future__ import annotations

from verl.utils.lazy import lazy_exports

_LAZY = {"set_device_map": "verl.config.device_map"}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
