"""Countdown: `Use 3 5 2 to make 16:` -> `(3+5)*2`. Problems come from random expression trees, so
each has at least one solution; held-out problems are a fixed seed's and never appear in training."""

from __future__ import annotations

import random
from fractions import Fraction

_OPS = ["+", "-", "*", "/"]


def _make_problem(rng: random.Random, count: int, high: int) -> tuple[list[int], int, str] | None:
    numbers = [rng.randint(1, high) for _ in range(count)]
    exprs = [(str(n), Fraction(n)) for n in numbers]
    while len(exprs) > 1:
        i, j = rng.sample(range(len(exprs)), 2)
        (ea, va), (eb, vb) = exprs[i], exprs[j]
        op = rng.choice(_OPS)
        if op == "/" and vb == 0:
            return None
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
        exprs = [e for k, e in enumerate(exprs) if k not in (i, j)] + [(f"({ea}{op}{eb})", value)]
    expression, value = exprs[0]
    if value.denominator != 1 or not 0 <= value <= 999:
        return None
    return numbers, int(value), expression[1:-1]


class CountdownTask:
    name = "countdown"
    rewards = ["countdown_equation"]

    def __init__(self, count: int = 3, high: int = 20, train_size: int = 10000, eval_size: int = 500):
        self.count, self.high = count, high
        self.train_size, self.eval_size = train_size, eval_size

    def _rows(self, seed: int, size: int, exclude: set) -> list[dict]:
        rng, rows, seen = random.Random(seed), [], set(exclude)
        for _ in range(size * 100):  # bounded: a small number range has few distinct problems
            if len(rows) == size:
                break
            problem = _make_problem(rng, self.count, self.high)
            if problem is None:
                continue
            numbers, target, solution = problem
            key = (tuple(sorted(numbers)), target)
            if key in seen:
                continue
            seen.add(key)
            prompt = f"Use {' '.join(map(str, numbers))} to make {target}:"
            rows.append({"prompt": prompt, "answer": str(target), "numbers": numbers,
                         "target": target, "solution": solution})
        return rows

    def eval_rows(self) -> list[dict]:
        return self._rows(seed=10_000, size=self.eval_size, exclude=set())

    def train_rows(self, seed: int) -> list[dict]:
        """The fixed training split, in an order that depends on `seed`."""
        held = {(tuple(sorted(r["numbers"])), r["target"]) for r in self.eval_rows()}
        rows = self._rows(seed=0, size=self.train_size, exclude=held)
        random.Random(seed).shuffle(rows)
        return rows

    def demonstration(self, row: dict) -> str:
        return row["solution"]
