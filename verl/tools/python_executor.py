"""The built-in Python executor tool: runs model-written code in the code-reward sandbox.

The code runs through :func:`verl.rewards.sandbox.run_python`: a fresh temporary
directory, a wall-clock and CPU limit, an address-space limit, no network, and (where the
kernel allows) private namespaces and filesystem; the child dies with the thread that
started it. The tool returns what the program printed (stdout, then stderr when it
failed), cut to ``max_output_chars``. A run never outlasts the agent loop's deadline for
the call (:func:`verl.tools.base.time_left`): the sandbox is killed then, so the tool's
thread ends with the round instead of running on.
"""

from __future__ import annotations

from verl.rewards.sandbox import run_python
from verl.tools.base import Tool, time_left

__all__ = ["PYTHON_SCHEMA", "python_tool"]

PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program and return what it prints (no network, "
        "no files kept, a few seconds at most).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program to run"}},
            "required": ["code"],
        },
    },
}


def python_tool(timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000) -> Tool:
    """The executor as a :class:`~verl.tools.base.Tool` named ``python``."""

    def run(code: str) -> str:
        if not isinstance(code, str):
            raise ValueError(f"code must be a string, got {type(code).__name__}")
        left = time_left()
        limit = timeout_s if left is None else min(timeout_s, left)
        if limit <= 0:
            raise TimeoutError("no time left for this call")
        result = run_python(code, timeout_s=limit, memory_mb=memory_mb)
        text = result.stdout
        if result.status != "ok":
            text += f"\n[{result.status}] {result.stderr.strip()[-max_output_chars // 2 :]}"
        text = text.strip() or "(no output)"
        if len(text) > max_output_chars:
            text = text[:max_output_chars] + "\n...(output truncated)"
        return text

    return Tool(name="python", schema=PYTHON_SCHEMA, fn=run)
