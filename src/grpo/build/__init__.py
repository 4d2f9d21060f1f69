"""Everything a run needs, built from a config: models, tokenizer, data, reward functions.

Kept apart from `train.py` so the loop there reads like Algorithm 1.
"""

from __future__ import annotations

import os
import re
import random
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import torch

from grpo.algorithm.advantages import ADVANTAGES
from grpo.config import ALGORITHMS, ConfigError, OptimConfig, TrainConfig
from grpo.algorithm.loss import AGGREGATIONS, COVARIANCE_LOSSES, KL_ESTIMATORS, POLICY_LOSSES
from grpo.data import (GIVEN, Columns, DataError, coverage_note, demonstration_text, first_line,
                       fingerprint, format_prompt, given_label, given_rows, load_rows)
from grpo.run import distributed
from grpo import vision
from grpo.models.tiny_vision import build_tiny_vlm
from grpo.models import ModelError, build_tiny, load_policy, load_tokenizer, model_source
from grpo.run.progress import to_stderr
from grpo.rewards.sources import RewardModel, RewardServer
from grpo.rewards.code import CodeTests, CodeTestsError, spec_from_row
from grpo.sandbox.isolate import Limits
from grpo.rewards import REWARDS, RewardError, RewardFn, faults, get_reward, math_accuracy, reward_name, score
from grpo.rewards.answers import parsed_gold
from grpo.data.tasks import get_task
from grpo.agents.environments import EnvironmentError_, environment_factory
from grpo.sampling.episodes import EpisodeLimits, shown_tools
from grpo.agents.tools import Tool, ToolError, resolve_tools


TASK_EVAL_SIZE = 200   # held-out rows of a built-in task scored when eval_size is unset (0)


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


def check_golds(path: str, rows: list[dict], column: str = "answer", key: str = "dataset") -> None:
    """Parse every gold answer once, at load; those that hold no value are an error naming the
    first in the file's order and how many there are.
    Held-out rows (`key` eval_dataset) are checked when eval/accuracy is math_accuracy."""
    why = ("which math_accuracy compares with" if key == "dataset" else
           "which eval/accuracy compares with (math_accuracy, for rows from a file; code scores "
           "with rewards=[code_tests])")
    problems = {}
    for row in rows:
        if row["answer"] is None:
            problems[row["_row"]] = (f"no value in the answer column '{column}', {why}; set "
                                     "answer_column=NAME or choose rewards that need no answer")
        elif not parsed_gold(row["answer"]):
            problems[row["_row"]] = (f"answer {str(row['answer'])[:80]!r} holds no value "
                                     "math_accuracy can compare with; fix the row or drop it")
    if problems:
        raise DataError(f"config key '{key}': {first_bad_row(path, problems, len(rows))}")


def first_bad_row(path: str, problems: dict[int, str], total: int) -> str:
    """`problems` (a file row, from 0, and what is wrong with it) as one line: the first row in
    the file's order, whatever order the rows were shuffled in, and how many rows are bad."""
    first = min(problems)
    text = problems[first]
    if not text.startswith(f"{path} row {first + 1}"):     # else the message names its row already
        text = f"{path} row {first + 1}: {text}"
    more = f"; {len(problems)} of the {total} rows are like this" if len(problems) > 1 else ""
    return text + more


def check_code_tests(path: str, rows: list[dict]) -> None:
    """Read every row's tests once, at load; those that cannot be read are an error naming the
    first in the file's order and how many there are."""
    problems = {}
    for row in rows:
        try:
            spec_from_row(row, f"{path} row {row['_row'] + 1}")
        except CodeTestsError as e:
            problems[row["_row"]] = str(e)
    if problems:
        raise DataError(first_bad_row(path, problems, len(rows)))


def check_choices(config: TrainConfig) -> None:
    """Names that pick a table entry must name one; the error lists the choices."""
    tables = {"advantage": ADVANTAGES, "loss_type": POLICY_LOSSES, "aggregation": AGGREGATIONS,
              "kl_estimator": KL_ESTIMATORS}
    values = config.flat()
    for key, table in tables.items():
        if values[key] not in table:
            preset = (f" ({values[key]!r} is a preset here: algorithm={values[key]} sets this key "
                      "and its companions)" if values[key] in ALGORITHMS else "")
            raise ConfigError(f"config key '{key}': unknown choice {values[key]!r}; "
                              f"choose one of {sorted(table)}{preset}")


