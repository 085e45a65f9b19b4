"""Tools: the calculator's arithmetic and refusals, the sandboxed python tool, loading
tools from files and built-ins, and schemas derived from functions."""

from __future__ import annotations

import pytest

from verl.tools import load_tool, tool_from_function
from verl.tools.calculator import calculate


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1234 * 5678", "7006652"),
        ("(2 + 3) * -4", "-20"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("17 // 5 + 17 % 5", "5"),
        ("2 ** 10", "1024"),
    ],
)
def test_calculator_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('ls')", "unsupported syntax"),
        ("x + 1", "unsupported syntax"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 60 * 10 ** 60", "too large"),
        ("1 +", "not an arithmetic expression"),
        ("'a' * 3", "unsupported syntax"),
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression, error):
    with pytest.raises(ValueError, match=error):
        calculate(expression)


def test_calculator_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        calculate("1 / 0")


def test_python_tool_runs_code_in_the_sandbox():
    tool = load_tool("builtin", "python")
    assert tool.name == "python" and tool.schema["function"]["name"] == "python"
    assert tool(code="print(6 * 7)") == "42"
    failed = tool(code="raise SystemExit('bad')")
    assert "[error]" in failed and "bad" in failed


def test_python_tool_timeout_kills_the_program():
    from verl.tools.python_executor import python_tool

    tool = python_tool(timeout_s=0.5)
    assert "[timeout]" in tool(code="while True: pass")


def test_load_tool_from_a_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(
        "def reverse(text: str) -> str:\n"
        '    """Reverse a text.\n\n    Args:\n        text: what to reverse\n    """\n'
        "    return text[::-1]\n"
        "def undocumented(x):\n    return x\n"
    )
    tool = load_tool(str(path), "reverse")
    assert tool(text="abc") == "cba"
    assert tool.schema["function"]["parameters"]["required"] == ["text"]
    assert "return" not in tool.schema["function"]
    with pytest.raises(AttributeError, match="defines no 'missing'"):
        load_tool(str(path), "missing")
    with pytest.raises(ValueError, match="cannot derive a JSON schema for tool 'undocumented'"):
        load_tool(str(path), "undocumented")
    with pytest.raises(FileNotFoundError, match="tool file not found"):
        load_tool(str(tmp_path / "nope.py"), "reverse")
    with pytest.raises(AttributeError, match="built-in tools: \\['calculator', 'python'\\]"):
        load_tool("builtin", "search")


def test_tool_from_function_uses_a_given_schema():
    def f(**kwargs) -> str:
        return "x"

    f.schema = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert tool_from_function(f).schema is f.schema
