"""What a run trains and is scored on, besides its model: `Data` (rows, rewards, demonstrations,
the agent), `Agent` (tools, environment, call format, limits) and each reward term's
`RewardUse`; and the prompts as the model sees them (`prompt_texts`), which assembly, checks,
evaluation and the pipeline all format the same way. Made by `assembly/` (data.load_data), read
by the stages that sample, score and evaluate: so it sits in the steps layer, below both."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from grpo.agents.environments import EnvironmentError_, environment_factory
from grpo.agents.tools import Tool, ToolError, resolve_tools
from grpo.config import ConfigError, TrainConfig
from grpo.data import DataError, format_prompt
from grpo.data.tasks import get_task
from grpo.rewards import RewardFn
from grpo.sampling.episodes import EpisodeLimits, shown_tools


@dataclass
class Agent:
    """What a multi-turn run needs to sample episodes (episodes.py)."""
    tools: dict[str, Tool]
    make_env: Callable[[], object] | None
    call_format: str
    limits: EpisodeLimits
    turn_rewards: bool = False

    @cached_property
    def shown(self) -> list[Tool]:
        """What every prompt describes: the run's tools, then the environment's methods."""
        return shown_tools(self.make_env, self.tools)


@dataclass(frozen=True)
class RewardUse:
    """One term of the reward a run optimizes, its weight, and where it came from."""
    name: str
    weight: float
    source: str


@dataclass
class Data:
    train_rows: list[dict]
    eval_rows: list[dict]
    reward_fns: list[RewardFn]
    reward_weights: list[float]
    accuracy_fn: RewardFn | None                # scores held-out answers for `eval/accuracy`;
                                                # None: the environment's episode reward
    # for the cold start: (row, context after its prompt that is not imitated, completion to imitate)
    demonstrations: list[tuple[dict, str, str]] = field(default_factory=list)
    skipped_long_prompts: int = 0               # rows left out by long_prompts=skip
    skipped_long_eval_prompts: int = 0          # of those, held-out rows (eval/skipped_long_prompts)
    agent: Agent | None = None                  # tools and/or an environment: episodes
    reward_uses: list = field(default_factory=list)   # [RewardUse]: each term and its source
    accuracy_source: str = ""                   # what eval/accuracy is scored with, and why
    eval_rows_available: int = 0                # held-out rows before the eval_size cut (and
                                                # before long_prompts=skip)
    eval_fns: list[RewardFn] = field(default_factory=list)   # eval_rewards=, each one's mean logged
    # dataset= and eval_dataset= rows as loaded, by key (data.fingerprint): a checkpoint records
    # them, and a resumed run on other data is refused
    fingerprints: dict[str, dict] = field(default_factory=dict)
    # a reasoning-gym task with a curriculum (task_args curriculum=T): its rows by level
    curriculum: object | None = None


def load_agent(config: TrainConfig, task_tools: list[str], extra_tools: list | None = None,
               environment: Callable[[], object] | None = None) -> Agent | None:
    """Tools and environment from the config (or the task's tools), plus those given from Python;
    None for single-turn runs. A tool or an environment method whose signature cannot become a
    schema stops here, named."""
    a = config.agent
    names = (list(a.tools) or task_tools) + list(extra_tools or [])
    try:
        make_env = environment or environment_factory(a.environment)
        if not names and make_env is None:
            return None
        tools = resolve_tools(names)
        shown_tools(make_env, tools)    # an environment made now: its protocol and methods checked
    except (ToolError, EnvironmentError_) as e:
        raise ConfigError(f"config key '{'environment' if isinstance(e, EnvironmentError_) else 'tools'}"
                          f"': {e}") from None
    turn = a.turn_tokens or config.sampling.max_new_tokens
    episode = a.episode_tokens or a.max_turns * (turn + 64)
    limits = EpisodeLimits(max_turns=a.max_turns, turn_tokens=turn, episode_tokens=episode,
                           observation_tokens=min(256, episode), deadline_s=a.tool_deadline_s)
    return Agent(tools, make_env, a.tool_format, limits, a.turn_rewards)


def agent_of(config: TrainConfig) -> Agent | None:
    """The config's Agent, from its keys alone (a run's own is `Data.agent`, which holds the
    tools and environment given from Python as well)."""
    d = config.data
    task_tools = [] if d.dataset else list(getattr(get_task(d.task, d.task_args), "tools", []))
    return load_agent(config, task_tools)


def system_prompt_of(config: TrainConfig) -> str:
    """`system_prompt`, or where it is empty, the task's own (a reasoning-gym task's names the
    answer format)."""
    d = config.data
    if d.system_prompt or d.dataset:
        return d.system_prompt
    return getattr(get_task(d.task, d.task_args), "system_prompt", "")


def call_format_of(config: TrainConfig, tokenizer, agent: Agent):
    """The agent's call format; with `hermes` and prompts in the chat template, tool results are
    rendered by the template as `tool` messages, as the model saw them in its own training."""
    from grpo.agents.tools import FORMATS, templated
    fmt = FORMATS[agent.call_format]
    uses_template = bool(getattr(tokenizer, "chat_template", None)) and config.model.chat_template != "none"
    return templated(fmt, tokenizer) if agent.call_format == "hermes" and uses_template else fmt


def prompt_texts(config: TrainConfig, tokenizer, rows: list[dict], agent: Agent | None) -> list[str]:
    """Each row's prompt as the model sees it (chat template applied where it belongs), with
    the tools and environment of `agent` (the run's: Data.agent) described."""
    texts, system = [], system_prompt_of(config)
    for i, r in enumerate(rows):
        try:
            texts.append(format_prompt(tokenizer, r["prompt"], config.model.chat_template, system,
                                       tools=agent.shown if agent else None,
                                       call_format=agent.call_format if agent else "plain",
                                       images=len(r.get("images") or [])))
        except DataError as e:
            where = config.data.dataset or f"task {config.data.task}"
            raise DataError(f"{where} row {r.get('_row', i) + 1}: {e}") from None
    return texts


def source_of(config: TrainConfig, rows: str) -> str:
    """Where a set of rows came from, as errors name it: the file, or the built-in task."""
    d = config.data
    if rows == "eval_rows" and d.eval_dataset:
        return d.eval_dataset
    return d.dataset or f"task {d.task}"


def accuracy_text(data: Data) -> str:
    return data.accuracy_source if data.eval_rows else "none (no held-out rows: set eval_dataset=)"
