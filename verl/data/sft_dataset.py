"""SFT data: chats tokenised with an assistant-only loss mask, optional packing, collation.

Rows (parquet or JSON lines; the column names are configurable) come in two formats:

    messages   [{"role": str, "content": str}, ...]   a whole chat; the loss covers every
                                                      assistant turn
    prompt     str | [{"role", "content"}, ...]      or a prompt (text = one user message)
    response   str | [{"role": "assistant", ...}]    and its response

The chat is rendered with the tokenizer's chat template. The loss mask is built by
comparing templated prefixes: for assistant message ``k``, ``render(messages[:k],
add_generation_prompt=True)`` must be a prefix of ``render(messages[:k + 1])``, which must
be a prefix of the rendering of the whole chat; the characters between the two are that
turn's completion (its content and end-of-turn token; whatever the template puts after the
tokenizer's eos token, e.g. ChatML's newline, is not trained). The text is tokenised segment
by segment, so a loss token never straddles a prompt/completion boundary and the prompt
tokens are exactly those a generation from that prompt would see. Templates that rewrite
earlier turns (e.g. drop the reasoning of previous assistant messages) fail the prefix check
with an error naming the row. The first token of a sample is never in the loss (nothing
predicts it), which also makes packed and unpacked losses identical.

With ``apply_chat_template=False`` (base models, prompt/response rows only), the text is
``prompt + response + eos`` and the loss covers ``response + eos``.

Every row is read, validated and tokenised up front; all problems are reported together in
one ``DatasetValidationError`` naming file and row (see ``verl.data.io``).

Packing (:class:`PackedSFTDataset`) places whole samples into sequences of at most
``max_length`` tokens (best-fit decreasing) and restarts ``position_ids`` at 0 for every
sample. Run such a batch with ``attention_mask=None``: transformers (>= 5) then derives a
block-diagonal causal mask from the position restarts (varlen kernels under
flash-attention), so samples in one sequence do not attend to each other.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from verl.data.base import (
    TRUNCATION_MODES,
    Row,
    RowDataset,
    as_messages,
    clean_messages,
    end_after_eos,
    join_contents,
    render_chat,
    validate_messages,
)
from verl.data.io import write_records

logger = logging.getLogger(__name__)

# accepted spellings of `truncation`; "right" is the older name of "truncate" here
SFT_TRUNCATION_POLICIES = (*TRUNCATION_MODES, "right")

__all__ = [
    "SFT_TRUNCATION_POLICIES",
    "PackedSFTDataset",
    "SFTDataset",
    "arithmetic_val_problems",
    "collate_sft",
    "completion_char_spans",
    "make_arithmetic_sft_rows",
    "pack_lengths",
    "tokenize_conversation",
    "validate_messages",
    "write_arithmetic_sft_dataset",
]


def completion_char_spans(
    tokenizer: Any, messages: list[dict[str, str]]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the ``[start, end)`` character span of each assistant turn.

    Raises ValueError when the template is not prefix-consistent (see the module docstring).
    """
    full = render_chat(tokenizer, messages, add_generation_prompt=False)
    eos = getattr(tokenizer, "eos_token", None)
    spans = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = render_chat(tokenizer, messages[:k], add_generation_prompt=True)
        upto = render_chat(tokenizer, messages[: k + 1], add_generation_prompt=False)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise ValueError(
                f"the chat template is not prefix-consistent at assistant message {k}: the "
                "rendering of the earlier messages (with the generation prompt) is not a "
                "prefix of the rendering with this message, so its tokens cannot be located; "
                "use a template that renders earlier turns unchanged"
            )
        spans.append((len(prefix), end_after_eos(full, len(prefix), len(upto), eos)))
    return full, spans


