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
_CLOSING = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b|^\s*A:", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[a-zA-Z*]+\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)"
                           r"\s*\{([^{}]*)\}")
_WORD = re.compile(r"[a-z]{2,}")


def boxed_answers(text: str) -> list[str]:
    """Contents of every \\boxed{...}, braces balanced, in order."""
    out, start = [], text.find("\\boxed{")
    while start >= 0:
        i, depth = start + len("\\boxed{"), 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                out.append(text[i:j].strip())
                break
        start = text.find("\\boxed{", start + 1)
    return out


def _marked_answer(text: str) -> str | None:
    """The answer a writer marked: last \\boxed{}, else last <answer>..</answer>, else `#### n`."""
    boxed = boxed_answers(text)
    if boxed:
        return boxed[-1]
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    gsm = _GSM8K.search(text)
    return gsm.group(1).strip() if gsm else None


def extract_answer(text: str) -> str | None:
    """A completion's final answer: the marked one, else a closing "the answer is ..." or "A: ...",
    else the last number in the text."""
    marked = _marked_answer(text)
    if marked is not None:
        return marked
    closing = list(_CLOSING.finditer(text))
    if closing:
        rest = text[closing[-1].end():].split("\n", 1)[0]
        return rest.strip().lstrip(":").strip().rstrip(".").strip() or None
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_gold(text: str) -> str | None:
    """A reference answer: the marked one; else the whole text when it is a bare value such as
    `\\frac{1}{2}` or `x=3`; else, for prose, its last number."""
    marked = _marked_answer(text)
    if marked is not None:
        return marked
    bare = _LATEX_COMMAND.sub("", _TEXT_WRAPPER.sub("", _ENVIRONMENT.sub("", text)))
    if _PROSE.search(bare) and not is_text_answer(text):
        return extract_answer(text)
    return text.strip() or None


def normalize_text(answer: str) -> str:
    """A text answer as compared: `\\text{}`-like wrappers, `$`, spacing commands and a final
    period removed, a lone choice letter taken out of its parentheses, lower case, single spaces."""
    s = _TEXT_WRAPPER.sub(r"\1", answer)
    for token in ("$", "\\!", "\\,", "\\;", "\\ ", "~"):
        s = s.replace(token, " ")
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"^\(([A-Za-z])\)$", r"\1", s)
    return " ".join(s.lower().split())


def is_text_answer(answer: str) -> bool:
    """Words, not mathematics: once normalized, one to four words with a word of two or more
    letters, no digit and no LaTeX command left (`\\text{Monday}`, `yes`, `Dirichlet's theorem`).
    Longer prose is a worked solution, whose answer is looked for inside it."""
    s = normalize_text(answer)
    return (bool(_WORD.search(s)) and len(s.split()) <= 4
            and not re.search(r"[\d\\^_{}=+*/<>]", s))


def _parse(text: str) -> list:
    from math_verify import parse  # imported here: it takes most of a second to load

    return parse(f"${text}$") or parse(text)


def verify_against(gold_parsed: list, predicted: str) -> bool:
    """Parse a completion's answer and compare it with a parsed gold (runs in a worker process)."""
    from math_verify import verify

    pred_parsed = _parse(predicted)
    return bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed))


_GOLD_CACHE: dict[str, list] = {}   # gold text -> parsed gold: each gold is parsed once
_POOL = None


def parsed_gold(gold_text) -> list:
    """The parsed gold for an `answer` value ([] when it holds nothing to compare with), cached.
    A text answer is kept as [TextAnswer(normalized)], compared as text, not by math-verify."""
    key = str(gold_text)
    if key not in _GOLD_CACHE:
        gold = extract_gold(key) if gold_text is not None else None
        if gold and is_text_answer(gold):
            _GOLD_CACHE[key] = [TextAnswer(normalize_text(gold))]
        else:
            _GOLD_CACHE[key] = _parse(gold) if gold else []
    return _GOLD_CACHE[key]


class TextAnswer(str):
    """A gold answer made of words (a day, a name, yes/no): equal when the normalized texts are."""


def verifier_pool():
    """The worker processes that run math-verify with a deadline (started on first use)."""
    global _POOL
    if _POOL is None:
        import atexit

        from grpo.rewards.workers import DeadlinePool
        _POOL = DeadlinePool(verify_against, workers=MATH_WORKERS, deadline_s=MATH_DEADLINE_S)
        atexit.register(_POOL.close)
    return _POOL


MATH_WORKERS = 2
MATH_DEADLINE_S = 5.0


def math_accuracy(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the completion's final answer equals `answer` (via math-verify), else 0.0.

    None when the gold holds no value to compare with, or when verifying overran its deadline
    (the worker is killed and replaced). Several different \\boxed{} answers score 0.
    """
    out: list[float | None] = [None] * len(completions)
    jobs, where = [], []
    for i, (completion, gold_text) in enumerate(zip(completions, answer)):
        gold = parsed_gold(gold_text)
        if not gold:
            continue
        predicted = extract_answer(completion)
        if predicted is None or len(set(boxed_answers(completion))) > 1:
            out[i] = 0.0
            continue
        if isinstance(gold[0], TextAnswer):
            out[i] = float(normalize_text(predicted) == gold[0])
            continue
        jobs.append((gold, predicted))
        where.append(i)
    for i, ok in zip(where, verifier_pool().map(jobs) if jobs else []):
        out[i] = None if ok is None else float(ok)
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


_RESULT_END = re.compile(r"</result>|</tool_response>")


def final_answer(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when what the model wrote after the last tool result (`</result>` or
    `</tool_response>`; the whole completion when there is none), stripped, is exactly `answer`.
    For agent episodes, whose completion is the whole transcript: a tool's answer is not the
    model's, so only the text after it counts."""
    out = []
    for completion, gold in zip(completions, answer):
        last = None
        for last in _RESULT_END.finditer(completion):
            pass
        given = completion[last.end():] if last is not None else completion
        out.append(1.0 if given.strip() == str(gold).strip() else 0.0)
    return out
