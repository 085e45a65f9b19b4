"""The built-in calculator tool: exact arithmetic on an expression, never ``eval``.

The expression is parsed with :mod:`ast` and only numbers, parentheses and the operators
``+ - * / // % **`` (binary and unary) are evaluated; a name, a call, an attribute or any
other node is refused. Integers stay exact (``1234 * 5678`` is ``7006652``); ``**`` is
limited to exponents up to 64 and operands up to 10**100 so that a call cannot be made to
run for minutes or eat the memory.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from verl.tools.base import Tool

__all__ = ["CALCULATOR_SCHEMA", "calculate", "calculator_tool"]

_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 10**100
_MAX_CHARS = 500

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly, e.g. '1234 * 5678'.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "numbers, parentheses and + - * / // % ** only",
                }
            },
            "required": ["expression"],
        },
    },
}


def _check(value: float) -> float:
    if abs(value) > _MAX_MAGNITUDE:
        raise ValueError("result too large")
    return value


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {_MAX_EXPONENT}")
        return _check(_BINARY[type(node.op)](left, right))
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:40]}")


def calculate(expression: str) -> str:
    """The value of the arithmetic ``expression`` as text; raises ``ValueError`` for
    anything that is not plain arithmetic and ``ZeroDivisionError`` for a division by 0."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"expression longer than {_MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def calculator_tool() -> Tool:
    """The calculator as a :class:`~verl.tools.base.Tool` named ``calculator``."""
    return Tool(name="calculator", schema=CALCULATOR_SCHEMA, fn=calculate)
