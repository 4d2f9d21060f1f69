"""Off-policy corrections, as pure tensor functions: CORRECTIONS maps each method's name to its
weight on every token's surrogate, which `loss.policy_loss` multiplies in (its `is_weights`).
Tested against hand-derived numbers in tests/test_corrections.py.
"""

from __future__ import annotations

import math

import torch


def truncated_importance_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor,
                                 mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training"): min(pi_old / pi_sampler, cap) per token, 0 on padding. [N, T]."""
    return tis_weights(old_logp - sampler_logp, mask, cap)


# Off-policy corrections: the policy that sampled a token (pi_behaviour: the sampler, or with
# async_steps a rollout worker's older weights) is not the one the update starts from (pi_old, or
# pi_prox in AReaL's decoupled objective). Each maps log rho = log pi_old - log pi_behaviour [N, T]
# and the completion mask to a weight on every token's surrogate [N, T]: 0 masks a token (and
# padding); `cap` is the method's threshold C > 1 and `low` its lower threshold below 1 (verl's
# rollout_rs_threshold_lower), 0 for the method's own. Ratios are compared in log space, so a
# sequence's product of ratios cannot overflow before it is masked.

def _masked(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = mask.bool()
    return log_ratio.masked_fill(~m, 0.0), m


def _log_low(cap: float, low: float, two_sided: bool) -> float:
    """log of the lower threshold: `low` where set, else 1/C for a two-sided band, else none."""
    if low > 0:
        return math.log(low)
    return -math.log(cap) if two_sided else -math.inf


def plain_is_weights(log_ratio, mask, cap, low=0.0):
    """The importance weight itself, rho (AReaL's decoupled PPO, arXiv:2505.24298, eq. 5)."""
    lr, m = _masked(log_ratio, mask)
    return torch.exp(lr).masked_fill(~m, 0.0)


def tis_weights(log_ratio, mask, cap, low=0.0):
    """Token TIS: min(rho, C)."""
    lr, m = _masked(log_ratio, mask)
    return torch.exp(lr).clamp(max=cap).masked_fill(~m, 0.0)


def token_mis_weights(log_ratio, mask, cap, low=0.0):
    """Token masked importance sampling: rho where low <= rho <= C, else 0 (the token leaves the
    loss); no lower bound unless `low` is set."""
    lr, m = _masked(log_ratio, mask)
    keep = m & (lr <= math.log(cap)) & (lr >= _log_low(cap, low, two_sided=False))
    return torch.exp(lr.masked_fill(~keep, 0.0)).masked_fill(~keep, 0.0)


def seq_mis_weights(log_ratio, mask, cap, low=0.0):
    """Sequence masked importance sampling: the sequence's ratio prod_t rho_t on each of its
    tokens where low <= it <= C; a sequence outside leaves the loss whole. No lower bound unless
    `low` is set."""
    lr, m = _masked(log_ratio, mask)
    log_seq = lr.sum(-1, keepdim=True)                       # [N, 1]
    inside = (log_seq <= math.log(cap)) & (log_seq >= _log_low(cap, low, two_sided=False))
    return torch.exp(log_seq.masked_fill(~inside, 0.0)).expand_as(lr).masked_fill(~(inside & m), 0.0)


def icepop_weights(log_ratio, mask, cap, low=0.0):
    """IcePop (Ling team, Ring-1T, arXiv:2510.18855): rho where low <= rho <= C (low = 1/C unless
    set), else 0: tokens on which the two policies disagree too much either way take no gradient."""
    lr, m = _masked(log_ratio, mask)
    keep = m & (lr <= math.log(cap)) & (lr >= _log_low(cap, low, two_sided=True))
    return torch.exp(lr.masked_fill(~keep, 0.0)).masked_fill(~keep, 0.0)


def geo_mask_weights(log_ratio, mask, cap, low=0.0):
    """Geometric-mean sequence rejection (verl's Geo-RS): a sequence whose per-token geometric-mean
    ratio exp(mean_t log rho_t) lies outside [low, C] (low = 1/C unless set) is masked whole; the
    others keep weight 1."""
    lr, m = _masked(log_ratio, mask)
    n = m.sum(-1, keepdim=True).clamp(min=1)
    log_mean = lr.sum(-1, keepdim=True) / n
    keep = (log_mean <= math.log(cap)) & (log_mean >= _log_low(cap, low, two_sided=True)) & m
    return keep.to(log_ratio.dtype)


CORRECTIONS = {
    "is": plain_is_weights,
    "tis": tis_weights,
    "token_mis": token_mis_weights,
    "seq_mis": seq_mis_weights,
    "icepop": icepop_weights,
    "geo_mask": geo_mask_weights,
}
