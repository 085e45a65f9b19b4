"""What the RL, SFT and preference datasets share: reading, validation, chat templates and
the length limit.

:class:`RowDataset` is the base of `RLHFDataset` (`rl_dataset`), `SFTDataset`
(`sft_dataset`) and `PreferenceDataset` (`preference_dataset`). Every one of them:

- reads one or many parquet / JSON lines files (`verl.data.io`: pyarrow and json), rows
  concatenated in the order given, each row numbered from 1 in its file;
- validates every row and tokenises the valid ones up front, collecting every problem
  (a missing column, a wrong type, a chat template that fails on a row) and raising one
  `DatasetValidationError` naming file and row of each;
- renders chat messages with the tokenizer's chat template (:func:`render_chat`), or joins
  the plain texts when ``apply_chat_template=False`` (base models);
- enforces its length limit with one vocabulary, ``truncation``:

  ============  ===============================================================
  ``error``     (default) raise, naming the offending rows and the fix
  ``drop``      remove the rows (``num_dropped``, locations in ``dropped_rows``)
  ``truncate``  cut to fit (``num_truncated``), keeping what matters: an RL prompt
                keeps its end (the question and the generation prompt), an SFT
                sample its start, a preference row its prompt's end and its
                completions' start. A row left with nothing to train on is dropped.
  ============  ===============================================================

  The older per-dataset spellings stay accepted as aliases of ``truncate`` where they
  describe the same cut: ``left`` for RL prompts, ``right`` for SFT samples.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from verl.data.io import DatasetValidationError, Record, normalize_paths, read_records

__all__ = [
    "TRUNCATION_MODES",
    "Row",
    "RowDataset",
    "check_chat_template",
    "clean_messages",
    "end_after_eos",
    "join_contents",
    "render_chat",
    "resolve_truncation",
    "shown",
    "tools_system_prompt",
    "validate_messages",
]

TRUNCATION_MODES = ("error", "drop", "truncate")


def resolve_truncation(value: str, aliases: Mapping[str, str] | None = None) -> str:
    """The mode of :data:`TRUNCATION_MODES` that ``value`` names (an alias maps onto one)."""
    aliases = aliases or {}
    if value in TRUNCATION_MODES:
        return value
    if value in aliases:
        return aliases[value]
    accepted = TRUNCATION_MODES + tuple(aliases)
    raise ValueError(f"truncation={value!r}; choose one of {accepted}")


def shown(value: Any) -> str:
    """The type and (shortened) value, for messages: "int 3", "str 'abc'"."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def check_chat_template(tokenizer: Any, apply_chat_template: bool) -> None:
    """Raise ValueError when the chat template is wanted and the tokenizer has none."""
    if apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer {name!r} has no chat template, and data.apply_chat_template="
            "True needs one; use an instruct model's tokenizer, set "
            "tokenizer.chat_template, or set data.apply_chat_template=false (base models)"
        )


def validate_messages(
    messages: Any, what: str, label: str | None = None, nonblank: str | None = None
) -> list[str]:
    """Problems of a chat-message list (empty when it is a non-empty list of role/content).

    Args:
        messages: the value of the column.
        what: how the column is named in the problems, e.g. ``"'messages'"``.
        label: how its messages are named (default ``what``): ``"{label} message 0 ..."``.
        nonblank: when given, a list whose every content is blank is a problem, reported
            as ``"empty {nonblank}: every message content is blank"``.
    """
    label = what if label is None else label
    if not isinstance(messages, (list, tuple)):
        return [
            f"{what} must be a list of chat messages {{'role': ..., 'content': ...}}, "
            f"got {shown(messages)}"
        ]
    if not messages:
        return [
            f"empty {nonblank}: {what} has no messages" if nonblank else f"{what} has no messages"
        ]
    problems = []
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict):
            problems.append(f"{label} message {j} must be a dict, got {shown(msg)}")
            continue
        for key in ("role", "content"):
            if msg.get(key) is None:
                problems.append(f"{label} message {j} has no {key!r}")
            elif not isinstance(msg[key], str):
                problems.append(
                    f"{label} message {j} {key!r} must be a string, got {shown(msg[key])}"
                )
    if nonblank and not problems and all(not m["content"].strip() for m in messages):
        problems.append(f"empty {nonblank}: every message content is blank")
    return problems


