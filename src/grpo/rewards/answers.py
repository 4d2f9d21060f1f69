"""Math answer rewards: the completion's final answer against the `answer` column.

Answers are compared with the `math-verify` library, so `\\frac{1}{2}`, `0.5` and `1/2` agree. Golds
may be bare values, `\\boxed{..}` or GSM8K solutions ending in `#### n`.
"""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
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


def extract_answer(text: str) -> str | None:
    """The final answer: last \\boxed{}, else last <answer>..</answer>, else `#### n`, else last number."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    gsm = _GSM8K.search(text)
    if gsm:
        return gsm.group(1).strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _verify(gold: str, predicted: str) -> bool:
    from math_verify import parse, verify  # imported here: it takes most of a second to load

    gold_parsed = parse(f"${gold}$") or parse(gold)
    pred_parsed = parse(f"${predicted}$") or parse(predicted)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed))


def math_accuracy(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the completion's final answer equals `answer` (via math-verify), else 0.0.

    None when the gold itself has no answer to compare with (the row cannot be scored).
    """
    out: list[float | None] = []
    for completion, gold_text in zip(completions, answer):
        gold = extract_answer(str(gold_text)) if gold_text is not None else None
        if not gold:
            out.append(None)
            continue
        predicted = extract_answer(completion)
        out.append(1.0 if predicted is not None and _verify(gold, predicted) else 0.0)
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
