"""The rewards of the built-in tasks: countdown's equation, and reasoning-gym's own scorers.

Countdown: reach a target number from given numbers, each used once, with + - * / and brackets.

The equation is read in bounded time whatever the completion holds: the last <answer>..</answer>
is found in one pass, and an expression longer than MAX_EQUATION_CHARS is not parsed. An equation
that cannot be read scores 0 with its cause counted (faults.py): `equation_too_long`,
`not_arithmetic` (not Python syntax, or names, calls, powers...), `divides_by_zero`.

reasoning-gym (`task=reasoning_gym:NAME`, data/tasks/gym.py): `reasoning_gym` scores a completion
with the task's own code, `score_answer(extract_answer(completion), entry)`, in worker processes
with the same CPU budget and deadline as math answers (answers.py): a scorer that uses up the
budget scores 0 (`scorer_overran`), one that raises scores 0 (`scorer_raised`), one that returns
something other than a finite number scores 0 (`scorer_not_a_number`); a worker starved past its
deadline or killed gives None. The task's own rules stand: its default `score_answer` gives partial
credit, len(answer) / len(completion's answer), to an answer that contains the right one.
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


def _gym_dataset(task: str, config_json: str):
    key = (task, config_json)
    if key not in _GYM_DATASETS:
        import json

        import reasoning_gym
        from grpo.data.tasks.gym import typed_knobs
        knobs = typed_knobs(task, json.loads(config_json))     # enum fields travel as their values
        _GYM_DATASETS[key] = reasoning_gym.create_dataset(task, seed=0, size=1, **knobs)
    return _GYM_DATASETS[key]


_GYM_DATASETS: dict = {}


def score_gym(task: str, config_json: str, entry_json: str, completion: str):
    """In a worker: the task's own extraction and score (module docstring)."""
    import json

    from reasoning_gym.utils import extract_answer
    return _gym_dataset(task, config_json).score_answer(extract_answer(completion), json.loads(entry_json))


def gym_pool():
    """The worker processes that run reasoning-gym's scorers with a deadline (started on first use)."""
    global _GYM_POOL
    if _GYM_POOL is None:
        import atexit

        from grpo.rewards.answers import MATH_CPU_S, MATH_DEADLINE_S, MATH_WORKERS
        from grpo.sandbox.pool import DeadlinePool
        _GYM_POOL = DeadlinePool(score_gym, workers=MATH_WORKERS, deadline_s=MATH_DEADLINE_S,
                                 cpu_s=MATH_CPU_S)
        atexit.register(_GYM_POOL.close)
    return _GYM_POOL


_GYM_POOL = None
_GYM_CAUSES = {"cpu": "scorer_overran", "error": "scorer_raised"}


def reasoning_gym(prompts: list[str], completions: list[str], rg_task: list, rg_config: list,
                  rg_entry: list, **columns) -> list:
    """A reasoning-gym task's own score of each completion (module docstring), in [0, 1]."""
    import math
    jobs = [((t, c, e, completion), {}) for t, c, e, completion in zip(rg_task, rg_config, rg_entry, completions)]
    out: list[float | None] = []
    for kind, value in gym_pool().run(jobs) if jobs else []:
        if kind == "ok":
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if math.isfinite(number):
                out.append(number)
                continue
            faults.count("reasoning_gym", "scorer_not_a_number")
            out.append(0.0)
        elif kind in _GYM_CAUSES:
            faults.count("reasoning_gym", _GYM_CAUSES[kind])
            out.append(0.0)
        else:
            out.append(None)
    return out