def clean_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Only role and content: parquet fills absent struct fields with None."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def as_messages(value: Any, role: str) -> list[dict[str, str]]:
    """A text as one message of ``role``; a message list cleaned to role and content."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return clean_messages(value)


def join_contents(value: Any) -> str:
    """The plain text of a text or message list (contents joined by newlines), for
    ``apply_chat_template=False``."""
    if isinstance(value, str):
        return value
    return "\n".join(m["content"] for m in value)


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat template's text for ``messages`` (not tokenised).

    ``tools`` (OpenAI function schemas, for multi-turn rollouts) go to the template's
    ``tools=`` argument when the template uses it; a template that ignores it gets them
    described in the system message instead (:func:`tools_system_prompt`).
    """
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not tools:
        return text
    with_tools = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if with_tools != text:
        return with_tools
    prompt = tools_system_prompt(tools)
    if messages and messages[0]["role"] == "system":
        system = {"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}
        messages = [system, *messages[1:]]
    else:
        messages = [{"role": "system", "content": prompt}, *messages]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """A system-message description of ``tools`` and of the call format the rollout parses
    (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the Qwen / Hermes one)."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to help with the user's request. The functions "
        f"are described in JSON below.\n<tools>\n{listing}\n</tools>\nTo call a function, "
        'write <tool_call>{"name": <function name>, "arguments": <arguments object>}'
        "</tool_call>; its result comes back in the next message."
    )


def end_after_eos(text: str, start: int, end: int, eos: str | None) -> int:
    """End of the span ``[start, end)`` cut just after the last eos token inside it."""
    if eos:
        idx = text.rfind(eos, start, end)
        if idx >= 0:
            return idx + len(eos)
    return end


@dataclass
class Row:
    """A valid row: where it came from, its 0-based index over all files concatenated
    (counted before any row is dropped), its data and what the dataset encoded from it."""

    where: str
    index: int
    data: dict[str, Any]
    encoded: Any


class RowDataset:
    """Base of the row datasets (see the module docstring for what it does).

    A subclass sets ``noun`` (how its items are named in messages), ``truncation_aliases``
    and ``truncated_how`` (the log's verb for its cut), calls :meth:`_setup`, then
    :meth:`_read_rows` with its row check and encoder, then :meth:`_apply_length_limit`.
    """

    noun: ClassVar[str] = "row"
    truncation_aliases: ClassVar[Mapping[str, str]] = {}
    truncated_how: ClassVar[str] = "truncated"

    def _setup(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        truncation: str,
        apply_chat_template: bool,
    ) -> None:
        self.truncation = resolve_truncation(truncation, self.truncation_aliases)
        self.data_files = normalize_paths(data_files)
        check_chat_template(tokenizer, apply_chat_template)
        self.tokenizer = tokenizer
        self.apply_chat_template = apply_chat_template
        self.num_dropped = 0  # rows removed by the length limit
        self.dropped_rows: list[str] = []  # their locations, e.g. "train.parquet row 7"
        self.num_truncated = 0  # rows cut to fit

    @property
    def _logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    # ------------------------------------------------------------------ reading
    def _read_records(self, required_columns: Sequence[str] = ()) -> tuple[list[Record], list[str]]:
        """Every record of every file, and the file-level problems (a parquet file missing
        a required column is skipped whole; a file without rows is a problem)."""
        records: list[Record] = []
        problems: list[str] = []
        for path in self.data_files:
            rf = read_records(path)
            if rf.columns is not None:
                missing = [c for c in required_columns if c not in rf.columns]
                if missing:
                    problems.append(
                        f"{path}: missing required column(s) {missing} "
                        f"(columns present: {rf.columns})"
                    )
                    continue
            if not rf.records:
                problems.append(f"{path}: the file has no rows")
            records.extend(rf.records)
        return records, problems

    def _check_rows(
        self,
        records: list[Record],
        problems: list[str],
        check: Callable[[dict[str, Any]], list[str]],
        encode: Callable[[dict[str, Any]], Any],
        max_reported: int,
    ) -> list[Row]:
        """Validate (``check``) and encode every record; raise one DatasetValidationError
        with all problems (``problems`` holds those found before) or return the rows."""
        rows: list[Row] = []
        for index, rec in enumerate(records):
            if rec.problem is not None:
                problems.append(f"{rec.where}: {rec.problem}")
                continue
            row_problems = check(rec.data)
            if row_problems:
                problems.extend(f"{rec.where}: {p}" for p in row_problems)
                continue
            try:
                encoded = encode(rec.data)
            except Exception as exc:  # a chat template may raise anything (jinja errors)
                problems.append(f"{rec.where}: cannot tokenise: {exc}")
                continue
            rows.append(Row(rec.where, index, rec.data, encoded))
        if problems:
            raise DatasetValidationError(problems, max_reported)
        return rows

    def _read_rows(
        self,
        check: Callable[[dict[str, Any]], list[str]],
        encode: Callable[[dict[str, Any]], Any],
        max_reported: int,
        required_columns: Sequence[str] = (),
    ) -> list[Row]:
        """:meth:`_read_records` then :meth:`_check_rows`."""
        records, problems = self._read_records(required_columns)
        return self._check_rows(records, problems, check, encode, max_reported)

    # ------------------------------------------------------------------ length limit
    def _apply_length_limit(
        self,
        rows: list[Row],
        too_long: Callable[[Row], bool],
        cut: Callable[[Row], bool],
        error_problems: Callable[[list[Row]], list[str]],
        limits: str,
    ) -> list[Row]:
        """Enforce the limit with ``self.truncation``; returns the rows kept.

        Args:
            too_long: whether a row is over the limit.
            cut: shortens a row in place for ``truncate``; False when nothing worth
                training on is left (the row is then dropped).
            error_problems: the problems to raise for ``error`` (given the rows over).
            limits: the limits, for messages ("max_prompt_length=30").
        """
        over = [row for row in rows if too_long(row)]
        if not over:
            return rows
        if self.truncation == "error":
            raise DatasetValidationError(error_problems(over))
        dropped = []
        for row in over:
            if self.truncation == "truncate" and cut(row):
                self.num_truncated += 1
            else:
                dropped.append(row)
        if self.num_truncated:
            self._logger.warning(
                "%s %d %s(s) to %s", self.truncated_how, self.num_truncated, self.noun, limits
            )
        if not dropped:
            return rows
        self.num_dropped = len(dropped)
        self.dropped_rows = [row.where for row in dropped]
        self._logger.warning(
            "dropped %d %s(s) longer than %s%s: %s%s",
            self.num_dropped,
            self.noun,
            limits,
            " (nothing left to train on after the cut)" if self.truncation == "truncate" else "",
            ", ".join(self.dropped_rows[:20]),
            " ..." if self.num_dropped > 20 else "",
        )
        gone = {id(row) for row in dropped}
        kept = [row for row in rows if id(row) not in gone]
        if not kept:
            raise ValueError(
                f"every {self.noun} exceeds {limits} and was dropped "
                f"(truncation={self.truncation!r}); raise the limit"
            )
        return kept
