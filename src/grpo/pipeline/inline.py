"""The groups of a step sampled inline (async_steps = 0): the learner's own engine samples step t's
groups from the weights after step t-1, and they are scored at once. The synchronous loop is this
group source; the asynchronous pipeline (groups.py) is the other.

    InlineGroups           the GroupSource of step.grpo_step
    sample_scored_groups   prompts_per_step groups, sampled and scored (dynamic sampling refills)
    draw_groups            this process's share of n groups, with the draws of (seed, step, round)
    score_rollout          the reward functions' weighted sum, the environment's reward, shaping

Rollout workers sample with the same functions (assembly/groups.start_pipeline passes them), so a
group is the same whichever process samples it.
"""

from __future__ import annotations

import math
import time

import torch

from grpo import inputs
from grpo.algorithm.advantages import groups_with_contrast
from grpo.algorithm.shaping import overlong_penalty
from grpo.config import TrainConfig
from grpo.data import PromptStream, columns_of
from grpo.rewards import faults, score
from grpo.rollout import Rollout, concat
from grpo.run import distributed
from grpo.sampling import Sampler
from grpo.step import Learner, Taken


class InlineGroups:
    """Step t's groups sampled by the learner's engine from the weights it holds (after step
    t-1) and scored, in this process."""
    colocated = True

    def __init__(self, c: TrainConfig, learner: Learner, tokenizer, data: inputs.Data,
                 stream: PromptStream):
        self.c, self.learner, self.tokenizer, self.data, self.stream = c, learner, tokenizer, data, stream

    def take(self, step: int) -> Taken:
        timer = {"sample": 0.0, "reward": 0.0}
        with distributed.full_parameters(self.learner.policy), faults.counting() as counts:
            rollout, extra = sample_scored_groups(self.c, self.learner.sampler, self.tokenizer, self.data,
                                                  self.stream, timer, self.learner.world, step)
        return Taken(rollout, extra, timer["sample"], timer["reward"], counts.metrics())

    def send_weights(self, step: int, policy) -> None:
        return None   # the learner's engine samples from the policy itself (or was synced)


def sample_scored_groups(c: TrainConfig, sampler: Sampler, tokenizer, data: inputs.Data,
                         stream: PromptStream, timer: dict | None = None,
                         world: distributed.World = distributed.World(),
                         step: int = 0) -> tuple[Rollout, dict]:
    """Sample and score `prompts_per_step` groups. With dynamic sampling (DAPO), groups whose
    rewards are all equal are dropped and more prompts are sampled, at most `max_sampling_rounds`
    extra times; if none has contrast, the last round is kept (its advantages are all 0).
    `sampling/dropped_groups` counts the groups without contrast, whatever the number of processes.
    With several processes each samples and scores its part of a round, and every process
    filters the gathered round, so all keep the same groups and sample the same refills; the
    kept groups are then shared out (`everyones_round`, `my_share`), and the gathers timed apart
    from the rewards (`time/gather_s`)."""
    G, wanted = c.sampling.group_size, c.sampling.prompts_per_step
    together = c.sampling.dynamic_sampling and world.size > 1
    kept: list[Rollout] = []
    have, dropped, rounds, gather_s = 0, 0, 0, 0.0
    while True:
        t0 = time.perf_counter()
        part = draw_groups(c, sampler, tokenizer, stream, wanted - have, world, step, rounds,
                           agent=data.agent)
        t1 = time.perf_counter()
        if part is not None:
            score_rollout(c, part, data)
        t2 = time.perf_counter()
        if together:   # its own time: the wait for the slowest process and the transfer
            part = everyones_round(part, world, tokenizer.pad_token_id)
            gather_s += time.perf_counter() - t2
        if timer is not None:
            timer["sample"] += t1 - t0
            timer["reward"] += t2 - t1
        if not c.sampling.dynamic_sampling:
            return part, {}
        contrast = set(groups_with_contrast(part.rewards, part.group_ids))
        dropped += len(part) // G - len(contrast)
        if contrast:
            kept.append(part.rows([i for i, g in enumerate(part.group_ids.tolist()) if g in contrast]))
            have += len(contrast)
        if have >= wanted or rounds >= c.sampling.max_sampling_rounds:
            break
        rounds += 1
    rollout = concat(kept, tokenizer.pad_token_id) if kept else part
    extra = {"sampling/dropped_groups": dropped, "sampling/extra_rounds": rounds}
    if together:   # groups with contrast left out of the step are not dropped ones: counted apart
        rollout, extra["sampling/unshared_groups"] = my_share(rollout, world, G)
        extra["time/gather_s"] = gather_s
    return rollout, extra


