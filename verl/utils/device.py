"""Which device a worker computes on, resolved once from ``trainer.device``."""

from __future__ import annotations

import torch


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> ``cuda:<local_rank>`` when CUDA is available, else ``cpu``.

    ``"cuda"`` on a machine without CUDA is an error rather than a silent CPU run.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "trainer.device=cuda but torch.cuda.is_available() is False on this machine; "
                "use trainer.device=auto or trainer.device=cpu"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    raise ValueError(f"trainer.device={name!r}; expected 'auto', 'cpu' or 'cuda'")
