"""Generate verifiable arithmetic prompt datasets (`a op b`, op in + - *) in verl's format.

    python -m verl.data.arithmetic --out data/arith --train-size 1000 --val-size 200 \\
        --digits 1 --ops + - '*' --seed 0 --format parquet

writes `train.parquet` and `test.parquet` (or `.jsonl`). Each row:

    data_source  "arithmetic"
    prompt       [{"role": "user", "content": "What is 3 + 4? Answer with just the number."}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": "7"}
    extra_info   {"split", "index", "a", "b", "op", "expression"}

Operands have exactly `digits` digits (0-9 for one digit); `digits` may also be a range
`(lo, hi)` (`(1, 2)`: operands 0-99, one- and two-digit). Operands are uniform over that
range, so most have `hi` digits; with `balance_digits=True` each operand's digit count is
drawn uniformly from `lo..hi` first (`(1, 2)`: half the operands 0-9, half 10-99), which
keeps the easier problems in the mix. Subtraction puts the larger
operand first, so every answer is a non-negative integer, unless `negative=True` (operands
in either order, answers down to `-(10**digits - 1)`). `prompt_style="plain"` gives a
completion prompt ("3 + 4 =") for base models (use it with `apply_chat_template=False`).
`prompt_style="tool"` asks the model to use the calculator tool, for multi-turn rollouts
(`actor_rollout_ref.rollout.multi_turn`, docs/multiturn.md): multiplying 3- or 4-digit
numbers (`--digits 3 --ops '*'`) is hard for a small model alone and easy with the tool.

**Phrasings** (chat prompts): `phrasings` names the question forms rows are drawn from,
one per row uniformly (seeded, independent of the problem draw):

    question   What is 3 + 4? Answer with just the number.          (the default)
    words      What is 3 plus 4? Answer with just the number.       (plus, minus, times)
    compute    Compute 3 * 4 and reply with only the result.
    calculate  Calculate 9 minus 5. Give just the number.

Each row's form is in ``extra_info["phrasing"]`` beside ``op``, so validation reports
accuracy per operation and per phrasing with ``trainer.val_group_by=[op,phrasing]``.

Train and validation come from disjoint seeds (`2 * seed` and `2 * seed + 1`). The
validation set is drawn first and its problems are excluded from train, so no problem is in
both splits whenever the space of problems is larger than the validation set. Within a
split, problems are distinct while the space allows; once a split asks for more rows than
there are distinct problems left, problems repeat (logged as a warning). The space holds
`m*m` problems for + and *, and `m*(m+1)/2` for -, with `m` operand values (m=10 for one
digit: 255 problems with all three ops).

**Tool-call transcripts** (:func:`write_tool_transcripts`, for a supervised warm start
before RL with the calculator): SFT rows whose ``messages`` are the tool prompt's chat with
the tools described in the system message (as ``RLHFDataset`` renders it for a template
without ``tools=`` support), the assistant's ``<tool_call>`` to the calculator, the tool's
result and the assistant's final answer::

    system     the tools_system_prompt of the given schemas
    user       What is 123 * 456? Call the calculator tool to compute it, ...
    assistant  <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>
    tool       56088
    assistant  56088
"""

from __future__ import annotations

import argparse
import json
import logging
import operator
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

from verl.data.base import tools_system_prompt
from verl.data.io import write_records

logger = logging.getLogger(__name__)

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
OPERATOR_WORDS = {"+": "plus", "-": "minus", "*": "times"}
# phrasing -> (template, operator spelled as a word)
PHRASINGS = {
    "question": ("What is {a} {op} {b}? Answer with just the number.", False),
    "words": ("What is {a} {op} {b}? Answer with just the number.", True),
    "compute": ("Compute {a} {op} {b} and reply with only the result.", False),
    "calculate": ("Calculate {a} {op} {b}. Give just the number.", True),
}
PROMPT_STYLES = ("chat", "plain", "tool")
FORMATS = ("parquet", "jsonl")
DATA_SOURCE = "arithmetic"

Problem = tuple[int, str, int]
Digits = int | tuple[int, int]  # exactly n digits, or from lo to hi digits
# The operands are stored as integers in ``extra_info`` (``a``, ``b``), which parquet holds
# as int64: at most 18 digits (10**18 - 1 < 2**63). Answers are strings, so a product of
# two 18-digit operands (36 digits) is fine.
MAX_DIGITS = 18


def digit_bounds(digits: Digits) -> tuple[int, int]:
    """``(lo, hi)`` digit counts of a ``digits`` spec (an int n is ``(n, n)``)."""
    if isinstance(digits, int):
        return digits, digits
    lo, hi = (int(d) for d in digits)
    return lo, hi


