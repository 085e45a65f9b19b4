"""Convert GSM8K JSON lines files into verl's prompt format.

    python -m verl.data.gsm8k --input gsm8k/train.jsonl --out data/gsm8k/train.parquet

Input rows are `{"question": str, "answer": str}` where the answer is a worked solution
ending with `#### <number>` (GSM8K's own format). Output rows:

    data_source  "openai/gsm8k"
    prompt       [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": number after "####", commas removed}
    extra_info   {"split", "index", "question", "answer"}

Malformed rows (bad JSON or UTF-8, missing fields, no `####`, a non-numeric final answer)
are all reported with file and 1-based line number; the conversion fails unless
`skip_invalid=True` (`--skip-invalid`), which drops them with a warning. GSM8K itself is
not shipped in any package reachable offline: download it yourself.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from verl.data.io import DatasetValidationError, read_records, write_records

logger = logging.getLogger(__name__)

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Solve it step by step, then write the final answer as a number after "####".'
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def extract_gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the number after the last `####`, no commas.

    Raises ValueError when there is no `####` or what follows is not a number.
    """
    if "####" not in answer:
        raise ValueError("the answer has no '####' followed by the final number")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not _NUMBER.fullmatch(final):
        raise ValueError(f"the text after '####' is not a number: {final!r}")
    return final


def gsm8k_row(question: str, answer: str, index: int, split: str) -> dict[str, Any]:
    """One verl row from a GSM8K question and solution."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question.strip()} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_gsm8k_answer(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def convert_gsm8k(
    input_path: str | os.PathLike,
    out_path: str | os.PathLike,
    split: str | None = None,
    skip_invalid: bool = False,
    max_reported_problems: int = 20,
) -> int:
    """Convert one GSM8K file to `out_path` (.parquet or .jsonl); returns the rows written.

    `split` (stored in extra_info) defaults to the input file's stem, e.g. "train".
    """
    input_path = os.fspath(input_path)
    if not os.path.isfile(input_path):
        raise FileNotFoundError(f"GSM8K input file {input_path!r} does not exist")
    if split is None:
        split = os.path.splitext(os.path.basename(input_path))[0]
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for rec in read_records(input_path).records:
        try:
            if rec.problem is not None:
                raise ValueError(rec.problem)
            question, answer = rec.data.get("question"), rec.data.get("answer")
            for key, value in (("question", question), ("answer", answer)):
                if not isinstance(value, str) or not value.strip():
                    raise ValueError(f"{key!r} must be a non-empty string, got {value!r}")
            rows.append(gsm8k_row(question, answer, len(rows), split))
        except ValueError as e:
            problems.append(f"{rec.where}: {e}")
    if problems and not skip_invalid:
        raise DatasetValidationError(problems, max_reported_problems)
    if problems:
        logger.warning(
            "skipped %d malformed row(s) of %s: %s", len(problems), input_path, problems[:5]
        )
    if not rows:
        raise ValueError(f"{input_path}: no valid GSM8K rows to convert")
    write_records(rows, out_path)
    logger.info("wrote %d GSM8K rows to %s", len(rows), out_path)
    return len(rows)


def main(argv: Sequence[str] | None = None, prog: str = "python -m verl.data.gsm8k") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert a GSM8K .jsonl file (question, answer) into verl's format.",
    )
    parser.add_argument("--input", required=True, help="GSM8K .jsonl file")
    parser.add_argument("--out", required=True, help="output file (.parquet or .jsonl)")
    parser.add_argument("--split", default=None, help="split name (default: input file stem)")
    parser.add_argument(
        "--skip-invalid", action="store_true", help="drop malformed rows instead of failing"
    )
    args = parser.parse_args(argv)
    if not args.out.endswith((".parquet", ".jsonl")):
        parser.error(f"--out {args.out!r}: must end with .parquet or .jsonl")
    try:
        n = convert_gsm8k(args.input, args.out, args.split, args.skip_invalid)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {n} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
