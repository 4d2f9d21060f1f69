"""Where step t's groups come from, as the Plan says (`Plan.groups`):

    inline    the learner's sampler, from the weights after step t-1 (async_steps=0)
    workers   rollout workers forked from the trainer, from the weights after t-1-k
    client    an engine client, a thread of each trainer process (vLLM here or on servers, or
              grpo's own sampler with rollout_workers=0), from the weights after t-1-k
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from grpo.assembly.learner import make_sampler
from grpo.inputs import Data
from grpo.config import TrainConfig
from grpo.data import PromptStream
from grpo.pipeline import Groups, Work, split_threads
from grpo.pipeline.inline import InlineGroups, draw_groups, sample_scored_groups, score_rollout
from grpo.run import distributed, resume
from grpo.step import GroupSource, Learner


def group_source(c: TrainConfig, learner: Learner, tokenizer, data: Data, stream: PromptStream,
                 first: int, checkpoint: Path | None, world: distributed.World, log,
                 client_model=None, engine=None) -> GroupSource:
    """Where step t's groups come from, as the Plan says (Plan.groups): sampled inline by the
    learner's sampler, or the pipeline (rollout workers forked now, or an engine client)."""
    if learner.plan.groups == "inline":     # check_pipeline has refused a checkpoint with queued groups
        return InlineGroups(c, learner, tokenizer, data, stream)
    return start_pipeline(c, learner, tokenizer, data, stream, first, checkpoint, world, log,
                          client_model, engine)


def start_pipeline(c: TrainConfig, learner: Learner, tokenizer, data: Data, stream: PromptStream,
                   first: int, checkpoint: Path | None, world: distributed.World, log,
                   client_model=None, engine=None) -> Groups:
    """With async_steps = k > 0, where this trainer process's groups come from (pipeline/): an
    engine client (a thread) or forked rollout workers, which sample step t's groups from the
    weights after step t-1-k with step t's draws. With forked workers the machine's cores are
    split between the trainer and them (torch threads per role). `client_model`: the copy of the
    policy (unsharded) that the client loads each version into."""
    p = c.pipeline
    ahead = resume.pipeline_state(checkpoint, world)
    client = learner.plan.groups == "client"
    if client:   # a thread of this process beside evaluation: a fast tokenizer is not shared
        tokenizer = copy.deepcopy(tokenizer)   # between threads (Rust's "Already borrowed")
    workers = 0 if client else p.rollout_workers
    trainer_threads, worker_threads = split_threads(c.run.threads or torch.get_num_threads(), workers)
    trainer_threads, worker_threads = p.trainer_threads or trainer_threads, p.worker_threads or worker_threads
    torch.set_num_threads(trainer_threads)
    if workers:
        log(f"async_steps={p.async_steps}: {p.rollout_workers} rollout worker(s) with {worker_threads} "
            f"torch thread(s) each, the trainer with {trainer_threads}")

    def sample(sampler, stream, step, share):
        timer = {"sample": 0.0, "reward": 0.0}
        rollout, extra = sample_scored_groups(c, sampler, tokenizer, data, stream, timer, share, step)
        return rollout, extra, timer

    def draw(sampler, stream, step, share):   # without dynamic sampling, scoring can wait
        return draw_groups(c, sampler, tokenizer, stream, c.sampling.prompts_per_step, share, step,
                           agent=data.agent)

    work = Work(policy=learner.policy, rows=data.train_rows, seed=c.run.seed, steps=c.run.steps,
                k=p.async_steps, make_sampler=lambda model: make_sampler(c, model, tokenizer, data.agent),
                sample=sample, pad_token_id=tokenizer.pad_token_id, threads=worker_threads,
                timeout_s=p.transfer_timeout_s,
                draw=None if c.sampling.dynamic_sampling else draw,
                score=lambda rollout: score_rollout(c, rollout, data))
    pair = None
    if client:
        model = client_model if client_model is not None else copy.deepcopy(learner.policy)
        if world.size > 1:
            # the processes' clients meet in a group of their own, away from the trainers'
            # collectives: around each weight load of the servers they share, and in each round
            # of dynamic sampling
            import datetime

            import torch.distributed as dist
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=p.transfer_timeout_s))
            world = distributed.World(world.rank, world.size, group)
        sampler = make_sampler(c, model, tokenizer, data.agent, engine, sync=False,
                               world=world, log=log)
        where = getattr(getattr(sampler, "engine", None), "name", None) or "grpo's own sampler"
        log(f"async_steps={p.async_steps}: step t's groups are sampled on {where} from the weights "
            f"after step t-{1 + p.async_steps}, by a thread of this process")
        pair = (model, sampler, engine is None)
    return Groups(work, workers=workers, world=world, first=first,
                  stream_state=stream.state_dict(), queued=ahead["queued"] if ahead else None,
                  restarts=p.worker_restarts, log=log, client=pair)