def resolve_model(config: TrainConfig, run_dir: Path | None,
                  world: distributed.World = distributed.World()) -> str:
    """The model path; `tiny` builds a fresh tiny model in the run directory (or a temporary one),
    `tiny-vlm` (or `tiny` for a task with images) a tiny LLaVA-architecture vision-language model.
    Under torchrun rank 0 writes it into `output_dir`/base_model and every rank reads it from there
    after a barrier (transformers writes model files on rank 0 only): a process that does not see
    it (machines that do not share `output_dir`) stops every process, in one line."""
    name = config.model.model
    if name == "tiny" and not config.data.dataset and getattr(get_task(config.data.task), "vision", False):
        name = "tiny-vlm"             # a task whose prompts hold images gets the tiny vision model
    if name in ("tiny", "tiny-vlm"):
        make = build_tiny_vlm if name == "tiny-vlm" else build_tiny
        if world.size > 1:
            where = Path(config.run.output_dir) / "base_model"
            if world.is_main:
                make(where, seed=config.run.seed)
            distributed.barrier(world)
            problem = unseen_model(distributed.gather_objects((str(where), appears(where)), world))
            if problem:
                raise ConfigError(problem)
            return str(where)
        where = run_dir / "base_model" if run_dir is not None else Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
        return str(make(where, seed=config.run.seed))
    return name


def appears(model_dir: Path, wait_s: float = 10.0) -> bool:
    """True once `model_dir` holds a model's config.json, looked for during `wait_s` seconds: a
    shared file system may show what another machine wrote a moment late."""
    deadline = time.monotonic() + wait_s
    while not (model_dir / "config.json").is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def unseen_model(seen: list[tuple[str, bool]]) -> str | None:
    """What is wrong when a process (of `seen`, each one's (path, whether it sees the tiny model
    there), in rank order) does not see the model rank 0 built; None when every one does."""
    missing = [rank for rank, (_, there) in enumerate(seen) if not there]
    if not missing:
        return None
    rank, where = missing[0], seen[missing[0]][0]
    return (f"config key 'model': process {rank} does not see {where}, where process 0 built the "
            "tiny model: under torchrun on several machines, output_dir must be on a file system "
            "they share")


RUN_FILES = ("final", "checkpoints", "metrics.jsonl")   # beside config.yaml, they make a run directory


def run_dir_of(path: str | Path) -> Path | None:
    """The run directory `path` names (the directory, or the config.yaml in it): one that holds
    config.yaml and a run's files; None for anything else."""
    path = Path(path).expanduser()
    where = path.parent if path.name == "config.yaml" and path.is_file() else path
    if (where / "config.yaml").is_file() and any((where / name).exists() for name in RUN_FILES):
        return where
    return None


def run_weights(run_dir: Path, log: Callable[[str], None] = to_stderr) -> Path:
    """A run's trained weights, for load_model_and_tokenizer as `model`: final/merged (lora_merge),
    else final/ (with LoRA, the adapter the loader puts on its base), else the newest checkpoint
    whose manifest verifies, said in `log`."""
    from grpo.run.checkpoint import newest_valid
    final = run_dir / "final"
    if (final / "merged").is_dir():
        return final / "merged"
    if final.is_dir():
        return final
    newest = newest_valid(run_dir / "checkpoints", log)
    if newest is None:
        raise ConfigError(f"config key 'model': cannot load '{run_dir}': a run directory with no "
                          "trained weights yet (no final/, no valid checkpoints/step-N/); continue "
                          "the run with resume=auto")
    log(f"run {run_dir} has no final/ (it stopped before its end): using its newest checkpoint, "
        f"{newest}")
    return newest


def run_settings(run_dir: Path, log: Callable[[str], None] = to_stderr) -> dict:
    """The keys a run was trained with (its config.yaml), less any this version does not know."""
    from grpo.config import KEYS, load_yaml
    saved = load_yaml(run_dir / "config.yaml")
    unknown = sorted(k for k in saved if k not in KEYS)
    if unknown:
        log(f"{run_dir / 'config.yaml'}: leaving out keys this version does not have: {unknown}")
    return {k: v for k, v in saved.items() if k in KEYS}


