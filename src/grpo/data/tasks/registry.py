"""The built-in tasks by name (`TASKS`), each with how to make it and a one-line summary, and
`get_task`, which makes one by name."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable

from grpo.config import ConfigError
from grpo.data.tasks.addition import AdditionTask
from grpo.data.tasks.calculator import CalculatorTask
from grpo.data.tasks.countdown import CountdownTask
from grpo.data.tasks.gym import PREFIX, ReasoningGymTask
from grpo.data.tasks.largest import LargestTask
from grpo.data.tasks.shapes import ShapesTask


@dataclass(frozen=True)
class TaskSpec:
    name: str
    make: Callable[[], object]
    summary: str


TASKS: dict[str, TaskSpec] = {
    "addition": TaskSpec("addition", AdditionTask, "a+b= with two-digit numbers; answer the sum"),
    "largest": TaskSpec("largest", LargestTask, "the largest of four distinct digits"),
    "countdown": TaskSpec("countdown", CountdownTask,
                          "reach a target from three numbers with + - * /, each used once"),
    "calculator": TaskSpec("calculator", CalculatorTask,
                           "a three-digit times a two-digit number, with a calculator tool"),
    "shapes": TaskSpec("shapes", ShapesTask,
                       "count the shapes in a 32x32 picture (1-4); needs a vision-language model"),
}


def get_task(name: str, args: dict | None = None):
    """The task `name` makes: a built-in, or reasoning-gym's (`reasoning_gym:NAME[:WEIGHT],...`,
    data/tasks/gym.py) with the knobs in `args` (`task_args`), which built-ins take none of. Made
    once per name and knobs: prompts are formatted with the task's system prompt at every step."""
    return _task(name, json.dumps(args or {}, sort_keys=True, default=str))


@functools.lru_cache(maxsize=16)
def _task(name: str, args_json: str):
    args = json.loads(args_json)
    if name.startswith(PREFIX):
        return ReasoningGymTask(name[len(PREFIX):], args)
    if name not in TASKS:
        raise ConfigError(f"config key 'task': unknown task {name!r}; built-ins are {sorted(TASKS)}, "
                          f"or {PREFIX}NAME for reasoning-gym's")
    if args:
        raise ConfigError(f"config key 'task_args': the built-in task {name!r} takes no arguments "
                          f"(they are for {PREFIX}NAME tasks); got {sorted(args)}")
    return TASKS[name].make()
