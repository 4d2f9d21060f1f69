"""The prompt stream: endless shuffled batches of rows, with a position a checkpoint saves, and
the rows' columns as reward functions receive them."""

from __future__ import annotations

import random


class PromptStream:
    """Endless batches of rows: shuffled by `seed`, reshuffled each pass. With `rows_at` (a
    curriculum: the rows of a level), `set_level` changes the rows and starts a new pass, and the
    level is part of the state a checkpoint saves."""

    def __init__(self, rows: list[dict], seed: int, rows_at=None, level: int = 0):
        self.rows, self.rng = list(rows), random.Random(seed)
        self.order: list[int] = []
        self.rows_at, self.level = rows_at, level

    def set_level(self, level: int) -> None:
        self.rows, self.level, self.order = list(self.rows_at(level)), level, []

    def state_dict(self) -> dict:
        """Where the stream is: the rows left in this pass and the shuffler's state (and the
        curriculum's level)."""
        state = {"order": list(self.order), "rng": self.rng.getstate()}
        return {**state, "level": self.level} if self.rows_at is not None else state

    def load_state_dict(self, state: dict) -> None:
        if self.rows_at is not None and state.get("level", self.level) != self.level:
            self.set_level(state["level"])
        self.order = list(state["order"])
        self.rng.setstate(state["rng"])

    def next_batch(self, size: int) -> list[dict]:
        batch = []
        while len(batch) < size:
            if not self.order:
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
            batch.append(self.rows[self.order.pop()])
        return batch


RAW_PROMPTS = "_grpo_prompt"   # the rows' prompts as the data holds them: text, or messages


def columns_of(rows: list[dict], repeat: int) -> dict[str, list]:
    """Every column but `prompt`, each value repeated for the `repeat` members of its group; and
    under RAW_PROMPTS the prompt as the row holds it, which only a reward marked
    rewards.as_messages is given (the others get the prompt as the model saw it)."""
    keys = [k for k in rows[0] if k not in ("prompt", "_row")] + [RAW_PROMPTS]
    return {k: [row.get("prompt" if k == RAW_PROMPTS else k) for row in rows for _ in range(repeat)]
            for k in keys}
