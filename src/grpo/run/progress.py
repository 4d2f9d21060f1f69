"""Live progress for long work (train, sft, eval, bench).

On a terminal: a bar with the count, elapsed and remaining time, and a compact line of the key
metrics, redrawn in place; each time the count passes a multiple of `every` (and at the end) the
line is also printed above the bar, so the scrollback keeps a record. Not on a terminal (a pipe, a file, a test's list): no bar and no
carriage returns, only those lines, through the caller's `log`.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable


def to_stderr(line: str) -> None:
    """`line` on stderr in one write: print's two (the text, then its newline) let processes
    sharing a stderr, as torchrun's do, splice their lines into one another."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


to_stderr.stream = sys.stderr


def _terminal_stream(log: Callable[[str], None]):
    """The terminal `log` writes to, or None when it is not a terminal (or not a plain print)."""
    stream = getattr(log, "stream", sys.stdout if log is print else None)
    try:
        return stream if stream is not None and stream.isatty() else None
    except (AttributeError, ValueError):
        return None


def eta(elapsed: float, done: int, total: int) -> str:
    """Time left at the mean rate so far, as 'XmYYs'."""
    left = elapsed / max(done, 1) * max(total - done, 0)
    return f"{int(left // 60)}m{int(left % 60):02d}s"


class Progress:
    """`update(done, line)` after each unit of work, or after several at once (a batch); use as a
    context manager. A line is kept when `done` reaches or passes the next multiple of `every`
    (an update of several units may step over the multiple itself), and at `total`."""

    def __init__(self, label: str, total: int, log: Callable[[str], None] = print, every: int = 1,
                 start: int = 0):
        self.label, self.total, self.log, self.every = label, total, log, max(1, every)
        self.start, self.started = start, time.perf_counter()
        self.last = start           # `done` at the last update
        self.stream = _terminal_stream(log)
        self.bar = None

    def __enter__(self) -> "Progress":
        if self.stream is not None and self.total > 0:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("elapsed"), TimeRemainingColumn(),
                           TextColumn("left"),
                           TextColumn("{task.fields[line]}"),
                           console=Console(file=self.stream, highlight=False), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, completed=self.start, line="")
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    @contextmanager
    def paused(self):
        """The live bar off the screen while another one (an evaluation's) runs, then back."""
        if self.bar is None:
            yield
            return
        self.bar.stop()
        try:
            yield
        finally:
            self.bar.start()

    def update(self, done: int, line: str) -> None:
        """`done` units of `total` are finished; `line` is the compact metrics line."""
        elapsed = time.perf_counter() - self.started
        full = f"{self.label} {done}/{self.total}  {line}  {eta(elapsed, done - self.start, self.total - self.start)} left"
        kept = done // self.every > self.last // self.every or done == self.total
        self.last = done
        if self.bar is not None:
            self.bar.update(self.task, completed=done, line=line)
            if kept:
                self.bar.console.print(full)
        elif kept:
            self.log(full)


@contextmanager
def libraries_quiet():
    """Hugging Face's own progress bars (transformers' shard writing and weight loading, the hub's
    downloads, datasets' splits) off while grpo's work shows its own progress, then as they were:
    train() and evaluate() run in a user's process, whose settings are theirs."""
    restore = []
    try:
        from transformers.utils import logging as hf_logging
        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            restore.append(hf_logging.enable_progress_bar)
    except ImportError:
        pass
    from huggingface_hub import utils as hub_utils
    if not hub_utils.are_progress_bars_disabled():
        hub_utils.disable_progress_bars()
        restore.append(hub_utils.enable_progress_bars)
    try:
        import datasets
        if datasets.is_progress_bar_enabled():
            datasets.disable_progress_bars()
            restore.append(datasets.enable_progress_bars)
    except ImportError:
        pass
    try:
        yield
    finally:
        for again in restore:
            again()
