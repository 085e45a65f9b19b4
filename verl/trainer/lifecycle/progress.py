"""The training progress bar: one tqdm bar whose postfix is the step just finished.

``advance(bar, metrics)`` sets the postfix from the step's metrics *before* the bar moves
and redraws it, so the line a user reads after step k carries step k's reward, accuracy
and step time. (Setting the postfix with ``refresh=False`` after ``update`` showed step
k-1's values until the next redraw.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tqdm.auto import tqdm

# postfix name -> (metric key, format); the first that a step reports are shown, in order
POSTFIX_KEYS: tuple[tuple[str, str, str], ...] = (
    ("reward", "critic/score/mean", "{:.3f}"),
    ("acc", "reward/acc", "{:.3f}"),
    ("val_acc", "val/acc", "{:.3f}"),
    ("loss", "train/loss", "{:.4f}"),
    ("step_s", "timing_s/step", "{:.2f}"),
)


def step_postfix(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The bar's postfix for one step's ``metrics``: the keys of :data:`POSTFIX_KEYS` the
    step reports (a missing or non-numeric metric is left out, not shown as nan)."""
    out: dict[str, str] = {}
    for name, key, fmt in POSTFIX_KEYS:
        value = metrics.get(key)
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = fmt.format(value) if math.isfinite(value) else str(value)
    return out


def advance(bar: tqdm, metrics: Mapping[str, Any]) -> None:
    """Move ``bar`` one step and show ``metrics`` (the step just finished) in its postfix."""
    bar.set_postfix(step_postfix(metrics), refresh=False)
    bar.update(1)
    # update() redraws only when tqdm's mininterval has passed; a step's line must not wait
    if not bar.disable and bar.last_print_n != bar.n:
        bar.refresh()
