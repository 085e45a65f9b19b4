"""Code scorer: run the model's Python program against test cases in the sandbox.

The response's code is the last fenced block (```python ... ``` or ``` ... ```), or the
whole response when it has none. The ground truth (a dict, or a JSON string of one) holds
either

- `{"inputs": [str, ...], "outputs": [str, ...]}`: stdin/stdout cases; a case passes when
  the program exits 0 and its stdout equals the expected output up to surrounding and
  trailing-per-line whitespace; or
- `{"tests": "assert f(1) == 2\\n..."}`: test statements run after the program (one case).

Score = the fraction of cases passed; `acc` = 1.0 when all pass. Extras count the cases that
timed out (`timeouts`) or hit the memory limit (`memory_errors`). A ground truth that is not
one of the two shapes (or whose tests are not valid Python) scores 0.0 with
`invalid_ground_truth=1.0` (counted by the reward manager as `reward/invalid_ground_truth`);
the scorer never raises.

A test case passes only on positive evidence that every test ran, never on the exit code
alone. Before each run the parent draws one random 16-byte token per test chunk (a
top-level test statement; very long test files are grouped into at most
`MAX_TEST_CHUNKS`) and writes them into a pipe. The harness (`code_harness.py`) reads the
tests from a descriptor and closes it, runs the solution, then runs the tests chunk by
chunk and after each chunk moves the next token from the pipe to a result file with
`os.splice`, inside the kernel. The parent scores the case passed only if the program
exited 0 and the result file holds exactly the tokens, in order. What this defeats, each
with a test in `tests/rewards/test_code_hacks.py`:

- ending early with a clean exit: `os._exit(0)`, `sys.exit(0)` in a `finally`, an `atexit`
  hook or `sys.excepthook` that exits 0, `SystemExit` raised from a function the tests
  call: the remaining tokens are never moved;
- replacing `print`, `sys.stdout` or the builtins, or writing guesses to every open
  descriptor and every file in the working directory: the tokens never exist in the
  process's memory, files, environment or arguments, so they cannot be printed;
- taking the tokens from the pipe (read, duplicate then read, `fcntl` duplicate, `tee` or
  `splice` into a pipe of its own, reopening `/proc/self/fd/N`): refused by the sandbox's
  seccomp filter (`run_python(splice_only=...)`) and by the pipe's owner and mode;
- patching builtins the tests use (`len`, `sorted`, `isinstance`...) or defining globals
  that shadow them: the tests run with a copy of the builtins taken before the solution
  ran, and without the solution's globals that shadow a builtin name;
- reading or draining the tests: they are in no file under any directory the program sees,
  and their descriptor is read (at offset 0, to its known length) and closed before the
  solution runs.

What it does not defeat (the program shares a process with the tests, so nothing in-process
can be fully trusted): code that performs the harness's own step (splicing from the token
descriptor into the result descriptor, the one move the filter must allow), rewrites the
harness's frames or objects with a trace function, `gc` or `ctypes` (which also reveals the
test source held in the harness's memory), monkeypatches library modules the tests import
(`math.isclose`), or returns objects whose `__eq__` always answers True. These need
knowledge of this harness or of the tests. Without the seccomp filter (the sandbox's
fallback) the token pipe can also be read. The sandbox's limits still contain whatever
such code does.

Every run goes through `verl.rewards.sandbox.run_python` (time and memory limits,
namespaces, a temporary working directory removed afterwards; see that module).
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

from verl.rewards.sandbox import SandboxResult, run_python

# Blanks, then a language and blanks only after one: two blank runs around an optional
# language made the search quadratic on a long run of blanks ("```" + " " * 20000: 3 s).
_FENCE = re.compile(r"```[ \t]*(?:(?:python3|python|py)[ \t]*)?\n(.*?)```", re.DOTALL)

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 1024
MAX_TEST_CHUNKS = 256  # tokens per run: 32 bytes each, well inside one pipe buffer
_TOKEN_BYTES = 16
_TOKEN_LEN = 2 * _TOKEN_BYTES  # hex digits
_HARNESS = (Path(__file__).with_name("code_harness.py")).read_text(encoding="utf-8")


def extract_code(text: str) -> str:
    """The last fenced code block of `text`, or `text` itself when there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def split_tests(tests: str) -> list[str] | None:
    """Test source split into chunks of whole top-level statements (at most
    `MAX_TEST_CHUNKS`), each padded with newlines so tracebacks show the original line
    numbers; None if it is not valid Python."""
    try:
        body = ast.parse(tests).body
    except (SyntaxError, ValueError):  # ValueError: NUL bytes
        return None
    if not body:
        return None
    starts = sorted(
        {
            min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            for node in body
        }
    )
    starts[0] = 1  # leading comments belong to the first chunk
    group = -(-len(starts) // MAX_TEST_CHUNKS)  # ceil: statements per chunk
    starts = starts[::group]
    lines = tests.splitlines(keepends=True)
    ends = [*starts[1:], len(lines) + 1]
    return ["\n" * (a - 1) + "".join(lines[a - 1 : b - 1]) for a, b in zip(starts, ends)]


def parse_tests(ground_truth: Any) -> list[tuple[str, str | None]] | None:
    """`[(stdin or test code, expected stdout or None)]`, or None if malformed."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError:
            return None
    if not isinstance(ground_truth, dict):
        return None
    tests = ground_truth.get("tests")
    if isinstance(tests, str) and tests.strip():
        return [(tests, None)] if split_tests(tests) is not None else None
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


def run_tests(
    code: str, tests: str, *, timeout_s: float, memory_mb: int
) -> tuple[bool, SandboxResult]:
    """Run `code` then `tests` under the token harness; `(passed, sandbox result)`.

    Raises:
        ValueError: `tests` is not valid Python (`parse_tests` rejects such ground truths).
    """
    chunks = split_tests(tests)
    if chunks is None:
        raise ValueError("test source is not valid Python")
    tokens = [secrets.token_hex(_TOKEN_BYTES).encode() for _ in chunks]
    token_r, token_w = os.pipe()
    try:
        os.write(token_w, b"".join(tokens))  # < 64 KiB: never blocks
        os.close(token_w)
        token_w = -1
        with tempfile.TemporaryFile() as tests_file, tempfile.TemporaryFile() as result_file:
            source = "\0".join(chunks).encode("utf-8")
            tests_file.write(source)
            tests_file.flush()
            fds = (tests_file.fileno(), token_r, result_file.fileno())
            result = run_python(
                code,
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                runner=_HARNESS,
                runner_args=[str(fds[0]), str(len(source)), *map(str, fds[1:]), str(_TOKEN_LEN)],
                pass_fds=fds,
                splice_only=(token_r, result_file.fileno()),
            )
            result_file.seek(0)
            evidence = result_file.read(len(tokens) * len(tokens[0]) + 1)
    finally:
        os.close(token_r)
        if token_w >= 0:
            os.close(token_w)
    return result.ok and evidence == b"".join(tokens), result


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
        if expected is None:  # test statements, run by the token harness
            ok, result = run_tests(code, case, timeout_s=timeout_s, memory_mb=memory_mb)
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
