"""Everything a run needs, built from a config: models, tokenizer, data, reward functions.

Kept apart from `train.py` so the loop there reads like Algorithm 1.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from grpo.advantages import ADVANTAGES
from grpo.config import ConfigError, TrainConfig
from grpo.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grpo.data import Columns, DataError, coverage_note, format_prompt, load_rows
from grpo.models import build_tiny, load_policy, load_tokenizer
from grpo.reward_sources import RewardModel, RewardServer
from grpo.rewards.code import CodeTests, CodeTestsError, spec_from_row
from grpo.rewards.sandbox import Limits
from grpo.rewards import RewardFn, get_reward, math_accuracy, reward_name
from grpo.rewards.answers import parsed_gold
from grpo.tasks import get_task
from grpo.environments import EnvironmentError_, environment_factory
from grpo.episodes import EpisodeLimits, episode_tools
from grpo.tools import Tool, ToolError, resolve_tools


@dataclass
class Agent:
    """What a multi-turn run needs to sample episodes (episodes.py)."""
    tools: dict[str, Tool]
    make_env: Callable[[], object] | None
    call_format: str
    limits: EpisodeLimits
    turn_rewards: bool = False


@dataclass
class Data:
    train_rows: list[dict]
    eval_rows: list[dict]
    reward_fns: list[RewardFn]
    reward_weights: list[float]
    accuracy_fn: RewardFn                       # scores held-out answers for `eval/accuracy`
    # for the cold start: (prompt, context after it that is not imitated, completion to imitate)
    demonstrations: list[tuple[str, str, str]] = field(default_factory=list)
    skipped_long_prompts: int = 0               # rows left out by long_prompts=skip
    agent: Agent | None = None                  # tools and/or an environment: episodes


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


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
        return RewardServer(name)
    if name.startswith("model:"):
        return RewardModel(name.removeprefix("model:"))
    return get_reward(name)


def check_golds(path: str, rows: list[dict], column: str = "answer") -> None:
    """Parse every gold answer once, at load; one that holds no value is an error naming its row."""
    for row in rows:
        if row["answer"] is None:
            raise DataError(f"{path} row {row['_row'] + 1}: no value in the answer column '{column}', "
                            "which math_accuracy compares with; set answer_column=NAME or choose "
                            "rewards that need no answer")
        if not parsed_gold(row["answer"]):
            raise DataError(f"{path} row {row['_row'] + 1}: answer {str(row['answer'])[:80]!r} holds no "
                            "value math_accuracy can compare with; fix the row or drop it")


def check_code_tests(path: str, rows: list[dict]) -> None:
    """Read every row's tests once, at load; one that cannot be read is an error naming its row."""
    for row in rows:
        try:
            spec_from_row(row, f"{path} row {row['_row'] + 1}")
        except CodeTestsError as e:
            raise DataError(str(e)) from None


def check_choices(config: TrainConfig) -> None:
    """Names that pick a table entry must name one; the error lists the choices."""
    tables = {"advantage": ADVANTAGES, "loss_type": POLICY_LOSSES, "aggregation": AGGREGATIONS,
              "kl_estimator": KL_ESTIMATORS}
    values = config.flat()
    for key, table in tables.items():
        if values[key] not in table:
            raise ConfigError(f"config key '{key}': unknown choice {values[key]!r}; "
                              f"choose one of {sorted(table)}")


def resolve_model(config: TrainConfig, run_dir: Path | None) -> str:
    """The model path; `tiny` builds a fresh tiny model in the run directory (or a temporary one)."""
    name = config.model.model
    if name == "tiny":
        where = run_dir / "base_model" if run_dir is not None else Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
        return str(build_tiny(where, seed=config.run.seed))
    return name


def load_model_and_tokenizer(config: TrainConfig, run_dir: Path | None):
    path = resolve_model(config, run_dir)
    try:
        tokenizer = load_tokenizer(path, config.model.chat_template)
        policy = load_policy(path, config.model.dtype)
    except OSError as e:
        raise ConfigError(f"config key 'model': cannot load {path!r}: {str(e).splitlines()[0]}") from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if torch.cuda.is_available():   # this process's GPU under torchrun (LOCAL_RANK), else the first
        policy = policy.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if config.optim.gradient_checkpointing:
        set_checkpointing(policy, True)
    if config.optim.mixed_precision == "bf16":
        policy.grpo_autocast = torch.bfloat16     # models.token_logprobs computes under autocast
    if config.model.lora_r > 0:
        policy = add_lora(policy, config)
    return policy, tokenizer


