"""Addition: `a+b=` -> `c`. Held-out pairs are a fixed hash-chosen tenth of all pairs."""

from __future__ import annotations

import random
import zlib


class AdditionTask:
    name = "addition"
    rewards = ["exact_answer"]

    def __init__(self, low: int = 0, high: int = 99):
        self.low, self.high = low, high

    @staticmethod
    def is_held_out(a: int, b: int) -> bool:
        return zlib.crc32(f"{a}+{b}".encode()) % 10 == 0

    def _row(self, a: int, b: int) -> dict:
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}

    def _pairs(self, held_out: bool) -> list[tuple[int, int]]:
        span = range(self.low, self.high + 1)
        return [(a, b) for a in span for b in span if self.is_held_out(a, b) == held_out]

    def train_rows(self, seed: int) -> list[dict]:
        pairs = self._pairs(held_out=False)
        random.Random(seed).shuffle(pairs)
        return [self._row(a, b) for a, b in pairs]

    def eval_rows(self) -> list[dict]:
        pairs = self._pairs(held_out=True)
        random.Random(1234).shuffle(pairs)  # a fixed order, so eval_size takes the same prompts
        return [self._row(a, b) for a, b in pairs]

    def demonstration(self, row: dict) -> str:
        return row["answer"]
