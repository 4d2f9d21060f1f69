"""What a completion's answer may be before it goes to the math verifier.

math-verify parses LaTeX with sympy, which evaluates what it parses: `9^{9^{9^{9}}}` asks for a
number of some 10^(10^8) digits, and twenty nested braces take its parser seconds (the time grows
about 2x per two levels). Such an answer is the completion's doing, so it scores 0 with its cause,
here in the trainer's process and in time linear in its length, before any worker sees it:

- `answer_too_long`: more than MAX_ANSWER_CHARS characters;
- `answer_too_deep`: brackets (`{} () []`, escaped or not) nested more than MAX_ANSWER_DEPTH deep,
  or powers stacked more than MAX_POWER_HEIGHT high (`x^x^x^x^x^x`, `x^{x^{...}}`): a tower costs
  math-verify more the higher it is, whatever its value (16 powers of x took 3 s, 50 of 1, 2 s);
- `answer_too_large`: a power or a factorial of numbers whose value would have more than
  MAX_NUMBER_DIGITS digits, estimated from the numbers written (below).

An answer within these bounds still has a CPU budget in the worker (answers.py), which catches
what the estimate cannot see (sums, products, integrals).

The estimate reads the answer as atoms (a number, a bracketed group, anything else) each followed
by powers (`^` or `**`, right-associative, whose exponent is the next atom with its own powers) and
factorials (`!`). It works with log10 of an upper bound on each atom's magnitude: a number's own;
a group's, the sum of its atoms' (as if they were all multiplied, which bounds sums and quotients
too); `\\frac{a}{b}`'s, a's and b's summed; `\\binom{n}{k}`'s and `{n \\choose k}`'s, the smaller
of n^k's and 2^n's; `\\Gamma(n)`'s, that of n!; a letter or another command's, 0 (symbolic:
sympy keeps `x^{1000}` as it is). `B^E` has about |E| * log10|B| digits, `n!` log10(n!)
(Stirling). Its exponent's own powers are checked first, so a tower is refused whatever its base
(`x^{9^{9^{9}}}` too).
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 1000     # competition answers are tens of characters; a matrix a few hundred
MAX_ANSWER_DEPTH = 8        # brackets in brackets; `\frac{\sqrt{\left(\frac{1}{2}\right)}}{2}` is 4
MAX_NUMBER_DIGITS = 4000    # Python prints no integer past 4,300 digits; 2^{2017} has 608
MAX_POWER_HEIGHT = 4        # powers on powers: `e^{x^{2}}` is 2; `x^x^x^x^x` (4) parses in 0.07 s

_OPENERS, _CLOSERS = frozenset("{(["), frozenset("})]")
_TOKEN = re.compile(r"\d+(?:\.\d*)?|\*\*|\\[a-zA-Z]+|\\.|\s+|.", re.DOTALL)
_LOG_LIMIT = math.log10(MAX_NUMBER_DIGITS)
# commands whose arguments the estimate reads as numbers, not as symbols
_FRACTIONS = frozenset({"\\frac", "\\tfrac", "\\dfrac", "\\cfrac"})
_BINOMIALS = frozenset({"\\binom", "\\tbinom", "\\dbinom"})


class _TooLarge(Exception):
    pass


class _TooDeep(Exception):
    pass


def answer_fault(answer: str) -> str | None:
    """Why `answer` may not go to the verifier (a cause above), or None when it may."""
    if len(answer) > MAX_ANSWER_CHARS:
        return "answer_too_long"
    if nesting_depth(answer) > MAX_ANSWER_DEPTH:
        return "answer_too_deep"
    tokens = [t for t in _TOKEN.findall(answer) if not t.isspace()]
    try:
        _Magnitudes(tokens).sequence(None)
    except _TooDeep:
        return "answer_too_deep"
    except _TooLarge:
        return "answer_too_large"
    return None


def nesting_depth(text: str) -> int:
    """How deep brackets of any kind are nested (a closer with nothing open is ignored)."""
    depth = deepest = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSERS and depth:
            depth -= 1
    return deepest


def _log_number(token: str) -> float:
    """|log10| of a number written in digits: how far it is from 1, either way (0.5^{10^9} asks
    for as many digits as 2^{10^9}); a long one's digit count bounds it."""
    whole = token.split(".")[0].lstrip("0")
    if len(whole) > 15:
        return float(len(whole))
    value = float(token)
    return abs(math.log10(value)) if value else 0.0


def _log_digits(log_exponent: float, log_base: float) -> float:
    """log10 of the number of digits of B^E, given log10|E| and |log10 B|; raises _TooLarge past
    MAX_NUMBER_DIGITS. -inf for a base of magnitude 1 or a symbol."""
    log_digits = log_exponent + math.log10(log_base) if log_base > 0 else -math.inf
    if log_digits > _LOG_LIMIT:
        raise _TooLarge
    return log_digits