def everyones_round(part: Rollout | None, world: distributed.World, pad_token_id: int) -> Rollout:
    """Every process's scored part of a round of dynamic sampling, in rank order (the order one
    process would have sampled them in), on every process, on this process's device."""
    device = part.completion_ids.device if part is not None else torch.device("cpu")
    parts = distributed.gather_objects(part.to("cpu") if part is not None else None, world)
    return concat([p for p in parts if p is not None], pad_token_id).to(device)


def my_share(rollout: Rollout, world: distributed.World, G: int) -> tuple[Rollout, int]:
    """This process's contiguous share of the kept groups (every process holds them all), and how
    many groups were left out so that the processes' shares are equal: only when the rounds ran
    out with a number of kept groups the number of processes does not divide."""
    groups = len(rollout) // G
    unshared = groups % world.size
    rows = (groups - unshared) * G
    return rollout.rows(world.rows(rows)), unshared


def draw_groups(c: TrainConfig, sampler, tokenizer, stream: PromptStream, n: int,
                world: distributed.World = distributed.World(), step: int = 0,
                rounds: int = 0, *, agent: inputs.Agent | None = None) -> Rollout | None:
    """This process's share of `n` groups, sampled (not scored) with the draws of (seed, step,
    round); None when a refill of dynamic sampling leaves this process no group. `agent`: the
    run's tools and environment, which the prompts describe."""
    G = c.sampling.group_size
    rows = stream.next_batch(n)
    # The draws for every row of the whole batch, from (seed, step, round): a completion is the
    # same whichever process samples it, so N processes reproduce one.
    draws = torch.Generator().manual_seed(hash((c.run.seed, step, rounds)) & 0x7FFFFFFF)
    uniforms = torch.rand(len(rows) * G, sampler.max_new_tokens, generator=draws)
    mine = world.part(len(rows))   # whole groups; uneven only in a refill of dynamic sampling
    rows, uniforms = rows[mine], uniforms[mine.start * G:mine.stop * G]
    if not rows:
        return None
    part = sampler.sample(inputs.prompt_texts(c, tokenizer, rows, agent), G, uniforms=uniforms, rows=rows)
    part.columns = columns_of(rows, G)
    return part


def score_rollout(c: TrainConfig, rollout: Rollout, data: inputs.Data) -> None:
    """Weighted sum of the reward functions (plus DAPO's overlong penalty); an unscorable row
    (`unscorable`: any or all of its functions returned None) becomes NaN."""
    totals, rollout.rewards_per_fn = score(data.reward_fns, data.reward_weights, rollout.prompts,
                                           rollout.completions, rollout.columns,
                                           on_error=c.reward.reward_on_error,
                                           unscorable=c.reward.unscorable)
    if rollout.episodes and data.agent is not None and data.agent.make_env is not None:
        # the environment's own episode reward is one more component (0 when it gave none)
        env = [0.0 if r is None else r for r in rollout.episodes.env_reward]
        rollout.rewards_per_fn["environment"] = env
        totals = [None if t is None else t + r for t, r in zip(totals, env)]
    if c.loss.overlong_buffer > 0:
        # An episode's budget counts every token after the prompt, the environment's too, so its
        # length does: an episode cut at episode_tokens gets the full penalty.
        budget = data.agent.limits.episode_tokens if data.agent else c.sampling.max_new_tokens
        penalty = overlong_penalty(rollout.real_mask.sum(-1).tolist(), budget,
                                   round(c.loss.overlong_buffer * budget), c.loss.overlong_penalty)
        rollout.rewards_per_fn["overlong"] = penalty
        totals = [None if t is None else t + p for t, p in zip(totals, penalty)]
    rollout.rewards = torch.tensor([math.nan if r is None else r for r in totals])

