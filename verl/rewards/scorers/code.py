"""Code scorer: run the model's Python program against test cases in the sandbox.

The response's code is the last fenced block (```python ... ``` or ``` ... ```), or the
whole response when it has none. The ground truth (a dict, or a JSON string of one) holds
either

- `{"inputs": [str, ...], "outputs": [str, ...]}`: stdin/stdout cases; a case passes when
  the program exits 0 and its stdout equals the expected output up to surrounding and
  trailing-per-line whitespace; or
- `{"tests": "assert f(1) == 2\\n..."}`: assertions appended to the program; it passes
  when the program exits 0 (one case).

Every run goes through `verl.rewards.sandbox.run_python` (time and memory limits, no
network where possible, a temporary working directory removed afterwards). Score = the
fraction of cases passed; `acc` = 1.0 when all pass. Extras count the cases that timed out
(`timeouts`) or hit the memory limit (`memory_errors`). A ground truth that is not one of
the two shapes scores 0.0 with `invalid_ground_truth=1.0` (counted by the reward manager as
`reward/invalid_ground_truth`); the scorer never raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

from verl.rewards.sandbox import run_python

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 1024


def extract_code(text: str) -> str:
    """The last fenced code block of `text`, or `text` itself when there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def parse_tests(ground_truth: Any) -> list[tuple[str, str | None]] | None:
    """`[(stdin or appended test code, expected stdout or None)]`, or None if malformed."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError:
            return None
    if not isinstance(ground_truth, dict):
        return None
    if isinstance(ground_truth.get("tests"), str) and ground_truth["tests"].strip():
        return [(ground_truth["tests"], None)]
    inputs, outputs = ground_truth.get("inputs"), ground_truth.get("outputs")
    if (
        isinstance(inputs, list)
        and isinstance(outputs, list)
        and inputs
        and len(inputs) == len(outputs)
        and all(isinstance(x, str) for x in inputs + outputs)
    ):
        return list(zip(inputs, outputs))
    return None


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> dict[str, Any]:
    """Score one code response; see the module docstring.

    Returns `{"score", "acc", "passed", "total", "timeouts", "memory_errors"}`, plus
    `"invalid_ground_truth": 1.0` when the ground truth cannot be parsed.
    """
    del extra_info
    cases = parse_tests(ground_truth)
    if cases is None:
        return {"score": 0.0, "acc": 0.0, "invalid_ground_truth": 1.0}
    code = extract_code(solution_str if isinstance(solution_str, str) else "")
    passed = timeouts = memory_errors = 0
    for case, expected in cases:
        if expected is None:  # assertion tests appended to the program
            result = run_python(code + "\n\n" + case, timeout_s=timeout_s, memory_mb=memory_mb)
            ok = result.ok
        else:
            result = run_python(code, case, timeout_s=timeout_s, memory_mb=memory_mb)
            ok = result.ok and _normalize(result.stdout) == _normalize(expected)
        passed += ok
        timeouts += result.status == "timeout"
        memory_errors += result.status == "memory"
    total = len(cases)
    return {
        "score": passed / total,
        "acc": float(passed == total),
        "passed": passed,
        "total": total,
        "timeouts": timeouts,
        "memory_errors": memory_errors,
    }