def _log_factorial(log_n: float) -> float:
    """log10(n!) for n = 10^log_n (Stirling, through lgamma); raises _TooLarge past
    MAX_NUMBER_DIGITS digits."""
    if log_n <= 0:
        return 0.0
    if log_n > 15:                       # n! has about n * log10(n) digits
        return 10 ** _log_digits(log_n, log_n)
    log_value = math.lgamma(10 ** log_n + 1) / math.log(10)
    if log_value > MAX_NUMBER_DIGITS:
        raise _TooLarge
    return log_value


def _log_binomial(log_n: float, log_k: float) -> float:
    """log10 of a bound on C(n, k): the smaller of n^k and 2^n (C(10^4, 9999) is 10^4, within
    the bounds); raises _TooLarge when both are past MAX_NUMBER_DIGITS digits."""
    logs = []
    for log_exponent, log_base in ((log_k, log_n), (log_n, math.log10(2))):
        try:
            log_digits = _log_digits(log_exponent, log_base)
        except _TooLarge:
            continue
        logs.append(10 ** log_digits if log_digits > -math.inf else 0.0)
    if not logs:
        raise _TooLarge
    return min(logs)


class _Magnitudes:
    """A one-pass reader of the tokens of an answer within MAX_ANSWER_CHARS and MAX_ANSWER_DEPTH
    (so its recursion, one level per bracket, stays shallow). `height` is the tower height of what
    was read last (an atom, an item, a group's highest item)."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.at, self.height = tokens, 0, 0

    def sequence(self, closer: str | None) -> float:
        """log10 bound of the atoms up to `closer` (or the end), which it consumes. A stray closer
        at the top level is passed over: the answer after it is read too."""
        total, highest = 0.0, 0
        while self.at < len(self.tokens):
            token = self.tokens[self.at]
            if token in _CLOSERS:
                self.at += 1
                if closer is not None:
                    break
                continue
            if token == "\\choose":           # {n \choose k}: n is what came before, k the rest
                self.at += 1
                log_k = self.sequence(closer)
                self.height = max(self.height, highest)
                return _log_binomial(total, log_k)
            total += max(self.item(), 0.0)
            highest = max(highest, self.height)
        self.height = highest
        return total

    def item(self) -> float:
        """An atom with its factorials, then its powers: `a ^ b ^ c` is a^(b^c), folded from the
        right without recursion. The height of B^E is the larger of B's and 1 + E's."""
        logs = [self.factorials(self.atom())]
        heights = [self.height]
        while self.at < len(self.tokens) and self.tokens[self.at] in ("^", "**"):
            self.at += 1
            logs.append(self.factorials(self.atom()))
            heights.append(self.height)
        height = heights.pop()
        while heights:
            height = max(heights.pop(), height + 1)
        if height > MAX_POWER_HEIGHT:
            raise _TooDeep
        self.height = height
        log = logs.pop()
        while logs:
            log_digits = _log_digits(log, logs.pop())
            log = 10 ** log_digits if log_digits > -math.inf else 0.0
        return log

    def factorials(self, log: float) -> float:
        while self.at < len(self.tokens) and self.tokens[self.at] == "!":
            self.at += 1
            log = _log_factorial(log)
        return log

    def atom(self) -> float:
        self.height = 0
        if self.at >= len(self.tokens) or self.tokens[self.at] in _CLOSERS:
            return 0.0                      # nothing there (`x^` at the end, `x^}`)
        token = self.tokens[self.at]
        self.at += 1
        if token in _OPENERS:
            return self.sequence({"{": "}", "(": ")", "[": "]"}[token])
        if token[0].isdigit():
            return _log_number(token)
        if token in _FRACTIONS:             # \frac{a}{b}: at most |a| * |b| either way
            log_a, height_a = self.argument(), self.height
            log_b = self.argument()
            self.height = max(height_a, self.height)
            return log_a + log_b
        if token in _BINOMIALS:             # C(n, k) <= min(n^k, 2^n)
            log_n, height_n = self.argument(), self.height
            log_k = self.argument()
            self.height = max(height_n, self.height)
            return _log_binomial(log_n, log_k)
        if token == "\\Gamma":             # Gamma(n) = (n - 1)!
            return _log_factorial(self.argument())
        return 0.0                          # a letter, a command, an operator: symbolic

    def argument(self) -> float:
        """A command's argument: the next atom (a group in braces, mostly); a power after the
        last one is the whole command's (`\\frac{9}{1}^{9^{9}}`), read by `item`."""
        return max(self.atom(), 0.0)
