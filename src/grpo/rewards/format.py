"""Format rewards."""

from __future__ import annotations

import re

# DeepSeek-R1's template: reasoning in <think>, the final answer in <answer>, nothing around them.
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def think_format(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>`, else 0.0."""
    return [1.0 if _THINK_ANSWER.match(c) and all(c.count(tag) == 1 for tag in _TAGS) else 0.0
            for c in completions]
