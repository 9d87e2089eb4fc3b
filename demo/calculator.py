"""Arithmetic for the model without eval: an `ast` whitelist with size checks made before any computation.

Only numbers, + - * / // % **, unary +/- and parentheses are accepted. Every bound is checked before the
operation that could be expensive (a power is sized from logarithms first), so no input runs long.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from gatedloop.tools.errors import ToolFailure

Number = int | float

MAX_LENGTH = 200
MAX_NODES = 400
MAX_NESTING = 100
MAX_EXPONENT = 100
MAX_DIGITS = 100
_LIMIT = 10**MAX_DIGITS

ALLOWED = "Only numbers, + - * / // % **, unary +/- and parentheses are allowed."

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _refuse(message: str) -> ToolFailure:
    return ToolFailure(message, error_type="invalid_arguments")


def safe_eval(expression: str) -> int | float:
    """The value of an arithmetic expression; anything else is a ToolFailure whose message is safe to show."""
    if not isinstance(expression, str):
        raise _refuse("The expression must be a string.")
    if len(expression) > MAX_LENGTH:
        raise _refuse(f"The expression is too long (at most {MAX_LENGTH} characters).")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _refuse(f"The expression is not valid arithmetic. {ALLOWED}") from None
    _check_shape(tree)
    return _eval(tree.body)


def _check_shape(tree: ast.Expression) -> None:
    """Bounds the tree iteratively, so the recursive evaluation below never goes deep."""
    nodes = 0
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES or depth > MAX_NESTING:
            raise _refuse("The expression is too complex.")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise _refuse(f"Unsupported literal: only real numbers are allowed. {ALLOWED}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise _refuse("Division by zero.") from None
        except OverflowError:
            raise _refuse(f"The result is too large (limit: {MAX_DIGITS} digits).") from None
        return _bounded(result)
    raise _refuse(f"Unsupported element in the expression ({type(node).__name__}). {ALLOWED}")


def _check_power(base: Number, exponent: Number) -> None:
    """Refuses a power whose result would be too large before computing it: 9**9**9 costs two logarithms."""
    if abs(exponent) > MAX_EXPONENT:
        raise _refuse(f"The exponent is too large (at most {MAX_EXPONENT} in absolute value).")
    if base != 0 and exponent > 0 and exponent * math.log10(abs(base)) >= MAX_DIGITS:
        raise _refuse(f"The result is too large (limit: {MAX_DIGITS} digits).")


def _bounded(value: Number | complex) -> Number:
    """Every intermediate value stays a finite real below 10**MAX_DIGITS, so the next operation is cheap."""
    if isinstance(value, complex):
        raise _refuse("The result is not a real number.")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) >= _LIMIT:
        raise _refuse(f"The result is too large (limit: {MAX_DIGITS} digits).")
    return value