def _tokenize_segments(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], add_special_tokens: bool
) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` tokenised piece by piece, and 1 for tokens inside ``spans``."""
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    pieces: list[tuple[str, int]] = []
    for start, end in spans:
        if start > cursor:
            pieces.append((text[cursor:start], 0))
        if end > start:
            pieces.append((text[start:end], 1))
        cursor = max(cursor, end)
    if cursor < len(text):
        pieces.append((text[cursor:], 0))
    for i, (piece, in_loss) in enumerate(pieces):
        # Special tokens (a bos) only once, at the very start.
        special = add_special_tokens and i == 0
        piece_ids = tokenizer(piece, add_special_tokens=special)["input_ids"]
        ids.extend(piece_ids)
        mask.extend([in_loss] * len(piece_ids))
    return ids, mask


def tokenize_conversation(
    tokenizer: Any, messages: Sequence[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a chat: 1 on the tokens of every assistant turn.

    The ids equal the tokenisation of the rendered chat (without added special tokens),
    cut at turn boundaries. ``loss_mask[0]`` is always 0.
    """
    text, spans = completion_char_spans(tokenizer, clean_messages(messages))
    ids, mask = _tokenize_segments(tokenizer, text, spans, add_special_tokens=False)
    if mask:
        mask[0] = 0
    return ids, mask


def _tokenize_plain(tokenizer: Any, prompt: Any, response: Any) -> tuple[list[int], list[int]]:
    """``prompt + response + eos`` without a chat template; loss on ``response + eos``."""
    prompt, response = join_contents(prompt), join_contents(response)
    eos = getattr(tokenizer, "eos_token", None) or ""
    text = prompt + response + eos
    ids, mask = _tokenize_segments(
        tokenizer, text, [(len(prompt), len(text))], add_special_tokens=True
    )
    if mask:
        mask[0] = 0
    return ids, mask


class SFTDataset(RowDataset):
    """Tokenised SFT samples with loss masks, read from parquet / JSON lines files.

    Args:
        data_files: one path or a list of paths, concatenated in order.
        tokenizer: a HF tokenizer (with a chat template unless ``apply_chat_template=False``).
        max_length: token limit per sample, or None.
        truncation: over-long samples (`verl.data.base`): "error" (raise listing them),
            "truncate" (or its older spelling "right": keep the first ``max_length``
            tokens; a sample left without loss tokens is dropped) or "drop".
        messages_key / prompt_key / response_key: column names (see the module docstring).
        prompt_path / response_path: keys leading into the prompt / response column's value
            when it is a mapping (``prompt_key="extra_info"``, ``prompt_path=["question"]``:
            the prompt is ``row["extra_info"]["question"]``).
        apply_chat_template: render with the chat template (False: plain concatenation,
            prompt/response rows only).
        max_reported_problems: how many problems the validation error lists.

    Item ``i``: ``input_ids`` and ``loss_mask`` (int64 arrays of the sample's length),
    ``position_ids`` (``0..len-1``) and ``num_samples`` (1).
    """

    noun = "sample"
    truncation_aliases: ClassVar[Mapping[str, str]] = {"right": "truncate"}
    truncated_how = "right-truncated"

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_length: int | None = None,
        truncation: Literal["error", "drop", "truncate", "right"] = "error",
        messages_key: str = "messages",
        prompt_key: str = "prompt",
        response_key: str = "response",
        apply_chat_template: bool = True,
        max_reported_problems: int = 20,
        prompt_path: Sequence[str] = (),
        response_path: Sequence[str] = (),
    ) -> None:
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length={max_length} must be >= 2 (or None)")
        self.max_length = max_length
        # prompt and response as (name for messages, column, keys into its value)
        self.keys = (
            messages_key,
            ".".join([prompt_key, *prompt_path]),
            ".".join([response_key, *response_path]),
        )
        self._columns = ((prompt_key, tuple(prompt_path)), (response_key, tuple(response_path)))
        self._setup(data_files, tokenizer, truncation, apply_chat_template)
        rows = self._read_rows(self.validate_row, self.tokenize_row, max_reported_problems)
        if max_length is not None:
            rows = self._apply_length_limit(
                rows,
                too_long=lambda row: len(row.encoded[0]) > max_length,
                cut=self._keep_start,
                error_problems=self._too_long_problems,
                limits=f"max_length={max_length}",
            )
        self._where = [row.where for row in rows]
        samples = [row.encoded for row in rows]
        lengths = np.array([len(ids) for ids, _ in samples], dtype=np.int64)
        self.lengths = lengths
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in samples])
        self._mask = np.concatenate([np.asarray(m, dtype=np.int64) for _, m in samples])
        logger.info(
            "SFTDataset: %d samples from %d file(s); tokens min/mean/max %d/%.1f/%d; "
            "%d loss tokens",
            len(self),
            len(self.data_files),
            lengths.min(),
            lengths.mean(),
            lengths.max(),
            int(self._mask.sum()),
        )

    # ------------------------------------------------------------------ reading
    def validate_row(self, row: dict[str, Any]) -> list[str]:
        """Problems of one row (empty when it is a valid messages or prompt/response row)."""
        messages_key, prompt_key, response_key = self.keys
        if row.get(messages_key) is not None:
            if not self.apply_chat_template:
                return [
                    f"{messages_key!r} rows need the chat template; set "
                    "data.apply_chat_template=true or give prompt/response columns"
                ]
            messages = row[messages_key]
            problems = validate_messages(messages, repr(messages_key))
            if problems:
                return problems
            if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
                return [f"{messages_key!r} has no assistant message with content: nothing to learn"]
            return []
        prompt, response = self._prompt_and_response(row)
        missing = [k for k, v in ((prompt_key, prompt), (response_key, response)) if v is None]
        if missing:
            return [
                f"missing column(s) {missing}: a row needs {messages_key!r} (chat messages) "
                f"or {prompt_key!r} and {response_key!r}"
            ]
        problems = []
        if isinstance(prompt, str):
            if not prompt.strip():
                problems.append(f"empty prompt: {prompt_key!r} is blank")
        else:
            problems += validate_messages(prompt, repr(prompt_key))
        if isinstance(response, str):
            if not response.strip():
                problems.append(f"empty response: {response_key!r} is blank")
        else:
            msg_problems = validate_messages(response, repr(response_key))
            problems += msg_problems
            if not msg_problems and any(m["role"] != "assistant" for m in response):
                problems.append(f"{response_key!r} messages must all have role 'assistant'")
        return problems

    def tokenize_row(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        """``(input_ids, loss_mask)`` of a valid row."""
        messages_key = self.keys[0]
        if row.get(messages_key) is not None:
            return tokenize_conversation(self.tokenizer, row[messages_key])
        prompt, response = self._prompt_and_response(row)
        if not self.apply_chat_template:
            return _tokenize_plain(self.tokenizer, prompt, response)
        messages = as_messages(prompt, "user") + as_messages(response, "assistant")
        return tokenize_conversation(self.tokenizer, messages)

    def _prompt_and_response(self, row: dict[str, Any]) -> tuple[Any, Any]:
        """The prompt and response of a prompt/response row (None where one is missing)."""
        out = []
        for column, path in self._columns:
            value = row.get(column)
            for key in path:
                value = value.get(key) if isinstance(value, Mapping) else None
            out.append(value)
        return out[0], out[1]

    def _keep_start(self, row: Row) -> bool:
        ids, mask = row.encoded
        row.encoded = (ids[: self.max_length], mask[: self.max_length])
        return any(row.encoded[1])  # cut before the response: nothing left to learn

    def _too_long_problems(self, over: list[Row]) -> list[str]:
        return [
            f"{row.where}: {len(row.encoded[0])} tokens > max_length={self.max_length}; "
            "raise data.max_length, or set data.truncation=truncate (keep the first "
            "max_length tokens; older spelling data.truncation=right) or drop"
            for row in over
        ]

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.lengths)

    def where(self, index: int) -> str:
        """The file and row of sample ``index`` (e.g. ``train.jsonl line 3``)."""
        return self._where[index]

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self._offsets[index], self._offsets[index + 1]
        return self._ids[s:e], self._mask[s:e]

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids, mask = self.sample(index)
        return {
            "input_ids": ids,
            "loss_mask": mask,
            "position_ids": np.arange(len(ids), dtype=np.int64),
            "num_samples": 1,
        }


def pack_lengths(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Group sample indices into bins whose lengths sum to at most ``max_length``.

    Best-fit decreasing: longest samples first, each into the fullest bin it still fits
    (O(n log n) with a sorted list of free capacities). Deterministic; bins are ordered by
    creation, indices inside a bin by insertion.
    """
    if max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (free capacity, bin id)
    for i in order:
        n = lengths[i]
        if n > max_length:
            raise ValueError(f"sample {i} has {n} tokens > max_length={max_length}")
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            capacity, b = free.pop(pos)
        else:
            capacity, b = max_length, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(free, (capacity - n, b))
    return bins


class PackedSFTDataset:
    """An :class:`SFTDataset` packed into sequences of at most ``max_length`` tokens.

    Item ``i`` concatenates the samples of bin ``i``: ``input_ids``, ``loss_mask`` (each
    sample's first token is out of the loss, as unpacked) and ``position_ids`` restarting
    at 0 for every sample; ``num_samples`` counts them.
    """

    def __init__(self, dataset: SFTDataset, max_length: int) -> None:
        self.dataset = dataset
        self.max_length = max_length
        self.bins = pack_lengths([int(n) for n in dataset.lengths], max_length)
        total = int(dataset.lengths.sum())
        logger.info(
            "packing: %d samples into %d sequences of <= %d tokens (%.1f%% filled)",
            len(dataset),
            len(self.bins),
            max_length,
            100.0 * total / (len(self.bins) * max_length),
        )

    def __len__(self) -> int:
        return len(self.bins)

    def __getitem__(self, index: int) -> dict[str, Any]:
        parts = [self.dataset.sample(i) for i in self.bins[index]]
        return {
            "input_ids": np.concatenate([ids for ids, _ in parts]),
            "loss_mask": np.concatenate([m for _, m in parts]),
            "position_ids": np.concatenate([np.arange(len(ids)) for ids, _ in parts]),
            "num_samples": len(parts),
        }


def collate_sft(items: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad items into ``(batch, max_len)`` int64 tensors.

    Returns ``input_ids`` (padding = ``pad_token_id``), ``attention_mask`` (1 on real
    tokens), ``loss_mask`` (0 on padding) and ``position_ids``. Padding continues as a
    segment of its own (positions 0, 1, ... after the last sample), so a packed batch run
    with ``attention_mask=None`` keeps it apart from the samples; unpacked batches use the
    attention mask. ``num_samples`` (0-dim) counts the samples in the batch.
    """
    if not items:
        raise ValueError("collate_sft got no items")
    width = max(len(it["input_ids"]) for it in items)
    n = len(items)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.long)
    position_ids = torch.zeros((n, width), dtype=torch.long)
    for r, it in enumerate(items):
        length = len(it["input_ids"])
        input_ids[r, :length] = torch.as_tensor(it["input_ids"])
        attention_mask[r, :length] = 1
        loss_mask[r, :length] = torch.as_tensor(it["loss_mask"])
        position_ids[r, :length] = torch.as_tensor(it["position_ids"])
        position_ids[r, length:] = torch.arange(width - length)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "num_samples": torch.tensor(sum(int(it["num_samples"]) for it in items)),
    }


# ---------------------------------------------------------------------- built-in data


def make_arithmetic_sft_rows(
    n: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+",),
    seed: int = 0,
    split: str = "train",
    exclude: set | None = None,
) -> list[dict[str, Any]]:
    """``n`` prompt/response rows: an arithmetic question and its answer (just the number)."""
    from verl.data.arithmetic import OPERATORS, make_arithmetic_rows

    rows = make_arithmetic_rows(n, digits, ops, seed, split, "chat", exclude)
    out = []
    for row in rows:
        info = row["extra_info"]
        answer = OPERATORS[info["op"]](info["a"], info["b"])
        out.append({"prompt": row["prompt"], "response": str(answer)})
    return out


def arithmetic_val_problems(
    val_size: int, digits: int | tuple[int, int], ops: Sequence[str], seed: int
) -> set:
    """The ``(a, op, b)`` problems of the built-in validation split, to keep out of train.

    Drawn exactly as ``verl.data.arithmetic.write_arithmetic_dataset`` draws them.
    """
    from verl.data.arithmetic import make_arithmetic_rows, row_problem

    if val_size <= 0:
        return set()
    return {row_problem(r) for r in make_arithmetic_rows(val_size, digits, ops, 2 * seed + 1)}


def write_arithmetic_sft_dataset(
    out_dir: str | os.PathLike,
    train_size: int,
    val_size: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+",),
    seed: int = 0,
) -> tuple[str, str | None]:
    """Write ``sft_train.parquet`` (and ``sft_test.parquet`` when ``val_size > 0``).

    Validation problems are drawn first and excluded from train. Returns the paths (the
    second is None without validation rows).
    """
    exclude = arithmetic_val_problems(val_size, digits, ops, seed)
    rows = make_arithmetic_sft_rows(train_size, digits, ops, 2 * seed, "train", exclude)
    train_path = write_records(rows, os.path.join(out_dir, "sft_train.parquet"))
    val_path = None
    if val_size > 0:
        rows = make_arithmetic_sft_rows(val_size, digits, ops, 2 * seed + 1, "test")
        val_path = write_records(rows, os.path.join(out_dir, "sft_test.parquet"))
    return train_path, val_path