def _check_args(
    digits: Digits, ops: Sequence[str], prompt_style: str, phrasings: Sequence[str] = ("question",)
) -> None:
    lo, hi = digit_bounds(digits)
    if lo < 1 or hi < lo:
        raise ValueError(f"digits={digits} must be >= 1 (a range (lo, hi) needs 1 <= lo <= hi)")
    if hi > MAX_DIGITS:
        raise ValueError(
            f"digits={digits}: operands may have at most {MAX_DIGITS} digits (they are stored "
            "as 64-bit integers in extra_info)"
        )
    if not ops:
        raise ValueError("ops is empty; choose from '+', '-', '*'")
    bad = [op for op in ops if op not in OPERATORS]
    if bad:
        raise ValueError(
            f"unsupported op(s) {bad}; ops must be a subset of {list(OPERATORS)} "
            "(quote '*' on a shell command line)"
        )
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style={prompt_style!r}; choose one of {PROMPT_STYLES}")
    unknown = [name for name in phrasings if name not in PHRASINGS]
    if unknown or not phrasings:
        raise ValueError(f"phrasings={list(phrasings)}: choose one or more of {list(PHRASINGS)}")
    if prompt_style != "chat" and tuple(phrasings) != ("question",):
        raise ValueError(
            f"phrasings={list(phrasings)} apply to chat prompts; prompt_style={prompt_style!r} "
            "has one form"
        )


def operand_range(digits: Digits) -> tuple[int, int]:
    """Smallest and largest operand with `digits` digits (0 counts as one digit)."""
    lo, hi = digit_bounds(digits)
    return (0 if lo == 1 else 10 ** (lo - 1)), 10**hi - 1


def problem_space_size(digits: Digits, ops: Sequence[str], negative: bool = False) -> int:
    """Number of distinct problems (a, op, b) the generator can produce."""
    lo, hi = operand_range(digits)
    m = hi - lo + 1
    return sum(m * (m + 1) // 2 if op == "-" and not negative else m * m for op in set(ops))


def _random_operand(rng: random.Random, lo: int, hi: int, balance_digits: bool) -> int:
    """An operand in ``[lo, hi]``: uniform, or (``balance_digits``) a uniform digit count
    first, then uniform among the operands with that many digits."""
    fewest, most = len(str(lo)), len(str(hi))
    if not balance_digits or fewest == most:
        return rng.randint(lo, hi)
    n = rng.randint(fewest, most)
    return rng.randint(max(lo, 0 if n == 1 else 10 ** (n - 1)), min(hi, 10**n - 1))


def _random_problem(
    rng: random.Random,
    lo: int,
    hi: int,
    ops: Sequence[str],
    balance_digits: bool = False,
    negative: bool = False,
) -> Problem:
    op = rng.choice(ops)
    a = _random_operand(rng, lo, hi, balance_digits)
    b = _random_operand(rng, lo, hi, balance_digits)
    if op == "-" and a < b and not negative:
        a, b = b, a
    return a, op, b


def _in_space(p: Problem, lo: int, hi: int, ops: Sequence[str], negative: bool = False) -> bool:
    """Can the generator produce problem `p` with these settings?"""
    a, op, b = p
    in_range = lo <= a <= hi and lo <= b <= hi
    return in_range and op in ops and (negative or not (op == "-" and a < b))


def _all_problems(lo: int, hi: int, ops: Sequence[str], negative: bool = False) -> list[Problem]:
    return [
        (a, op, b)
        for op in ops
        for a in range(lo, hi + 1)
        for b in range(lo, hi + 1)
        if negative or not (op == "-" and a < b)
    ]


def sample_problems(
    n: int,
    digits: Digits,
    ops: Sequence[str],
    seed: int,
    exclude: set[Problem] | None = None,
    balance_digits: bool = False,
    negative: bool = False,
) -> list[Problem]:
    """`n` problems, distinct while the space (minus `exclude`) allows, in random order
    (``negative``: subtraction in either order, so answers may be negative).

    ``balance_digits`` (module docstring) weights the draw by digit count while at most half
    of the space is asked for; beyond that the draw enumerates the space and is uniform.
    """
    ops = list(dict.fromkeys(ops))  # dedupe, keep order: the draw depends on it
    _check_args(digits, ops, "chat")
    rng = random.Random(seed)
    lo, hi = operand_range(digits)
    exclude = {p for p in exclude or () if _in_space(p, lo, hi, ops, negative)}
    available = problem_space_size(digits, ops, negative) - len(exclude)
    if available <= 0:
        raise ValueError(
            f"no problems left: digits={digits}, ops={ops} give "
            f"{problem_space_size(digits, ops)} problems and all are excluded (e.g. taken by "
            "the validation set); lower val_size or use more digits or ops"
        )
    if n <= available // 2:
        # Rejection sampling: cheap because at most half of the candidates are taken.
        seen: set[Problem] = set()
        out: list[Problem] = []
        while len(out) < n:
            p = _random_problem(rng, lo, hi, ops, balance_digits, negative)
            if p not in seen and p not in exclude:
                seen.add(p)
                out.append(p)
        return out
    # The space is small compared with n (available < 2n), so enumerating it is cheap.
    pool = [p for p in _all_problems(lo, hi, ops, negative) if p not in exclude]
    if n <= len(pool):
        return rng.sample(pool, n)
    logger.warning(
        "asked for %d problems but only %d distinct ones are available "
        "(digits=%s, ops=%s); problems will repeat",
        n,
        len(pool),
        digits,
        ops,
    )
    out = rng.sample(pool, len(pool))
    return out + rng.choices(pool, k=n - len(pool))


def arithmetic_row(
    problem: Problem,
    index: int,
    split: str,
    prompt_style: str = "chat",
    phrasing: str = "question",
) -> dict[str, Any]:
    """One dataset row for problem (a, op, b), a chat prompt in the form ``phrasing``."""
    a, op, b = problem
    expression = f"{a} {op} {b}"
    answer = OPERATORS[op](a, b)
    if prompt_style == "chat":
        template, in_words = PHRASINGS[phrasing]
        content = template.format(a=a, op=OPERATOR_WORDS[op] if in_words else op, b=b)
    elif prompt_style == "tool":
        content = (
            f"What is {expression}? Call the calculator tool to compute it, then answer "
            "with just the number."
        )
    else:
        content = f"{expression} ="
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "a": a,
            "b": b,
            "op": op,
            "expression": expression,
            "phrasing": phrasing if prompt_style == "chat" else prompt_style,
        },
    }


