"""What a GRPO step reports: the DESIGN.md metric names, measured on the step's rollout (every
process's rows) and updates; the records of samples.jsonl; the progress line."""

from __future__ import annotations

import math

import torch

from grpo.run import distributed
from grpo import vision
from grpo.algorithm.advantages import zero_std_fraction
from grpo.rollout import Episodes, Rollout


def step_metrics(rollout: Rollout, updates: list[dict], *, sample_s: float, reward_s: float,
                 update_s: float, reference_s: float = 0.0, advantage_s: float = 0.0,
                 step_s: float | None = None) -> dict:
    """The DESIGN.md metric names, all measured on this step's rollout and updates."""
    rewards = rollout.rewards
    scored = rewards[~torch.isnan(rewards)]
    lengths = rollout.completion_mask.sum(-1).float()
    metrics = {
        "reward/mean": scored.mean().item() if scored.numel() else math.nan,
        "reward/std": scored.std().item() if scored.numel() > 1 else 0.0,
        "reward/min": scored.min().item() if scored.numel() else math.nan,
        "reward/max": scored.max().item() if scored.numel() else math.nan,
        "reward/unscorable": int(torch.isnan(rewards).sum()),
    }
    for name, values in rollout.rewards_per_fn.items():
        valid = [v for v in values if v is not None]
        metrics[f"reward/{name}/mean"] = sum(valid) / len(valid) if valid else math.nan
    metrics["advantage/zero_std_frac"] = zero_std_fraction(rewards, rollout.group_ids)
    for key in ("kl", "clip/frac", "clip/frac_low", "clip/frac_high", "ratio/mean", "entropy", "loss",
                "grad_norm"):
        metrics[key] = sum(u[key] for u in updates) / len(updates)
    for key in sorted({k for u in updates for k in u if "/" in k and k not in metrics}):
        metrics[key] = sum(u[key] for u in updates) / len(updates)   # a variant's own (sapo/...)
    metrics["completion/len_mean"] = lengths.mean().item()
    metrics["tokens/completion"] = int(lengths.sum())
    metrics["tokens/prompt"] = int(rollout.prompt_mask.sum())
    metrics["completion/truncated_frac"] = rollout.truncated.float().mean().item()
    metrics["time/sample_s"], metrics["time/reward_s"] = sample_s, reward_s
    metrics["time/reference_s"], metrics["time/advantage_s"] = reference_s, advantage_s
    metrics["time/update_s"] = update_s
    metrics["time/step_s"] = step_s = step_s or (sample_s + reward_s + reference_s + advantage_s + update_s)
    metrics["tokens/s"] = lengths.sum().item() / step_s  # completion tokens per second of the step
    metrics.update(episode_metrics(rollout))
    return metrics


def episode_metrics(rollout: Rollout) -> dict:
    """Multi-turn episodes: turns, tool calls and their failures, the environment's share of the
    tokens; nothing for single-turn rollouts."""
    e = rollout.episodes
    if not e:
        return {}
    n = max(len(e.turns), 1)
    calls = sum(e.tool_calls)
    policy = rollout.completion_mask.sum().item()
    real = rollout.real_mask.sum().item()
    out = {"episode/turns_mean": sum(e.turns) / n,
           "episode/tool_calls_mean": calls / n,
           "episode/tool_use_frac": sum(c > 0 for c in e.tool_calls) / n,
           "episode/env_token_frac": (real - policy) / real if real else 0.0,
           "episode/env_failures": sum(e.env_failures)}
    if calls:
        out["episode/tool_failure_rate"] = sum(e.tool_failures) / calls
    return out


def everyones_faults(world: distributed.World, mine: dict[str, int]) -> dict[str, int]:
    """`reward/<fn>/zero/<cause>` and `reward/<fn>/error/<cause>`: the counts of this process's
    share of a step's groups (faults.py, counted where they were scored), summed over every
    process."""
    total: dict[str, int] = {}
    for part in distributed.gather_objects(mine, world):
        for key, n in part.items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items()))


