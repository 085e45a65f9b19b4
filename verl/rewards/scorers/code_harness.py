"""The test harness that runs inside the code sandbox for `{"tests": ...}` ground truths.

Never imported by verl: `verl.rewards.scorers.code` reads this file as text and runs it as
`python -I -S -c <source> SOLUTION_PATH TESTS_FD TESTS_LEN TOKEN_FD RESULT_FD TOKEN_LEN`.
It

1. binds every function it will need later to local variables, before any model code runs,
   so a solution that replaces builtins or `os` functions cannot change what it does;
2. reads the test chunks (NUL-separated sources, TESTS_LEN bytes at offset 0 of TESTS_FD)
   and closes that descriptor, so the solution can neither read nor drain it;
3. runs the solution as `__main__` in its own namespace;
4. runs the test chunks one by one in a namespace holding the solution's names (minus any
   that shadow a builtin) and a pristine copy of the builtins taken at step 1;
5. after each chunk completes, moves TOKEN_LEN bytes from the TOKEN_FD pipe to RESULT_FD
   with `os.splice`: the parent's random tokens go from one kernel buffer to another and are
   never in this process's memory, so nothing the solution does can print them.

It must only use the standard library (the sandbox runs without site-packages).
"""

import builtins
import os
import sys


def _main() -> None:
    run, build, splice = exec, compile, os.splice
    pristine = dict(vars(builtins))  # before the solution can patch the builtins module
    path = sys.argv[1]
    tests_fd, tests_len, token_fd, result_fd, token_len = (int(x) for x in sys.argv[2:7])
    sys.argv[:] = [path]  # what a solution run as a script used to see
    data = b""
    while len(data) < tests_len:  # pread: independent of the descriptor's file position
        block = os.pread(tests_fd, tests_len - len(data), len(data))
        if not block:
            raise SystemExit("test harness: the tests are truncated")
        data += block
    os.close(tests_fd)
    chunks = tuple(data.decode("utf-8").split("\0"))  # a tuple: cannot be edited in place
    del data
    with open(path, encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": builtins}
    run(build(source, path, "exec"), namespace)

    test_namespace = {k: v for k, v in namespace.items() if k not in pristine}
    test_namespace["__name__"] = "__main__"
    test_namespace["__builtins__"] = pristine
    for chunk in chunks:
        run(build(chunk, "<tests>", "exec"), test_namespace)
        moved = 0
        while moved < token_len:
            step = splice(token_fd, result_fd, token_len - moved)
            if step <= 0:
                raise SystemExit("test harness: token pipe exhausted")
            moved += step


if __name__ == "__main__":  # run with `python -c`; importing it does nothing
    _main()
