"""Countdown: reach a target number from given numbers, each used once, with + - * / and brackets.

The equation is read in bounded time whatever the completion holds: the last <answer>..</answer>
is found in one pass, and an expression longer than MAX_EQUATION_CHARS is not parsed. An equation
that cannot be read scores 0 with its cause counted (faults.py): `equation_too_long`,
`not_arithmetic` (not Python syntax, or names, calls, powers...), `divides_by_zero`.
"""

from __future__ import annotations

import ast
from fractions import Fraction

from grpo.rewards import faults
from grpo.rewards.answers import last_tagged

MAX_EQUATION_CHARS = 200    # a few numbers and operators; also bounds the Fractions' sizes

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class _Unreadable(ValueError):
    """An equation that cannot be judged; the message is the cause."""


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an expression of integers and + - * /; anything else raises _Unreadable."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Unreadable("divides_by_zero")
        return _OPS[type(node.op)](left, right)
    raise _Unreadable("not_arithmetic")


def judge_equation(expression: str, numbers: list[int], target: int) -> tuple[float, str | None]:
    """(1.0, None) when `expression` uses exactly `numbers` (each once) and equals `target`;
    (0.0, None) when it is a readable equation that does not; (0.0, cause) when it cannot be read."""
    if len(expression) > MAX_EQUATION_CHARS:
        return 0.0, "equation_too_long"
    try:
        used: list[int] = []
        value = _evaluate(ast.parse(expression.strip(), mode="eval"), used)
    except _Unreadable as e:
        return 0.0, str(e)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0.0, "not_arithmetic"
    return float(sorted(used) == sorted(numbers) and value == target), None


def check_equation(expression: str, numbers: list[int], target: int) -> bool:
    """True when `expression` uses exactly `numbers` (each once) and equals `target`."""
    return judge_equation(expression, numbers, target)[0] == 1.0


def countdown_equation(prompts: list[str], completions: list[str], numbers: list, target: list,
                       **columns) -> list[float]:
    """1.0 when the equation (inside <answer> tags if present) uses each given number once and
    reaches the target, else 0.0 (with a cause counted when it cannot be read)."""
    out = []
    for completion, nums, tgt in zip(completions, numbers, target):
        tagged = last_tagged(completion)
        score, cause = judge_equation(tagged if tagged is not None else completion, list(nums),
                                      int(tgt))
        if cause is not None:
            faults.count("countdown_equation", cause)
        out.append(score)
    return out
