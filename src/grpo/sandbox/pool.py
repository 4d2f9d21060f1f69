"""Run a function on many inputs in worker processes, each call with a deadline.

Workers are fresh interpreters, `python -m grpo.sandbox.pool MODULE:FUNCTION`: they import the
function by name and nothing else, so they never re-run the caller's main module (a script without
an `if __name__ == "__main__":` guard, or a program read from standard input, works as it is) and
share none of the trainer's state. Inputs and results travel as length-prefixed pickles on the
worker's stdin and stdout.

Each call ends one of five ways (`run` says which; `map` keeps only the values, `None` for the rest):

- `ok`: it returned a value;
- `error`: it raised (the message comes back);
- `cpu`: it used up its CPU budget (`cpu_s`): the worker arms a CPU-time timer (ITIMER_PROF) before
  each call, whose signal ends it, even inside C code that never returns to the interpreter. CPU
  time is what the input costs, whatever else the machine runs: on an idle machine and on a loaded
  one, the same input spends the same CPU seconds, so an overrun of the budget is the input's doing;
- `timeout`: the wall-clock deadline passed first. With a CPU budget under the deadline, that
  means the call did not get the CPU it was allowed (a loaded or stopped machine): not the input's
  doing;
- `died`: the worker died under the call for another reason (killed from outside, out of memory,
  a crash in a C extension).

A worker that overran or died is killed if need be and replaced, and the event is counted.

A worker finds its function as rewards, tools and environments are found (sandbox/usercode.py:
`find`, given the target `target_of` makes). It starts in the caller's working directory with the
caller's search path, and without the working directory put first (`-P`), so it finds the same
module the caller found, and nothing else of the user's.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from grpo.sandbox.usercode import find, target_of

_HEADER = struct.Struct("<I")
_READY = "ready"
STARTUP_S = 120.0   # how long a fresh worker may take to import its function
# `-m` puts the working directory first on a worker's path; -P (Python 3.11+) leaves it off, so a
# user's `datasets.py` there cannot hide the library's own imports (find() still finds theirs).
_SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []


def _name_of(fn: Callable) -> str:
    """`module:qualname` (or `path.py:qualname`) of a module-level function (what a worker
    imports: usercode.target_of)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(f"{fn!r}: a worker function must be defined at the top level of an "
                         "importable module (not in __main__, not a lambda or a nested function)")
    return target_of(module, qualname)


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
        self.process = subprocess.Popen([sys.executable, *_SAFE_PATH, "-m", "grpo.sandbox.pool",
                                         target],
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


OK, ERROR, CPU, TIMEOUT, DIED = "ok", "error", "cpu", "timeout", "died"


class DeadlinePool:
    """`run(jobs)` -> one (kind, value) per job (see the module docstring); `map(inputs)` -> one
    value per input, `None` where the call did not return one. `fn` must be a module-level
    function of an importable module. `cpu_s`: each call's CPU budget (None: none)."""

    def __init__(self, fn: Callable, workers: int = 2, deadline_s: float = 5.0,
                 cpu_s: float | None = None):
        self.target, self.deadline_s, self.cpu_s = _name_of(fn), deadline_s, cpu_s
        self._workers = [_Worker(self.target) for _ in range(workers)]
        self.timeouts = 0   # calls killed at the deadline, over the pool's life
        self.errors = 0     # calls that raised
        self.deaths = 0     # calls whose worker died under them
        self.cpu_overruns = 0   # calls that used up their CPU budget

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self.target)

    def _send(self, w: _Worker, index: int, job: tuple) -> bool:
        if not w.wait_ready(STARTUP_S):
            return False
        args, kwargs = job
        try:
            _write_message(w.process.stdin, (index, args, kwargs, self.cpu_s))
        except (BrokenPipeError, OSError, ValueError):
            return False
        w.job, w.started = index, time.monotonic()
        return True

    def map(self, inputs: list[tuple]) -> list[Any]:
        """`fn(*args)` for each args in `inputs`: its value, or None (raised, overran, died)."""
        return [value if kind == OK else None for kind, value in self.run([(a, {}) for a in inputs])]

    def run(self, jobs: list[tuple[tuple, dict]], deadline_s: float | None = None
            ) -> list[tuple[str, Any]]:
        """`fn(*args, **kwargs)` for each (args, kwargs): (kind, value) with kind ok (value the
        result), error (value the message), cpu, timeout or died (value None)."""
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        results: list[tuple[str, Any]] = [(DIED, None)] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[int, _Worker] = {}
        while pending or busy:
            for slot, w in enumerate(self._workers):
                if w.job is None and pending:
                    index = pending.pop()
                    if not self._send(w, index, jobs[index]):   # it died while idle: a fresh one
                        self._replace(w)
                        w = self._workers[slot]
                        if not self._send(w, index, jobs[index]):
                            if not w.ready:
                                raise RuntimeError(
                                    f"a worker for {self.target} did not start twice in a row: "
                                    f"`python -m grpo.sandbox.pool {self.target}` must import "
                                    f"the function within {STARTUP_S:.0f} s")
                            self.deaths += 1
                            continue
                    busy[w.fileno()] = w
            if not busy:
                continue
            next_deadline = min(w.started + deadline_s for w in busy.values())
            for ready in wait(list(busy.values()), timeout=max(0.0, next_deadline - time.monotonic())):
                w = busy.pop(ready.fileno())
                try:
                    message = _read_message(w.process.stdout)
                except (OSError, pickle.UnpicklingError, EOFError):
                    message = None
                if message is None:            # the worker died mid-call: why, counted, replaced
                    index = w.job
                    w.kill()
                    if w.process.returncode == -signal.SIGPROF:   # its own CPU timer ended it
                        self.cpu_overruns += 1
                        results[index] = (CPU, None)
                    else:
                        self.deaths += 1
                    w.job = None
                    self._replace(w)
                    continue
                index, value, error = message
                results[index] = (OK, value) if error is None else (ERROR, error)
                self.errors += error is not None
                w.job = None
            now = time.monotonic()
            for key, w in list(busy.items()):
                if now - w.started >= deadline_s:  # overran: kill, replace
                    del busy[key]
                    self.timeouts += 1
                    results[w.job] = (TIMEOUT, None)
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
    """The worker's loop: read (index, args, kwargs, cpu_s), answer (index, value, error) until
    stdin closes. A function's `warm_up` attribute, if any, runs before the worker says it is
    ready (lazy imports, caches): a call's budget is spent on the call alone."""
    fn = find(target)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)   # the CPU timer's signal ends the process
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr      # anything the function prints stays off the message channel
    if callable(getattr(fn, "warm_up", None)):
        fn.warm_up()
    _write_message(stdout, _READY)
    while True:
        job = _read_message(stdin)
        if job is None:
            return
        index, args, kwargs, cpu_s = job
        if cpu_s:
            signal.setitimer(signal.ITIMER_PROF, cpu_s)
        try:
            reply = (index, fn(*args, **kwargs), None)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - reported to the parent, which decides
            reply = (index, None, f"{type(e).__name__}: {e}")
        finally:
            if cpu_s:
                signal.setitimer(signal.ITIMER_PROF, 0)
        try:
            _write_message(stdout, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # a value that cannot travel
            _write_message(stdout, (index, None, f"its value cannot be sent back ({e})"))


if __name__ == "__main__":
    _serve(sys.argv[1])
