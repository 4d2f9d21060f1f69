"""Why rewards gave a completion 0, or none: counted per reward function and cause.

A completion can be at fault in many ways (code that does not compile, a verifier bomb that
overruns its deadline, a result that is not a plain value, a forged result line). Each built-in
reward scores such a completion 0 and counts the cause here; the trainer takes the counts once per
step and logs them as `reward/<fn>/zero/<cause>`. `None` (unscorable) stays for failures that are
not the completion's: a worker killed from outside, a reward server that is down. Those a source
reports with reward_on_error=skip (a server's timeout, its HTTP 500, an answer that is not JSON)
are counted as `reward/<fn>/error/<cause>`.
"""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()


def count(fn: str, cause: str, n: int = 1, kind: str = "zero") -> None:
    """One more completion (or `n`) that `fn` scored 0 (`kind="zero"`), or could not score
    (`kind="error"`), because of `cause` (a short snake_case word)."""
    with _lock:
        _counts[(fn, kind, cause)] += n


def take() -> dict[str, int]:
    """The counts since the last call, as metric names, and a fresh start."""
    with _lock:
        out = {f"reward/{fn}/{kind}/{cause}": n for (fn, kind, cause), n in sorted(_counts.items())}
        _counts.clear()
    return out
