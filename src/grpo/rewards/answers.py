"""Math answer rewards: the completion's final answer against the `answer` column.

Answers are compared with the `math-verify` library, so `\\frac{1}{2}`, `0.5` and `1/2` agree. Golds
may be bare values, `\\boxed{..}` or GSM8K solutions ending in `#### n`, read by the completions'
rule (`extract_answer`): of the first kind present, the last answer counts.

A completion is an adversary: whatever it holds, `math_accuracy` returns a number for it in bounded
time, and scores 0 (counted in faults.py, `reward/math_accuracy/zero/<cause>`) when the completion
is at fault:

    completion --extract (one pass, linear)--> answer --bounds.py--> worker: parse, verify
                      no_answer                     answer_too_*     verifier_overran, verifier_raised

Reading the answer is linear in the completion's length (no regular expression that backtracks
over it, no scan per `\\boxed{`). An answer past the bounds of bounds.py never reaches a worker. In
the worker each call has a CPU budget (MATH_CPU_S) under its wall-clock deadline (MATH_DEADLINE_S):
a call that spends its CPU budget is the answer's doing (CPU seconds do not depend on what else
the machine runs) and scores 0 (`verifier_overran`); a call that reaches the wall-clock deadline
first was starved (a loaded or stopped machine), and a worker that dies otherwise was killed from
outside or ran out of memory: neither is the completion's doing, so the sample is unscorable
(None), as when its gold holds nothing to compare with.
"""

from __future__ import annotations

import re

from grpo.rewards import faults
from grpo.rewards.bounds import answer_fault

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_BOXED_OR_BRACE = re.compile(r"\\boxed\{|[{}]")
# `^[ \t]*A:`, not `^\s*A:`: `\s*` runs across lines, so on a flood of newlines every line start
# scanned all the rest (quadratic). `the\s+` is linear: the runs after different "the"s are apart.
# `answer(?:\*\*)?[ \t]*:` has one run that can fail, never two around an optional part (which
# backtracks quadratically over a flood of spaces).
_CLOSING = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b|\banswer(?:\*\*)?[ \t]*:|^[ \t]*A:",
                      re.IGNORECASE | re.MULTILINE)
# A number as people and LaTeX write it. Tried left to right at each place: a fraction
# (`\frac{1}{2}`, `\dfrac34`), thousands in groups of three (`1,000`, `1{,}000`, `1\,000`, narrow
# spaces; `1.000.000` when two or more dots show they cannot be a decimal point), plain digits or
# a leading point (`.5`); then `/4`, an exponent (`e3`, `\times 10^{23}`) or a power (`2^10`,
# `10^{3}`: never read as its exponent alone), a percent sign. A minus
# (or U+2212) right before it is a sign where no word or bracket precedes it: `16-3-4=9` ends in 9.
_FRACTION_PART = r"(?:\{\s*(?P<NAME>[-\u2212]?\d+(?:\.\d+)?)\s*\}|(?P<NAME1>\d))"
_SEPARATOR = r"(?:,|\{,\}|\\,|[\u2009\u202f\u00a0])"
_NUMBER = re.compile(
    r"(?<!\^)(?<!\^\{)(?<!\^ )"           # not the exponent of a power: 10^{3} is not 3
    r"(?P<sign>(?<![\w)\]}])[-\u2212])?"
    r"(?:\\[dtc]?frac\s*" + _FRACTION_PART.replace("NAME", "top") + r"\s*"
    + _FRACTION_PART.replace("NAME", "bottom")
    + r"|(?:(?P<grouped>\d{1,3}(?:" + _SEPARATOR + r"\d{3})+(?!\d)(?:\.\d+)?)"
    r"|(?P<dotted>\d{1,3}(?:\.\d{3}){2,}(?![\d.]))"
    r"|(?P<plain>\d+(?:\.\d+)?|(?<!\d)\.\d+))"
    r"(?P<over>/\d+)?"
    r"(?:[eE](?P<e>[-+]?\d+)(?!\w)"
    r"|\s*\\times\s*10\s*\^\s*(?:\{\s*(?P<times>[-+]?\d+)\s*\}|(?P<times1>\d))"
    r"|\s*\^\s*(?:\{\s*(?P<power>[-+]?\d+)\s*\}|(?P<power1>\d+)(?![.\d])))?"
    r"(?P<percent>\s*\\?%)?)")
_UNITS_AFTER = re.compile(r"\s+[A-Za-z]{2,}|\s+[A-Za-z](?![\w^_{(])")
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_MATH_SIGN = re.compile(r"[\d\\=^_{}+*/<>]")
_SPACE = re.compile(r"\s*")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_PROSE = re.compile(r"[a-zA-Z]{2,}")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[a-zA-Z*]+\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)"
                           r"\s*\{([^{}]*)\}")
_WORD = re.compile(r"[a-z]{2,}")


