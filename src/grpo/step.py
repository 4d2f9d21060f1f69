"""One GRPO step, as named stages: Algorithm 1's inner loop (DeepSeekMath, arXiv:2402.03300).

    take_groups          1-2. G completions for each prompt, scored    (a GroupSource)
    fixed_logprobs            pi_old and pi_ref, fixed for the step's updates
    rewards_to_advantages  3. advantages (and the off-policy correction, the selected tokens)
    update_policy          4. mu clipped updates against pi_old and pi_ref    (update.py)
    send_weights              the new weights to the engines that sample the next groups

`grpo_step` runs them in that order, and is the only place they run: `train()` calls it once per
step, and `grpo explain` calls it with an Observer that records every intermediate number, so what
explain shows is what training does.

Where the groups come from is a GroupSource: inline (pipeline/inline.py: the learner's own engine
samples the groups of step t from the weights after step t-1) or the asynchronous pipeline
(pipeline/groups.py: rollout workers sample them from the weights after step t-1-k). The step
itself does not know which, but for what the source says of itself: whether the learner's engine
sampled (`colocated`), so it sleeps during the update and takes the new weights after it.

Departures, on purpose: with mu = 1 the old log-probs equal the current ones, so no extra forward
pass computes them (the ratio is 1 and the gradient is the same); `beta = 0` loads no reference.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from grpo.algorithm.advantages import (ADVANTAGES, TOKEN_RETURNS, batch_token_normalized,
                                       distillation_advantages, process_supervision, token_returns)
from grpo.algorithm.corrections import CORRECTIONS
from grpo.algorithm.loss import (COVARIANCE_LOSSES, LossSettings, aggregation_weights, clip_cov_tokens,
                                 kl_cov_tokens, kl_penalized_rewards, token_covariance, token_kl)
from grpo.config import TrainConfig
from grpo.config.plan import Plan
from grpo.rollout import Rollout
from grpo.run import distributed
from grpo.run.metrics import everyones_faults, everyones_rows, step_metrics
from grpo.sampling import Sampler
from grpo.update import accumulate_gradients, logprobs_of, optimizer_step


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what to change."""


@dataclass
class Taken:
    """The groups of one step as a GroupSource hands them over: scored, with their metrics (such
    as dynamic sampling's), the seconds spent sampling and scoring them, and the counts of why
    built-in rewards scored 0 (or none) in scoring them (faults.py), wherever they were scored."""
    rollout: Rollout
    extra: dict
    sample_s: float
    reward_s: float
    faults: dict


class GroupSource(Protocol):
    """Where a step's groups come from."""
    colocated: bool   # the learner's own engine samples them (it sleeps while the policy updates)

    def take(self, step: int) -> Taken:
        """The scored groups of `step`."""

    def send_weights(self, step: int, policy) -> float | None:
        """The weights after `step` to whoever samples the next groups; the seconds it took, or
        None where there is no one to send them to (inline: the learner's engine has them)."""


class Observer:
    """Sees a step's stages as they happen (grpo explain records every number); does nothing here."""

    def groups(self, rollout: Rollout) -> None:
        """After stages 1-2: the sampled, scored groups."""

    def fixed(self, rollout: Rollout) -> None:
        """After pi_old and pi_ref are fixed (rollout.old_logprobs is None where mu = 1 and no
        correction reads it: the update's own log-probs, detached, stand for it)."""

    def advantages(self, rollout: Rollout, is_weights: torch.Tensor | None,
                   selected: torch.Tensor | None) -> None:
        """After stage 3."""

    def before_update(self, iteration: int, rollout: Rollout, selected: torch.Tensor | None) -> None:
        """Before update `iteration` (from 0) of stage 4, with the tokens it selects."""

    def after_update(self, iteration: int, stats: dict, stepped: bool) -> None:
        """After it: its loss, gradient norm and statistics, and whether the optimizer stepped."""


@dataclass
class Learner:
    """What a GRPO step changes or reads: the policy, its frozen reference, sampler and optimizer."""
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    plan: Plan                   # config.plan_of(config), decided at start (make_learner)
    skipped_in_a_row: int = 0    # updates skipped for a non-finite loss or gradient, consecutive
    skipped_total: int = 0
    world: distributed.World = distributed.World()   # this process's rank among `size`
    step: int = 0                # the GRPO step being taken (it seeds the sampling draws)
    teacher: torch.nn.Module | None = None   # on-policy distillation's teacher (`teacher`), frozen


