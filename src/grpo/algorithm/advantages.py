"""Step 3 of GRPO: turn rewards into advantages (outcome supervision), one function per estimator.

Every estimator takes rewards [N] (NaN = unscorable), group ids [N] and eps, and returns
advantages [N]; every token of completion i gets A_i. Shared rules: rows whose reward is NaN are left
out of every statistic and get 0; a group whose scorable rewards are all equal, or that has fewer than
two scorable rows, carries no signal and gets exactly 0. `std` is the sample standard deviation
(Bessel's correction), as `torch.std` computes it.

Process supervision (per-step rewards, per-token advantages) has its own function below.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def _groups(rewards: torch.Tensor, group_ids: torch.Tensor):
    """Yield (row mask, scorable rewards) for each group with contrast, i.e. rewards not all equal."""
    for gid in torch.unique(group_ids):
        rows = (group_ids == gid) & ~torch.isnan(rewards)
        r = rewards[rows]
        if r.numel() >= 2 and not bool((r == r[0]).all()):
            yield rows, r


def group_normalized(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO (DeepSeekMath, arXiv:2402.03300, 4.1.2): A = (r - mean_group) / (std_group + eps)."""
    advantages = torch.zeros_like(rewards)
    for rows, r in _groups(rewards, group_ids):
        advantages[rows] = (r - r.mean()) / (r.std() + eps)
    return advantages