def number_text(m: re.Match) -> str:
    """A `_NUMBER` match as the verifier reads it best: separators dropped, `0` before a leading
    point, `\\frac{a}{b}` braced, an exponent as `\\times 10^{n}`, `%` as `\\%`, `-` for U+2212."""
    sign = "-" if m.group("sign") else ""
    if m.group("top") is not None or m.group("top1") is not None:          # a fraction
        top, bottom = m.group("top") or m.group("top1"), m.group("bottom") or m.group("bottom1")
        return f"{sign}\\frac{{{top}}}{{{bottom}}}".replace("\u2212", "-")
    if m.group("grouped") is not None:
        body = re.sub(r"\{,\}|\\,|[,\u2009\u202f\u00a0]", "", m.group("grouped"))
    elif m.group("dotted") is not None:
        body = m.group("dotted").replace(".", "")
    else:
        body = m.group("plain")
        body = "0" + body if body.startswith(".") else body
    body += m.group("over") or ""
    exponent = m.group("e") or m.group("times") or m.group("times1")
    if exponent is not None:
        body += f" \\times 10^{{{exponent}}}"
    power = m.group("power") or m.group("power1")
    if power is not None:                         # 2^10, 10^{3}: the power, not its exponent
        body += f"^{{{power}}}"
    if m.group("percent"):
        body += "\\%"
    return sign + body


def as_number(answer: str) -> str:
    """`answer` in `number_text`'s form when the whole of it (past `$`, `**` and spaces) is one
    number; else unchanged."""
    m = _NUMBER.fullmatch(answer.strip().strip("$*").strip())
    return number_text(m) if m is not None else answer


def last_number(text: str) -> str | None:
    """The last number in `text` (`_NUMBER`), in `number_text`'s form."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return number_text(last) if last is not None else None


def boxed_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the contents of every \\boxed{...} whose braces balance, ordered by start;
    one pass over the text. A box closes at the first `}` that brings the brace depth back to
    where it was before its `{`, so boxes inside boxes are found too."""
    first = text.find("\\boxed{")
    if first < 0:
        return []
    spans, open_boxes, depth = [], [], 0       # open_boxes: (depth before its brace, content start)
    for m in _BOXED_OR_BRACE.finditer(text, first):
        token = m.group()
        if token == "}":
            depth -= 1
            if open_boxes and open_boxes[-1][0] == depth:
                spans.append((open_boxes.pop()[1], m.start()))
        else:
            if token != "{":
                open_boxes.append((depth, m.end()))
            depth += 1
    return sorted(spans)


def boxed_answers(text: str) -> list[str]:
    """Contents of every \\boxed{...}, braces balanced, in order (boxes inside boxes overlap, so
    the total can be longer than the text: the reward itself uses `boxed_spans`)."""
    return [text[start:end].strip() for start, end in boxed_spans(text)]