def load_model_and_tokenizer(config: TrainConfig, run_dir: Path | None,
                             log: Callable[[str], None] = to_stderr,
                             world: distributed.World = distributed.World()):
    """The policy and its tokenizer from `model`; every failure to load is one line naming the
    key and the path (models.model_source checks the directory first)."""
    try:
        path, note = model_source("model", resolve_model(config, run_dir, world))
    except ModelError as e:
        raise ConfigError(str(e)) from None
    if note:
        log(note)
    try:
        tokenizer = load_tokenizer(path, config.model.chat_template)
        policy = load_policy(path, config.model.dtype)
    except ModelError as e:         # the tokenizer's own checks: EOS, chat template
        raise ConfigError(str(e)) from None
    except (OSError, ValueError, KeyError, ImportError) as e:
        where = "" if Path(path).is_dir() else " (no directory here, so it was read as a hub name)"
        raise ConfigError(f"config key 'model': cannot load '{path}'{where}: {_first_line(e)}") from None
    if torch.cuda.is_available():   # this process's GPU under torchrun (LOCAL_RANK), else the first
        policy = policy.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if vision.is_vision_model(policy) and not config.model.train_vision:
        vision.freeze_tower(policy)   # the reference model then shares it (models.frozen_copy)
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
        raise ConfigError("config key 'lora_r' needs peft: pip install 'peft>=0.13' (in a clone of "
                          "grpo: pip install -e '.[lora]')") from None
    m = config.model
    present = {name.rsplit(".", 1)[-1] for name, _ in policy.named_modules()}
    missing = [t for t in m.lora_target_modules if t not in present]
    if missing:
        raise ConfigError(f"config key 'lora_target_modules': the model has no layers named {missing}")
    targets = list(m.lora_target_modules)
    if vision.is_vision_model(policy):   # the language model's layers only, not the image encoder's
        targets = (rf"^(?!.*\b({'|'.join(vision.TOWERS)})\b).*\.({'|'.join(map(re.escape, targets))})$")
    lora = LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, target_modules=targets,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(policy, lora)


@dataclass(frozen=True)
class RewardUse:
    """One term of the reward a run optimizes, its weight, and where it came from."""
    name: str
    weight: float
    source: str


def _rows_of(key: str, path: str, columns: Columns, config_name: str, split: str,
             given: dict | None = None) -> list[dict]:
    """The rows of the file or dataset a key names, or those `given` to train() for it; a load
    error names the key too."""
    try:
        if given and given.get(key) is not None:
            return given_rows(given[key], columns, key)
        return load_rows(path, columns, config_name, split)
    except DataError as e:
        raise DataError(f"config key '{key}': {e}") from None


def demonstrations_of(path: str, rows: list[dict], imitated: bool) -> list[tuple[dict, str, str]]:
    """(row, "", text to imitate) for the rows whose `completion` holds one (data.demonstration_text).
    With a cold start (`imitated`) an unusable one is an error naming the first such row in the
    file's order; without, it is no demonstration (`grpo score` reads lists of texts there)."""
    texts = {}
    for r in sorted(rows, key=lambda r: r["_row"]):
        if "completion" in r:
            try:
                texts[r["_row"]] = demonstration_text(r["completion"], f"{path} row {r['_row'] + 1}, "
                                                      "column 'completion'")
            except DataError:
                if imitated:
                    raise
    return [(r, "", texts[r["_row"]]) for r in rows if texts.get(r["_row"]) is not None]


