"""Pre-generated rollouts as training data: the rows ``verl generate`` writes, read back.

A rollout file (parquet or JSON lines, :mod:`verl.trainer.rl.generation`) holds one row per
prompt with ``n`` responses. :class:`RolloutFileDataset` reads the columns training needs:

- ``prompt_token_ids``: the prompt's token ids (unpadded);
- ``response_token_ids``: ``n`` lists of sampled ids, the stop token included;
- ``response_token_log_probs``: ``n`` lists, the log-prob of each sampled token under the
  policy that generated it (the behaviour policy), one per id;
- ``scores``: ``n`` scores;

and, when present, ``data_source``, ``prompt`` (the messages), ``ground_truth``,
``extra_info``, ``index``, ``accs`` and ``temperature`` (of the log-probs). A missing
column, a row whose lists disagree in length, a row with another number of responses than
``rollout.n`` or a response longer than ``data.max_response_length`` is an error naming the
file, the row and the fix; nothing is silently dropped.

An item is a prompt item as :class:`~verl.data.RLHFDataset` gives it (``input_ids`` and the
per-prompt fields, so :func:`~verl.data.collate_fn` pads it like any prompt) plus
``offline_rollout``: ``{"response_ids", "log_probs", "scores", "accs"}``. The trainer's
rollout source (:mod:`verl.trainer.rl.offline_rollouts`) turns a collated batch into the
rollout layout of :mod:`verl.rollout.base` without generating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from verl.data.io import DatasetValidationError, normalize_paths, read_records
from verl.data.rl_dataset import _object_array, collate_fn
from verl.protocol import DataProto

__all__ = ["REQUIRED_COLUMNS", "RolloutFileDataset", "collate_rollout_items"]

REQUIRED_COLUMNS = ("prompt_token_ids", "response_token_ids", "response_token_log_probs", "scores")
_PER_RESPONSE = ("response_token_ids", "response_token_log_probs", "scores")


class RolloutFileDataset:
    """The rows of ``files`` as prompt items carrying their stored responses (see module doc).

    Args:
        files: parquet / JSON-lines files written by ``verl generate``.
        n: responses per prompt the run trains with (``actor_rollout_ref.rollout.n``).
        max_prompt_length / max_response_length: the run's ``data.*`` limits (tokens).
        temperature: the run's log-prob temperature; a file that records another is refused
            (its log-probs would not be comparable with the trainer's).
        pad_token_id: exposed for the default collate.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        n: int,
        max_prompt_length: int,
        max_response_length: int,
        temperature: float = 1.0,
        pad_token_id: int | None = None,
    ) -> None:
        self.pad_token_id = pad_token_id
        self.n = n
        # every row is kept or refused: none is dropped or truncated (the loop logs these)
        self.num_dropped = self.num_truncated = 0
        self._items: list[dict[str, Any]] = []
        problems: list[str] = []
        for path in normalize_paths(files):
            table = read_records(path)
            if table.columns is not None:  # parquet: the schema names the columns up front
                missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
                if missing:
                    raise DatasetValidationError([_missing(path, missing)])
            for record in table.records:
                if record.problem is not None:
                    problems.append(f"{record.where}: {record.problem}")
                    continue
                missing = [c for c in REQUIRED_COLUMNS if c not in record.data]
                if missing:
                    raise DatasetValidationError([_missing(record.where, missing)])
                limits = (max_prompt_length, max_response_length, temperature)
                problem = _check_row(record.data, n, *limits)
                if problem:
                    problems.append(f"{record.where}: {problem}")
                else:
                    self._items.append(_item(record.data, len(self._items)))
        if problems:
            raise DatasetValidationError(problems)
        if not self._items:
            raise DatasetValidationError([f"data.rollout_files {list(files)!r}: no rows"])

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self._items[i]
        out = dict(item)
        out["input_ids"] = torch.tensor(item["input_ids"], dtype=torch.long)
        return out


def collate_rollout_items(items: list[dict[str, Any]], pad_token_id: int) -> DataProto:
    """Left-pad the prompts of ``items`` (:func:`~verl.data.collate_fn`) and carry each
    item's stored responses as the per-prompt object ``offline_rollout``."""
    batch = collate_fn(items, pad_token_id=pad_token_id)
    batch.non_tensor_batch["offline_rollout"] = _object_array(
        [it["offline_rollout"] for it in items]
    )
    return batch


def _missing(where: str, columns: list[str]) -> str:
    return (
        f"{where}: not a rollout file, missing column(s) {', '.join(columns)}; "
        "data.rollout_files takes the files `verl generate` writes (columns "
        f"{', '.join(REQUIRED_COLUMNS)})"
    )


def _check_row(
    row: dict[str, Any], n: int, max_prompt: int, max_response: int, temperature: float
) -> str | None:
    prompt = row["prompt_token_ids"]
    if not isinstance(prompt, list) or not prompt:
        return "prompt_token_ids must be a non-empty list of token ids"
    if len(prompt) > max_prompt:
        return (
            f"the prompt has {len(prompt)} tokens, more than data.max_prompt_length="
            f"{max_prompt}; raise it"
        )
    for key in _PER_RESPONSE:
        if not isinstance(row[key], list) or len(row[key]) != n:
            got = len(row[key]) if isinstance(row[key], list) else type(row[key]).__name__
            return (
                f"{key} has {got} responses, but actor_rollout_ref.rollout.n={n}; set "
                "rollout.n to the file's n"
            )
    for j, (ids, lps) in enumerate(zip(row["response_token_ids"], row["response_token_log_probs"])):
        if not ids or len(ids) != len(lps):
            return (
                f"response {j}: {len(ids)} token ids but {len(lps)} log-probs "
                "(response_token_log_probs must give one per id)"
            )
        if len(ids) > max_response:
            return (
                f"response {j} has {len(ids)} tokens, more than data.max_response_length="
                f"{max_response}; raise it"
            )
        if not all(math.isfinite(lp) and lp <= 0 for lp in lps):
            return f"response {j}: log-probs must be finite and <= 0"
    recorded = row.get("temperature")
    if recorded is not None and not math.isclose(float(recorded), temperature):
        return (
            f"log-probs at temperature {recorded}, but this run's log-prob temperature is "
            f"{temperature}; set actor_rollout_ref.rollout.temperature={recorded}"
        )
    return None


def _item(row: dict[str, Any], number: int) -> dict[str, Any]:
    scores = [float(s) for s in row["scores"]]
    accs = [float(a) for a in row.get("accs") or scores]
    return {
        "input_ids": [int(t) for t in row["prompt_token_ids"]],
        "raw_prompt": row.get("prompt") or [],
        "data_source": row.get("data_source") or "rollout_file",
        "ground_truth": row.get("ground_truth"),
        "extra_info": dict(row.get("extra_info") or {}),
        "index": int(row["index"]) if row.get("index") is not None else number,
        "offline_rollout": {
            "response_ids": [[int(t) for t in ids] for ids in row["response_token_ids"]],
            "log_probs": [[float(x) for x in lps] for lps in row["response_token_log_probs"]],
            "scores": scores,
            "accs": accs,
        },
    }
