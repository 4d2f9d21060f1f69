"""A run's rows: the task's or the files' (`dataset`, `eval_dataset`), shuffled from the seed, with
the demonstrations a cold start imitates, the rewards and the agent, each read once and checked
as it is read; and the config of a run given rows or a model from Python (`with_given`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

from grpo.assembly.checks import check_code_tests, check_golds
from grpo.inputs import Data, load_agent
from grpo.assembly.rewards import choose_accuracy, choose_rewards, resolve_reward, reward_line
from grpo.config import VISION_DEMO, ConfigError, RunConfig, TrainConfig
from grpo.data import (GIVEN, Columns, DataError, demonstration_text, fingerprint, given_label,
                       given_rows, given_shape, load_rows, system_prompt_note)
from grpo.data.tasks import get_task
from grpo.rewards import RewardFn, math_accuracy, reward_name

TASK_EVAL_SIZE = 200   # held-out rows of a built-in task scored when eval_size is unset (0)


def with_given(config: TrainConfig, given: dict, model=None, tokenizer=None,
               call: str = "train") -> TrainConfig:
    """The config of a run given rows (`given`: config key -> a list of dicts or a
    datasets.Dataset) or a loaded model in Python, by `call` (train or evaluate): each key then
    records what was given (the rows' `given_label`, the model's own name and dtype), so
    config.yaml says what the run used. A key set to a file in the config and given rows too is
    an error: one of the two would be ignored."""
    import dataclasses
    data = {}
    for key, rows in given.items():
        if rows is None:
            continue
        given_shape(rows, key, call)     # the error that names what was given
        named = getattr(config.data, key)
        if named and not GIVEN.fullmatch(named):
            raise ConfigError(f"config key '{key}' is {named!r} and {call}({key}=...) gave rows "
                              f"too; give one of them (the rows: set {key}='' in the config)")
        data[key] = given_label(rows)
    if data:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, **data))
    if "dataset" in data and "sft_steps" not in config.set_keys and \
            config.run.sft_steps in (RunConfig.sft_steps, VISION_DEMO["sft_steps"]):
        # as dataset=FILE implies (config.implied_keys): the demo's cold start is a built-in task's
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, sft_steps=0))
    if model is None and tokenizer is not None:
        raise ConfigError(f"{call}(tokenizer=...) is given without its model; give model=... too, "
                          "or neither (the config key 'model' then names both)")
    if model is not None:
        if tokenizer is None:
            raise ConfigError(f"{call}(model=...) needs its tokenizer too: {call}(..., model=model, "
                              "tokenizer=tokenizer)")
        name = str(getattr(model, "name_or_path", "") or "") or f"(a model given to {call}())"
        dtype = weights_dtype(model, config.model.dtype)
        if config.optim.mixed_precision != "no" and dtype != "float32":
            raise ConfigError(f"config key 'mixed_precision': {config.optim.mixed_precision} keeps "
                              f"float32 weights and computes in bfloat16, and the model given to "
                              f"{call}() holds {dtype} weights; give it model.float()")
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, model=name,
                                                                       dtype=dtype))
    return config


def weights_dtype(model, default: str) -> str:
    """The dtype a model given in Python holds its weights in: that of most of its floating-point
    weights, frozen ones too (a LoRA adapter's base; the `dtype` key applies to models grpo
    loads), so config.yaml records what ran and what final/ loads back in."""
    counts: dict[str, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            name = str(p.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + p.numel()
    return max(counts, key=counts.get) if counts else default


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
              held_out_only: bool = False, eval_fns: list[RewardFn] | None = None) -> Data:
    """Rows, reward functions and demonstrations from the task or the dataset file, and the
    held-out rows from `eval_dataset` whenever it is set. Golds are checked at load for GRPO;
    cold-start-only use (`grpo sft`) needs none. `log` gets the rewards the run uses. `given`
    holds rows given to train() in Python, by key (`dataset`, `eval_dataset`; with_given).
    `held_out_only` (`grpo eval`): the training rows are neither read nor made (train_rows and
    demonstrations empty), so a run whose training file is gone is still evaluated. `eval_fns`:
    reward functions given to grpo.train.evaluate, in place of `eval_rewards`.
    Longer than about 60 lines: the order a run's rows, rewards, golds and agent are read in, said
    once."""
    d = config.data
    columns = Columns(d.prompt_column, d.answer_column, d.tests_column, d.entry_point_column,
                      d.image_column)
    task, fingerprints = None, {}
    if held_out_only:
        train_rows, demonstrations = [], []
        task = get_task(d.task, d.task_args) if not d.dataset else None
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
        task = get_task(d.task, d.task_args)
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
    given_fns = list(eval_fns or [])
    eval_fns = given_fns or [resolve_reward(name, config) for name in config.eval.eval_rewards]
    accuracy_fn, accuracy_source = choose_accuracy(config, reward_fns, task, env_name, eval_fns)
    if given_fns:
        accuracy_source = f"{reward_name(given_fns[0])} (given to evaluate())"
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
                eval_fns=eval_fns, fingerprints=fingerprints,
                curriculum=task if getattr(task, "threshold", 0) else None)
    if log is not None:
        say_system_prompt(config, data, log)
        log(reward_line(data))
        if (cut := eval_cut_line(config, data)) is not None:
            log(cut)
    return data


def say_system_prompt(config: TrainConfig, data: Data, log: Callable[[str], None]) -> None:
    """Rows whose own system message stands for `system_prompt`, said (data.system_prompt_note)."""
    d = config.data
    for path, rows in ((d.dataset, data.train_rows), (d.eval_dataset, data.eval_rows)):
        if path and (note := system_prompt_note(d.system_prompt, rows, path)):
            log(note)


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
    if path.startswith("("):      # rows given from Python: "(N rows given in Python)"
        return f"{key}: {path}"
    return f"{key}: reading {path} (split {split}) from the hub or its cache"
