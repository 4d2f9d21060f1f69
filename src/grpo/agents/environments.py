"""Environments: stateful episodes a policy acts in, turn by turn.

The protocol (any object with these two methods; one is created per episode):

    reset(row: dict) -> str | None
        Start from the dataset row (its columns, `prompt` and `answer` included); return the
        first observation, placed after the prompt, or None.
    step(action: str) -> Step | tuple
        The text the model wrote this turn; return Step(observation, reward, done), or a tuple
        of those three: the next observation (None or "" for none), this turn's reward (None for
        none) and whether the episode is over.

Its other public methods are tools of the episode, bound to this episode's state, and shown to the
model as any tool is (a schema from the signature and the docstring, in every prompt): a turn
that calls one is answered by the method's result, and `step` sees only turns without calls. Each
needs type hints and a docstring, as any tool does; a helper the model must not call starts with
`_`. One environment is made at start to check all this (checked_instance). Without an
environment (`environment=` empty) an episode is the tool loop: a turn with calls is answered with
their results, a turn without ends the episode.

Environments are user code: `reset` and `step` run with a deadline; an error or an overrun in
`step` is shown to the model as the observation and counted, one in `reset` stops with an error
that names the row. The module that `module:Class` names is found in the working directory first,
as a reward's is, and so is the file `file.py:Class` names (sandbox/usercode.py).
"""

from __future__ import annotations

import inspect
import zlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

from grpo.agents.tools import Tool, ToolError, make_tool
from grpo.rewards import faults
from grpo.sandbox.usercode import target_of, user_object


class EnvironmentError_(RuntimeError):
    """An environment that cannot start an episode; the message names the row."""


@dataclass
class Step:
    observation: str | None = None
    reward: float | None = None
    done: bool = False


def as_step(value) -> Step:
    if isinstance(value, Step):
        return value
    if isinstance(value, tuple) and len(value) == 3:
        return Step(*value)
    raise TypeError(f"step() must return Step(observation, reward, done) or a 3-tuple, got "
                    f"{type(value).__name__}")


def with_deadline(fn: Callable, deadline_s: float, *args) -> tuple[Any, str | None]:
    """(result, None), or (None, what went wrong): an exception or an overrun."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - user code
            box["error"] = f"{type(e).__name__}: {e}"

    # in the caller's context: a reward it calls counts its zeros in the caller's scope (faults.py)
    worker = threading.Thread(target=faults.carried(target), daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        return None, f"did not answer within {deadline_s:g} s"
    return box.get("value"), box.get("error")


PROTOCOL = ("reset", "step")    # the methods every environment has; its other public ones are tools


def public_methods(env) -> dict[str, Callable]:
    """The environment's methods that are tools: public, bound, not those of the protocol."""
    out = {}
    for name, member in inspect.getmembers(env, callable):
        if name.startswith("_") or name in PROTOCOL or not inspect.ismethod(member):
            continue
        out[name] = member
    return out


def label(make_env: Callable) -> str:
    """`module:Class` (or `path.py:Class`) of a factory, as a config names it (a built-in by its
    own name)."""
    for name, factory in ENVIRONMENTS.items():
        if factory is make_env:
            return name
    return target_of(getattr(make_env, "__module__", "?"),
                     getattr(make_env, "__qualname__", make_env))


def method_tools(env, where: str = "") -> dict[str, Tool]:
    """The environment's public methods as tools, each schema from its signature and docstring;
    one that cannot become a schema is an error naming the environment and the method."""
    tools = {}
    for name, method in public_methods(env).items():
        try:
            tools[name] = make_tool(method, name)
        except ToolError as e:
            raise EnvironmentError_(
                f"environment '{where or type(env).__name__}': {e}. Its public methods are the "
                f"episode's tools: give {name} type hints and a docstring, or name it _{name} to "
                "keep it from the model") from None
    return tools


def checked_instance(make_env: Callable):
    """An environment made now, as each episode's will be: one that cannot be made with no
    arguments, or lacks a method of the protocol, is an error naming it."""
    where = label(make_env)
    try:
        env = make_env()
    except Exception as e:  # noqa: BLE001 - user code
        raise EnvironmentError_(f"environment '{where}': making one raised {type(e).__name__}: {e} "
                                "(an environment is made with no arguments, once per episode)") from None
    missing = [f"{m}()" for m in PROTOCOL if not callable(getattr(env, m, None))]
    if missing:
        raise EnvironmentError_(f"environment '{where}': {type(env).__name__} has no "
                                f"{' and no '.join(missing)}; an environment has reset(row) and "
                                "step(action) (docs/guides/agents.md)")
    return env


# ---------------------------------------------------------------------------------------------
# A built-in stateful environment

class GuessNumber:
    """Guess a secret number from 1 to `high` in few turns: after each guess the environment
    answers `higher`, `lower` or `correct`. What it answers depends on every earlier guess only
    through the secret, and the reward is given when the guess is right: 1, less 0.1 a turn."""

    def __init__(self, high: int = 16):
        self.high = high
        self.secret, self.turns = 0, 0

    def reset(self, row: dict) -> str | None:
        """The secret is the row's `secret` column, else a hash of its prompt: the same row gets
        the same secret in every process and after a resume."""
        secret = row.get("secret")
        if secret is None:
            secret = 1 + zlib.crc32(str(row.get("prompt", "")).encode()) % self.high
        self.secret = int(secret)
        self.turns = 0
        return None

    def step(self, action: str) -> Step:
        self.turns += 1
        digits = "".join(ch for ch in action if ch.isdigit())
        if not digits:
            return Step("say a number", 0.0, False)
        guess = int(digits[-6:])
        if guess == self.secret:
            return Step(None, max(0.0, 1.0 - 0.1 * (self.turns - 1)), True)
        return Step("higher" if guess < self.secret else "lower", 0.0, False)


ENVIRONMENTS: dict[str, Callable[[], Any]] = {"guess_number": GuessNumber}


def environment_factory(name: str) -> Callable[[], Any] | None:
    """A zero-argument factory: a built-in name, or `module:ClassOrFunction` (the module found in
    the working directory first) or `file.py:ClassOrFunction` (sandbox/usercode.py); empty ->
    None."""
    if not name:
        return None
    return user_object(name, ENVIRONMENTS, what="environment", error=EnvironmentError_,
                       kind="class or function", form="module:Class",
                       not_callable="a class or a function that makes one")
