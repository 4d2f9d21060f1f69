"""The reward a run optimizes: each function resolved from its name (a built-in, `module:function`,
code_tests, a reward model or server), every term with its weight and where it came from, and
what eval/accuracy scores held-out answers with."""

from __future__ import annotations

from grpo.inputs import Data, RewardUse, accuracy_text
from grpo.config import ConfigError, TrainConfig
from grpo.config.plan import plan_of
from grpo.data import GIVEN, first_line
from grpo.models import ModelError, model_source
from grpo.rewards import RewardFn, get_reward, math_accuracy, reward_name
from grpo.rewards.code import CodeTests
from grpo.rewards.sources import RewardModel, RewardServer
from grpo.sandbox.isolate import Limits


def resolve_reward(name: str, config: TrainConfig) -> RewardFn:
    """`model:DIR` a reward model, `http(s)://...` a reward server, `code_tests` the sandboxed
    code reward, else a function by name."""
    if name == "code_tests":
        r = config.reward
        try:
            return CodeTests(Limits(timeout_s=r.code_timeout_s), workers=r.code_workers,
                             partial_credit=r.partial_credit,
                             unsafe_code_execution=r.unsafe_code_execution)
        except RuntimeError as e:
            raise ConfigError(str(e)) from None
    if name.startswith(("http://", "https://")):
        return RewardServer(name, timeout_s=config.reward.reward_server_timeout_s)
    if name.startswith("model:"):
        path = name.removeprefix("model:")
        try:
            path, _ = model_source("rewards", path, runs=False, adapters=False)
            return RewardModel(path)
        except ModelError as e:
            raise ConfigError(f"{e} (the reward model {name})") from None
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"config key 'rewards': cannot load the reward model {name}: "
                              f"{_first_line(e)}") from None
    return get_reward(name)


def _first_line(error: Exception, limit: int = 300) -> str:
    """A library's error, cut to its first line: the rest is advice about other setups."""
    text = first_line(error)
    return text if len(text) <= limit else text[:limit] + " ..."


def choose_rewards(config: TrainConfig, given: list[RewardFn] | None, task, env_name: str
                   ) -> tuple[list[RewardFn], list[RewardUse]]:
    """The reward functions and every term of the reward, each with its source: functions given
    from Python, else `rewards=`, else (empty) the environment's reward alone, else the dataset
    default (math_accuracy), else the task's own. The environment's reward is always a term."""
    r, d = config.reward, config.data
    if given is not None:
        names, source = [reward_name(fn) for fn in given], "given to train()"
    elif r.rewards:
        names, source = list(r.rewards), "rewards="
    elif env_name:
        names, source = [], ""
    elif d.dataset:
        names, source = ["math_accuracy"], "the default with dataset=; rewards= chooses others"
    else:
        names, source = list(task.rewards), f"task {d.task}'s own reward"
    fns = list(given) if given is not None else [resolve_reward(n, config) for n in names]
    weights = list(r.reward_weights) or [1.0] * len(fns)
    if len(weights) != len(fns):
        raise ConfigError(f"config key 'reward_weights' has {len(weights)} weights for "
                          f"{len(fns)} reward functions")
    uses = [RewardUse(n, w, source) for n, w in zip(names, weights)]
    if env_name:
        alone = "" if fns else "; alone, as no rewards= is set"
        uses.append(RewardUse("environment", 1.0, f"environment {env_name}'s episode reward{alone}"))
    if config.loss.overlong_buffer > 0:
        uses.append(RewardUse("overlong", 1.0, f"overlong_buffer={config.loss.overlong_buffer:g}'s "
                                               "penalty"))
    if plan_of(config).kl_in == "reward":
        uses.append(RewardUse("kl", -config.loss.beta, "kl_in_reward=true: -beta x the KL"))
    return fns, uses


def choose_accuracy(config: TrainConfig, reward_fns: list[RewardFn], task, env_name: str,
                    eval_fns: list[RewardFn] = ()) -> tuple[RewardFn | None, str]:
    """What `eval/accuracy` scores held-out completions with, and why: the first of
    `eval_rewards` when set; code_tests when it is the first reward; the environment's episode
    reward when it is the only one (None); math_accuracy for rows from a file (`dataset`,
    `eval_dataset`); else the task's own reward."""
    if eval_fns:
        return eval_fns[0], f"{reward_name(eval_fns[0])} (eval_rewards=)"
    if reward_fns and reward_name(reward_fns[0]) == "code_tests":
        return reward_fns[0], "code_tests, the first of the rewards"
    if env_name and not reward_fns:
        return None, f"environment {env_name}'s episode reward"
    if config.data.dataset or config.data.eval_dataset:
        given = all(GIVEN.fullmatch(p) for p in (config.data.dataset, config.data.eval_dataset) if p)
        return math_accuracy, f"math_accuracy, for rows {'given in Python' if given else 'from a file'}"
    return get_reward(task.rewards[0]), f"{task.rewards[0]}, task {config.data.task}'s own reward"


def reward_line(data: Data) -> str:
    """The rewards a run uses and where each came from, in one line."""
    terms = ", ".join(f"{u.name} x{u.weight:g} ({u.source})" for u in data.reward_uses) or "none"
    return f"rewards: {terms}; eval/accuracy: {accuracy_text(data)}"


def rewards_comment(data: Data) -> str:
    """config.yaml's head: the same, as YAML comments, so the file still loads as a config."""
    lines = ["# The reward this run optimized, term by term, and where each came from:"]
    lines += [f"#   {u.name}  weight {u.weight:g}  ({u.source})" for u in data.reward_uses]
    lines.append(f"# eval/accuracy: {accuracy_text(data)}")
    return "\n".join(lines) + "\n"
