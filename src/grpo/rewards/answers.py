"""Math answer rewards: the completion's final answer against the `answer` column.

Answers are compared with the `math-verify` library, so `\\frac{1}{2}`, `0.5` and `1/2` agree. Golds
may be bare values, `\\boxed{..}` or GSM8K solutions ending in `#### n`.
"""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*([^\n]+)")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_PROSE = re.compile(r"[a-zA-Z]{2,}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _marked_answer(text: str) -> str | None:
    """The answer a writer marked: last \\boxed{}, else last <answer>..</answer>, else `#### n`."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    gsm = _GSM8K.search(text)
    return gsm.group(1).strip() if gsm else None


def extract_answer(text: str) -> str | None:
    """A completion's final answer: the marked one, else the last number in the text."""
    marked = _marked_answer(text)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_gold(text: str) -> str | None:
    """A reference answer: the marked one; else the whole text when it is a bare value such as
    `\\frac{1}{2}` or `x=3`; else, for prose, its last number."""
    marked = _marked_answer(text)
    if marked is not None:
        return marked
    if _PROSE.search(_LATEX_COMMAND.sub("", text)):
        return extract_answer(text)
    return text.strip() or None


def _parse(text: str) -> list:
    from math_verify import parse  # imported here: it takes most of a second to load

    return parse(f"${text}$") or parse(text)


def math_accuracy(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the completion's final answer equals `answer` (via math-verify), else 0.0.

    None when the gold itself holds no value to compare with (the row cannot be scored).
    """
    from math_verify import verify

    out: list[float | None] = []
    for completion, gold_text in zip(completions, answer):
        gold = extract_gold(str(gold_text)) if gold_text is not None else None
        gold_parsed = _parse(gold) if gold else []
        if not gold_parsed:
            out.append(None)
            continue
        predicted = extract_answer(completion)
        pred_parsed = _parse(predicted) if predicted else []
        out.append(1.0 if pred_parsed and verify(gold_parsed, pred_parsed) else 0.0)
    return out


def exact_answer(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the answer (inside <answer> tags if present, else the whole completion, stripped)
    is exactly the string `answer`; a strict, fast check for tasks with canonical answers."""
    out = []
    for completion, gold in zip(completions, answer):
        tags = _ANSWER_TAG.findall(completion)
        given = tags[-1] if tags else completion
        out.append(1.0 if given.strip() == str(gold).strip() else 0.0)
    return out