def load_data(config: TrainConfig, reward_fns: list[RewardFn] | None = None,
              check_golds_now: bool = True, tools: list | None = None,
              environment: Callable[[], object] | None = None,
              log: Callable[[str], None] | None = None, given: dict | None = None,
              held_out_only: bool = False) -> Data:
    """Rows, reward functions and demonstrations from the task or the dataset file, and the
    held-out rows from `eval_dataset` whenever it is set. Golds are checked at load for GRPO;
    cold-start-only use (`grpo sft`) needs none. `log` gets the rewards the run uses. `given`
    holds rows given to train() in Python, by key (`dataset`, `eval_dataset`; with_given).
    `held_out_only` (`grpo eval`): the training rows are neither read nor made (train_rows and
    demonstrations empty), so a run whose training file is gone is still evaluated."""
    d = config.data
    columns = Columns(d.prompt_column, d.answer_column, d.tests_column, d.entry_point_column,
                      d.image_column)
    task, fingerprints = None, {}
    if held_out_only:
        train_rows, demonstrations = [], []
        task = get_task(d.task) if not d.dataset else None
    elif d.dataset:
        if log is not None:
            log(reading_note("dataset", d.dataset, d.dataset_split))
        train_rows = _rows_of("dataset", d.dataset, columns, d.dataset_config, d.dataset_split,
                              given)
        fingerprints["dataset"] = fingerprint(d.dataset, train_rows)    # in the file's order
        if log is not None:
            log(f"dataset: {len(train_rows):,} rows from {d.dataset}")
        random.Random(config.run.seed).shuffle(train_rows)
        demonstrations = demonstrations_of(d.dataset, train_rows, config.run.sft_steps > 0)
        if log is not None and 0 < len(demonstrations) < len(train_rows) and config.run.sft_steps:
            log(f"cold start: {len(demonstrations):,} of {len(train_rows):,} rows have a completion "
                "to imitate; the rest are GRPO's only")
    else:
        task = get_task(d.task)
        train_rows = task.train_rows(config.run.seed)
        demonstrations = []
        for r in train_rows:
            shown = task.demonstration(r)    # a completion, or (context, completion) turns
            turns = [("", shown)] if isinstance(shown, str) else shown
            demonstrations += [(r, context, target) for context, target in turns]
    if d.eval_dataset:
        if log is not None:
            log(reading_note("eval_dataset", d.eval_dataset, d.eval_split))
        eval_rows = _rows_of("eval_dataset", d.eval_dataset, columns, d.dataset_config, d.eval_split,
                             given)
        fingerprints["eval_dataset"] = fingerprint(d.eval_dataset, eval_rows)   # before the eval_size cut
    else:
        eval_rows = task.eval_rows() if task is not None else []
    available = len(eval_rows)
    eval_rows = eval_rows[: d.eval_size or (TASK_EVAL_SIZE if not d.eval_dataset else None)]
    env_name = config.agent.environment or (reward_name(environment) if environment else "")
    reward_fns, uses = choose_rewards(config, reward_fns, task, env_name)
    eval_fns = [resolve_reward(name, config) for name in config.eval.eval_rewards]
    accuracy_fn, accuracy_source = choose_accuracy(config, reward_fns, task, env_name, eval_fns)
    if check_golds_now and d.dataset and math_accuracy in reward_fns:
        check_golds(d.dataset, train_rows, d.answer_column)
    if check_golds_now and d.eval_dataset and accuracy_fn is math_accuracy:
        check_golds(d.eval_dataset, eval_rows, d.answer_column, key="eval_dataset")
    if any(reward_name(fn) == "code_tests" for fn in reward_fns):
        for path, rows in ((d.dataset, train_rows), (d.eval_dataset, eval_rows)):
            if path:
                check_code_tests(path, rows)
    weights = [u.weight for u in uses[: len(reward_fns)]]
    agent = load_agent(config, list(getattr(task, "tools", [])) if task is not None else [], tools,
                       environment)
    data = Data(train_rows, eval_rows, reward_fns, weights, accuracy_fn, demonstrations, agent=agent,
                reward_uses=uses, accuracy_source=accuracy_source, eval_rows_available=available,
                eval_fns=eval_fns, fingerprints=fingerprints)
    if log is not None:
        log(reward_line(data))
        if (cut := eval_cut_line(config, data)) is not None:
            log(cut)
    return data


def eval_cut_line(config: TrainConfig, data: Data) -> str | None:
    """The held-out rows an evaluation leaves out, in one line; None when it scores them all."""
    if len(data.eval_rows) >= data.eval_rows_available:
        return None
    why = (f"eval_size={config.data.eval_size}" if config.data.eval_size else
           f"eval_size unset: a built-in task's first {TASK_EVAL_SIZE}")
    return (f"evaluating the first {len(data.eval_rows)} of {data.eval_rows_available} held-out "
            f"rows ({why}; eval_size=N sets how many, logged as eval/n of eval/rows)")