def everyones_rows(rollout: Rollout, world: distributed.World) -> Rollout:
    """The fields `step_metrics` reads, with every process's rows (this rollout when alone)."""
    if world.size == 1:
        return rollout
    parts = distributed.gather_objects(
        {"rewards": rollout.rewards, "truncated": rollout.truncated,
         "group_ids": rollout.group_ids, "completion_mask": rollout.completion_mask,
         "prompt_mask": rollout.prompt_mask, "rewards_per_fn": rollout.rewards_per_fn,
         "episodes": rollout.episodes, "real_mask": rollout.real_mask}, world)
    offsets = [0]
    for p in parts[:-1]:
        offsets.append(offsets[-1] + int(p["group_ids"].max()) + 1)
    return Rollout(
        prompts=[], completions=[],
        group_ids=torch.cat([p["group_ids"] + o for p, o in zip(parts, offsets)]),
        prompt_ids=torch.empty(0), prompt_mask=distributed.gather_rows(rollout.prompt_mask, world),
        completion_ids=torch.empty(0),
        completion_mask=distributed.gather_rows(rollout.completion_mask, world),
        sampler_logprobs=torch.empty(0), truncated=torch.cat([p["truncated"] for p in parts]),
        rewards=torch.cat([p["rewards"] for p in parts]),
        rewards_per_fn={k: [v for p in parts for v in p["rewards_per_fn"][k]]
                        for k in parts[0]["rewards_per_fn"]},
        context_mask=(distributed.gather_rows(rollout.real_mask, world)
                      if rollout.context_mask is not None else None),
        episodes=(Episodes.joined([p["episodes"] for p in parts])
                  if parts[0]["episodes"] is not None else None))


THUMBNAILED_PER_STEP = 16   # = report.SAMPLES_PER_STEP: the records the completion browser shows


def sample_records(rollout, step: int) -> list[dict]:
    """samples.jsonl: one record per completion; an episode's also say where its turns end (as
    character offsets into the completion) and how many tool calls it made."""
    advantages = rollout.advantages
    if advantages.dim() == 2:   # per-token (turn rewards): the mean over the policy's tokens
        mask = rollout.completion_mask.float()
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    records = [{"step": step, "group": int(g), "prompt": p, "completion": comp,
                "reward": None if math.isnan(r) else r, "advantage": a}
               for p, comp, g, r, a in zip(rollout.prompts, rollout.completions,
                                           rollout.group_ids.tolist(), rollout.rewards.tolist(),
                                           advantages.tolist())]
    pictures = rollout.columns.get("images")
    if pictures:        # the prompts' images, as thumbnails, for the rows the report's browser keeps
        for record, sources in zip(records[:THUMBNAILED_PER_STEP], pictures):
            record["images"] = [vision.thumbnail(s) for s in sources or []]
    if rollout.episodes:
        for i, record in enumerate(records):
            record["turns"] = rollout.episodes.turns[i]
            record["tool_calls"] = rollout.episodes.tool_calls[i]
            record["spans"] = rollout.episodes.spans[i]
    return records


def metrics_line(m: dict, accuracy: float) -> str:
    """The key metrics of a step, in one short line."""
    held_out = "" if accuracy != accuracy else f"eval/accuracy {accuracy:.3f}  "   # NaN: no eval
    tools = (f"tool use {m['episode/tool_use_frac']:.2f}  " if "episode/tool_use_frac" in m else "")
    reward = ("reward none (no sample scored)" if math.isnan(m["reward/mean"])
              else f"reward {m['reward/mean']:.3f}")
    # async_steps: how stale the groups were and how long the trainer waited for them
    pipeline = (f"stale {m['pipeline/staleness_max']:.0f}  waited {m['pipeline/trainer_wait_s']:.2f}s  "
                if "pipeline/staleness_max" in m else "")
    teacher = f"teacher kl {m['distill/reverse_kl']:.4f}  " if "distill/reverse_kl" in m else ""
    return f"{reward}  kl {m['kl']:.4f}  {teacher}{tools}{held_out}{pipeline}{m['time/step_s']:.2f}s/step"


