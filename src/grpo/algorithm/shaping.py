"""Reward shaping that depends on the completion, not on the task."""

from __future__ import annotations


def overlong_penalty(lengths: list[int], max_new_tokens: int, buffer_tokens: int,
                     penalty: float = 1.0) -> list[float]:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), one value per completion.

    0 up to max_new_tokens - buffer_tokens; then falls linearly to -penalty at max_new_tokens:
    ((max_new_tokens - buffer_tokens) - length) / buffer_tokens * penalty.
    `lengths` count what the budget `max_new_tokens` counts: a completion's tokens, or for a
    multi-turn episode every token after the prompt (the environment's too) against its
    `episode_tokens`.
    """
    if buffer_tokens <= 0:
        return [0.0] * len(lengths)
    free = max_new_tokens - buffer_tokens
    return [0.0 if n <= free else max(-1.0, (free - n) / buffer_tokens) * penalty for n in lengths]