def reading_note(key: str, path: str, split: str) -> str:
    """Said before a dataset is read, which takes a while for a large one: what, and how big."""
    where = Path(path).expanduser()
    if where.is_file():
        return f"{key}: reading {path} ({where.stat().st_size / 1e6:.1f} MB)"
    if where.is_dir():
        return f"{key}: reading the files of {path}"
    if path.startswith("("):      # rows given from Python: "(N rows given to train())"
        return f"{key}: {path}"
    return f"{key}: reading {path} (split {split}) from the hub or its cache"


def check_engine(config: TrainConfig, engine=None) -> None:
    """`sampler=vllm` needs vLLM importable here (found at start, not after the cold start), or
    an engine given from Python (with async_steps the pipeline's client samples on it)."""
    if engine is not None:
        if config.sampling.sampler == "hf":
            raise ConfigError("config key 'sampler': an engine was given (train(engine=...)), and "
                              "sampler=hf samples from the policy itself: set sampler=vllm")
        return
    if config.sampling.sampler != "vllm":   # vllm_server: HTTP, nothing to import
        return
    from grpo.sampling.vllm import VLLMUnavailable, import_vllm
    try:
        import_vllm()
    except VLLMUnavailable as e:
        raise ConfigError(f"config key 'sampler': {e}") from None


def check_rewards(config: TrainConfig, tokenizer, data: Data) -> None:
    """One dry call of each of the user's reward functions, before any training: on the first
    training row, with that row's own completion or answer (else an empty string) standing in for
    a sampled completion. A function that raises (with reward_on_error=raise), has a signature the
    call does not fit, returns the wrong number of values or a value that is not finite stops the
    run here, named, as it would at step 1. Nothing is recorded: no metric, no fault count.
    The built-ins, code_tests, reward models and reward servers are not called: their contract is
    the project's own (a server's first request is step 1's, with its own timeout and retries)."""
    mine = [(fn, w) for fn, w in zip(data.reward_fns, data.reward_weights) if _users_own(fn)]
    if not mine or not data.train_rows:
        return
    row = data.train_rows[0]
    stand_in = next((str(row[k]) for k in ("completion", "answer") if row.get(k) is not None), "")
    where = f"{source_of(config, 'train_rows')} row {row.get('_row', 0) + 1}"
    from grpo.data import columns_of
    try:
        with faults.counting():     # the stand-in's counts are no step's
            score([fn for fn, _ in mine], [w for _, w in mine],
                  prompt_texts(config, tokenizer, [row], data.agent), [stand_in], columns_of([row], 1), on_error=config.reward.reward_on_error,
                  unscorable=config.reward.unscorable)
    except RewardError as e:
        raise RewardError(f"before training, a dry call on {where} (completion {stand_in[:40]!r}): "
                          f"{e}") from None


def _users_own(fn: RewardFn) -> bool:
    """A reward function the project did not write: a user's function given as module:function
    or from Python (not a built-in, code_tests, a reward model or a reward server)."""
    return (fn not in REWARDS.values() and not isinstance(fn, (CodeTests, RewardModel, RewardServer)))


def check_batch(config: TrainConfig, data: Data, log) -> None:
    """A note at start when the dataset holds fewer rows than a step's prompts: every step then
    samples some prompts twice or more, as separate groups."""
    n, wanted = len(data.train_rows), config.sampling.prompts_per_step
    if config.data.dataset and n < wanted:
        log(f"{config.data.dataset} has {n} row{'s' if n != 1 else ''} (after the checks), fewer than "
            f"prompts_per_step={wanted}: every step repeats prompts, each as a group of its own; set "
            f"prompts_per_step={n} or lower for distinct prompts")


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
    if config.loss.kl_in_reward and config.loss.beta > 0:
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
        return math_accuracy, "math_accuracy, for rows from a file"
    return get_reward(task.rewards[0]), f"{task.rewards[0]}, task {config.data.task}'s own reward"


def reward_line(data: Data) -> str:
    """The rewards a run uses and where each came from, in one line."""
    terms = ", ".join(f"{u.name} x{u.weight:g} ({u.source})" for u in data.reward_uses) or "none"
    return f"rewards: {terms}; eval/accuracy: {accuracy_text(data)}"


