"""The reward contract in code: the built-ins by name (`REWARDS`), a function by name
(`get_reward`), the errors a function's breach raises (`RewardError`, `Unscored`), and `score`,
which calls every function on a batch and sums their weighted rewards per row.
"""

from __future__ import annotations

import functools
import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from grpo.rewards.tasks import countdown_equation, reasoning_gym
from grpo.rewards.format import think_format
from grpo.rewards.answers import exact_answer, final_answer, math_accuracy
from grpo.rewards.code import code_tests
from grpo.rewards import faults
from grpo.data import RAW_PROMPTS
from grpo.sandbox.usercode import user_object

RewardFn = Callable[..., list]

# name -> function; `rewards=[a,b]` in a config picks from here.
REWARDS: dict[str, RewardFn] = {
    "math_accuracy": math_accuracy,
    "exact_answer": exact_answer,
    "think_format": think_format,
    "countdown_equation": countdown_equation,
    "reasoning_gym": reasoning_gym,
    "code_tests": code_tests,
    "final_answer": final_answer,
}


class RewardError(ValueError):
    """A reward function broke the contract; the message names it."""


class Unscored(RewardError):
    """A reward source could not score some or all of a batch for a reason that is not the
    completions' doing (a server down, or answering something that is not rewards; a completion
    it refuses for its size). `cause` is a short snake_case word (`timeout`, `http_500`); where
    some samples were scored, `partial` holds the batch's values with None for the others, and
    `unscored` counts those. reward_on_error=skip keeps the values it has (None for every sample
    without `partial`) and counts the rest as `reward/<fn>/error/<cause>`; raise stops the run
    with the message, which names the source."""

    def __init__(self, message: str, cause: str = "error", partial: list | None = None,
                 unscored: int | None = None):
        super().__init__(message)
        self.cause, self.partial = cause, partial
        self.unscored = (unscored if unscored is not None or partial is None
                         else sum(v is None for v in partial))


def get_reward(name: str) -> RewardFn:
    """A built-in by name, or any function as `module:function` (the module found in the working
    directory first) or `file.py:function` (sandbox/usercode.py)."""
    return user_object(name, REWARDS, what="reward function", error=RewardError)


def columns_for(fn: RewardFn, columns: dict[str, list]) -> dict[str, list]:
    """The columns `fn` is given: the rows' own, and their raw prompts (RAW_PROMPTS) only for a
    function marked as_messages."""
    wants_raw = getattr(fn, "takes_raw_prompts", False)
    return {k: v for k, v in columns.items() if k != RAW_PROMPTS or wants_raw}


def as_messages(fn: RewardFn) -> RewardFn:
    """A reward written in TRL's form: for a row whose prompt is a list of chat messages it gets
    `prompts` as those messages (a list of {"role", "content"} per completion) and `completions` as
    `[{"role": "assistant", "content": text}]`; for a text row, the row's prompt text (before any
    chat template or system prompt) and the completion's text. Without it a reward gets both as
    text: the prompt as the model saw it (chat template applied), the completion as sampled.

        @as_messages
        def right_answer(prompts, completions, answer, **columns):
            return [float(c[0]["content"].strip().endswith(a)) for c, a in zip(completions, answer)]
    """
    @functools.wraps(fn)
    def in_messages(prompts, completions, **columns):
        raw = columns.pop(RAW_PROMPTS, None) or list(prompts)
        chat = [isinstance(p, (list, tuple)) for p in raw]
        return fn([list(p) if c else p for p, c in zip(raw, chat)],
                  [[{"role": "assistant", "content": t}] if c else t for t, c in zip(completions, chat)],
                  **columns)
    in_messages.takes_raw_prompts = True
    return in_messages


