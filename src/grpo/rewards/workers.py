"""Run a function on many inputs in worker processes, each call with a deadline.

Workers are fresh interpreters, `python -m grpo.rewards.workers MODULE:FUNCTION`: they import the
function by name and nothing else, so they never re-run the caller's main module (a script without
an `if __name__ == "__main__":` guard, or a program read from standard input, works as it is) and
share none of the trainer's state. Inputs and results travel as length-prefixed pickles on the
worker's stdin and stdout.

A call that overruns its deadline, or whose worker dies for any reason (killed from outside, out of
memory, a crash in a C extension), gets the result `None` (unscorable, never a guess): the worker
is killed if need be and replaced, and the event is counted.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import subprocess
import sys
import time
from multiprocessing.connection import wait
from typing import Any, Callable

_HEADER = struct.Struct("<I")
_READY = "ready"
STARTUP_S = 120.0   # how long a fresh worker may take to import its function


def _name_of(fn: Callable) -> str:
    """`module:qualname` of a module-level function (what a worker imports)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(f"{fn!r}: a worker function must be defined at the top level of an "
                         "importable module (not in __main__, not a lambda or a nested function)")
    return f"{module}:{qualname}"


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_message(stream):
    header = _read_exact(stream, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(stream, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _write_message(stream, value) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


class _Worker:
    def __init__(self, target: str):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen([sys.executable, "-m", "grpo.rewards.workers", target],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd())
        self.job: int | None = None
        self.started = 0.0
        self.ready = False

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the worker's first message, sent once its function is imported: a call's
        deadline never includes the start of a fresh interpreter (seconds on a loaded machine)."""
        if not self.ready and wait([self], timeout=timeout_s):
            try:
                self.ready = _read_message(self.process.stdout) == _READY
            except (OSError, pickle.UnpicklingError, EOFError):
                self.ready = False
        return self.ready

    def fileno(self) -> int:
        return self.process.stdout.fileno()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class DeadlinePool:
    """`map(inputs)` -> one result per input, `None` where the call overran, raised or its worker
    died. `fn` must be a module-level function of an importable module."""

    def __init__(self, fn: Callable, workers: int = 2, deadline_s: float = 5.0):
        self.target, self.deadline_s = _name_of(fn), deadline_s
        self._workers = [_Worker(self.target) for _ in range(workers)]
        self.timeouts = 0   # calls killed at the deadline, over the pool's life
        self.errors = 0     # calls that raised
        self.deaths = 0     # calls whose worker died under them

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self.target)

    def _send(self, w: _Worker, index: int, args: tuple) -> bool:
        if not w.wait_ready(STARTUP_S):
            return False
        try:
            _write_message(w.process.stdin, (index, args))
        except (BrokenPipeError, OSError, ValueError):
            return False
        w.job, w.started = index, time.monotonic()
        return True

    def map(self, inputs: list[tuple]) -> list[Any]:
        results: list[Any] = [None] * len(inputs)
        pending = list(range(len(inputs)))[::-1]
        busy: dict[int, _Worker] = {}
        while pending or busy:
            for slot, w in enumerate(self._workers):
                if w.job is None and pending:
                    index = pending.pop()
                    if not self._send(w, index, inputs[index]):   # it died while idle: a fresh one
                        self._replace(w)
                        w = self._workers[slot]
                        if not self._send(w, index, inputs[index]):
                            if not w.ready:
                                raise RuntimeError(
                                    f"a worker for {self.target} did not start twice in a row: "
                                    f"`python -m grpo.rewards.workers {self.target}` must import "
                                    f"the function within {STARTUP_S:.0f} s")
                            self.deaths += 1
                            continue
                    busy[w.fileno()] = w
            if not busy:
                continue
            next_deadline = min(w.started + self.deadline_s for w in busy.values())
            for ready in wait(list(busy.values()), timeout=max(0.0, next_deadline - time.monotonic())):
                w = busy.pop(ready.fileno())
                try:
                    message = _read_message(w.process.stdout)
                except (OSError, pickle.UnpicklingError, EOFError):
                    message = None
                if message is None:            # the worker died mid-call: None, counted, replaced
                    self.deaths += 1
                    w.job = None
                    self._replace(w)
                    continue
                index, value, error = message
                results[index] = value
                self.errors += error is not None
                w.job = None
            now = time.monotonic()
            for key, w in list(busy.items()):
                if now - w.started >= self.deadline_s:  # overran: kill, replace; result stays None
                    del busy[key]
                    self.timeouts += 1
                    w.job = None
                    self._replace(w)
        return results

    def close(self) -> None:
        for w in self._workers:
            try:
                w.process.stdin.close()
            except OSError:
                pass
            try:
                w.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                w.kill()


def _serve(target: str) -> None:
    """The worker's loop: read (index, args), answer (index, value, error) until stdin closes."""
    module_name, _, qualname = target.partition(":")
    fn: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr      # anything the function prints stays off the message channel
    _write_message(stdout, _READY)
    while True:
        job = _read_message(stdin)
        if job is None:
            return
        index, args = job
        try:
            _write_message(stdout, (index, fn(*args), None))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
            _write_message(stdout, (index, None, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve(sys.argv[1])