def set_checkpointing(model, on: bool) -> None:
    """Activation checkpointing per decoder layer in the passes that build a graph: the lean
    decoder reads `grpo_checkpointing`; Hugging Face's forward (heads that are more than a linear
    layer, FSDP2) gets its own gradient checkpointing. Passes without gradients are unchanged."""
    model.grpo_checkpointing = on
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):      # transformers >= 5.x's names
        enable = lambda: model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # noqa: E731
        disable = model.activation_checkpointing_disable
    else:
        enable = lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # noqa: E731
        disable = model.gradient_checkpointing_disable
    if on and getattr(model, "supports_gradient_checkpointing", False):
        enable()
    elif not on and getattr(model, "is_gradient_checkpointing", False):
        disable()


def add_lora(policy, config: TrainConfig):
    """Wrap the policy with a fresh LoRA adapter (peft); only the adapter's weights train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("config key 'lora_r' needs peft: pip install 'grpo[lora]'") from None
    m = config.model
    present = {name.rsplit(".", 1)[-1] for name, _ in policy.named_modules()}
    missing = [t for t in m.lora_target_modules if t not in present]
    if missing:
        raise ConfigError(f"config key 'lora_target_modules': the model has no layers named {missing}")
    lora = LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, target_modules=list(m.lora_target_modules),
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(policy, lora)


def load_data(config: TrainConfig, reward_fns: list[RewardFn] | None = None,
              check_golds_now: bool = True, tools: list | None = None,
              environment: Callable[[], object] | None = None) -> Data:
    """Rows, reward functions and demonstrations from the task or the dataset file. Golds are
    checked at load for GRPO; cold-start-only use (`grpo sft`) needs none."""
    d = config.data
    if d.dataset:
        columns = Columns(d.prompt_column, d.answer_column, d.tests_column, d.entry_point_column)
        train_rows = load_rows(d.dataset, columns, d.dataset_config, d.dataset_split)
        eval_rows = (load_rows(d.eval_dataset, columns, d.dataset_config, d.eval_split)
                     if d.eval_dataset else [])
        random.Random(config.run.seed).shuffle(train_rows)
        default_rewards, accuracy_fn = ["math_accuracy"], math_accuracy
        demonstrations = [(r["prompt"], "", str(r["completion"])) for r in train_rows
                          if "completion" in r]
    else:
        task = get_task(d.task)
        train_rows, eval_rows = task.train_rows(config.run.seed), task.eval_rows()
        default_rewards, accuracy_fn = task.rewards, get_reward(task.rewards[0])
        demonstrations = []
        for r in train_rows:
            shown = task.demonstration(r)    # a completion, or (context, completion) turns
            turns = [("", shown)] if isinstance(shown, str) else shown
            demonstrations += [(r["prompt"], context, target) for context, target in turns]
    if reward_fns is None:
        names = config.reward.rewards or default_rewards
        reward_fns = [resolve_reward(n, config) for n in names]
    if d.dataset and check_golds_now and math_accuracy in reward_fns:
        check_golds(d.dataset, train_rows, d.answer_column)
    if d.dataset and any(reward_name(fn) == "code_tests" for fn in reward_fns):
        for path, rows in ((d.dataset, train_rows), (d.eval_dataset, eval_rows)):
            check_code_tests(path, rows)
    if d.dataset and reward_name(reward_fns[0]) == "code_tests":
        accuracy_fn = reward_fns[0]
    weights = list(config.reward.reward_weights) or [1.0] * len(reward_fns)
    if len(weights) != len(reward_fns):
        raise ConfigError(f"config key 'reward_weights' has {len(weights)} weights for "
                          f"{len(reward_fns)} reward functions")
    agent = load_agent(config, [] if d.dataset else list(getattr(task, "tools", [])), tools,
                       environment)
    _AGENTS[id(config)] = (config, agent)
    return Data(train_rows, eval_rows[: d.eval_size], reward_fns, weights, accuracy_fn, demonstrations,
                agent=agent)


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
        if make_env is not None:
            episode_tools(make_env(), tools)    # the environment's methods as tools, checked now
    except (ToolError, EnvironmentError_) as e:
        raise ConfigError(f"config key '{'environment' if isinstance(e, EnvironmentError_) else 'tools'}"
                          f"': {e}") from None
    turn = a.turn_tokens or config.sampling.max_new_tokens
    episode = a.episode_tokens or a.max_turns * (turn + 64)
    limits = EpisodeLimits(max_turns=a.max_turns, turn_tokens=turn, episode_tokens=episode,
                           observation_tokens=min(256, episode), deadline_s=a.tool_deadline_s)
    return Agent(tools, make_env, a.tool_format, limits, a.turn_rewards)


_AGENTS: dict[int, tuple[TrainConfig, Agent | None]] = {}


def call_format_of(config: TrainConfig, tokenizer, agent: Agent):
    """The agent's call format; with `hermes` and prompts in the chat template, tool results are
    rendered by the template as `tool` messages, as the model saw them in its own training."""
    from grpo.tools import FORMATS, templated
    fmt = FORMATS[agent.call_format]
    uses_template = bool(getattr(tokenizer, "chat_template", None)) and config.model.chat_template != "none"
    return templated(fmt, tokenizer) if agent.call_format == "hermes" and uses_template else fmt


def agent_of(config: TrainConfig) -> Agent | None:
    """The config's Agent (built once per config; the tools' schemas are what prompts show)."""
    entry = _AGENTS.get(id(config))
    if entry is None or entry[0] is not config:
        task_tools = [] if config.data.dataset else list(getattr(get_task(config.data.task), "tools", []))
        entry = _AGENTS[id(config)] = (config, load_agent(config, task_tools))
    return entry[1]


def prompt_texts(config: TrainConfig, tokenizer, rows: list[dict]) -> list[str]:
    """Each row's prompt as the model sees it (chat template applied where it belongs)."""
    texts = []
    agent = agent_of(config)
    for i, r in enumerate(rows):
        try:
            texts.append(format_prompt(tokenizer, r["prompt"], config.model.chat_template,
                                       config.data.system_prompt,
                                       tools=list(agent.tools.values()) if agent else None,
                                       call_format=agent.call_format if agent else "plain"))
        except DataError as e:
            where = config.data.dataset or f"task {config.data.task}"
            raise DataError(f"{where} row {r.get('_row', i) + 1}: {e}") from None
    return texts


