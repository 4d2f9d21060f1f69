"""Run a function on many inputs in worker processes, each call with a deadline.

A worker that overruns its deadline is killed and replaced, and that input's result is `None`
(unscorable), never a guess. Workers are started with `spawn`, never forked from the trainer, so
they share none of its state; the function must be importable by name (defined at module level).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Any, Callable


def _serve(fn: Callable, conn) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        index, args = job
        try:
            conn.send((index, fn(*args), None))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            conn.send((index, None, f"{type(e).__name__}: {e}"))


class _Worker:
    def __init__(self, ctx, fn: Callable):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(fn, child), daemon=True)
        self.process.start()
        child.close()
        self.job: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


class DeadlinePool:
    """`map(inputs)` -> one result per input, `None` where the call overran or raised."""

    def __init__(self, fn: Callable, workers: int = 2, deadline_s: float = 5.0):
        self.fn, self.deadline_s = fn, deadline_s
        self._ctx = mp.get_context("spawn")
        self._workers = [_Worker(self._ctx, fn) for _ in range(workers)]
        self.timeouts = 0   # calls killed at the deadline, over the pool's life
        self.errors = 0     # calls that raised

    def map(self, inputs: list[tuple]) -> list[Any]:
        results: list[Any] = [None] * len(inputs)
        pending = list(range(len(inputs)))[::-1]
        busy: dict[Any, _Worker] = {}
        while pending or busy:
            for w in self._workers:
                if w.job is None and pending:
                    w.job, w.started = pending.pop(), time.monotonic()
                    w.conn.send((w.job, inputs[w.job]))
                    busy[w.conn] = w
            now = time.monotonic()
            next_deadline = min(w.started + self.deadline_s for w in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, next_deadline - now)):
                w = busy.pop(conn)
                index, value, error = conn.recv()
                results[index] = value
                self.errors += error is not None
                w.job = None
            now = time.monotonic()
            for conn, w in list(busy.items()):
                if now - w.started >= self.deadline_s:  # overran: kill, replace; result stays None
                    del busy[conn]
                    w.kill()
                    self.timeouts += 1
                    self._workers[self._workers.index(w)] = _Worker(self._ctx, self.fn)
        return results

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.process.join(timeout=1)
            if w.process.is_alive():
                w.kill()
