"""Calculator: `What is 482*37?` -> `17834`, with a calculator tool the model may call.

Products have five digits, so copying a result is the same at every position.

A tiny model cannot multiply a three-digit by a two-digit number in its head; with the tool it
only has to write the call and copy the result. The cold start shows the call on a quarter of the
training rows and a direct answer on the rest, and on every row how to copy a result once it is
there; so GRPO starts from a policy that seldom calls the tool and is seldom right, and learns
that calling pays.
Held-out pairs are a fixed hash-chosen tenth of all pairs.
"""

from __future__ import annotations

import random
import zlib


class CalculatorTask:
    name = "calculator"
    rewards = ["final_answer"]
    tools = ["calculator"]

    def __init__(self, tool_share: float = 0.25):
        self.tool_share = tool_share

    @staticmethod
    def _hash(a: int, b: int) -> int:
        return zlib.crc32(f"{a}*{b}".encode())

    def _pairs(self, held_out: bool) -> list[tuple[int, int]]:
        return [(a, b) for a in range(100, 1000) for b in range(10, 100)
                if a * b >= 10000 and (self._hash(a, b) % 10 == 0) == held_out]

    def _row(self, a: int, b: int) -> dict:
        return {"prompt": f"What is {a}*{b}?", "answer": str(a * b), "a": a, "b": b}

    def train_rows(self, seed: int) -> list[dict]:
        pairs = sorted(self._pairs(held_out=False), key=lambda p: self._hash(*p))[:20000]
        random.Random(seed).shuffle(pairs)         # the same 20,000 pairs, in a seed's order
        return [self._row(a, b) for a, b in pairs]

    def eval_rows(self) -> list[dict]:
        pairs = self._pairs(held_out=True)
        random.Random(1234).shuffle(pairs)
        return [self._row(a, b) for a, b in pairs[:1000]]

    def demonstration(self, row: dict) -> list[tuple[str, str]]:
        """(text after the prompt that is context, text to imitate), turn by turn: the first
        turn calls the tool on `tool_share` of the rows and answers directly on the rest; every
        row also shows the turn after a result, which copies it."""
        a, b = row["a"], row["b"]
        call = f"<call>calculator {a}*{b}</call>"
        uses_tool = (self._hash(a, b) // 10) % 100 < self.tool_share * 100
        return [("", call if uses_tool else str(a * b)),
                (f"{call}<result>{a * b}</result>", str(a * b))]
