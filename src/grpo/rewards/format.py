"""Format rewards."""

from __future__ import annotations

# DeepSeek-R1's template: reasoning in <think>, the final answer in <answer>, nothing around them.
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _is_think_answer(text: str) -> bool:
    """`<think>...</think><answer>...</answer>`, each tag once and in that order, only whitespace
    before, between and after. Counted and found with str methods, so it is linear in the length
    (a lazy regular expression over four tags backtracks quadratically on a flood of them)."""
    if not all(text.count(tag) == 1 for tag in _TAGS):
        return False
    think, think_end, answer, answer_end = (text.index(tag) for tag in _TAGS)
    return (think < think_end < answer < answer_end and not text[:think].strip()
            and not text[think_end + len("</think>"):answer].strip()
            and not text[answer_end + len("</answer>"):].strip())


def think_format(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>`, else 0.0."""
    return [1.0 if _is_think_answer(c) else 0.0 for c in completions]
