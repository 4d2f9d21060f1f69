"""Countdown: reach a target number from given numbers, each used once, with + - * / and brackets."""

from __future__ import annotations

import ast
from fractions import Fraction

from grpo.rewards.answers import _ANSWER_TAG

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an expression of integers and + - * /; anything else raises ValueError."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPS[type(node.op)](left, right)
    raise ValueError("not an arithmetic expression")


def check_equation(expression: str, numbers: list[int], target: int) -> bool:
    """True when `expression` uses exactly `numbers` (each once) and equals `target`."""
    if len(expression) > 200:
        return False
    try:
        used: list[int] = []
        value = _evaluate(ast.parse(expression.strip(), mode="eval"), used)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return sorted(used) == sorted(numbers) and value == target


def countdown_equation(prompts: list[str], completions: list[str], numbers: list, target: list,
                       **columns) -> list[float]:
    """1.0 when the equation (inside <answer> tags if present) uses each given number once and
    reaches the target, else 0.0."""
    out = []
    for completion, nums, tgt in zip(completions, numbers, target):
        tags = _ANSWER_TAG.findall(completion)
        expression = tags[-1] if tags else completion
        out.append(1.0 if check_equation(expression, list(nums), int(tgt)) else 0.0)
    return out
