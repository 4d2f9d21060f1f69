"""Built-in procedural tasks with verifiable answers and fixed train and held-out splits.

A task yields rows: {"prompt": str, "answer": str, ...columns}; its demonstrations feed the cold
start (a completion, or for an agent task a list of (context, completion) turns); it names its
own reward functions, and an agent task its tools.
"""

from grpo.data.tasks.registry import TASKS, TaskSpec, get_task

__all__ = ["TASKS", "TaskSpec", "get_task"]
