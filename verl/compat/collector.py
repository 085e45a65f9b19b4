"""``DataCollector``: rollouts for a stream of prompts, from a step-by-step trainer.

Tutorial 002 imports ``DataCollector`` beside ``Trainer`` and ``make_trainer_config``. Here
it is a thin adapter over any trainer with ``collect_data(prompts)`` (``verl.Trainer``)::

    collector = DataCollector(trainer, prompts, batch_size=8)
    for data in collector:                    # one DataProto per 8 prompts
        metrics = trainer.update_policy(data)

``collector.collect(prompts)`` (or ``collector(prompts)``) is ``trainer.collect_data``.
It imports nothing of verl, so it works with any object offering that method.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["DataCollector"]


class DataCollector:
    """Rollout + rewards + advantages of prompts, ``batch_size`` prompts at a time.

    Args:
        trainer: an object with ``collect_data(prompts) -> DataProto`` (``verl.Trainer``).
        prompts: optional prompts to iterate over (strings, chat message lists, or dicts
            with ``prompt`` and optional ``ground_truth`` / ``data_source``).
        batch_size: prompts per collected batch; default: the trainer config's
            ``data.train_batch_size``. A last batch with fewer prompts is collected too.
    """

    def __init__(
        self, trainer: Any, prompts: Sequence[Any] = (), batch_size: int | None = None
    ) -> None:
        if not callable(getattr(trainer, "collect_data", None)):
            raise TypeError(
                f"DataCollector needs a trainer with collect_data(prompts) (verl.Trainer), "
                f"got {type(trainer).__name__}"
            )
        if batch_size is None:
            batch_size = trainer.config.data.train_batch_size
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        self.trainer = trainer
        self.prompts = list(prompts)
        self.batch_size = batch_size

    def collect(self, prompts: Sequence[Any]) -> Any:
        """One batch: ``trainer.collect_data(prompts)``."""
        return self.trainer.collect_data(prompts)

    __call__ = collect

    def __len__(self) -> int:
        """Batches one pass over ``prompts`` yields."""
        return -(-len(self.prompts) // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, len(self.prompts), self.batch_size):
            yield self.collect(self.prompts[start : start + self.batch_size])
