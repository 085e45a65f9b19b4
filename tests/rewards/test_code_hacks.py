"""Reward hacks against the code scorer: a wrong solution scores 0 whatever it does.

Every wrong solution below returns the wrong answer and then tries to make the run look
successful; each scored 1.0 when a clean exit was the only evidence. A correct solution
(including one that uses the same tricks harmlessly) still scores 1.0.
"""

from __future__ import annotations

import pytest

from verl.rewards import sandbox
from verl.rewards.scorers import code

TESTS = {"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"}
WRONG = "def add(a, b):\n    return 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"

# Writes 32-hex-digit guesses (the token format) everywhere it can, then exits cleanly.
FAKE_TOKENS = """
import os, sys, builtins
guess = (os.urandom(16).hex() + "\\n").encode() * 64
for fd in range(0, 64):
    try:
        os.write(fd, guess)
    except OSError:
        pass
for name in os.listdir("."):
    try:
        with open(name, "ab") as f:
            f.write(guess)
    except OSError:
        pass
for name in os.listdir("/proc/self/fd"):
    try:
        with open("/proc/self/fd/" + name, "ab") as f:
            f.write(guess)
    except OSError:
        pass
builtins.print = lambda *a, **k: sys.__stdout__.write("ok\\n")
sys.stdout = sys.stderr = open(os.devnull, "w")
"""

HACKS = {
    "os._exit": WRONG + "import os\nos._exit(0)\n",
    "atexit": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook": WRONG + "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "sys.exit in finally": (
        "import sys\n"
        "def add(a, b):\n"
        "    try:\n"
        "        return 0\n"
        "    finally:\n"
        "        sys.exit(0)\n"
    ),
    "SystemExit from a test": "def add(a, b):\n    raise SystemExit(0)\n",
    "KeyboardInterrupt swallowed": (
        "import signal, os\nsignal.signal(signal.SIGINT, lambda *a: os._exit(0))\n"
        "def add(a, b):\n    os.kill(os.getpid(), signal.SIGINT)\n"
    ),
    "fake tokens": WRONG + FAKE_TOKENS + "os._exit(0)\n",
    "fake tokens then fail": WRONG + FAKE_TOKENS,
}


# Takes the harness's descriptors from its frame (the solution runs inside the harness).
HARNESS_FDS = """
import os, sys
_harness = sys._getframe(1).f_locals
tests_fd, token_fd, result_fd = _harness["tests_fd"], _harness["token_fd"], _harness["result_fd"]
"""
# Takes the tokens from the token pipe and writes them where the parent looks.
RELAYS = {
    "read": "os.read(token_fd, 1 << 16)",
    "dup then read": "os.read(os.dup(token_fd), 1 << 16)",
    "fcntl dup then read": "os.read(__import__('fcntl').fcntl(token_fd, 0, 100), 1 << 16)",
    "reopen through /proc": "open(f'/proc/self/fd/{token_fd}', 'rb').read(1 << 16)",
    "splice into a pipe of its own": (
        "(lambda r, w: (os.splice(token_fd, w, 1 << 16), os.read(r, 1 << 16))[1])(*os.pipe())"
    ),
    "tee into a pipe of its own": "tee_then_read()",
}


TEE = """
def tee_then_read():
    import ctypes
    r, w = os.pipe()
    if ctypes.CDLL(None, use_errno=True).tee(token_fd, w, 1 << 16, 0) < 0:
        raise OSError(ctypes.get_errno(), "tee failed")
    return os.read(r, 1 << 16)
"""


@pytest.mark.skipif(not sandbox.isolation().seccomp, reason="needs the sandbox's seccomp filter")
@pytest.mark.parametrize("relay", sorted(RELAYS))
def test_tokens_cannot_be_taken_from_the_pipe(relay):
    code_ = (
        WRONG
        + HARNESS_FDS
        + TEE
        + f"try:\n    os.write(result_fd, {RELAYS[relay]})\n    os._exit(0)\n"
        + "except OSError as exc:\n    print('refused', exc)\n"
    )
    ok, result = code.run_tests(code_, TESTS["tests"], timeout_s=5.0, memory_mb=512)
    assert not ok
    assert "refused" in result.stdout, (result.stdout, result.stderr)


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_wrong_solution_scores_0_whatever_it_does(hack):
    out = code.compute_score(HACKS[hack], TESTS)
    assert (out["score"], out["acc"], out["passed"]) == (0.0, 0.0, 0), out