def reward_name(fn: RewardFn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def unique_names(fns: list[RewardFn]) -> list[str]:
    """Each function's name; a repeated name (two lambdas, two partials) gets `_2`, `_3`, ..."""
    names: list[str] = []
    for fn in fns:
        base, name, k = reward_name(fn), reward_name(fn), 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    return names


def _call(fn: RewardFn, name: str, prompts: list[str], completions: list[str],
          columns: dict[str, list], on_error: str) -> list:
    """Call `fn` on the batch; if it raises, find the samples that fail one at a time, then stop
    with an error that names the function and the first failing sample (`raise`) or mark the
    failing samples unscorable (`skip`). The function gets lists of its own: one that changes
    them in place changes neither the other functions' inputs (they run beside it) nor the
    completions and rows the run logs and reuses."""
    prompts, completions = list(prompts), list(completions)
    columns = {k: list(v) for k, v in columns_for(fn, columns).items()}
    try:
        return as_values(fn(prompts, completions, **columns))
    except Unscored as e:  # a source that names itself and the cause (a reward server down, say)
        if on_error == "raise":
            raise
        n = len(completions)
        whole = e.partial is not None and len(e.partial) == n
        faults.count(name, e.cause, e.unscored if whole else n, kind="error")
        return e.partial if whole else [None] * n
    except RewardError:  # it names its source
        raise
    except Exception:  # noqa: BLE001 - a user's function may raise anything; we name it below
        pass
    values: list = []
    for i in range(len(completions)):
        try:
            values += list(as_values(fn(prompts[i:i + 1], completions[i:i + 1],
                                        **{k: v[i:i + 1] for k, v in columns.items()})))
        except Exception as e:  # noqa: BLE001
            if on_error == "raise":
                raise RewardError(f"reward function '{name}' raised {type(e).__name__}: {e} on sample "
                                  f"{i} (completion {completions[i][:60]!r}); fix it, or set "
                                  "reward_on_error=skip to count such samples as unscorable") from e
            values.append(None)
    return values


def as_values(values):
    """A NumPy array or a torch tensor of rewards (which TRL accepts) as a list; else as given."""
    if type(values).__module__.split(".")[0] in ("numpy", "torch") and getattr(values, "ndim", 0) == 1:
        return values.tolist()
    return values


def _as_reward(value, name: str, i: int) -> float | None:
    """One returned value as a reward: None stays None; a number, NumPy's included, is a float;
    a bool (Python's or NumPy's, from a check such as `answer == gold`) is 1.0 or 0.0."""
    if value is None:
        return None
    if type(value).__module__ == "torch" and getattr(value, "ndim", None) == 0:
        value = value.item()                 # a 0-d tensor, as `(x == y).float()` gives
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if isinstance(value, (bool, numbers.Real)) or numpy_bool:
        number = float(value)
        if math.isfinite(number):
            return number
    raise RewardError(f"reward function '{name}' returned {value!r} for completion {i}; "
                      "rewards must be finite numbers (or bools), or None when unscorable")


UNSCORABLE = ("any", "all")   # a row is unscorable when any / when all of its functions return None


def score(fns: list[RewardFn], weights: list[float], prompts: list[str], completions: list[str],
          columns: dict[str, list], on_error: str = "raise", unscorable: str = "any"
          ) -> tuple[list[float | None], dict[str, list[float | None]]]:
    """Weighted sum of every function's reward, per row.

    `unscorable="any"`: a row is None when any function could not score it. `"all"`: None only
    when no function could; otherwise the weighted sum over the functions that scored it, None
    counting as missing (TRL's nansum), for a dataset that mixes tasks whose functions each score
    their own rows. Returns the totals [N] and each function's own rewards by name.
    """
    if unscorable not in UNSCORABLE:
        raise ValueError(f"unscorable must be one of {UNSCORABLE}, got {unscorable!r}")
    n = len(completions)
    if not fns:     # no function (an environment's reward alone, added by the caller): 0 each
        return [0.0] * n, {}
    names = unique_names(fns)
    per_fn: dict[str, list[float | None]] = {}
    # The functions run concurrently: a reward model, a server and math workers overlap their waits.
    # Each runs in this caller's context, so what it counts (faults.py) is this caller's.
    with ThreadPoolExecutor(max_workers=max(1, len(fns))) as pool:
        outputs = list(pool.map(faults.carried(lambda fn_name: _call(fn_name[0], fn_name[1], prompts,
                                                                     completions, columns, on_error)),
                                zip(fns, names)))
    for name, values in zip(names, outputs):
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise RewardError(f"reward function '{name}' returned {got} values for {n} completions; "
                              "it must return one float or None per completion")
        per_fn[name] = [_as_reward(v, name, i) for i, v in enumerate(values)]
    totals: list[float | None] = []
    for i in range(n):
        row = [(w, per_fn[name][i]) for w, name in zip(weights, names)]
        scored = [(w, v) for w, v in row if v is not None]
        missing = len(scored) < len(row) if unscorable == "any" else not scored
        totals.append(None if missing else sum(w * v for w, v in scored))
    return totals, per_fn
