"""Why rewards gave a completion 0, or none: counted per reward function and cause.

A completion can be at fault in many ways (code that does not compile, a verifier bomb that
overruns its deadline, a result that is not a plain value, a forged result line). Each built-in
reward scores such a completion 0 and counts the cause here; whoever scores opens a scope around
the call that scores (`with counting() as counts:`) and logs its counts as
`reward/<fn>/zero/<cause>`: a step its own completions', evaluation none. `None` (unscorable)
stays for failures that are not the completion's: a worker killed from outside, a reward server
that is down. Those a source reports with reward_on_error=skip (a server's timeout, its HTTP 500,
an answer that is not JSON) are counted as `reward/<fn>/error/<cause>`.

A count goes to the innermost scope open in the calling context, and nowhere when none is open.
Work handed to other threads (a pool's) counts into the caller's scope when it runs in the
caller's context: `carried(fn)` wraps a function so.
"""

from __future__ import annotations

import contextvars
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator


class Counts:
    """The counts of one scope (every thread that counts into it adds here)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, fn: str, kind: str, cause: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(fn, kind, cause)] += n

    def metrics(self) -> dict[str, int]:
        """The counts as metric names, `reward/<fn>/<kind>/<cause>`, sorted."""
        with self._lock:
            return {f"reward/{fn}/{kind}/{cause}": n
                    for (fn, kind, cause), n in sorted(self._counts.items())}


_scope: contextvars.ContextVar[Counts | None] = contextvars.ContextVar("grpo_fault_counts",
                                                                       default=None)


@contextmanager
def counting() -> Iterator[Counts]:
    """A scope: what is counted inside it (in this context, or in work `carried` from it) is
    its own, and no other scope's."""
    counts = Counts()
    token = _scope.set(counts)
    try:
        yield counts
    finally:
        _scope.reset(token)


def count(fn: str, cause: str, n: int = 1, kind: str = "zero") -> None:
    """One more completion (or `n`) that `fn` scored 0 (`kind="zero"`), or could not score
    (`kind="error"`), because of `cause` (a short snake_case word); counted in the innermost
    open scope (none open: not counted)."""
    counts = _scope.get()
    if counts is not None:
        counts.add(fn, kind, cause, n)


def carried(fn: Callable) -> Callable:
    """`fn`, to be run in other threads (a pool's): each call runs in a copy of the context this
    is called in, so what it counts lands in the scope open here."""
    context = contextvars.copy_context()
    return lambda *args, **kwargs: context.copy().run(fn, *args, **kwargs)
