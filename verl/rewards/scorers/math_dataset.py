"""MATH-dataset scorer: compare the last `\\boxed{...}` answer after light normalisation.

The response's answer is the content of its last complete `\\boxed{...}` (nested braces
allowed); no boxed answer scores 0. The ground truth is the bare answer, or a full solution
whose last boxed answer is used.

Normalisation (`normalize_answer`) is a documented subset of the usual MATH rules, applied
to both sides in this order:

1. drop `\\!`, `\\,`, `\\;`, `\\:`, `\\ `, `\\displaystyle`, `\\left`, `\\right`, `$`, `\\$`;
2. `\\dfrac` / `\\tfrac` -> `\\frac`;
3. drop degrees: `^\\circ`, `^{\\circ}`, `°`;
4. drop a unit written as a trailing `\\text{...}` / `\\mbox{...}` after a value
   (`5\\text{ cm}^2` -> `5`), then unwrap any remaining `\\text{X}`, `\\textbf{X}`,
   `\\mathrm{X}`, `\\mbox{X}` -> `X`;
5. drop `\\%` and `%`; remove all whitespace; drop trailing periods;
6. drop a short left-hand side: `x=5` -> `5` (one or two letters before a single `=`);
7. brace shorthand: `\\frac12` -> `\\frac{1}{2}`, `\\sqrt2` -> `\\sqrt{2}`;
8. `.5` -> `0.5`; a plain `a/b` of integers -> `\\frac{a}{b}`; drop comma thousands
   separators when the whole answer is one number (`1,000` -> `1000`, but `(1,2)` stays).

Two answers are equal when their normalised strings are equal, or when both are plain
numbers (integers, decimals or `\\frac{a}{b}` of integers, optionally negative) with the
same value, so `0.5`, `\\frac{1}{2}` and `1/2` all match. Not handled: symbolic
equivalence (`\\sqrt{8}` vs `2\\sqrt{2}`), reordered sets or intervals, bare-word units.

Never raises: an empty or non-string ground truth scores 0 with `invalid_ground_truth=1.0`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from verl.rewards.scorers.extract import bounded, last_boxed

_SPACING = ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\displaystyle", "\\$", "$")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_TRAILING_UNIT_RE = re.compile(r"^(.*\S)\s*\\(?:text|mbox)\{[^{}]*\}(?:\^\{?\d\}?)?$", re.DOTALL)
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_SHORT_LHS_RE = re.compile(r"^[a-zA-Z]{1,2}=(?!=)(.+)$")
_LEADING_DOT_RE = re.compile(r"(^|[^\d])\.(\d)")
_INT_RATIO_RE = re.compile(r"(-?)(\d+)/(\d+)")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC_NUMBER_RE = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def normalize_answer(answer: str) -> str:
    """Normalise a MATH answer string (see the module docstring for the rules)."""
    text = answer.strip()
    for token in _SPACING:
        text = text.replace(token, "")
    text = _LEFT_RIGHT_RE.sub("", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = _DEGREES_RE.sub("", text).replace("°", "")
    unit = _TRAILING_UNIT_RE.match(text.strip())
    if unit:
        text = unit.group(1)
    text = _TEXT_WRAP_RE.sub(r"\1", text)
    text = text.replace("\\%", "").replace("%", "")
    text = re.sub(r"\s+", "", text).rstrip(".")
    lhs = _SHORT_LHS_RE.match(text)
    if lhs:
        text = lhs.group(1)
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = _LEADING_DOT_RE.sub(r"\g<1>0.\2", text)
    ratio = _INT_RATIO_RE.fullmatch(text)
    if ratio:
        text = f"{ratio.group(1)}\\frac{{{ratio.group(2)}}}{{{ratio.group(3)}}}"
    if _THOUSANDS_RE.fullmatch(text):
        text = text.replace(",", "")
    return text


def _as_number(normalized: str) -> Fraction | None:
    """Value of a normalised answer that is a plain number or integer fraction, or None."""
    try:
        frac = _FRAC_NUMBER_RE.fullmatch(normalized)
        if frac:
            value = Fraction(int(frac.group(2)), int(frac.group(3)))
            return -value if frac.group(1) else value
        if _PLAIN_NUMBER_RE.fullmatch(normalized):
            return Fraction(normalized)
    except (ZeroDivisionError, ValueError):  # ValueError: over Python's 4300-digit limit
        return None
    return None


def is_equiv(pred: str, target: str) -> bool:
    """True when two normalised answers match as strings or as numbers."""
    if pred == target:
        return True
    pred_value, target_value = _as_number(pred), _as_number(target)
    return pred_value is not None and pred_value == target_value


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.0,
) -> dict[str, Any]:
    """Score one MATH response.

    Returns `{"score": float, "acc": float, "pred": str | None}` (pred normalised) and,
    when the ground truth is empty or not text, `"invalid_ground_truth": 1.0`.
    """
    del extra_info  # same signature as every scorer; MATH needs no extra context
    if isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    if not isinstance(ground_truth, str):
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    ground_truth = bounded(ground_truth)
    boxed_truth = last_boxed(ground_truth) if "\\boxed" in ground_truth else None
    target = normalize_answer(boxed_truth if boxed_truth is not None else ground_truth)
    if not target:
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    boxed = last_boxed(bounded(solution_str)) if isinstance(solution_str, str) else None
    if boxed is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    pred = normalize_answer(boxed)
    correct = is_equiv(pred, target)
    return {
        "score": 1.0 if correct else float(format_score),
        "acc": 1.0 if correct else 0.0,
        "pred": pred,
    }
