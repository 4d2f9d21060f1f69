"""Shared by the benchmarks: items per second over repeats, reported as median, min and max."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def per_second(run: Callable[[], object], items: int, repeats: int) -> tuple[dict, object]:
    """Call `run` `repeats` times; return {median, min, max} of items/s and the last result."""
    rates, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        rates.append(items / (time.perf_counter() - start))
    return ({"median": round(statistics.median(rates), 1), "min": round(min(rates), 1),
             "max": round(max(rates), 1)}, result)