def accuracy_text(data: Data) -> str:
    return data.accuracy_source if data.eval_rows else "none (no held-out rows: set eval_dataset=)"


def rewards_comment(data: Data) -> str:
    """config.yaml's head: the same, as YAML comments, so the file still loads as a config."""
    lines = ["# The reward this run optimized, term by term, and where each came from:"]
    lines += [f"#   {u.name}  weight {u.weight:g}  ({u.source})" for u in data.reward_uses]
    lines.append(f"# eval/accuracy: {accuracy_text(data)}")
    return "\n".join(lines) + "\n"


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


def call_format_of(config: TrainConfig, tokenizer, agent: Agent):
    """The agent's call format; with `hermes` and prompts in the chat template, tool results are
    rendered by the template as `tool` messages, as the model saw them in its own training."""
    from grpo.agents.tools import FORMATS, templated
    fmt = FORMATS[agent.call_format]
    uses_template = bool(getattr(tokenizer, "chat_template", None)) and config.model.chat_template != "none"
    return templated(fmt, tokenizer) if agent.call_format == "hermes" and uses_template else fmt


def agent_of(config: TrainConfig) -> Agent | None:
    """The config's Agent, from its keys alone (a run's own is `Data.agent`, which holds the
    tools and environment given from Python as well)."""
    task_tools = [] if config.data.dataset else list(getattr(get_task(config.data.task), "tools", []))
    return load_agent(config, task_tools)


def prompt_texts(config: TrainConfig, tokenizer, rows: list[dict], agent: Agent | None) -> list[str]:
    """Each row's prompt as the model sees it (chat template applied where it belongs), with
    the tools and environment of `agent` (the run's: Data.agent) described."""
    texts = []
    for i, r in enumerate(rows):
        try:
            texts.append(format_prompt(tokenizer, r["prompt"], config.model.chat_template,
                                       config.data.system_prompt,
                                       tools=agent.shown if agent else None,
                                       call_format=agent.call_format if agent else "plain",
                                       images=len(r.get("images") or [])))
        except DataError as e:
            where = config.data.dataset or f"task {config.data.task}"
            raise DataError(f"{where} row {r.get('_row', i) + 1}: {e}") from None
    return texts


def check_images(config: TrainConfig, tokenizer, data: Data) -> None:
    """Rows with images need a model with an image processor: refused, never dropped."""
    if getattr(tokenizer, "grpo_processor", None) is not None:
        return
    for key, rows in (("dataset", data.train_rows), ("eval_dataset", data.eval_rows)):
        with_images = [r for r in rows if r.get("images")]
        if with_images:
            where = getattr(config.data, key) or f"task {config.data.task}"
            row = with_images[0].get("_row", rows.index(with_images[0]))
            raise ConfigError(
                f"config key 'model': {config.model.model} is a text-only model, but {where} has "
                f"images ({len(with_images)} of {len(rows)} rows, the first row {row + 1}); use a "
                "vision-language model (one transformers loads as image-text-to-text, with its "
                "processor), or a dataset without an image column. Images are never dropped")


