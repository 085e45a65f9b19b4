"""Small shared utilities: devices, torch.distributed set-up, log-prob kernels.

``set_device_map`` is re-exported here from ``verl.config.device_map`` (the short Python
form of the ``resource_pool`` section), imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["set_device_map"]


def __getattr__(name: str) -> Any:
    if name == "set_device_map":
        from verl.config.device_map import set_device_map

        return set_device_map
    raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
