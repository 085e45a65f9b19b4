"""Rule-based scorers (response text -> score) and the registry that picks one per data source."""

from verl.rewards.scorers.registry import (
    Scorer,
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    known_data_sources,
    register_scorer,
)

__all__ = [
    "Scorer",
    "UnknownDataSourceError",
    "default_compute_score",
    "get_scorer",
    "known_data_sources",
    "register_scorer",
]