def fit_prompts(config: TrainConfig, tokenizer, context: int | None, data: Data,
                log=print) -> None:
    """Rows whose templated prompt plus `max_new_tokens` exceed the model's context: an error
    naming the first (long_prompts=error) or left out and counted (skip). Never truncated.
    Characters the tokenizer cannot represent are reported first (data.coverage_note)."""
    note = coverage_note(tokenizer, {"train": data.train_rows, "held-out": data.eval_rows},
                         f"model {config.model.model}")
    if note:
        log(note)
    if not context:
        return
    limit = context - config.sampling.max_new_tokens
    where = config.data.dataset or f"task {config.data.task}"
    for name in ("train_rows", "eval_rows"):
        rows = getattr(data, name)
        kept = []
        lengths = [len(ids) for ids in tokenizer(prompt_texts(config, tokenizer, rows),
                                                 add_special_tokens=False).input_ids] if rows else []
        for i, (row, n) in enumerate(zip(rows, lengths)):
            if n <= limit:
                kept.append(row)
            elif config.data.long_prompts == "error":
                number = row.get("_row", i) + 1
                raise DataError(f"{where} row {number}: the prompt has {n} tokens; with max_new_tokens="
                                f"{config.sampling.max_new_tokens} it exceeds the model's context of "
                                f"{context}. Shorten it, lower max_new_tokens, or set long_prompts=skip")
        if len(kept) < len(rows):
            data.skipped_long_prompts += len(rows) - len(kept)
            log(f"long_prompts=skip: left out {len(rows) - len(kept)} of {len(rows)} "
                f"{name.replace('_rows', '')} prompts longer than {limit} tokens")
        setattr(data, name, kept)
    if not data.train_rows:
        raise DataError(f"{where}: every prompt is longer than {limit} tokens; nothing to train on")