def fit_prompts(config: TrainConfig, tokenizer, context: int | None, data: Data,
                log=print) -> None:
    """Rows whose templated prompt plus `max_new_tokens` exceed the model's context: an error
    naming the first and counting them all (long_prompts=error), or left out and counted (skip),
    said louder when that is most of them. Never truncated. Characters the tokenizer cannot
    represent are reported first (data.coverage_note); then `check_answer_lengths`."""
    note = coverage_note(tokenizer, {"train": data.train_rows, "held-out": data.eval_rows},
                         f"model {config.model.model}")
    if note:
        log(note)
    check_answer_lengths(config, tokenizer, data, log)
    if not context:
        return
    limit = context - config.sampling.max_new_tokens
    fix = (f"a model with a longer context, or a lower max_new_tokens (now "
           f"{config.sampling.max_new_tokens}), fits more")
    had_train_rows = bool(data.train_rows)     # none at all: grpo eval, which reads no training rows
    for name in ("train_rows", "eval_rows"):
        rows, where = getattr(data, name), source_of(config, name)
        lengths = [len(ids) for ids in tokenizer(prompt_texts(config, tokenizer, rows, data.agent),
                                                 add_special_tokens=False).input_ids] if rows else []
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long and config.data.long_prompts == "error":
            first = too_long[0]
            raise DataError(f"{where} row {rows[first].get('_row', first) + 1}: the prompt has "
                            f"{lengths[first]} tokens; with max_new_tokens="
                            f"{config.sampling.max_new_tokens} it exceeds the model's context of "
                            f"{context} ({len(too_long)} of {len(rows)} prompts do). Shorten it, lower "
                            "max_new_tokens, or set long_prompts=skip")
        kept = [row for row, n in zip(rows, lengths) if n <= limit]
        if len(kept) < len(rows):
            data.skipped_long_prompts += len(rows) - len(kept)
            if name == "eval_rows":
                data.skipped_long_eval_prompts += len(rows) - len(kept)
            most = f": most of {where}; {fix}" if len(kept) < len(rows) / 2 else ""
            log(f"long_prompts=skip: left out {len(rows) - len(kept)} of {len(rows)} "
                f"{name.replace('_rows', '')} prompts longer than {limit} tokens{most}")
        setattr(data, name, kept)
    if had_train_rows and not data.train_rows:
        raise DataError(f"{source_of(config, 'train_rows')}: every prompt is longer than {limit} "
                        f"tokens; nothing to train on: {fix}")


def source_of(config: TrainConfig, rows: str) -> str:
    """Where a set of rows came from, as errors name it: the file, or the built-in task."""
    d = config.data
    if rows == "eval_rows" and d.eval_dataset:
        return d.eval_dataset
    return d.dataset or f"task {d.task}"


# A row's reference answer, the first of these columns it has: a demonstration, HumanEval's
# canonical solution, the gold answer (GSM8K's worked solution; MATH's `solution` arrives as it).
REFERENCE_COLUMNS = ("completion", "canonical_solution", "answer")
LENGTH_SAMPLE = 1000    # rows whose reference is tokenized for the check


def check_answer_lengths(config: TrainConfig, tokenizer, data: Data, log) -> None:
    """Said at start when most reference answers are longer than a completion may be: they would
    all be cut at max_new_tokens (turn_tokens in multi-turn runs), so the key to raise is named."""
    key = "turn_tokens" if data.agent is not None and config.agent.turn_tokens else "max_new_tokens"
    budget = config.agent.turn_tokens if key == "turn_tokens" else config.sampling.max_new_tokens
    for name in ("train_rows", "eval_rows"):
        rows = getattr(data, name)[:LENGTH_SAMPLE]
        column = next((c for c in REFERENCE_COLUMNS if any(r.get(c) is not None for r in rows)), None)
        texts = [str(r[column]) for r in rows if column and r.get(column) is not None]
        if not texts:
            continue
        lengths = sorted(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids)
        longer = sum(n > budget for n in lengths)
        if longer > len(lengths) / 2:
            log(f"{key}={budget} cuts most answers: {longer} of {len(lengths)} reference answers "
                f"('{column}' column of {source_of(config, name)}) are longer (median "
                f"{lengths[len(lengths) // 2]} tokens); raise {key}")


# pretrained models past this many parameters meet the demo's lr with a note
LR_NOTE_PARAMETERS = 20_000_000


def check_lr(config: TrainConfig, policy, log) -> None:
    """A note at start when the demo's default lr meets a model much larger than the demo's."""
    if config.optim.lr != OptimConfig.lr:
        return
    n = sum(p.numel() for p in policy.parameters())
    if n > LR_NOTE_PARAMETERS:
        lora = ", or 1e-5 for a LoRA adapter" if config.model.lora_r else ""
        log(f"lr={config.optim.lr:g} is the demo's default, for its tiny model trained from scratch; "
            f"this model has {n / 1e6:.0f}M parameters: a pretrained model wants about lr=1e-6"
            f"{lora} (docs/guides/troubleshooting.md)")


