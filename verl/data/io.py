"""Read and write row files (parquet, JSON lines) with per-row locations for error messages.

Reading never raises on a bad row: every row comes back as a `Record` carrying either its
data or a description of what is wrong with it, so callers can validate a whole dataset and
report many problems at once. Row numbers are 1-based: the physical line number for JSON
lines files (blank lines are skipped but counted), the row number for parquet, the item
number for a `.json` file holding one JSON array.

Text must be Unicode: a JSON row holding a lone surrogate (a ``\\ud800`` escape without
its pair) and a parquet row whose strings are not UTF-8 are problems naming the row and
the column, never passed on (they would fail later in the tokenizer, a logger or a
writer) and never silently replaced.

Writing goes to a temporary file renamed into place, so an interrupted write never leaves a
half-written dataset behind.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from verl.utils.atomic_io import atomic_path

PARQUET_SUFFIXES = (".parquet",)
JSON_SUFFIXES = (".jsonl", ".json")
SUPPORTED_SUFFIXES = PARQUET_SUFFIXES + JSON_SUFFIXES


class DatasetValidationError(ValueError):
    """One or more rows of a dataset are malformed; `problems` lists all that were found."""

    def __init__(self, problems: list[str] | str, max_reported: int = 20):
        # one string is one problem (torch's DataLoader re-raises a worker's error so)
        problems = [problems] if isinstance(problems, str) else list(problems)
        self.problems = problems
        self.max_reported = max_reported
        shown = problems[:max_reported]
        header = f"{len(problems)} problem(s) in the dataset (rows and lines numbered from 1):"
        lines = [header] + [f"  - {p}" for p in shown]
        if len(problems) > len(shown):
            lines.append(f"  ... and {len(problems) - len(shown)} more")
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep it picklable (e.g. across Ray) despite the custom __init__
        return self.__class__, (self.problems, self.max_reported)


@dataclass(frozen=True)
class Record:
    """One row of a file: its data (a dict) or, if unreadable, the reason in `problem`."""

    file: str
    number: int  # 1-based, counted in `unit`
    unit: str  # "line" (JSON lines), "row" (parquet) or "item" (JSON array)
    data: dict[str, Any] | None
    problem: str | None = None

    @property
    def where(self) -> str:
        return f"{self.file} {self.unit} {self.number}"


@dataclass(frozen=True)
class RecordFile:
    """All records of one file; `columns` is the parquet schema (None for JSON files)."""

    path: str
    columns: list[str] | None
    records: list[Record]


def normalize_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Turn one path or a list of paths into a list of strings, checking each exists."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = [os.fspath(p) for p in paths]
    if not out:
        raise ValueError("no data files given: pass a path or a non-empty list of paths")
    for p in out:
        if os.path.isdir(p):
            raise IsADirectoryError(
                f"data file {p!r} is a directory; list the files in it "
                f"(data.train_files=[{p}/part-0.parquet, ...])"
            )
        if not os.path.isfile(p):
            raise FileNotFoundError(f"data file {p!r} does not exist (or is not a file)")
        if not p.endswith(SUPPORTED_SUFFIXES):
            raise ValueError(
                f"data file {p!r} has an unsupported extension; use one of {SUPPORTED_SUFFIXES}"
            )
        try:  # open once now: a permission problem is reported before any work starts
            with open(p, "rb"):
                pass
        except OSError as e:
            raise OSError(e.errno, f"data file {p!r} cannot be read: {e.strerror or e}") from e
    return out


def read_records(path: str | os.PathLike) -> RecordFile:
    """Read every row of a parquet, `.jsonl` or `.json` file into `Record`s."""
    path = os.fspath(path)
    if path.endswith(PARQUET_SUFFIXES):
        return _read_parquet(path)
    if path.endswith(JSON_SUFFIXES):
        return _read_json(path)
    raise ValueError(f"{path!r}: unsupported extension; use one of {SUPPORTED_SUFFIXES}")


def _read_parquet(path: str) -> RecordFile:
    # pyarrow costs ~28 MiB of RSS and 0.2 s to import: only runs that read or write
    # parquet pay for it
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: cannot read as parquet: {e}") from e
    try:
        rows = table.to_pylist()
    except UnicodeDecodeError:  # a string column holds bytes that are not UTF-8
        return RecordFile(path, list(table.column_names), _parquet_rows_one_by_one(path, table))
    records = [Record(path, i + 1, "row", row) for i, row in enumerate(rows)]
    return RecordFile(path, list(table.column_names), records)


def _parquet_rows_one_by_one(path: str, table: Any) -> list[Record]:
    """The rows of ``table`` converted one at a time, so that a row whose strings are not
    valid UTF-8 becomes a problem naming its row and column, and the others still read."""
    records = []
    for i in range(table.num_rows):
        row: dict[str, Any] = {}
        problem = None
        for name in table.column_names:
            try:
                row[name] = table.column(name)[i].as_py()
            except UnicodeDecodeError as e:
                problem = (
                    f"column {name!r} is not valid UTF-8 ({e.reason} at byte {e.start}); "
                    "fix the text where the file was written"
                )
                break
        records.append(Record(path, i + 1, "row", None if problem else row, problem))
    return records


# A JSON "\uXXXX" escape of a UTF-16 surrogate (D800-DFFF): only then can json.loads return
# a string holding a lone surrogate. Checked on the raw text first, so that rows without
# one cost a regex scan, not a walk over every string.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where the first lone surrogate in ``value`` (a JSON value) is, e.g.
    ``"'prompt' [0] 'content' character 11 (\\ud800)"``, or None when there is none.

    A lone surrogate (a ``\\ud800`` escape without its pair) is not a Unicode character: it
    cannot be encoded as UTF-8, so tokenizers, loggers and file writers fail on it.
    """
    if isinstance(value, str):
        for pos, char in enumerate(value):
            if "\ud800" <= char <= "\udfff":  # json.loads joins a valid pair into one
                return f"{where} character {pos + 1} (\\u{ord(char):04x})".strip()
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate(key, f"{where} key") or lone_surrogate(item, f"{where} {key!r}")
            if found:
                return found
    elif isinstance(value, list):
        for j, item in enumerate(value):
            found = lone_surrogate(item, f"{where} [{j}]")
            if found:
                return found
    return None


