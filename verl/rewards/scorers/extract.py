"""Text helpers shared by the rule-based scorers: find numbers and `\\boxed{...}` answers.

Numbers: optional sign, digits with optional comma thousands separators ("1,234,567"),
optional decimal part. A minus sign counts as a sign only when it does not follow a word
character or a closing bracket, so "7-3" yields 7 and 3 while "x = -3" yields -3. A trailing
period ("is 42.") is a full stop, not a decimal point. Values are parsed to `Fraction` so
that comparisons are exact ("12.0" equals 12, large integers stay exact).
"""

from __future__ import annotations

import re
from fractions import Fraction

# One number: thousands-grouped digits (not followed by more digits) or plain digits,
# then an optional decimal part that needs at least one digit after the point.
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_FULL_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# Characters of a response the scorers read (its end): 25x a 4k-token response's text.
MAX_SCORED_CHARS = 100_000
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")
_SPACES_RE = re.compile(r"\s*")
_BARE_TOKEN_RE = re.compile(r"\s+([^\s$]+)")
# Characters after which "-" is a binary minus, not a sign.
_MINUS_AFTER = re.compile(r"[\w)\]}]")
_UNICODE_MINUSES = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2012": "-"})


def find_numbers(text: str) -> list[str]:
    """All numbers in `text`, left to right, as strings without thousands separators.

    >>> find_numbers("I had 1,234 apples, ate -5.5 and 7-3 = 4.")
    ['1234', '-5.5', '7', '3', '4']
    """
    text = text.translate(_UNICODE_MINUSES)
    found = []
    for match in _NUMBER_RE.finditer(text):
        token = match.group(0)
        start = match.start()
        if token.startswith("-") and start > 0 and _MINUS_AFTER.match(text[start - 1]):
            token = token[1:]
        found.append(token.replace(",", ""))
    return found


def last_number(text: str) -> str | None:
    """The last number in `text` (see `find_numbers`), or None."""
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def first_number(text: str) -> str | None:
    """The first number in `text` (see `find_numbers`), or None."""
    numbers = find_numbers(text)
    return numbers[0] if numbers else None


def to_fraction(token: str) -> Fraction | None:
    """Parse a number token such as "-1234.5" to an exact Fraction, or None."""
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def parse_number(value: object) -> Fraction | None:
    """Parse a whole value that should be exactly one number (a ground truth), or None.

    Accepts ints, finite floats and strings like "72", " -5 ", "1,234", "$1,234.50", "42.",
    "7%". Anything else (text, several numbers, bools, NaN) gives None.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if value == value and abs(value) != float("inf") else None
    if not isinstance(value, str):
        return None
    text = value.translate(_UNICODE_MINUSES).strip()
    text = text.replace("\\$", "").replace("$", "").replace("\\%", "").rstrip("%").strip()
    text = text.rstrip(".").strip()
    if not _FULL_NUMBER_RE.fullmatch(text):
        return None
    return to_fraction(text.replace(",", ""))


def format_number(value: Fraction) -> str:
    """Render a Fraction as an integer or a plain decimal string ("12", "-0.25")."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


def score_number(token: str | None, target: Fraction, format_score: float) -> dict:
    """The result dict of a numeric scorer: the predicted ``token`` compared with ``target``.

    ``score`` is 1 when equal, ``format_score`` when a number was given but wrong, 0 when
    there is none; ``acc`` is 1 or 0; ``pred`` the prediction in canonical form.
    """
    pred = to_fraction(token) if token is not None else None
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    correct = pred == target
    return {
        "score": 1.0 if correct else float(format_score),
        "acc": 1.0 if correct else 0.0,
        "pred": format_number(pred),
    }


def bounded(text: str) -> str:
    """The last :data:`MAX_SCORED_CHARS` characters of ``text`` (the answer is at its end):
    what the scorers read, so that no response, however long, costs more than that."""
    return text[-MAX_SCORED_CHARS:] if len(text) > MAX_SCORED_CHARS else text


def matching_braces(text: str) -> dict[int, int]:
    """``{index of a "{": index of its matching "}"}`` for every brace that closes, in one
    pass with a stack (a "}" with no open brace is ignored)."""
    opened: list[int] = []
    pairs: dict[int, int] = {}
    for i, char in enumerate(text):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            pairs[opened.pop()] = i
    return pairs


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    Also handles the brace-less form `\\boxed 5`. A boxed whose braces never close (a
    truncated response) is skipped in favour of an earlier complete one; None when there
    is no complete boxed answer. Linear in ``len(text)``: the braces are matched once for
    the whole text, and each ``\\boxed`` is then looked up, not rescanned.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and not \\boxed{3")
    '\\\\frac{1}{2}'
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    pairs = matching_braces(text) if "{" in text else {}
    for end in reversed(starts):
        brace = _SPACES_RE.match(text, end).end()  # the whitespace runs are disjoint
        if text.startswith("{", brace):
            close = pairs.get(brace)
            if close is not None:
                return text[brace + 1 : close]
            continue
        if text.startswith(" ", end):
            token = _BARE_TOKEN_RE.match(text, end)
            if token:
                return token.group(1)
    return None