@pytest.mark.parametrize(
    ("tests", "solution"),
    [
        # patched builtins the tests use
        (
            "assert sorted(digits(321)) == [1, 2, 3]",
            "import builtins\ndef digits(n):\n    return [9]\nbuiltins.sorted = lambda x: [1, 2, 3]\n",
        ),
        (
            "assert len(twice('ab')) == 4",
            "import builtins\ndef twice(s):\n    return s\nbuiltins.len = lambda x: 4\n",
        ),
        # a global that shadows the builtin the tests call
        (
            "assert isinstance(half(3), float)",
            "def half(x):\n    return x // 2\ndef isinstance(*a):\n    return True\n",
        ),
        # a different AssertionError in builtins never changed the assert statement (a
        # regression guard: this one scored 0 before the harness too)
        (
            "assert add(2, 3) == 5",
            "import builtins\nclass Quiet(Exception):\n    pass\n"
            "builtins.AssertionError = Quiet\n" + WRONG,
        ),
    ],
)
def test_patched_or_shadowed_builtins_do_not_fool_the_tests(tests, solution):
    assert code.compute_score(solution, {"tests": tests})["score"] == 0.0


def test_draining_the_tests_descriptor_does_not_skip_the_tests():
    # With one test chunk, a harness that read the tests after the solution ran would run
    # an empty chunk and move the one token the parent expects.
    drain = (
        WRONG + HARNESS_FDS + "try:\n    os.read(tests_fd, 1 << 20)\nexcept OSError:\n    pass\n"
    )
    assert code.compute_score(drain, {"tests": "assert add(2, 3) == 5"})["score"] == 0.0


def test_correct_solutions_still_score_1():
    assert code.compute_score(RIGHT, TESTS)["score"] == 1.0
    # harmless use of the same tricks: atexit, its own print, a helper shadowing a builtin
    tricks = (
        "import atexit, builtins\natexit.register(lambda: None)\n"
        "def max(a, b):\n    return a if a > b else b\n"
        "def add(a, b):\n    print('adding', a, b)\n    return max(a, b) + min(a, b)\n"
    )
    tests = TESTS["tests"] + "assert max([1, 5, 2]) == 5  # the builtin, not the solution's\n"
    assert code.compute_score(tricks, {"tests": tests})["score"] == 1.0


def test_test_statements_of_every_shape_run():
    tests = (
        "# comment before\n"
        "import functools\n"
        "@functools.lru_cache\n"
        "def check(n):\n"
        "    return add(n, n) == 2 * n\n"
        "x = 1; assert check(x)\n"
        "for i in range(5):\n"
        "    assert check(i)\n"
        "if True:\n"
        "    assert add(1, 2) == 3\n"
    )
    assert code.compute_score(RIGHT, {"tests": tests})["score"] == 1.0
    ok, result = code.run_tests(WRONG, tests, timeout_s=5.0, memory_mb=512)
    assert not ok
    assert 'File "<tests>", line 6' in result.stderr  # original line numbers


def test_many_statements_are_grouped_into_chunks():
    tests = "".join(f"assert add({i}, 1) == {i + 1}\n" for i in range(1000))
    chunks = code.split_tests(tests)
    assert len(chunks) == 250  # 4 statements per chunk, at most MAX_TEST_CHUNKS
    assert code.compute_score(RIGHT, {"tests": tests})["score"] == 1.0
    almost = tests + "assert add(0, 0) == 1\n"
    assert code.compute_score(RIGHT, {"tests": almost})["score"] == 0.0


def test_tests_are_not_in_any_file_the_solution_sees():
    spy = (
        "import os\n"
        "for root, _, files in os.walk('.'):\n"
        "    for f in files:\n"
        "        print(open(os.path.join(root, f), errors='replace').read())\n"
        "import sys\nprint(open(sys.argv[0]).read())\n"
    )
    ok, result = code.run_tests(spy, "assert 'SECRET-EXPECTED' != 1", timeout_s=5.0, memory_mb=512)
    assert result.ok and ok  # the spy ran to the end and the tests passed
    assert "SECRET-EXPECTED" not in result.stdout


def test_invalid_test_source_is_an_invalid_ground_truth():
    assert code.compute_score(RIGHT, {"tests": "assert (("})["invalid_ground_truth"] == 1.0


def test_partial_credit_of_io_cases_is_kept():
    truth = {"inputs": ["1\n", "2\n"], "outputs": ["2", "4"]}
    out = code.compute_score("n = int(input())\nprint(4 if n == 2 else 0)", truth)
    assert (out["score"], out["acc"], out["passed"], out["total"]) == (0.5, 0.0, 1, 2)
