"""Step 3 of GRPO: turn rewards into advantages within each group (outcome supervision).

A_i = (r_i - mean(r)) / (std(r) + eps) over the scorable members of the group
(DeepSeekMath, arXiv:2402.03300, section 4.1.2). `std` is the sample standard deviation (Bessel's
correction), as `torch.std` computes it. Every token of completion i gets A_i.

Rows whose reward is NaN (no reward function could score them) are left out of their group's mean
and std and get advantage 0. A group whose scorable rewards are all equal, or that has fewer than two
scorable rows, carries no signal and gets exactly 0.
"""

from __future__ import annotations

from typing import Callable

import torch


def group_normalized(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """rewards [N] (NaN = unscorable), group_ids [N] -> advantages [N]."""
    advantages = torch.zeros_like(rewards)
    for gid in torch.unique(group_ids):
        rows = (group_ids == gid) & ~torch.isnan(rewards)
        r = rewards[rows]
        if r.numel() < 2 or bool((r == r[0]).all()):
            continue  # no contrast inside the group: exactly zero
        advantages[rows] = (r - r.mean()) / (r.std() + eps)
    return advantages


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose scorable rewards are all equal (they teach nothing this step)."""
    groups = torch.unique(group_ids)
    flat = 0
    for gid in groups:
        r = rewards[(group_ids == gid) & ~torch.isnan(rewards)]
        flat += int(r.numel() < 2 or bool((r == r[0]).all()))
    return flat / len(groups)


# name -> function(rewards, group_ids, eps) -> advantages. Variants are added here, one entry each.
ADVANTAGES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "group_norm": group_normalized,
}
