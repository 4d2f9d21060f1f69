"""Largest: `largest of 3 8 5 1:` -> `8`, over distinct digits. Held-out lists are a fixed hash-chosen
tenth of all lists, never seen in training.

A task a tiny model learns from rewards in minutes: a short cold start teaches the answer format
(one digit, then stop), and GRPO must learn which digit to pick.
"""

from __future__ import annotations

import itertools
import random
import zlib


class LargestTask:
    name = "largest"
    rewards = ["exact_answer"]

    def __init__(self, count: int = 4):
        self.count = count

    @staticmethod
    def is_held_out(digits: tuple[int, ...]) -> bool:
        return zlib.crc32(bytes(digits)) % 10 == 0

    def _rows(self, held_out: bool, seed: int) -> list[dict]:
        lists = [d for d in itertools.permutations(range(10), self.count)
                 if self.is_held_out(d) == held_out]
        random.Random(seed).shuffle(lists)
        return [{"prompt": f"largest of {' '.join(map(str, d))}:", "answer": str(max(d))}
                for d in lists]

    def train_rows(self, seed: int) -> list[dict]:
        return self._rows(held_out=False, seed=seed)

    def eval_rows(self) -> list[dict]:
        return self._rows(held_out=True, seed=1234)  # a fixed order, so eval_size takes the same lists

    def demonstration(self, row: dict) -> str:
        return row["answer"]
