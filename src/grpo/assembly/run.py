"""`assemble(config) -> Run`: a run put together from its config, complete when returned.

    config ──▶ with_given ──▶ checks on the config (choices, processes, trackers, engine, push)
           ──▶ checkpoint? (resume=; queued groups need async_steps) ──▶ finished: Finished
           ──▶ data, rewards, agent ──▶ model and tokenizer ──▶ checks on data and model
               (async_steps off CUDA, images, prompt lengths, lr, precision, selection, batch, rewards
               on one row)
           ──▶ the policy GRPO starts from (resumed weights, or the cold start)
           ──▶ learner (reference, sampler, optimizer) ──▶ resumed state ──▶ group source
               (Plan.groups: inline, forked rollout workers, or an engine client)

`train.py` runs the loop on the `Run` this returns; `grpo explain` builds its own from the same
parts (make_learner, cold_start).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grpo.assembly.checks import (check_batch, check_choices, check_engine, check_images, check_lr,
                                  check_pipeline, check_push, check_rewards, check_selection,
                                  check_world, fit_prompts, note_unused_server)
from grpo.assembly.data import load_data, say_system_prompt, with_given
from grpo.assembly.groups import group_source
from grpo.assembly.learner import make_learner, make_sampler, resume_or_cold_start
from grpo.assembly.model import check_precision, given_model, load_model_and_tokenizer, seed_everything
from grpo.inputs import Data, source_of
from grpo.config import ConfigError, TrainConfig
from grpo.config.plan import plan_of
from grpo.data import PromptStream, check_messages_templated
from grpo.pipeline import Groups
from grpo.rewards import RewardFn
from grpo.run import distributed, resume
from grpo.run.tracking import check_trackers
from grpo.step import GroupSource, Learner


@dataclass(frozen=True)
class Finished:
    """A run resumed at its last step (`resume` on a run at `steps`): nothing to train."""
    config: TrainConfig
    log: Callable[[str], None]
    checkpoint: Path


@dataclass(frozen=True)
class Run:
    """What the loop needs, assembled and complete: every field is set when `assemble` returns."""
    config: TrainConfig                  # with the rows and model given from Python (with_given)
    world: distributed.World
    log: Callable[[str], None]           # quiet on every rank but 0
    write_files: bool                    # rank 0's, unless the caller asked for no files
    checkpoint: Path | None              # the one resumed from
    data: Data                           # rows, rewards and the agent (tools, environment)
    tokenizer: object
    learner: Learner                     # policy, reference, sampler, optimizer, the Plan
    stream: PromptStream                 # the prompts' order, resumed
    source: GroupSource                  # where each step's groups come from (Plan.groups)
    first: int                           # the first step to take
    accuracy: float                      # the last held-out accuracy (a resumed run's; else NaN)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.output_dir)

    @property
    def groups(self) -> Groups | None:
        """The pipeline, when the groups are not sampled inline (async_steps > 0)."""
        return None if self.learner.plan.groups == "inline" else self.source

    @property
    def kept(self) -> int:
        """The last step whose records stay: none from step 0, whose evaluation is written again."""
        return self.first - 1 if self.checkpoint is not None else -1


def assemble(config: TrainConfig, *, reward_fns: list[RewardFn] | None = None,
             tools: list[Callable] | None = None, environment: Callable[[], object] | None = None,
             dataset=None, eval_dataset=None, model=None, tokenizer=None, engine=None,
             log: Callable[[str], None] = print, write_files: bool = True) -> Run | Finished:
    """The run `train` takes, every check said before any work (the arguments are train's), in
    the order of checks.py's docstring; last, the group source (with async_steps, rollout workers
    forked now, before any thread of the run starts)."""
    given = {"dataset": dataset, "eval_dataset": eval_dataset}
    c = with_given(config, given, model, tokenizer)
    if c.run.threads:
        torch.set_num_threads(c.run.threads)
    check_push(c)
    world = distributed.setup()
    seed_everything(c.run.seed)
    check_choices(c)
    check_world(c, world)
    check_trackers(c.run.report_to)
    check_engine(c, engine)
    write_files = write_files and world.is_main   # only rank 0 writes; the others stay quiet
    if not world.is_main:
        log = lambda line: None  # noqa: E731
    note_unused_server(c, log)
    run_dir = Path(c.run.output_dir)
    checkpoint = resume.find(c, log) if write_files or c.run.resume else None
    if c.run.resume:
        resume.found_everywhere(checkpoint, world)
    check_pipeline(c, checkpoint)
    if checkpoint is not None and resume.finished(checkpoint, c.run.steps, run_dir):
        return Finished(c, log, checkpoint)
    data = load_data(c, reward_fns, tools=tools, environment=environment, log=log, given=given)
    if checkpoint is not None:
        resume.check_data(checkpoint, data.fingerprints, log)
    if model is not None:
        policy, tokenizer = given_model(c, model, tokenizer, log)
    else:
        policy, tokenizer = load_model_and_tokenizer(c, run_dir if write_files else None, log, world)
    distributed.broadcast_parameters(policy, world)
    check_pipeline(c, None, policy)
    check_images(c, tokenizer, data)
    fit_prompts(c, tokenizer, getattr(policy.config, "max_position_embeddings", None), data, log)
    check_lr(c, policy, log)
    check_precision(c, policy, log, given=model is not None)
    check_selection(c, log, data.agent)
    check_batch(c, data, log)
    check_rewards(c, tokenizer, data)
    policy = resume_or_cold_start(c, policy, tokenizer, data, checkpoint, log,
                                  run_dir if write_files else None, world)
    client_model = None
    if plan_of(c).groups == "client":   # unsharded, and on the CPU when an engine holds the weights
        client_model = copy.deepcopy(policy)
        if c.sampling.sampler != "hf" or engine is not None:
            client_model.to("cpu")
    learner = make_learner(c, policy, tokenizer, data.agent, world, resume.reference_state(checkpoint),
                           engine, log=log)
    if c.run.parallel == "fsdp" and not distributed.initialized():
        log("parallel=fsdp shards only under torchrun; this one process trains the whole model")
    stream = prompt_stream(c, data)
    first, accuracy = 1, math.nan
    if checkpoint is not None:
        state = resume.restore(learner, stream, checkpoint)    # a curriculum's level too
        first, accuracy = state["step"] + 1, state["accuracy"]
        log(f"resuming from {checkpoint} at step {first}/{c.run.steps}")
    source = group_source(c, learner, tokenizer, data, stream, first, checkpoint, world, log,
                          client_model, engine)
    return Run(c, world, log, write_files, checkpoint, data, tokenizer, learner, stream, source,
               first, accuracy)


# The commands that load a model and do not train: which rows each reads, and whether it samples
# (then the engine is checked and the prompts fitted to the model's context, as training does).
COMMANDS = {   # command -> (rows, samples)
    "eval": ("held_out", True),       # the held-out rows only: a run whose training file is gone
    "explain": ("all", True),
    "sft": ("demonstrations", False),   # golds unchecked: the cold start reads no answers
}


@dataclass(frozen=True)
class Loaded:
    """A command's rows and model, assembled as a run's are."""
    config: TrainConfig
    data: Data
    policy: object
    tokenizer: object


def prompt_stream(c: TrainConfig, data: Data) -> PromptStream:
    """The training rows in the order a run takes them. With a curriculum, the rows of its level,
    which the stream's checkpointed state carries: a change of level (train.raise_level, or a
    resumed checkpoint's) makes the training rows and the held-out rows the new level's."""
    cur = data.curriculum
    if cur is None:
        return PromptStream(data.train_rows, c.run.seed)

    def rows_at(level: int) -> list[dict]:
        data.eval_rows = cur.eval_rows(level)[:len(data.eval_rows)]
        return cur.train_rows(c.run.seed, level)
    return PromptStream(data.train_rows, c.run.seed, rows_at=rows_at, level=cur.level)


def assemble_command(command: str, config: TrainConfig, *, run_dir: Path | None = None,
                     said: Callable[[str], None] | None = None,
                     log: Callable[[str], None] = print, given: dict | None = None,
                     model=None, tokenizer=None, eval_fns: list[RewardFn] | None = None) -> Loaded:
    """The rows and model of `grpo eval`, `explain` or `sft` (COMMANDS), with training's checks
    in training's order (checks.py): the config's choices and engine before any load, images
    and prompt lengths once the model is loaded. `said` gets what is told while the rows load
    (eval shows it once the model has loaded, so that an error then is one line alone);
    `run_dir` is where a tiny model is built (None: a temporary directory). `given`, `model`
    and `tokenizer`: rows and a model given in Python, as train() takes them (with_given);
    `eval_fns`: reward functions given to grpo.train.evaluate."""
    rows, samples = COMMANDS[command]
    given = given or {}
    config = with_given(config, given, model, tokenizer, call="evaluate" if given or model else "train")
    seed_everything(config.run.seed)
    check_choices(config)
    if samples:
        check_engine(config)
    data = load_data(config, log=said, check_golds_now=command != "sft",
                     held_out_only=rows == "held_out", given=given, eval_fns=eval_fns)
    if rows == "held_out" and not data.eval_rows:
        raise ConfigError("nothing to evaluate: set eval_dataset=FILE or use a built-in task")
    if said is None:        # load_data said it where it had a log
        say_system_prompt(config, data, log)
    if model is not None:
        policy, tokenizer = given_model(config, model, tokenizer, log)
    else:
        policy, tokenizer = load_model_and_tokenizer(config, run_dir)
    check_images(config, tokenizer, data)
    if samples:
        fit_prompts(config, tokenizer, getattr(policy.config, "max_position_embeddings", None), data,
                    log)
    else:       # the cold start trains: its rows need their template, its rate must move weights
        check_messages_templated(tokenizer, data.train_rows, config.model.chat_template,
                                 source_of(config, "train_rows"))
        check_precision(config, policy, log, given=model is not None, keys=("sft_lr",))
    return Loaded(config, data, policy, tokenizer)


@dataclass(frozen=True)
class Evaluation:
    """What `grpo eval` needs, assembled: the held-out rows, the model and the sampler that
    training's evaluation would use (the same keys honoured: sampler=vllm samples on vLLM)."""
    loaded: Loaded
    sampler: object


def assemble_evaluation(config: TrainConfig, said: Callable[[str], None],
                        log: Callable[[str], None], **given_in_python) -> Evaluation:
    """`grpo eval`'s rows, model (assemble_command) and the sampler training evaluates with;
    `given_in_python`: assemble_command's `given`, `model`, `tokenizer`, `eval_fns`
    (grpo.train.evaluate)."""
    loaded = assemble_command("eval", config, said=said, log=log, **given_in_python)
    return Evaluation(loaded, make_sampler(loaded.config, loaded.policy, loaded.tokenizer,
                                           loaded.data.agent, log=log))
