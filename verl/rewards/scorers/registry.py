"""Scorer registry: maps a batch's `data_source` to the scorer that grades it.

A scorer is `compute_score(solution_str, ground_truth, extra_info=None) -> float | dict`
(a dict holds "score" and may add "acc", "pred", ...). Built-in data sources:

| data_source | scorer |
|---|---|
| `arithmetic` | `scorers.arithmetic` |
| `gsm8k`, `openai/gsm8k` | `scorers.gsm8k` (method="strict") |
| `math`, `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval` | `scorers.math_dataset` |
| `code` | `scorers.code` (sandboxed subprocess, see `verl/rewards/sandbox.py`) |
| `math_dapo`, `math_dapo_reasoning`, `aime`, any `aime...` | `scorers.math_dapo` (1 / -1) |

Add your own with the decorator, or change a built-in's options with `override=True`:

    @register_scorer("my_task")
    def compute_score(solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)

    register_scorer("gsm8k", override=True)(partial(gsm8k.compute_score, method="flexible"))

The built-in entries are declared (lazily) in `verl.registry.builtin`; a name already
registered raises unless `override=True`, the rule of every verl registry.

An unknown data source is a configuration error, not a scoring failure: `get_scorer` and
`default_compute_score` raise `UnknownDataSourceError` naming the known sources (the reward
manager checks this once per batch, before scoring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.registry import REWARD_SCORERS

Scorer = Callable[..., Any]

# The data sources' scorers (verl.registry.REWARD_SCORERS; built-ins are imported on first use).
_SCORERS = REWARD_SCORERS


# a data source starting with this is scored as the registered source of that name (upstream
# scores every "aime..." source with its DAPO math scorer)
PREFIX_SOURCES = ("aime",)


class UnknownDataSourceError(ValueError):
    """No scorer is registered for a data source."""


def register_scorer(name: str, *, override: bool = False) -> Callable[[Scorer], Scorer]:
    """Decorator registering a scorer for `data_source == name`; returns the scorer unchanged.

    Raises:
        ValueError: `name` is already registered and `override` is False.
    """

    def decorator(fn: Scorer) -> Scorer:
        if not callable(fn):
            raise TypeError(f"register_scorer({name!r}) got a non-callable {fn!r}")
        _SCORERS.add(name, fn, override=override)
        return fn

    return decorator


def known_data_sources() -> list[str]:
    """Sorted names of all registered data sources."""
    return _SCORERS.names()


def get_scorer(data_source: str) -> Scorer:
    """The scorer registered for `data_source`.

    Raises:
        UnknownDataSourceError: nothing is registered under that name.
    """
    if (
        isinstance(data_source, str)
        and data_source.startswith(PREFIX_SOURCES)
        and (data_source not in _SCORERS)
    ):
        return _SCORERS.get(PREFIX_SOURCES[0])  # aime_2026, aime-i, ... as upstream reads them
    if data_source not in _SCORERS:
        raise UnknownDataSourceError(
            f"no reward scorer for data_source={data_source!r}; known data sources: "
            f"{', '.join(known_data_sources())}. Register one with "
            "@verl.rewards.register_scorer(name) or pass a custom reward function."
        )
    return _SCORERS.get(data_source)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
) -> float | dict[str, Any]:
    """Score one response with the scorer registered for its data source.

    Same keyword signature as a custom reward function, so the two are interchangeable.

    Raises:
        UnknownDataSourceError: `data_source` is not registered.
    """
    return get_scorer(data_source)(solution_str, ground_truth, extra_info)
