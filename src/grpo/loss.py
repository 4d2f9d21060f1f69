"""Step 4 of GRPO: the clipped surrogate with a k3 KL penalty, as pure tensor functions.

Per token t of completion i (DeepSeekMath, arXiv:2402.03300, eq. 3):
    rho  = exp(logp - old_logp)
    term = min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i) - beta * KL_k3
    KL_k3 = exp(ref - logp) - (ref - logp) - 1      (Schulman, "Approximating KL divergence", 2020)
The objective averages `term` over each completion's tokens, then over completions; the loss is its
negative. How tokens are averaged is an *aggregation*: a function of the whole batch's completion
mask that returns one weight per token. Weights are computed once per batch, before it is split into
micro-batches, so the sum of the micro-batch losses equals the whole-batch loss and so do the
gradients.
"""

from __future__ import annotations

from typing import Callable

import torch


def sequence_mean_weights(completion_mask: torch.Tensor) -> torch.Tensor:
    """GRPO's aggregation: 1 / (|o_i| * number of completions) on each token. [N, T] -> [N, T]."""
    mask = completion_mask.float()
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    return mask / lengths / mask.shape[0]


# name -> function(completion_mask [N, T]) -> per-token weights [N, T] summing to at most 1.
AGGREGATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sequence_mean": sequence_mean_weights,
}


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref); non-negative, zero when they agree."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def clipped_surrogate_loss(
    logp: torch.Tensor,              # [n, T] pi_theta, with gradient
    old_logp: torch.Tensor,          # [n, T] pi_old, fixed
    ref_logp: torch.Tensor | None,   # [n, T] pi_ref, or None when beta = 0
    advantages: torch.Tensor,        # [n]
    completion_mask: torch.Tensor,   # [n, T]
    weights: torch.Tensor,           # [n, T] from an aggregation over the whole batch
    *,
    beta: float,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss for some rows of a batch, and sums for the diagnostics (divide by `tokens`)."""
    mask = completion_mask.float()
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)  # [n, 1]: every token of o_i gets A_i
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    objective = torch.min(unclipped, clipped)
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        if beta:
            objective = objective - beta * kl
    loss = -(objective * weights).sum()
    with torch.no_grad():
        # A token is clipped when the clipped branch is the one min() chose and it differs.
        is_clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        stats = {
            "tokens": mask.sum(),
            "clip": (is_clipped.float() * mask).sum(),
            "kl": (kl * mask).sum() if kl is not None else torch.zeros(()),
            "ratio": (ratio * mask).sum(),
        }
    return loss, stats