def group_centered(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783): A = r - mean_group; no std, whose division favours easy and
    hard questions over middling ones."""
    advantages = torch.zeros_like(rewards)
    for rows, r in _groups(rewards, group_ids):
        advantages[rows] = r - r.mean()
    return advantages


def batch_scaled(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """`scale=batch`: A = (r - mean_group) / (std over the whole step's scorable rewards + eps)."""
    scorable = rewards[~torch.isnan(rewards)]
    if scorable.numel() < 2:
        return torch.zeros_like(rewards)
    std = scorable.std()
    advantages = torch.zeros_like(rewards)
    for rows, r in _groups(rewards, group_ids):
        advantages[rows] = (r - r.mean()) / (std + eps)
    return advantages


def leave_one_out(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): A_i = r_i - mean of the other members'
    rewards = k/(k-1) * (r_i - mean_group) for k scorable members."""
    advantages = torch.zeros_like(rewards)
    for rows, r in _groups(rewards, group_ids):
        k = r.numel()
        advantages[rows] = (r * k - r.sum()) / (k - 1)
    return advantages


def reinforce_outcome(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """REINFORCE++ (Hu et al., arXiv:2501.03262, eq. 4): no baseline, A = r; the per-token KL
    return and the batch normalization follow (`token_returns`, `batch_token_normalized`)."""
    return torch.nan_to_num(rewards, nan=0.0)


def reinforce_baseline(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """REINFORCE++ with baseline (arXiv:2501.03262, eq. 6): A' = r - mean_group(r), the group's
    mean only (no division by its std: the batch normalization that follows scales instead)."""
    return group_centered(rewards, group_ids, eps)


ADVANTAGES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "group_norm": group_normalized,
    "group_mean": group_centered,
    "batch_norm": batch_scaled,
    "rloo": leave_one_out,
    "reinforce_pp": reinforce_outcome,
    "reinforce_pp_baseline": reinforce_baseline,
}

# The estimators whose advantage is per token: the outcome above, minus the KL the policy's later
# tokens put in the reward, then normalized over the whole batch's tokens.
TOKEN_RETURNS = ("reinforce_pp", "reinforce_pp_baseline")


def token_returns(outcome: torch.Tensor, kl: torch.Tensor | None, beta: float,
                  mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s per-token return (eq. 4, gamma = 1): the outcome at the end of the completion
    and a reward of -beta * KL_i at each of the policy's tokens i, so
        A_t = outcome - beta * sum_{i >= t} KL_i,
    KL_i = log(pi_old / pi_ref) at token i (k1; `kl` [N, T] is the chosen estimator per token).
    outcome [N], mask [N, T] (the policy's tokens: an episode's environment tokens are not its
    actions and carry no KL) -> [N, T], 0 outside the mask."""
    m = mask.to(outcome.dtype)
    returns = outcome.unsqueeze(-1).expand_as(m).clone()
    if kl is not None and beta:
        per_token = kl.to(outcome.dtype) * m
        to_go = per_token.flip(-1).cumsum(-1).flip(-1)            # sum over i >= t
        returns = returns - beta * to_go
    return returns * m


def distillation_advantages(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor,
                            coef: float) -> torch.Tensor:
    """On-policy distillation's per-token advantage (reverse KL, as in TRL's GKD with lambda = 1 and
    the on-policy distillation of Agarwal et al., arXiv:2306.13649): at each sampled token,
        A_t = coef * -(log pi(x_t) - log teacher(x_t)),
    the negative of the reverse KL's single-sample estimate there, so a token the teacher finds
    likelier than the student gains and one it finds less likely loses. student, teacher [N, T]
    log-probs of the same tokens, mask [N, T] (tokens in the loss) -> [N, T] float32, 0 outside."""
    m = mask.to(torch.float32)
    return (-coef * (student.float() - teacher.float()) * m).float()


def batch_token_normalized(adv: torch.Tensor, mask: torch.Tensor, eps: float,
                           reduce: Callable[[dict], dict] = dict) -> torch.Tensor:
    """REINFORCE++'s global normalization (eq. 5): (A - mean) / (std + eps), the mean and the sample
    std over every counted token of the whole batch. `reduce` sums a dict of numbers over processes
    (distributed.sum_values), so N processes normalize by the statistics of one. [N, T] -> [N, T],
    0 outside the mask."""
    m = mask.bool()
    a = adv.double().masked_fill(~m, 0.0)
    first = reduce({"n": float(m.sum()), "sum": float(a.sum())})
    n = first["n"]
    if n < 2:
        return torch.zeros_like(adv)
    mean = first["sum"] / n
    second = reduce({"squares": float(((a - mean) ** 2).masked_fill(~m, 0.0).sum())})
    std = math.sqrt(second["squares"] / (n - 1))
    return ((a - mean) / (std + eps)).masked_fill(~m, 0.0).to(adv.dtype)


def process_supervision(step_rewards: list[list[float]], step_ends: list[list[int]],
                        group_ids: torch.Tensor, T: int, eps: float) -> torch.Tensor:
    """DeepSeekMath 4.1.3: per-step rewards -> per-token advantages [N, T].

    step_rewards[i][j] scores the j-th reasoning step of completion i, which ends at token
    step_ends[i][j]. Rewards are normalized over all steps of all completions of the group,
    r~ = (r - mean) / (std + eps), and token t's advantage is the sum of r~ over the steps of its
    completion that end at or after t.
    """
    N = len(step_rewards)
    advantages = torch.zeros(N, T, dtype=torch.float64)
    for gid in torch.unique(group_ids):
        members = [i for i in range(N) if int(group_ids[i]) == int(gid)]
        pooled = torch.tensor([r for i in members for r in step_rewards[i]], dtype=torch.float64)
        if pooled.numel() < 2 or bool((pooled == pooled[0]).all()):
            continue
        mean, std = pooled.mean(), pooled.std()
        for i in members:
            for reward, end in zip(step_rewards[i], step_ends[i]):
                advantages[i, : end + 1] += (reward - mean) / (std + eps)
    return advantages.float()


def groups_with_contrast(rewards: torch.Tensor, group_ids: torch.Tensor) -> list[int]:
    """Ids of the groups whose scorable rewards differ (the ones a step learns from)."""
    return [int(group_ids[rows][0]) for rows, _ in _groups(rewards, group_ids)]


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose scorable rewards are all equal (they teach nothing this step)."""
    groups = torch.unique(group_ids)
    return (len(groups) - len(groups_with_contrast(rewards, group_ids))) / len(groups)
