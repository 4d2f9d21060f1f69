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
OWN_KEYS = ("size", "eval_size", "prompt", "curriculum", "level")
MISSING = ("task=reasoning_gym:... needs reasoning-gym, an optional extra: pip install -e '.[tasks]' "
           "(or pip install reasoning-gym)")


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(MISSING) from None
    return reasoning_gym


def typed_knobs(name: str, knobs: dict) -> dict:
    """Words for a task's enum fields, as YAML and the command line give them, made the enum
    members its configuration holds (aiw's `task_types: [siblings]` -> [TaskType.SIBLINGS]); a word
    that names no member is one line naming the task, the field and the members."""
    import enum
    import typing
    from reasoning_gym.factory import DATASETS
    try:
        hints = typing.get_type_hints(DATASETS[name][1])
    except Exception:       # a configuration whose annotations do not resolve: its own check decides
        return dict(knobs)

    def member(kind, field, value):
        if not isinstance(value, str):
            return value
        for m in kind:
            if value in (m.value, m.name) or value.lower() in (str(m.value).lower(), m.name.lower()):
                return m
        raise ConfigError(f"config key 'task_args': reasoning-gym's {name} has no {field} {value!r}; "
                          f"it takes {[m.value for m in kind]}")

    out = {}
    for field, value in knobs.items():
        hint = hints.get(field)
        args = typing.get_args(hint)
        inner = args[0] if args and typing.get_origin(hint) in (list, tuple, set) else None
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            value = member(hint, field, value)
        elif isinstance(inner, type) and issubclass(inner, enum.Enum) and isinstance(value, (list, tuple)):
            value = type(value)(member(inner, field, v) for v in value)
        out[field] = value
    return out


def _plain(value):
    """JSON for what a task's entry or configuration holds: an enum member as its value."""
    import enum
    return value.value if isinstance(value, enum.Enum) else str(value)


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
            self.knobs = {names[0]: typed_knobs(names[0], args)}
        else:
            stray = sorted(set(args) - set(names))
            if stray:
                raise ConfigError(f"config key 'task_args': {stray} name none of the tasks {names}; with "
                                  "several tasks, each one's knobs go under its name")
            self.knobs = {n: typed_knobs(n, dict(args.get(n) or {})) for n in names}
        self.threshold, self.level, self.max_level = float(own.get("curriculum", 0)), int(own.get("level", 0)), 0
        if self.threshold:
            self._curriculum(names)
        for name in names:   # the task's own check of its knobs, now rather than mid-run
            self._dataset(name, seed=0, size=1)

    def _curriculum(self, names: list[str]) -> None:
        """`curriculum=T`: each task's difficulty follows reasoning-gym's own curriculum, from
        `level` (0), one level up whenever held-out accuracy reaches T (train.raise_level)."""
        from reasoning_gym.factory import create_curriculum, has_curriculum
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"config key 'task_args': curriculum is the held-out accuracy that raises "
                              f"the level, in (0, 1]; got {self.threshold:g}")
        without = [n for n in names if not has_curriculum(n)]
        if without:
            raise ConfigError(f"config key 'task_args': curriculum needs reasoning-gym's curriculum for "
                              f"each task, and {without} have none")
        self.curricula = {n: create_curriculum(n) for n in names}
        self.max_level = max(len(a.levels) for c in self.curricula.values() for a in c.attributes.values()) - 1
        if not 0 <= self.level <= self.max_level:
            raise ConfigError(f"config key 'task_args': level {self.level} is not one of the "
                              f"curriculum's 0..{self.max_level}")

    def knobs_at(self, name: str, level: int) -> dict:
        """The task's knobs at `level`: the curriculum's fields over the user's (the user's alone
        without a curriculum)."""
        if not self.threshold:
            return self.knobs[name]
        import dataclasses
        curriculum = self.curricula[name]
        curriculum.set_global_level(level)      # each attribute at level, or at its highest
        config = dataclasses.asdict(curriculum.generate_configuration(dict(self.knobs[name])))
        return {k: v for k, v in config.items() if k not in ("seed", "size")}

    def describe(self, level: int) -> str:
        """What `level` sets, per task: its curriculum's fields."""
        parts = []
        for name, curriculum in self.curricula.items():
            knobs, fields = self.knobs_at(name, level), []
            for attr in curriculum.attributes.values():
                for key in (getattr(attr, "lower_field_name", None), getattr(attr, "upper_field_name", None),
                            getattr(attr, "field_name", None)):
                    if key and key in knobs and f"{key} {knobs[key]}" not in fields:
                        fields.append(f"{key} {knobs[key]}")
            parts.append(f"{name}: {', '.join(fields)}")
        return "; ".join(parts)

    def _dataset(self, name: str, seed: int, size: int, level: int = 0):
        knobs = self.knobs_at(name, level)
        try:
            return _gym().create_dataset(name, seed=seed, size=size, **knobs)
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"config key 'task_args': reasoning-gym's {name} refuses "
                              f"{knobs}: {e}") from None

    def _rows(self, seed: int, size: int, exclude: set[str], distinct: bool = False,
              level: int = 0) -> list[dict]:
        """`size` rows drawn by weight from the tasks (each task's items in its index order, from
        a seed of its own), skipping questions in `exclude` (and, `distinct`, any asked already);
        fewer when a task's problems run out."""
        exclude = set(exclude)
        rng = random.Random(seed)
        cap = 2 * (size + len(exclude)) + 16   # items a task may make (some make them all at once)
        sets = [self._dataset(name, seed=seed * 997 + i + 7919 * level, size=cap, level=level)
                for i, (name, _) in enumerate(self.parts)]
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
                         "rg_entry": json.dumps(entry, default=_plain),
                         "rg_config": json.dumps(self.knobs_at(name, level), default=_plain)})
        if not rows:
            raise ConfigError(f"config key 'task': {self.name} made no row that is not held out "
                              f"({len(exclude)} held-out questions); lower task_args eval_size, or "
                              "widen the task with its knobs")
        return rows

    def eval_rows(self, level: int | None = None) -> list[dict]:
        """The held-out rows (at `level`, the curriculum's; the starting one by default)."""
        level = self.level if level is None else level
        return self._rows(HELD_OUT_SEED, self.eval_size, exclude=set(), distinct=True, level=level)

    def train_rows(self, seed: int, level: int | None = None) -> list[dict]:
        """Training rows from the run's `seed` (a seed of their own, never the held-out one's),
        none asking a held-out row's question (at `level`, as eval_rows)."""
        level = self.level if level is None else level
        held = {r["prompt"] for r in self.eval_rows(level)}
        return self._rows(seed if seed != HELD_OUT_SEED else -seed, self.size, exclude=held, level=level)

    def demonstration(self, row: dict) -> str:
        """The answer in the format the system prompt asks for."""
        return f"<answer>{row['answer']}</answer>"
