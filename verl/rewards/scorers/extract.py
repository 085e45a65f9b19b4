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


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    Also handles the brace-less form `\\boxed 5`. A boxed whose braces never close (a
    truncated response) is skipped in favour of an earlier complete one; None when there
    is no complete boxed answer.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and not \\boxed{3")
    '\\\\frac{1}{2}'
    """
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\b", text)]
    for match in reversed(starts):
        rest = text[match.end() :]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            content = _balanced(stripped)
            if content is not None:
                return content
            continue
        if rest[:1] == " ":
            token = re.match(r"\s+([^\s$]+)", rest)
            if token:
                return token.group(1)
    return None


def _balanced(text: str) -> str | None:
    """Content between the opening brace at text[0] and its matching close, or None."""
    depth = 0
    for i, char in enumerate(text):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[1:i]
    return None