def grpo_step(c: TrainConfig, learner: Learner, source: GroupSource, agent=None,
              observer: Observer | None = None) -> tuple[Rollout, dict]:
    """One GRPO step: the stages above, in order; the step's rollout and its metrics. `agent`:
    the run's tools and environment (turn_rewards gives each turn its own advantage)."""
    watch = observer or Observer()
    t0 = time.perf_counter()
    taken = take_groups(learner, source)                                     # 1-2
    rollout, extra = taken.rollout, taken.extra
    watch.groups(rollout)
    t1 = time.perf_counter()
    fixed_logprobs(c, learner, rollout)                                      # pi_old, pi_ref
    watch.fixed(rollout)
    t2 = time.perf_counter()
    is_weights, selected = rewards_to_advantages(c, learner, rollout, agent, extra)   # 3
    watch.advantages(rollout, is_weights, selected)
    t3 = time.perf_counter()
    if source.colocated:
        learner.sampler.sleep()          # vLLM frees its memory for the update ...
    t_update = time.perf_counter()
    updates = update_policy(c, learner, rollout, is_weights, selected, observer)   # 4
    t_updated = time.perf_counter()
    if source.colocated:
        learner.sampler.sync(learner.policy)   # ... and samples from the new weights next step
    t4 = time.perf_counter()
    if source.colocated:                 # the engine's sleep and weight load, not the update's
        extra["time/sync_s"] = (t_update - t3) + (t4 - t_updated)
    with distributed.full_parameters(learner.policy) if not source.colocated else nullcontext():
        sent_s = source.send_weights(learner.step, learner.policy)
    if sent_s is not None:
        extra["pipeline/publish_s"] = sent_s
    lr = learner.scheduler.get_last_lr()[0]
    learner.scheduler.step()  # once per GRPO step: warmup and decay count steps, not updates
    t5 = time.perf_counter()
    metrics = step_metrics(everyones_rows(rollout, learner.world), updates, sample_s=taken.sample_s,
                           reward_s=taken.reward_s, reference_s=t2 - t1, advantage_s=t3 - t2,
                           update_s=t_updated - t_update, step_s=t5 - t0)
    metrics.update(extra, lr=lr)
    metrics.update(everyones_faults(learner.world, taken.faults))   # why built-in rewards scored 0
    metrics["update/skipped_steps"] = learner.skipped_total
    return rollout, metrics


def take_groups(learner: Learner, source: GroupSource) -> Taken:
    """Stages 1-2: the step's scored groups from the source, with how stale they are where they
    were sampled from older weights (rollout.versions)."""
    taken = source.take(learner.step)
    if taken.rollout.versions is not None:
        taken.extra.update(staleness(taken.rollout, learner.step))
    return taken