def _surrogate_problem(obj: Any, text: str) -> str | None:
    if not _SURROGATE_ESCAPE.search(text):
        return None
    found = lone_surrogate(obj)
    if found is None:
        return None
    return (
        f"column {found} is a lone surrogate, not a Unicode character (a \\uXXXX escape "
        "of half a UTF-16 pair); it cannot be tokenised or written as UTF-8: remove it or "
        "write the whole character"
    )


def _read_json(path: str) -> RecordFile:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot read the file: {e.strerror or e}") from e
    if raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark written by some editors
        raw = raw[3:]
    if raw.lstrip()[:1] == b"[":
        return RecordFile(path, None, _read_json_array(path, raw))
    records: list[Record] = []
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = line[e.start : e.start + 1].hex()
            records.append(
                Record(
                    path,
                    lineno,
                    "line",
                    None,
                    f"not valid UTF-8 (byte 0x{bad} at column {e.start + 1}); "
                    "re-encode the file as UTF-8",
                )
            )
            continue
        records.append(_parse_json_object(path, lineno, "line", text))
    return RecordFile(path, None, records)


def _read_json_array(path: str, raw: bytes) -> list[Record]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = raw[: e.start].count(b"\n") + 1
        return [Record(path, lineno, "line", None, "not valid UTF-8; re-encode the file as UTF-8")]
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        return [Record(path, e.lineno, "line", None, f"invalid JSON: {e.msg}")]
    out = []
    check = _SURROGATE_ESCAPE.search(text) is not None
    for i, item in enumerate(items, start=1):
        problem = _surrogate_problem(item, text) if check and isinstance(item, dict) else None
        if problem is not None:
            out.append(Record(path, i, "item", None, problem))
        elif isinstance(item, dict):
            out.append(Record(path, i, "item", item))
        else:
            out.append(
                Record(path, i, "item", None, f"expected a JSON object, got {type(item).__name__}")
            )
    return out


def _parse_json_object(path: str, number: int, unit: str, text: str) -> Record:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return Record(path, number, unit, None, f"invalid JSON at column {e.colno}: {e.msg}")
    if not isinstance(obj, dict):
        return Record(path, number, unit, None, f"expected a JSON object, got {type(obj).__name__}")
    problem = _surrogate_problem(obj, text)
    if problem is not None:
        return Record(path, number, unit, None, problem)
    return Record(path, number, unit, obj)


def write_records(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> str:
    """Write rows to `path` as parquet or JSON lines (chosen by the extension); returns it."""
    path = os.fspath(path)
    rows = list(rows)
    if not path.endswith(SUPPORTED_SUFFIXES):
        raise ValueError(f"{path!r}: unsupported extension; use one of {SUPPORTED_SUFFIXES}")
    with atomic_path(path) as tmp:
        if path.endswith(PARQUET_SUFFIXES):
            import pyarrow as pa
            import pyarrow.parquet as pq

            # pyarrow takes the columns from the first row alone: name every column any
            # row has, so a key missing from the first row is not silently dropped.
            columns = list(dict.fromkeys(key for row in rows for key in row))
            table = pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows])
            pq.write_table(table, tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