class RunawayWatch:
    """A note for the progress line when a step's numbers say the policy is running away.

    Two signs, each checked on every step's `entropy` and `kl` (per token, in nats):
      - entropy below ENTROPY_DROP of its mean over the WINDOW steps before: the policy is
        collapsing onto a few tokens faster than learning narrows it. Measured on the demo's tiny
        model after a 60-step cold start on `largest`: lr=5e-3 took it from 0.70 to 0.21 in three
        steps, 0.37 of the mean before (then to 0.03, with reward falling), while at lr=5e-4 no
        step fell below 0.96 of that mean, nor below 0.93 in the demo's own first 40 steps. The
        mean, not one step before, because a small step's entropy is noisy (with 16 completions a
        step, one step went from 0.81 to 1.52 and back at lr=5e-4);
      - kl above KL_LIMIT while the reward falls below REWARD_DROP of its mean over the WINDOW
        steps before: the policy has moved far from its reference and is getting worse for it.
        KL alone is no sign (the demo, learning from a random model, ends its 300 steps at a kl of
        1.3-1.7 with held-out accuracy 0.94).
    docs/guides/troubleshooting.md says how to pick an lr. An empty note when neither holds.

    Also noted, though it is no runaway: a step where every group's rewards are equal
    (`advantage/zero_std_frac` 1), whose advantages are all 0, so the reward taught nothing
    (unless a distillation teacher gave the tokens advantages of its own).
    """
    WINDOW = 3
    ENTROPY_DROP = 0.5
    KL_LIMIT = 1.0
    REWARD_DROP = 0.8

    def __init__(self):
        self.entropies: list[float] = []
        self.rewards: list[float] = []
        self.flat_steps = 0          # steps in a row where every group's rewards were equal

    def note(self, m: dict) -> str:
        entropy, kl = m.get("entropy", math.nan), m.get("kl", math.nan)
        reward = m.get("reward/mean", math.nan)
        self.entropies.append(entropy)
        self.rewards.append(reward)
        notes = []
        taught = "distill/reverse_kl" in m          # a teacher's advantages teach without rewards
        if m.get("advantage/zero_std_frac") == 1.0 and not math.isnan(reward) and not taught:
            self.flat_steps += 1
            notes.append(f"every group's rewards are equal ({self.flat_steps} step"
                         f"{'s' if self.flat_steps > 1 else ''} in a row): advantages 0, nothing "
                         "learned; docs/guides/troubleshooting.md")
        else:
            self.flat_steps = 0
        if len(self.entropies) > self.WINDOW:
            before = sum(self.entropies[-1 - self.WINDOW:-1]) / self.WINDOW
            if entropy < self.ENTROPY_DROP * before:
                notes.append(f"entropy {entropy:.3f}, under half of the last {self.WINDOW} steps' "
                             f"{before:.3f}: collapsing, lower lr")
            was = sum(self.rewards[-1 - self.WINDOW:-1]) / self.WINDOW
            if kl > self.KL_LIMIT and reward < self.REWARD_DROP * was:
                notes.append(f"kl {kl:.2f} above {self.KL_LIMIT:g} and reward {reward:.3f} under "
                             f"{self.REWARD_DROP:g} of the last {self.WINDOW} steps' {was:.3f}: "
                             "running away from the reference, lower lr")
        return "".join(f"  [{n}]" for n in notes)


SAMPLER_GAP_WARNING = 0.05   # mean |log pi_sampler - log pi_old| per token


def sampler_gap_warning(m: dict, step: int) -> str | None:
    """A line for a step whose sampler drew its tokens with log-probs far from the trainer's
    (sampler/logp_diff past SAMPLER_GAP_WARNING): the engine is not sampling the policy being
    trained, and the update is off-policy without a correction."""
    gap = m.get("sampler/logp_diff")
    if gap is None or not gap > SAMPLER_GAP_WARNING:
        return None
    return (f"warning: step {step}: the sampler's log-probs of the tokens it drew differ from the "
            f"trainer's by {gap:.3g} per token on average (sampler/logp_diff; over "
            f"{SAMPLER_GAP_WARNING:g} is not rounding): it does not sample from the weights being "
            "trained (an engine of another dtype or quantization, or weights it did not load). "
            "Set tis_cap=2.0 to correct for a known gap (docs/algorithms.md, off-policy corrections)")


def unscored_warning(m: dict, step: int) -> str | None:
    """A line for a step where no sample could be scored (every one unscorable): its reward is
    undefined and its update had no signal, which a mean of NaN in a progress line hides."""
    if not math.isnan(m["reward/mean"]):
        return None
    silent = [k.split("/")[1] for k, v in m.items() if k.startswith("reward/") and k.endswith("/mean")
              and k != "reward/mean" and isinstance(v, float) and math.isnan(v)]
    return (f"warning: step {step}: none of its {m['reward/unscorable']} samples could be scored "
            f"(no value from {', '.join(silent) or 'the reward functions'}); every advantage is 0 "
            "and the step taught nothing. With reward_on_error=skip a reward function that raises "
            "counts its samples unscorable: set reward_on_error=raise to see the error")
