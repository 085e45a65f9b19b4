"""The optimizer of a train engine: AdamW and a warm-up + cosine/constant LR schedule.

``OptimSpec`` is the engine-side description (built from a role's ``optim`` config section
with :meth:`OptimSpec.from_config`); ``build_adamw`` and ``build_lr_scheduler`` turn it into
torch objects for :class:`verl.engine.base.TrainEngine`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["OptimSpec", "build_adamw", "build_lr_scheduler"]


@dataclass
class OptimSpec:
    """AdamW hyper-parameters and the LR schedule.

    The schedule is a linear warm-up over ``warmup_steps`` optimizer steps (step ``s``,
    counted from 0, uses ``lr * (s + 1) / warmup_steps``, so the first step is not wasted at
    lr 0), then ``warmup_style``: ``"constant"`` keeps ``lr``; ``"cosine"`` decays from
    ``lr`` to ``lr * min_lr_ratio`` at ``total_steps`` and stays there.
    """

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    eps: float = 1e-8
    warmup_steps: int = 0
    warmup_style: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int | None = None

    def __post_init__(self) -> None:
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if self.lr < 0:
            raise ValueError(f"optim lr={self.lr} must be >= 0")
        if self.warmup_steps < 0:
            raise ValueError(f"optim warmup_steps={self.warmup_steps} must be >= 0")
        if self.warmup_style not in ("constant", "cosine"):
            raise ValueError(
                f"optim warmup_style={self.warmup_style!r} is not supported; "
                "use 'constant' or 'cosine'"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.warmup_style == "cosine" and not self.total_steps:
            raise ValueError(
                f"optim warmup_style='cosine' needs total_steps > 0, got {self.total_steps}; "
                "pass the number of optimizer steps of the run"
            )

    @classmethod
    def from_config(cls, optim_cfg: Any, total_steps: int | None = None) -> OptimSpec:
        """Build from a config ``optim`` section (duck-typed on its attribute names).

        Reads ``lr, betas, weight_decay, eps, lr_warmup_steps, lr_warmup_steps_ratio,
        warmup_style, min_lr_ratio, total_training_steps``. ``total_steps`` (what the
        trainer computed) wins over ``total_training_steps`` when given. Warm-up is
        ``lr_warmup_steps`` if it is >= 0, else ``int(lr_warmup_steps_ratio * total)``.
        """
        total = total_steps
        if total is None:
            total = getattr(optim_cfg, "total_training_steps", None)
        total = int(total) if total is not None and total > 0 else None
        warmup = optim_cfg.lr_warmup_steps
        if warmup is None or warmup < 0:
            ratio = optim_cfg.lr_warmup_steps_ratio
            if ratio and total is None:
                raise ValueError(
                    f"optim lr_warmup_steps_ratio={ratio} needs the total number of "
                    "training steps; set total_training_steps or lr_warmup_steps"
                )
            warmup = int(ratio * total) if ratio else 0
        return cls(
            lr=optim_cfg.lr,
            betas=tuple(optim_cfg.betas),
            weight_decay=optim_cfg.weight_decay,
            eps=optim_cfg.eps,
            warmup_steps=int(warmup),
            warmup_style=optim_cfg.warmup_style,
            min_lr_ratio=optim_cfg.min_lr_ratio,
            total_steps=total,
        )

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.warmup_style == "constant":
            return 1.0
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def build_adamw(params: list[nn.Parameter], spec: OptimSpec) -> torch.optim.AdamW:
    """AdamW over ``params``, fused kernel when the device supports it, else foreach."""
    kwargs = dict(lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except RuntimeError as err:  # device/dtype without a fused kernel
        logger.info("fused AdamW unavailable (%s); using foreach", err)
        return torch.optim.AdamW(params, foreach=True, **kwargs)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, spec: OptimSpec
) -> torch.optim.lr_scheduler.LambdaLR:
    # A plain function (not a bound method) so LambdaLR.state_dict() stores no lambda state.
    def factor(step: int) -> float:
        return spec.lr_factor(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