def tagged(text: str, opening: str, closing: str) -> list[str]:
    """The text between each `opening` and the next `closing`, pairs taken left to right, in one
    pass: what re.findall(opening + "(.*?)" + closing, text, re.S) finds, which tries every
    opening against the rest of the text (quadratic on a flood of openings that never close)."""
    out, at = [], 0
    while (start := text.find(opening, at)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        out.append(text[start + len(opening):end])
        at = end + len(closing)
    return out


def last_tagged(text: str) -> str | None:
    """The contents of the last <answer>..</answer> (`tagged`)."""
    found = tagged(text, _ANSWER_OPEN, _ANSWER_CLOSE)
    return found[-1] if found else None


_HASHES = re.compile(r"#{4,}\s*([^\s#][^\n]*)?")


def _gsm8k_answer(text: str) -> str | None:
    """What follows the last `####` that has something after it (past spaces and newlines), to
    the end of its line. One pass: each run of hashes is matched once, its spaces once."""
    found = None
    for m in _HASHES.finditer(text):
        if m.group(1) is not None:
            found = m.group(1)
    return found.strip() if found is not None else None


def _marked_answer(text: str, spans: list[tuple[int, int]] | None = None) -> str | None:
    """The answer a writer marked, the last of the first kind present: \\boxed{} (the one opened
    last), else <answer>..</answer>, else `#### n`."""
    spans = boxed_spans(text) if spans is None else spans
    if spans:
        start, end = spans[-1]
        return text[start:end].strip()
    tagged = last_tagged(text)
    if tagged is not None:
        return tagged.strip()
    return _gsm8k_answer(text)


def _closing_answer(text: str) -> str | None:
    """What follows the last "the answer is", "Answer:" or "A:" to the end of its sentence (a
    period before a space or the end) or line, past `:`, `*`, `$` and `\\(..\\)`; a number
    followed by words alone (`18 dollars`) is the number. None when none of these is there, or
    when what follows is prose: more than four words, none of them mathematics."""
    last = None
    for last in _CLOSING.finditer(text):
        pass
    if last is None:
        return None
    end = text.find("\n", last.end())
    rest = text[last.end():end if end >= 0 else len(text)]
    stop = _SENTENCE_END.search(rest)
    rest = rest[:stop.start()] if stop else rest
    rest = rest.strip().lstrip(":*").strip().strip("*$").strip()
    if rest.startswith("\\(") and rest.endswith("\\)"):
        rest = rest[2:-2].strip()
    m = _NUMBER.match(rest)
    if m is not None and (m.end() == len(rest) or _UNITS_AFTER.match(rest, m.end())):
        return number_text(m)
    if len(rest.split()) > 4 and not _MATH_SIGN.search(rest):
        return None         # prose ("Answer: let us work it out."): the answer is further on
    return rest or None


def extract_answer(text: str, spans: list[tuple[int, int]] | None = None) -> str | None:
    """A completion's final answer, by one rule (docs/guides/your-model-data-reward.md): the last
    of the first kind present of a marked answer (`_marked_answer`), a closing "the answer is"
    (`_closing_answer`), a number (`last_number`). A lone number is given in `number_text`'s form.
    Linear in the length of `text`."""
    marked = _marked_answer(text, spans)
    if marked is not None:
        return as_number(marked)
    closing = _closing_answer(text)
    if closing is not None:
        return closing
    return last_number(text)


def extract_gold(text: str) -> str | None:
    """A reference answer: the marked one; else the whole text when it is a bare value such as
    `\\frac{1}{2}` or `x=3`; else, for prose, its last number."""
    marked = _marked_answer(text)
    if marked is not None:
        return as_number(marked)
    bare = _LATEX_COMMAND.sub("", _TEXT_WRAPPER.sub("", _ENVIRONMENT.sub("", text)))
    if _PROSE.search(bare) and not is_text_answer(text):
        return extract_answer(text)
    return as_number(text.strip()) or None


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


def _parse(text: str, timeout_s: int | None = 5) -> list:
    from math_verify import parse  # imported here: it takes most of a second to load

    return parse(f"${text}$", parsing_timeout=timeout_s) or parse(text, parsing_timeout=timeout_s)


def verify_against(gold_parsed: list, predicted: str) -> bool:
    """Parse a completion's answer and compare it with a parsed gold (runs in a worker process).
    math-verify's own alarms are off here: the worker's CPU budget and deadline keep time, and an
    alarm would turn an overrun into a silent False."""
    from math_verify import verify

    pred_parsed = _parse(predicted, timeout_s=None)
    return bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _warm_up() -> None:
    """Load math-verify and its parsers in a fresh worker, before its calls' budgets start."""
    verify_against(_parse("1", timeout_s=None), "1")


verify_against.warm_up = _warm_up  # type: ignore[attr-defined]


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

        from grpo.sandbox.pool import DeadlinePool
        _POOL = DeadlinePool(verify_against, workers=MATH_WORKERS, deadline_s=MATH_DEADLINE_S,
                             cpu_s=MATH_CPU_S)
        atexit.register(_POOL.close)
    return _POOL


MATH_WORKERS = 2
MATH_DEADLINE_S = 5.0   # wall clock per call: past it, the call was starved (None)
MATH_CPU_S = 2.0        # CPU per call: spent, the answer is too costly (0). A bounded answer
                        # takes 5-400 ms; the gap to the deadline lets a machine 2.5x loaded pass

_POOL_CAUSES = {"cpu": "verifier_overran", "error": "verifier_raised"}


def math_accuracy(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the completion's final answer (`extract_answer`: the last of the first kind
    present) equals `answer` (via math-verify), else 0.0.

    0.0 with a cause counted (module docstring) when the completion has no answer, an answer past
    the bounds of bounds.py, or one that costs the verifier its CPU budget or makes it raise.
    None when the gold holds no value to compare with, or when the verifier was starved past its
    deadline or its worker was killed (not the completion's doing; the worker is replaced).
    """
    out: list[float | None] = [None] * len(completions)
    jobs, where = [], []
    for i, (completion, gold_text) in enumerate(zip(completions, answer)):
        gold = parsed_gold(gold_text)
        if not gold:
            continue
        predicted = extract_answer(completion)
        cause = "no_answer" if predicted is None else answer_fault(predicted)
        if cause is not None:
            out[i] = 0.0
            faults.count("math_accuracy", cause)
            continue
        if isinstance(gold[0], TextAnswer):
            out[i] = float(normalize_text(predicted) == gold[0])
            continue
        jobs.append(((gold, predicted), {}))
        where.append(i)
    for i, (kind, value) in zip(where, verifier_pool().run(jobs) if jobs else []):
        if kind == "ok":
            out[i] = float(bool(value))
        elif kind in _POOL_CAUSES:
            out[i] = 0.0
            faults.count("math_accuracy", _POOL_CAUSES[kind])
    return out


def exact_answer(prompts: list[str], completions: list[str], answer: list, **columns) -> list:
    """1.0 when the answer (inside <answer> tags if present, else the whole completion, stripped)
    is exactly the string `answer`; a strict, fast check for tasks with canonical answers."""
    out = []
    for completion, gold in zip(completions, answer):
        tagged = last_tagged(completion)
        given = tagged if tagged is not None else completion
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
