"""Tools that misbehave, in a module that imports nothing heavy: a tool's worker process imports it."""

import time


def boom(x: int) -> int:
    """Raise."""
    raise RuntimeError("it broke")


def sleepy(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "woke"


def tower(height: int) -> int:
    """9 ** 9 ** ... of this height: at height 3, seconds in C that never return to Python."""
    value = 9
    for _ in range(height - 1):
        value = 9 ** value
    return value