def make_arithmetic_rows(
    n: int,
    digits: Digits = 1,
    ops: Sequence[str] = ("+", "-", "*"),
    seed: int = 0,
    split: str = "train",
    prompt_style: str = "chat",
    exclude: set[Problem] | None = None,
    balance_digits: bool = False,
    negative: bool = False,
    phrasings: Sequence[str] = ("question",),
) -> list[dict[str, Any]]:
    """`n` arithmetic rows (see the module docstring), deterministic for a `seed`. The
    phrasing of each row is drawn by a generator of its own, so the problems are the same
    whatever ``phrasings`` is."""
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    _check_args(digits, ops, prompt_style, phrasings)
    problems = sample_problems(n, digits, ops, seed, exclude, balance_digits, negative) if n else []
    forms = list(dict.fromkeys(phrasings))
    pick = random.Random(f"phrasing-{seed}")
    return [
        arithmetic_row(
            p, i, split, prompt_style, forms[0] if len(forms) == 1 else pick.choice(forms)
        )
        for i, p in enumerate(problems)
    ]


def row_problem(row: dict[str, Any]) -> Problem:
    """The (a, op, b) of a generated row."""
    info = row["extra_info"]
    return info["a"], info["op"], info["b"]


def write_arithmetic_dataset(
    out_dir: str | os.PathLike,
    train_size: int = 1000,
    val_size: int = 200,
    digits: Digits = 1,
    ops: Sequence[str] = ("+", "-", "*"),
    seed: int = 0,
    fmt: str = "parquet",
    prompt_style: str = "chat",
    balance_digits: bool = False,
    negative: bool = False,
    phrasings: Sequence[str] = ("question",),
) -> tuple[str, str | None]:
    """Write `train.<fmt>` and `test.<fmt>` into `out_dir`; returns (train_path, val_path),
    val_path None when `val_size` is 0. `balance_digits`, `negative`, `phrasings`: see the
    module docstring."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}; choose one of {FORMATS}")
    if train_size < 1 or val_size < 0:
        raise ValueError(
            f"train_size={train_size} must be >= 1 and val_size={val_size} >= 0 (0: no "
            "validation file)"
        )
    _check_args(digits, ops, prompt_style, phrasings)
    val_rows = make_arithmetic_rows(
        val_size,
        digits,
        ops,
        2 * seed + 1,
        "test",
        prompt_style,
        balance_digits=balance_digits,
        negative=negative,
        phrasings=phrasings,
    )
    val_problems = {row_problem(r) for r in val_rows}
    train_rows = make_arithmetic_rows(
        train_size,
        digits,
        ops,
        2 * seed,
        "train",
        prompt_style,
        exclude=val_problems,
        balance_digits=balance_digits,
        negative=negative,
        phrasings=phrasings,
    )
    suffix = "parquet" if fmt == "parquet" else "jsonl"
    train_path = write_records(train_rows, os.path.join(out_dir, f"train.{suffix}"))
    val_path = (
        write_records(val_rows, os.path.join(out_dir, f"test.{suffix}")) if val_rows else None
    )
    logger.info("wrote %d train rows to %s", train_size, train_path)
    if val_path is not None:
        logger.info("wrote %d val rows to %s", val_size, val_path)
    return train_path, val_path


def tool_transcript_row(
    problem: Problem, tools: Sequence[dict[str, Any]], system: str | None = None
) -> dict[str, Any]:
    """One SFT row (``messages``) solving ``problem`` with the calculator (module docstring).

    ``tools`` are the OpenAI schemas listed in the system message; one must be named
    ``calculator`` (the rows call it). ``system`` replaces the system message's text
    (default ``tools_system_prompt(tools)``), for a chat template that renders ``tools=``
    itself: pass the text it writes, so that the transcripts match the RL prompts.
    """
    names = [t.get("function", {}).get("name") for t in tools]
    if "calculator" not in names:
        raise ValueError(f"tools={names}: the transcripts call 'calculator'; include its schema")
    a, op, b = problem
    expression = f"{a} {op} {b}"
    answer = str(OPERATORS[op](a, b))
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    user = arithmetic_row(problem, 0, "train", "tool")["prompt"][0]
    return {
        "messages": [
            {"role": "system", "content": system or tools_system_prompt(list(tools))},
            user,
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": answer},
        ]
    }


def write_tool_transcripts(
    path: str | os.PathLike,
    n: int,
    tools: Sequence[dict[str, Any]],
    digits: int = 3,
    ops: Sequence[str] = ("*",),
    seed: int = 0,
    exclude: set[Problem] | None = None,
    system: str | None = None,
) -> str:
    """Write ``n`` tool-call transcripts (:func:`tool_transcript_row`) to ``path``
    (``.parquet`` or ``.jsonl``), problems drawn like :func:`make_arithmetic_rows`."""
    if n < 1:
        raise ValueError(f"n={n} transcripts: must be >= 1")
    _check_args(digits, ops, "tool")
    problems = sample_problems(n, digits, ops, seed, exclude)
    return write_records([tool_transcript_row(p, tools, system) for p in problems], path)


def _build_parser(prog: str = "python -m verl.data.arithmetic") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Generate verifiable arithmetic prompt datasets in verl's format.",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--train-size", type=int, default=1000)
    p.add_argument("--val-size", type=int, default=200)
    p.add_argument("--digits", type=int, default=1, help=f"digits per operand (1 to {MAX_DIGITS})")
    p.add_argument(
        "--max-digits",
        type=int,
        default=None,
        help=f"operands up to this many digits (at most {MAX_DIGITS})",
    )
    p.add_argument("--ops", nargs="+", default=["+", "-", "*"], help="subset of + - '*'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=FORMATS, default="parquet", dest="fmt")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default="chat")
    p.add_argument(
        "--balance-digits",
        action="store_true",
        help="draw each operand's digit count uniformly from --digits..--max-digits",
    )
    p.add_argument(
        "--negative", action="store_true", help="subtraction in either order (negative answers)"
    )
    p.add_argument(
        "--phrasings",
        nargs="+",
        choices=list(PHRASINGS),
        default=["question"],
        help="question forms drawn per row (chat prompts)",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m verl.data.arithmetic") -> int:
    parser = _build_parser(prog)
    args = parser.parse_args(argv)
    if not 1 <= args.digits <= MAX_DIGITS:
        parser.error(
            f"--digits {args.digits}: must be >= 1 and <= {MAX_DIGITS} (operands are stored "
            "as 64-bit integers)"
        )
    if args.max_digits is not None and not args.digits <= args.max_digits <= MAX_DIGITS:
        parser.error(
            f"--max-digits {args.max_digits}: must be >= --digits {args.digits} and <= {MAX_DIGITS}"
        )
    digits = args.digits if args.max_digits is None else (args.digits, args.max_digits)
    if args.train_size < 1 or args.val_size < 1:
        parser.error("--train-size and --val-size must be >= 1")
    bad = [op for op in args.ops if op not in OPERATORS]
    if bad:
        parser.error(f"--ops {bad}: each op must be one of + - '*' (quote '*' in a shell)")
    try:
        train_path, val_path = write_arithmetic_dataset(
            args.out,
            args.train_size,
            args.val_size,
            digits,
            args.ops,
            args.seed,
            args.fmt,
            args.prompt_style,
            args.balance_digits,
            args.negative,
            args.phrasings,
        )
    except ValueError as e:
        parser.error(str(e))
    print(f"train: {train_path} ({args.train_size} rows)")
    print(f"val:   {val_path} ({args.val_size} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