def check_selection(config: TrainConfig, log, agent: Agent | None = None) -> None:
    """A note at start when clip_cov's or kl_cov's share of the batch cannot select one token:
    floor(fraction * tokens) is 0 for every step whose batch holds fewer than 1 / fraction tokens,
    and the run would then be plain policy gradient while its name says otherwise. `agent`: the
    run's (Data.agent); from the config's keys where not given."""
    loss = config.loss
    if loss.loss_type not in COVARIANCE_LOSSES:
        return
    if loss.loss_type == "kl_cov" and config.optim.num_iterations == 1:
        log("kl_cov's term, kl_cov_coef * |log pi_theta - log pi_old|, is 0 while pi_theta = pi_old, "
            "so with num_iterations=1 (one update per batch) it never acts and the run is the plain "
            "policy gradient; set num_iterations=2 or more (docs/algorithms.md)")
    key = "clip_cov_fraction" if loss.loss_type == "clip_cov" else "kl_cov_fraction"
    fraction = getattr(loss, key)
    agent = agent if agent is not None else agent_of(config)
    if agent is not None:   # an episode's own tokens: at most max_turns turns of turn_tokens
        limits = agent.limits
        per_row = min(limits.max_turns * limits.turn_tokens, limits.episode_tokens)
        bound = f"episodes of at most {per_row} tokens of the policy's own"
    else:
        per_row = config.sampling.max_new_tokens
        bound = f"max_new_tokens={per_row}"
    most = config.sampling.prompts_per_step * config.sampling.group_size * per_row
    if fraction * most < 1:
        log(f"{key}={fraction:g} selects floor({fraction:g} x the step's tokens) tokens, and a step "
            f"here has at most {most} ({config.sampling.prompts_per_step} prompts x "
            f"{config.sampling.group_size} x {bound}): {loss.loss_type} will select none. The "
            f"paper's share is for batches of millions of tokens; raise {key} to at least "
            f"{1 / most:.2g} (docs/algorithms.md)")


def with_given(config: TrainConfig, given: dict, model=None, tokenizer=None) -> TrainConfig:
    """The config of a run given rows (`given`: config key -> a list of dicts or a
    datasets.Dataset) or a loaded model in Python: each key then records what was given (the
    rows' `given_label`, the model's own name), so config.yaml says what the run used. A key set
    to a file in the config and given rows too is an error: one of the two would be ignored."""
    import dataclasses
    data = {}
    for key, rows in given.items():
        if rows is None:
            continue
        if not isinstance(rows, (list, tuple)) and not hasattr(rows, "column_names"):
            given_rows(rows, key=key)          # the error that names what was given
        named = getattr(config.data, key)
        if named and not GIVEN.fullmatch(named):
            raise ConfigError(f"config key '{key}' is {named!r} and train({key}=...) gave rows too; "
                              f"give one of them (the rows: set {key}='' in the config)")
        data[key] = given_label(rows)
    if data:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, **data))
    if model is None and tokenizer is not None:
        raise ConfigError("train(tokenizer=...) is given without its model; give model=... too, "
                          "or neither (the config key 'model' then names both)")
    if model is not None:
        if tokenizer is None:
            raise ConfigError("train(model=...) needs its tokenizer too: train(config, model=model, "
                              "tokenizer=tokenizer)")
        name = str(getattr(model, "name_or_path", "") or "") or "(a model given to train())"
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, model=name))
    return config


def given_model(config: TrainConfig, model, tokenizer, log: Callable[[str], None] = to_stderr):
    """A model and tokenizer loaded by the caller, made ready as load_model_and_tokenizer makes
    its own, in place: train mode and no dropout, the tokenizer's padding on the left (EOS pads
    when it has no pad token), the config's chat template, checkpointing, mixed precision and
    LoRA. The model stays on the device the caller put it on."""
    from grpo.models import prepare_tokenizer, ready_for_training
    try:
        tokenizer = prepare_tokenizer(tokenizer, config.model.model, config.model.chat_template)
    except ModelError as e:
        raise ConfigError(str(e)) from None
    policy = ready_for_training(model)
    if vision.is_vision_model(policy) and not config.model.train_vision:
        vision.freeze_tower(policy)
    if config.optim.gradient_checkpointing:
        set_checkpointing(policy, True)
    if config.optim.mixed_precision == "bf16":
        policy.grpo_autocast = torch.bfloat16
    if config.model.lora_r > 0:
        policy = add_lora(policy, config)
    return policy, tokenizer
