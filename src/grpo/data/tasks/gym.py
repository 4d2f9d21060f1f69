"""reasoning-gym's procedural tasks (`task=reasoning_gym:NAME`, an optional extra: `pip install -e
'.[tasks]'`): about a hundred generators (arithmetic, countdown, algebra, logic puzzles, graphs,
ciphers, ARC-like grids), each with its own `score_answer`, none needing a download.

    task=reasoning_gym:basic_arithmetic
    task=reasoning_gym:basic_arithmetic:3,leg_counting:1        several, drawn by weight
    task_args={min_terms: 2, max_terms: 2, size: 2000}          one task's knobs, and grpo's own
    task_args={basic_arithmetic: {max_digits: 2}, size: 500}    several: each task's under its name

The knobs are the task's own configuration fields (reasoning-gym's `<Name>Config`), checked by it;
grpo's own are `size` (training rows, default 1000), `eval_size` (held-out rows, default 200) and
`prompt` (the system prompt telling the answer format, one of reasoning-gym's SYSTEM_PROMPTS by
name; default "default", which its own examples use: the answer inside <answer> tags).

Rows are generated from the run's seed (training) and from a fixed seed (held out, the same in
every run); a training row whose question a held-out row asks is skipped, so the two never share a
question. Each row carries the task's entry (`rg_entry`) and its configuration (`rg_config`), from
which the reward `reasoning_gym` (rewards/tasks.py) scores a completion with the task's own
`score_answer`, in worker processes with a deadline, as math answers are scored.
"""

from __future__ import annotations

import json
import random

from grpo.config import ConfigError

PREFIX = "reasoning_gym:"
HELD_OUT_SEED = 10_000
OWN_KEYS = ("size", "eval_size", "prompt")
MISSING = ("task=reasoning_gym:... needs reasoning-gym, an optional extra: pip install -e '.[tasks]' "
           "(or pip install reasoning-gym)")


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(MISSING) from None
    return reasoning_gym


def parse_spec(spec: str) -> list[tuple[str, float]]:
    """'a:2,b' -> [('a', 2.0), ('b', 1.0)]; each name checked against reasoning-gym's list."""
    from reasoning_gym.factory import DATASETS
    out = []
    for part in spec.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in DATASETS:
            import difflib
            near = difflib.get_close_matches(name, DATASETS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; it has {len(DATASETS)} (grpo explain --overview)"
            raise ConfigError(f"config key 'task': reasoning-gym has no task {name!r}{hint}")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"config key 'task': weight {weight!r} of {name!r} is not a number") from None
        if not w > 0:
            raise ConfigError(f"config key 'task': weight {weight!r} of {name!r} must be above 0")
        out.append((name, w))
    return out


class ReasoningGymTask:
    """One reasoning-gym task, or several drawn by weight; rows as the module docstring says."""

    rewards = ["reasoning_gym"]

    def __init__(self, spec: str, args: dict | None = None):
        gym = _gym()
        self.name = PREFIX + spec
        self.parts = parse_spec(spec)
        args = dict(args or {})
        own = {k: args.pop(k) for k in OWN_KEYS if k in args}
        self.size, self.eval_size = int(own.get("size", 1000)), int(own.get("eval_size", 200))
        prompts = gym.utils.SYSTEM_PROMPTS
        if own.get("prompt", "default") not in prompts:
            raise ConfigError(f"config key 'task_args': prompt {own['prompt']!r} is not one of "
                              f"reasoning-gym's system prompts {sorted(prompts)}")
        self.system_prompt = prompts[own.get("prompt", "default")]
        names = [n for n, _ in self.parts]
        if len(names) == 1:
            self.knobs = {names[0]: args}
        else:
            stray = sorted(set(args) - set(names))
            if stray:
                raise ConfigError(f"config key 'task_args': {stray} name none of the tasks {names}; with "
                                  "several tasks, each one's knobs go under its name")
            self.knobs = {n: dict(args.get(n) or {}) for n in names}
        for name in names:   # the task's own check of its knobs, now rather than mid-run
            self._dataset(name, seed=0, size=1)

    def _dataset(self, name: str, seed: int, size: int):
        try:
            return _gym().create_dataset(name, seed=seed, size=size, **self.knobs[name])
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"config key 'task_args': reasoning-gym's {name} refuses "
                              f"{self.knobs[name]}: {e}") from None

    def _rows(self, seed: int, size: int, exclude: set[str], distinct: bool = False) -> list[dict]:
        """`size` rows drawn by weight from the tasks (each task's items in its index order, from
        a seed of its own), skipping questions in `exclude` (and, `distinct`, any asked already);
        fewer when a task's problems run out."""
        exclude = set(exclude)
        rng = random.Random(seed)
        cap = 2 * (size + len(exclude)) + 16   # items a task may make (some make them all at once)
        sets = [self._dataset(name, seed=seed * 997 + i, size=cap) for i, (name, _) in enumerate(self.parts)]
        at, rows = [0] * len(sets), []
        weights = [w for _, w in self.parts]
        while len(rows) < size and any(a < cap for a in at):
            k = rng.choices(range(len(sets)), weights)[0] if len(sets) > 1 else 0
            if at[k] >= cap:
                continue
            entry = sets[k][at[k]]
            at[k] += 1
            if entry["question"] in exclude:
                continue
            if distinct:
                exclude.add(entry["question"])
            name = self.parts[k][0]
            rows.append({"prompt": entry["question"], "answer": str(entry["answer"]), "rg_task": name,
                         "rg_entry": json.dumps(entry, default=str),
                         "rg_config": json.dumps(self.knobs[name], default=str)})
        if not rows:
            raise ConfigError(f"config key 'task': {self.name} made no row that is not held out "
                              f"({len(exclude)} held-out questions); lower task_args eval_size, or "
                              "widen the task with its knobs")
        return rows

    def eval_rows(self) -> list[dict]:
        return self._rows(HELD_OUT_SEED, self.eval_size, exclude=set(), distinct=True)

    def train_rows(self, seed: int) -> list[dict]:
        """Training rows from the run's `seed` (a seed of their own, never the held-out one's),
        none asking a held-out row's question."""
        held = {r["prompt"] for r in self.eval_rows()}
        return self._rows(seed if seed != HELD_OUT_SEED else -seed, self.size, exclude=held)

    def demonstration(self, row: dict) -> str:
        """The answer in the format the system prompt asks for."""
        return f"<answer>{row['answer']}</answer>"