def rewards_to_advantages(c: TrainConfig, learner: Learner, rollout: Rollout, agent,
                          extra: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Stage 3: the tokens in the loss (mask_truncated), the advantages (set_advantages), the
    off-policy correction's weights and the covariance losses' selected tokens; their metrics
    go into `extra`."""
    if c.loss.mask_truncated:
        rollout.loss_mask = rollout.completion_mask * (~rollout.truncated).long().unsqueeze(-1)
    extra.update(set_advantages(c, rollout, agent, learner.world, learner.plan))
    is_weights = None
    if (correction := learner.plan.correction) is not None:
        is_weights, correction_stats = off_policy_weights(rollout, *correction)
        extra.update(correction_stats)
    elif (learner.plan.pi_old == "recomputed" and rollout.old_logprobs is not None
          and rollout.sampler_logprobs is not None):   # else the first update measures it
        mask = rollout.completion_mask.bool()
        gap = (rollout.old_logprobs - rollout.sampler_logprobs).abs()[mask]
        extra["sampler/logp_diff"] = gap.mean().item() if gap.numel() else 0.0
    selected = None
    if c.loss.loss_type in COVARIANCE_LOSSES:
        selected, selection_stats = covariance_selection(c, rollout, learner.world, learner.step)
        extra.update(selection_stats)
    return is_weights, selected


def set_advantages(c: TrainConfig, rollout: Rollout, agent, world: distributed.World, plan: Plan) -> dict:
    """Step 3: the rewards (with the KL in them where Plan.kl_in is reward) -> rollout.advantages, [N] or
    [N, T]; returns the step's metrics of it. Batch statistics (reinforce_pp_batch_norm) are over
    every process's tokens."""
    extra: dict = {}
    rewards = rollout.rewards
    per_token = c.loss.advantage in TOKEN_RETURNS
    kl = None
    if plan.kl_in == "reward":
        if per_token:   # REINFORCE++: each token's KL is a reward at that token
            kl = token_kl(rollout.old_logprobs, rollout.ref_logprobs, rollout.tokens_in_loss,
                          c.loss.kl_estimator)
            penalty = c.loss.beta * kl.sum(-1)
        else:
            rewards = kl_penalized_rewards(rewards, rollout.old_logprobs, rollout.ref_logprobs,
                                           rollout.completion_mask, c.loss.beta, c.loss.kl_estimator)
            penalty = rollout.rewards - rewards
        scorable = ~torch.isnan(rollout.rewards)     # the mean over every process's scored rows
        sums = distributed.sum_values({"sum": float(penalty[scorable].sum()),
                                       "n": float(scorable.sum())}, world)
        extra["kl_reward/mean"] = sums["sum"] / sums["n"] if sums["n"] else math.nan
    if agent is not None and agent.turn_rewards:
        rollout.advantages = turn_advantages(rollout, rewards, c.loss.advantage_eps)
    elif per_token:
        outcome = ADVANTAGES[c.loss.advantage](rewards, rollout.group_ids, c.loss.advantage_eps)
        scored = rollout.scored_tokens
        returns = token_returns(outcome, kl, c.loss.beta, scored)
        if c.loss.reinforce_pp_batch_norm:
            returns = batch_token_normalized(returns, scored, c.loss.advantage_eps,
                                             lambda sums: distributed.sum_values(sums, world))
        rollout.advantages = returns.float()
    else:
        rollout.advantages = ADVANTAGES[c.loss.advantage](rewards, rollout.group_ids,
                                                          c.loss.advantage_eps)
    if rollout.teacher_logprobs is not None:
        extra.update(add_distillation(c, rollout, world))
    return extra


def add_distillation(c: TrainConfig, rollout: Rollout, world: distributed.World) -> dict:
    """On-policy distillation: each token's advantage distill_coef * -(log pi - log teacher), the
    reverse KL's per-token estimate at the sampled token, with log pi the policy's that sampled it:
    pi_old, recomputed by a pass made as the teacher's is (plan_of), so a teacher equal to the
    policy gives exactly 0; with async_steps and proximal=behaviour, the sampler's. Added to the
    GRPO advantage, or alone (distill=alone). Tokens outside the loss (an environment's, padding) get 0. Its metrics are
    means over every process's tokens in the loss."""
    student = rollout.old_logprobs if rollout.old_logprobs is not None else rollout.sampler_logprobs
    mask = rollout.tokens_in_loss.float()
    gap = (student.float() - rollout.teacher_logprobs.float()) * mask
    per_token = distillation_advantages(student, rollout.teacher_logprobs, mask, c.loss.distill_coef)
    if c.loss.distill == "alone":
        rollout.advantages = per_token
    else:
        outcome = rollout.advantages if rollout.advantages.dim() == 2 else rollout.advantages.unsqueeze(-1)
        rollout.advantages = (outcome + per_token).float()
    sums = distributed.sum_values({"kl": float(gap.sum()), "n": float(mask.sum())}, world)
    return {"distill/reverse_kl": sums["kl"] / sums["n"] if sums["n"] else math.nan}


def covariance_selection(c: TrainConfig, rollout: Rollout, world: distributed.World,
                         step: int) -> tuple[torch.Tensor, dict]:
    """Clip-Cov's or KL-Cov's tokens among this process's rows, [N, T] bool, chosen over the
    whole batch: every process gathers every process's log-probs, advantages and masks, so the
    means, the ranking and Clip-Cov's draw (from the seed and the step) are those of one process.
    The log-probs are pi_old's, the policy that the step's first update starts from. Counted
    tokens: the policy's own (no environment tokens) in rows that could be scored."""
    T = rollout.completion_ids.shape[1]
    adv = rollout.advantages if rollout.advantages.dim() == 2 else rollout.advantages.unsqueeze(-1)
    mask = rollout.scored_tokens
    logp = distributed.gather_rows(rollout.old_logprobs.float(), world)
    adv = distributed.gather_rows(adv.expand(-1, T).float().contiguous(), world)
    mask = distributed.gather_rows(mask, world)
    cov = token_covariance(logp, adv, mask)
    if c.loss.loss_type == "clip_cov":
        draws = torch.Generator().manual_seed(hash((c.run.seed, step, 2505)) & 0x7FFFFFFF)
        chosen = clip_cov_tokens(cov, mask, c.loss.clip_cov_fraction, c.loss.clip_cov_low,
                                 c.loss.clip_cov_high, draws)
    else:
        chosen = kl_cov_tokens(cov, mask, c.loss.kl_cov_fraction)
    n = max(int(mask.sum()), 1)
    stats = {"cov/selected_frac": int(chosen.sum()) / n, "cov/mean": float(cov.sum()) / n}
    return chosen[world.rows(len(chosen)), :T], stats


def turn_advantages(rollout: Rollout, rewards: torch.Tensor, eps: float) -> torch.Tensor:
    """Process supervision over turns (advantages.process_supervision): each turn's reward from
    the environment (0 where it gave none), the reward functions' total added to the last turn.
    The environment's episode reward is already inside `rewards`, so it is not counted twice.

    Every turn is a step with its own reward, the cut last turn of a truncated episode included:
    the environment never saw that turn (reward 0), and as the final turn it carries the outcome
    (the reward functions' total with any overlong penalty), so its tokens get an advantage of
    their own instead of 0, and the outcome is not moved to the turn before it."""
    e = rollout.episodes
    per_turn, ends = [], []
    for i in range(len(rollout)):
        turn_ends = e.turn_ends[i]
        given = e.turn_rewards[i]
        given = list(given) + [None] * (len(turn_ends) - len(given))   # a turn without an entry: 0
        turn = [0.0 if r is None else float(r) for r in given] or [0.0]
        outcome = float(rewards[i]) if not math.isnan(float(rewards[i])) else 0.0
        env_total = e.env_reward[i] or 0.0
        turn[-1] += outcome - env_total
        per_turn.append(turn)
        ends.append(turn_ends[:len(turn)] or [int(rollout.completion_mask[i].sum()) - 1])
    return process_supervision(per_turn, ends, rollout.group_ids, rollout.completion_ids.shape[1], eps)


def fixed_logprobs(c: TrainConfig, learner: Learner, rollout: Rollout) -> None:
    """pi_old and pi_ref as the plan has them (config/plan.py), held fixed for the step's updates:
    pi_old recomputed by a pass of the policy, or the behaviour policy's (the sampler's) log-probs,
    or none ("current": the updates' own, detached); pi_ref from the frozen copy, or from the
    policy with its LoRA adapter off."""
    plan = learner.plan
    mb, mb_tokens = c.optim.micro_batch_size, c.optim.micro_batch_tokens
    if plan.pi_old == "behaviour":
        # async_steps: the workers' weights sampled these tokens; their log-probs are pi_old
        rollout.old_logprobs = rollout.sampler_logprobs.clone()
    elif plan.pi_old == "recomputed":   # with async_steps (proximal=decoupled) pi_prox, the weights now
        with distributed.full_parameters(learner.policy):
            rollout.old_logprobs = logprobs_of(learner.policy, rollout, mb, mb_tokens)
    if plan.reference == "copy":
        with distributed.full_parameters(learner.ref):
            rollout.ref_logprobs = logprobs_of(learner.ref, rollout, mb, mb_tokens)
    elif plan.reference == "adapter_off":
        with learner.policy.disable_adapter():
            rollout.ref_logprobs = logprobs_of(learner.policy, rollout, mb, mb_tokens)
    if learner.teacher is not None:       # distillation: the teacher's log-probs of the same tokens
        rollout.teacher_logprobs = logprobs_of(learner.teacher, rollout, mb, mb_tokens)


def loss_settings(c: TrainConfig, plan: Plan) -> LossSettings:
    """The loss's settings, from the config, as one frozen record. The loss has a KL term only
    where the Plan puts the KL in the loss."""
    return LossSettings(loss_type=c.loss.loss_type, beta=c.loss.beta if plan.kl_in == "loss" else 0.0,
                        kl_estimator=c.loss.kl_estimator, eps_low=c.loss.epsilon,
                        eps_high=c.loss.epsilon_high or c.loss.epsilon, clip_c=c.loss.clip_c,
                        tau_pos=c.loss.sapo_tau_pos, tau_neg=c.loss.sapo_tau_neg,
                        kl_cov_coef=c.loss.kl_cov_coef)


def selection_for_update(c: TrainConfig, selected: torch.Tensor | None,
                         on_policy: bool) -> torch.Tensor | None:
    """The batch's selection as one update uses it. kl_cov's term |log pi_theta - log pi_old| is 0,
    with a gradient of 0, at an update where pi_theta = pi_old (the first of a batch the current
    weights sampled). pi_old's log-probs come from a pass of their own, whose rounding differs
    from the update's by about 1e-7, and the gradient of |x| at such an x is +-1: so the term is
    left out there instead of adding that noise."""
    return None if c.loss.loss_type == "kl_cov" and on_policy else selected


def update_policy(c: TrainConfig, learner: Learner, rollout: Rollout,
                  is_weights: torch.Tensor | None, selected: torch.Tensor | None = None,
                  observer: Observer | None = None) -> list[dict]:
    """`num_iterations` optimizer steps on the step's loss; non-finite ones skipped and counted.
    The observer sees each update's batch before it and its numbers after it."""
    world = learner.world
    sharded = distributed.is_sharded(learner.policy)
    everyone = distributed.gather_rows(rollout.tokens_in_loss, world)   # every process's tokens count
    weights = aggregation_weights(c.loss.aggregation, everyone, c.sampling.max_new_tokens,
                                  world.rows(len(everyone)), rollout.completion_ids.shape[1])
    updates = []
    settings = loss_settings(c, learner.plan)   # one record for the step's updates
    for iteration in range(c.optim.num_iterations):
        on_policy = iteration == 0 and learner.plan.first_update_on_policy
        chosen = selection_for_update(c, selected, on_policy)
        if observer is not None:
            observer.before_update(iteration, rollout, chosen)
        stats = accumulate_gradients(
            learner.policy, rollout, weights=weights,
            reduce=lambda totals: distributed.sum_values(totals, world), is_weights=is_weights,
            selected=chosen, settings=settings,
            micro_batch_size=c.optim.micro_batch_size, micro_batch_tokens=c.optim.micro_batch_tokens,
            passes=(lambda n: distributed.max_over(n, world)) if sharded else None)
        trained = [p for p in learner.policy.parameters() if p.requires_grad]
        if sharded:  # FSDP2 has already reduce-scattered (averaged) each pass's gradients
            distributed.undo_gradient_mean(trained, world)
        else:
            distributed.sum_gradients(trained, world)
        stats["grad_norm"], stepped = optimizer_step(learner.policy, learner.optimizer,
                                                     c.optim.max_grad_norm, stats["loss"])
        if observer is not None:
            observer.after_update(iteration, stats, stepped)
        learner.skipped_in_a_row = 0 if stepped else learner.skipped_in_a_row + 1
        learner.skipped_total += not stepped
        if learner.skipped_in_a_row > c.optim.max_skipped_updates:
            raise TrainingError(
                f"{learner.skipped_in_a_row} updates in a row had a loss or gradient norm that is not "
                f"finite (last: loss {stats['loss']}, grad_norm {stats['grad_norm']}); stopping. Lower "
                "'lr', check the reward functions, or raise 'max_skipped_updates'")
        updates.append(stats)
    return updates


def off_policy_weights(rollout: Rollout, name: str, cap: float, low: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The correction's weights [N, T] from rho = pi_old / pi_sampler, and what they did."""
    mask = rollout.completion_mask.bool()
    log_ratio = rollout.old_logprobs - rollout.sampler_logprobs
    weights = CORRECTIONS[name](log_ratio, mask, cap, low)
    ratio = torch.exp(log_ratio[mask])
    stats = {"offpolicy/ratio_mean": ratio.mean().item() if ratio.numel() else math.nan,
             "offpolicy/ratio_max": ratio.max().item() if ratio.numel() else math.nan,
             "offpolicy/masked_frac": (weights[mask] == 0).float().mean().item() if ratio.numel() else 0.0,
             "sampler/logp_diff": log_ratio.abs()[mask].mean().item() if ratio.numel() else 0.0}
    if name == "tis":   # the names TIS has always logged
        real = weights[mask]
        stats["tis/weight_mean"] = real.mean().item()
        stats["tis/weight_std"] = real.std().item() if real.numel() > 1 else 0.0
    return weights, stats


def staleness(rollout: Rollout, step: int) -> dict:
    """How many optimizer steps behind the trainer's weights (version step - 1) each group's
    tokens were drawn: mean and max over groups."""
    never = torch.iinfo(torch.long).max   # padding (-1) is no token
    row_oldest = rollout.versions.masked_fill(rollout.versions < 0, never).min(-1).values
    oldest = torch.full((int(rollout.group_ids.max()) + 1,), never).scatter_reduce(
        0, rollout.group_ids, row_oldest, "amin")
    # the groups present only: dynamic sampling keeps some ids and drops others
    behind = (step - 1 - oldest[rollout.group_ids.unique()]).float()
    return {"pipeline/staleness_mean": behind.mean().item(), "pipeline/staleness_max": behind.max().item()}
