"""Generated batches as readable rows: decoded prompt and response text with their score.

Used for the validation table (``trainer.log_val_generations``), the per-step files of
``trainer.rollout_data_dir`` / ``validation_data_dir`` (:func:`write_samples`) and by
``verl generate`` / ``verl eval``. Prompts are left-padded (``prompts`` with the first ``P`` columns of
``attention_mask``), responses right-padded (``responses`` with ``response_mask``); special
tokens are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.atomic_io import write_text_atomic


def decode_rows(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decode each row of ``ids`` (rows, len) keeping the positions where ``mask`` is set."""
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    return list(tokenizer.batch_decode(rows, skip_special_tokens=True))


def decode_prompts_and_responses(gen: DataProto, tokenizer: Any) -> tuple[list[str], list[str]]:
    """The prompt texts and response texts of every row of a rollout output ``gen``."""
    prompts = gen.batch["prompts"]
    prompt_mask = gen.batch["attention_mask"][:, : prompts.shape[1]]
    return (
        decode_rows(tokenizer, prompts, prompt_mask),
        decode_rows(tokenizer, gen.batch["responses"], gen.batch["response_mask"]),
    )


def generation_samples(
    gen: DataProto, scores: Sequence[float], tokenizer: Any, limit: int
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of ``gen`` as ``{data_source, prompt, response,
    ground_truth, score}`` dicts (``data_source`` / ``ground_truth`` when the batch has them)."""
    if limit <= 0 or len(gen) == 0:
        return []
    head = gen[:limit]
    prompts, responses = decode_prompts_and_responses(head, tokenizer)
    out = []
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        row: dict[str, Any] = {}
        if "data_source" in head.non_tensor_batch:
            row["data_source"] = str(head.non_tensor_batch["data_source"][i])
        row["prompt"] = prompt
        row["response"] = response
        if "ground_truth" in head.non_tensor_batch:
            row["ground_truth"] = str(head.non_tensor_batch["ground_truth"][i])
        row["score"] = float(scores[i])
        out.append(row)
    return out


def write_samples(out_dir: Path, step: int, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` (:func:`generation_samples`), each with ``"step": step``, as
    ``<out_dir>/<step>.jsonl``, atomically (a resumed run rewrites the steps it repeats)."""
    path = Path(out_dir) / f"{step}.jsonl"
    lines = (json.dumps({**row, "step": step}, ensure_ascii=False) for row in rows)
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return path
