"""Step 4 of GRPO: policy losses, KL estimators and aggregations, as pure tensor functions.

The per-token objective of GRPO (DeepSeekMath, arXiv:2402.03300, eq. 3) is
    min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) - beta * KL,   rho = pi_theta / pi_old.
It is built from three tables, one entry per published variant:

- POLICY_LOSSES: the surrogate term (token clip, dual clip, GSPO's sequence ratio, GSPO-token
  where advantages are per token, CISPO, SAPO's soft gate, GMPO's geometric mean, Clip-Cov and
  KL-Cov on the tokens that `token_covariance` and the two selections below pick per batch).
- KL_ESTIMATORS: k1, k2, k3 (Schulman, "Approximating KL divergence", 2020).
- AGGREGATIONS: how token terms become one number; a function of the *whole optimizer step's*
  completion mask returning one weight per token. Weights are computed before the step is split into
  micro-batches (`aggregation_weights`, once per step), so the micro-batch losses sum to the
  whole-step loss and so do their gradients.

The off-policy corrections (CORRECTIONS, the `is_weights` of `policy_loss`) are in corrections.py.

Shapes: n rows of this micro-batch, T completion tokens. `mask` is 1 on real completion tokens.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, NamedTuple

import torch


class Surrogate(NamedTuple):
    objective: torch.Tensor     # [n, T] per-token term to maximize (before KL and weights)
    clipped_low: torch.Tensor   # [n, T] bool: the lower clip bound is what acted on this token
    clipped_high: torch.Tensor  # [n, T] bool: the upper clip bound is what acted on this token
    # a variant's own diagnostics: name -> ([n, T] value per token, [n, T] bool where it counts);
    # logged as the mean over the step's counted tokens (update.accumulate_gradients)
    diagnostics: dict | None = None


# ----------------------------------------------------------------------------- policy losses

def token_clip(logp, old_logp, adv, mask, *, eps_low, eps_high) -> Surrogate:
    """PPO/GRPO per-token clipped ratio; `eps_high > eps_low` is DAPO's clip-higher."""
    ratio = torch.exp(logp - old_logp)
    objective = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    return Surrogate(objective, (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0))


def dual_clip(logp, old_logp, adv, mask, *, eps_low, eps_high, clip_c) -> Surrogate:
    """Dual clip (Ye et al. 2020, arXiv:1912.09729): for A < 0 the objective is at least c * A,
    so a huge ratio on a bad token cannot produce an unbounded update. c > 1."""
    base = token_clip(logp, old_logp, adv, mask, eps_low=eps_low, eps_high=eps_high)
    floor = clip_c * adv
    dual = (adv < 0) & (base.objective < floor)
    objective = torch.where(dual, floor, base.objective)
    return Surrogate(objective, base.clipped_low, base.clipped_high | dual)


def gspo(logp, old_logp, adv, mask, *, eps_low, eps_high) -> Surrogate:
    """GSPO (arXiv:2507.18071): one ratio per sequence, s_i = exp(mean_t(logp - old_logp)), clipped
    per sequence; every token of the sequence carries that sequence's term.

    With per-token advantages (adv [n, T], as turn_rewards gives) it is the paper's GSPO-token:
    s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], whose value is s_i and whose gradient is
    s_i * grad log pi(y_t), so token t's term min(s_i,t A_i,t, clip(s_i,t) A_i,t) is clipped by
    the sign of its own advantage and its gradient carries that advantage. When A_i,t = A_i on
    every token and the weights are constant along a row, both forms have the same value and
    gradient."""
    m = mask.float()
    mean_log_ratio = ((logp - old_logp) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(mean_log_ratio)                                  # [n, 1]
    if adv.shape[-1] > 1:                                              # GSPO-token
        ratio = ratio.detach() * torch.exp(logp - logp.detach())      # [n, T], each value s_i
    objective = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    low = ((ratio < 1 - eps_low) & (adv < 0)).expand_as(logp)
    high = ((ratio > 1 + eps_high) & (adv > 0)).expand_as(logp)
    return Surrogate(objective.expand_as(logp), low, high)


def cispo(logp, old_logp, adv, mask, *, eps_low, eps_high) -> Surrogate:
    """CISPO (MiniMax-M1, arXiv:2506.13585): sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp.
    The clipped weight is detached, so every token keeps a gradient, however far its ratio went.
    The paper bounds the weight above only: eps_low = 1 (what the config resolves for cispo unless
    `epsilon` is set) puts the lower bound at 0, below every ratio."""
    ratio = torch.exp(logp - old_logp)
    weight = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    return Surrogate(weight * adv * logp, ratio < 1 - eps_low, ratio > 1 + eps_high)


def sapo(logp, old_logp, adv, mask, *, tau_pos, tau_neg) -> Surrogate:
    """SAPO (Gao et al., arXiv:2511.20347): a soft gate in place of the clip. Each token's term is
    f(rho) * A with f(rho) = (4 / tau) * sigmoid(tau * (rho - 1)), tau = tau_pos where A > 0 and
    tau_neg elsewhere (the paper: tau_neg > tau_pos, so negative tokens' gradients fade faster).
    d f / d rho = 4 sigmoid (1 - sigmoid), which is 1 at rho = 1: on policy it is the plain policy
    gradient, and it decays smoothly as rho leaves 1, where a clip would cut it to 0. No bound
    "acts", so the clip fractions are 0; the gate's weight per side is logged (sapo/gate_pos,
    sapo/gate_neg: the mean of 4 sigmoid (1 - sigmoid) over the side's tokens, 1 on policy)."""
    ratio = torch.exp(logp - old_logp)
    positive = adv > 0
    tau = torch.where(positive, torch.as_tensor(tau_pos, dtype=logp.dtype),
                      torch.as_tensor(tau_neg, dtype=logp.dtype))
    gate = torch.sigmoid(tau * (ratio - 1))
    weight = (4 * gate * (1 - gate)).detach()
    none = torch.zeros_like(logp, dtype=torch.bool)
    real = mask.bool()
    return Surrogate(4 / tau * gate * adv, none, none, {
        "sapo/gate_pos": (weight, real & positive.expand_as(real)),
        "sapo/gate_neg": (weight, real & ~positive.expand_as(real))})


def gmpo(logp, old_logp, adv, mask, *, eps_low, eps_high) -> Surrogate:
    """GMPO (Zhao et al., arXiv:2507.20673): the geometric mean of the token terms instead of the
    arithmetic one, clipped per token in log space before the mean, one-sided by the sign of A:
        J_i = A_i * exp( mean_t sgn(A_i) * min(sgn(A_i) log rho_t, sgn(A_i) clip(log rho_t, -eps_low, eps_high)) )
    (for A > 0 the product of min(rho A, clip(rho) A), for A < 0 of its magnitude, each to the power
    1/|o_i|). epsilon and epsilon_high are in log space here: the paper's range is (e^-0.4, e^0.4).
    Every token of o_i carries J_i, as gspo's do, so sequence_mean gives the paper's mean over
    completions. A token whose log-ratio the clip replaced has no gradient (clip/frac_low, _high)."""
    if adv.shape[-1] > 1 and not bool(((adv == adv[:, :1]) | ~mask.bool()).all()):
        raise ValueError("loss_type=gmpo needs one advantage per completion (it takes a geometric "
                         "mean over the completion's tokens); per-token advantages (turn_rewards) "
                         "are not defined for it")
    a = adv[:, :1]                                                    # [n, 1]
    m = mask.float()
    sign = torch.where(a < 0, -1.0, 1.0).to(logp.dtype)
    log_ratio = logp - old_logp
    bounded = torch.clamp(log_ratio, -eps_low, eps_high)
    kept = sign * torch.min(sign * log_ratio, sign * bounded)          # [n, T]
    mean = (kept * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    objective = (a * torch.exp(mean)).expand_as(logp)
    return Surrogate(objective, (a < 0) & (log_ratio < -eps_low), (a > 0) & (log_ratio > eps_high))


def clip_cov(logp, old_logp, adv, mask, *, selected) -> Surrogate:
    """Clip-Cov (Cui et al., arXiv:2505.22617, eq. 12): the policy gradient rho * A, except on the
    tokens of I_clip (chosen per batch by `clip_cov_tokens`), which are detached from it: their term
    is 0. The paper's formula has no PPO clip, so epsilon plays no part. `selected` [n, T] bool;
    None selects nothing."""
    ratio = torch.exp(logp - old_logp)
    chosen = _chosen(selected, logp)
    objective = torch.where(chosen, torch.zeros_like(logp), ratio * adv)
    return _with_selection(objective, chosen, mask)


def kl_cov(logp, old_logp, adv, mask, *, selected, kl_cov_coef) -> Surrogate:
    """KL-Cov (arXiv:2505.22617, eq. 14): rho * A, minus beta * D_KL(pi_old || pi_theta) on the
    tokens of I_KL (the top k * N by covariance, `kl_cov_tokens`). The KL at the sampled token is
    |log pi_theta - log pi_old|, the form the paper's own implementation evaluates and its beta = 1
    was tuned at. It is 0 with no gradient while pi_theta = pi_old, so it acts from the second
    update of a batch on (num_iterations > 1). `selected` [n, T] bool; None selects nothing."""
    ratio = torch.exp(logp - old_logp)
    chosen = _chosen(selected, logp)
    penalty = kl_cov_coef * (logp - old_logp).abs()
    objective = ratio * adv - torch.where(chosen, penalty, torch.zeros_like(penalty))
    return _with_selection(objective, chosen, mask)


def _chosen(selected, logp) -> torch.Tensor:
    if selected is None:
        return torch.zeros_like(logp, dtype=torch.bool)
    return selected.bool()


def _with_selection(objective, chosen, mask) -> Surrogate:
    none = torch.zeros_like(chosen)     # no bound acts; the selection is logged where it is made
    return Surrogate(objective, none, none)


POLICY_LOSSES: dict[str, Callable[..., Surrogate]] = {
    "clip": token_clip,
    "dual_clip": dual_clip,
    "gspo": gspo,
    "cispo": cispo,
    "sapo": sapo,
    "gmpo": gmpo,
    "clip_cov": clip_cov,
    "kl_cov": kl_cov,
}

@dataclass(frozen=True)
class LossSettings:
    """The loss's settings as one frozen record, decided once from the config (step.loss_settings).
    A policy loss takes exactly the ones it uses (`surrogate` hands it those), so a setting that
    is misspelled, or that no loss has, is an error where it is written."""
    loss_type: str = "clip"          # an entry of POLICY_LOSSES
    beta: float = 0.0                # the KL term's weight in the loss (0 with the KL in the reward)
    kl_estimator: str = "k3"         # an entry of KL_ESTIMATORS
    eps_low: float = 0.2             # the clip's bounds: 1 - eps_low, 1 + eps_high
    eps_high: float = 0.2
    clip_c: float = 3.0              # dual_clip's floor, c * A for A < 0
    tau_pos: float = 1.0             # sapo's gate temperatures, A > 0 and elsewhere
    tau_neg: float = 1.05
    kl_cov_coef: float = 1.0         # kl_cov's weight on |log rho| of the selected tokens

    def __post_init__(self):
        if self.loss_type not in POLICY_LOSSES:
            raise ValueError(f"loss_type {self.loss_type!r} is not one of {sorted(POLICY_LOSSES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator {self.kl_estimator!r} is not one of {sorted(KL_ESTIMATORS)}")


@lru_cache(maxsize=None)
def _settings_taken(fn: Callable) -> tuple[str, ...]:
    """The keyword-only parameters of a policy loss: the settings it uses (and `selected`)."""
    return tuple(name for name, p in inspect.signature(fn).parameters.items()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY)


def surrogate(logp, old_logp, adv, mask, settings: LossSettings,
              selected: torch.Tensor | None = None) -> Surrogate:
    """The policy loss of `settings.loss_type`, handed exactly the settings it declares."""
    fn = POLICY_LOSSES[settings.loss_type]
    given = {"selected": selected}
    return fn(logp, old_logp, adv, mask, **{name: given[name] if name in given else getattr(settings, name)
                                            for name in _settings_taken(fn)})


# ----------------------------------------------------------------------------- token selections

COVARIANCE_LOSSES = ("clip_cov", "kl_cov")   # the losses that act on a batch's token selection
# Clip-Cov and KL-Cov act on the tokens whose log-probability and advantage covary most. The
# statistics are over the whole batch: every counted token of every process (environment tokens
# of an episode do not count), so the caller gathers the batch first (step.covariance_selection).


def token_covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """arXiv:2505.22617 eq. 10, per token over a batch of N tokens:
        Cov(y_i) = (log pi(y_i) - 1/N sum_j log pi(y_j)) * (A(y_i) - 1/N sum_j A(y_j)).
    logp, mask [N, T]; adv [N] or [N, T]. 0 on tokens outside the mask."""
    m = mask.bool()
    adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv).expand_as(logp).to(logp.dtype)
    n = m.sum().clamp(min=1)
    mean_logp = logp.masked_fill(~m, 0).sum() / n
    mean_adv = adv.masked_fill(~m, 0).sum() / n
    return ((logp - mean_logp) * (adv - mean_adv)).masked_fill(~m, 0)


def clip_cov_tokens(cov: torch.Tensor, mask: torch.Tensor, fraction: float, low: float, high: float,
                    generator: torch.Generator) -> torch.Tensor:
    """I_clip (eq. 11): floor(r * N) tokens drawn uniformly, without replacement, from those whose
    covariance lies in [low, high] (all of them if fewer qualify). [N, T] bool."""
    m = mask.bool()
    k = math.floor(fraction * int(m.sum()))
    band = (m & (cov >= low) & (cov <= high)).flatten().nonzero().squeeze(-1)
    chosen = torch.zeros(cov.numel(), dtype=torch.bool)
    if k > 0 and band.numel():
        chosen[band[torch.randperm(band.numel(), generator=generator)[:k]]] = True
    return chosen.view_as(cov)


def kl_cov_tokens(cov: torch.Tensor, mask: torch.Tensor, fraction: float) -> torch.Tensor:
    """I_KL (eq. 13): the floor(k * N) tokens of highest covariance. [N, T] bool."""
    m = mask.bool()
    k = math.floor(fraction * int(m.sum()))
    chosen = torch.zeros(cov.numel(), dtype=torch.bool)
    if k > 0:
        ranked = cov.masked_fill(~m, -math.inf).flatten()
        chosen[torch.topk(ranked, k, sorted=False).indices] = True
    return chosen.view_as(cov)

# ----------------------------------------------------------------------------- KL estimators
# Each estimates KL(pi_theta || pi_ref) per token from samples of pi_theta.

def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log(pi/pi_ref): unbiased, can be negative. As a loss term its gradient is grad log pi, whose
    expectation under pi is 0, so it belongs in the reward (`kl_penalized_rewards`); the config
    refuses it as a loss term."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(log(pi/pi_ref))^2 / 2: biased, non-negative, low variance."""
    return 0.5 * (logp - ref_logp) ** 2


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """pi_ref/pi - log(pi_ref/pi) - 1: unbiased, non-negative; GRPO's choice."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": k3_kl,
}

# ----------------------------------------------------------------------------- aggregations

def sequence_mean_weights(mask: torch.Tensor, max_tokens: int = 0) -> torch.Tensor:
    """GRPO paper: mean over each completion's tokens, then over completions: 1 / (|o_i| * N)."""
    m = mask.float()
    return m / m.sum(-1, keepdim=True).clamp(min=1) / m.shape[0]


def token_mean_weights(mask: torch.Tensor, max_tokens: int = 0) -> torch.Tensor:
    """DAPO: mean over every token of the step, so long completions weigh in proportion: 1 / sum|o_i|."""
    m = mask.float()
    return m / m.sum().clamp(min=1)


def constant_weights(mask: torch.Tensor, max_tokens: int = 0) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783): token sum over a constant, max_new_tokens * N, so no length bias."""
    if max_tokens <= 0:
        raise ValueError("the constant aggregation needs max_tokens (max_new_tokens) above 0")
    m = mask.float()
    return m / (max_tokens * m.shape[0])


def sequence_sum_weights(mask: torch.Tensor, max_tokens: int = 0) -> torch.Tensor:
    """REINFORCE/RLOO: sum over each completion's tokens (the sequence log-prob), mean over N."""
    m = mask.float()
    return m / m.shape[0]


AGGREGATIONS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "sequence_mean": sequence_mean_weights,
    "token_mean": token_mean_weights,
    "constant": constant_weights,
    "sequence_sum": sequence_sum_weights,
}


def aggregation_weights(aggregation: str, mask: torch.Tensor, max_tokens: int,
                        rows: slice | None = None, width: int | None = None) -> torch.Tensor:
    """The per-token weights of one optimizer step: AGGREGATIONS[aggregation] over the whole step's
    `mask` [N, T] (with several processes, every process's rows, gathered), then the `rows` and
    the first `width` tokens of this process's part, where given."""
    weights = AGGREGATIONS[aggregation](mask, max_tokens)
    return weights if rows is None else weights[rows, :width]

# ----------------------------------------------------------------------------- KL per token

def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
             estimator: str = "k1") -> torch.Tensor:
    """The chosen estimator's KL at each token of the mask, 0 elsewhere. [N, T]. Outside the mask
    logp is taken as ref_logp, so exp() in k3 cannot overflow on padding."""
    m = mask.bool()
    return KL_ESTIMATORS[estimator](torch.where(m, logp, ref_logp), ref_logp) * m


def kl_penalized_rewards(rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor,
                         mask: torch.Tensor, beta: float, estimator: str = "k1") -> torch.Tensor:
    """PPO-RLHF's KL in the reward: r_i - beta * sum_t KL_t(o_i). rewards [N] -> [N]."""
    return rewards - beta * token_kl(logp, ref_logp, mask, estimator).sum(-1)


# ----------------------------------------------------------------------------- the loss


def policy_loss(
    logp: torch.Tensor,              # [n, T] pi_theta, with gradient
    old_logp: torch.Tensor,          # [n, T] pi_old, fixed
    ref_logp: torch.Tensor | None,   # [n, T] pi_ref, or None when there is no KL term
    advantages: torch.Tensor,        # [n] outcome advantages, or [n, T] per token
    mask: torch.Tensor,              # [n, T]
    weights: torch.Tensor,           # [n, T] aggregation_weights over the whole optimizer step
    settings: LossSettings,
    *,
    is_weights: torch.Tensor | None = None,  # [n, T] an off-policy correction's weights (corrections.py)
    selected: torch.Tensor | None = None,    # [n, T] bool: clip_cov's / kl_cov's tokens of the batch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-(sum over tokens of weights * (surrogate * is_weights - beta * KL)); and diagnostic sums
    (a variant's own as NAME and NAME#n: the sum over its tokens and how many they are)."""
    m = mask.float()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # every token of o_i gets A_i
    sur = surrogate(logp, old_logp, adv, mask, settings, selected)
    objective = sur.objective if is_weights is None else sur.objective * is_weights
    kl = None
    if ref_logp is not None:  # padding gets logp = ref, so exp() in k3 cannot overflow there
        kl = KL_ESTIMATORS[settings.kl_estimator](torch.where(m.bool(), logp, ref_logp), ref_logp)
    if kl is not None and settings.beta:
        objective = objective - settings.beta * kl
    loss = -(objective * weights * m).sum()
    with torch.no_grad():
        stats = {
            "tokens": m.sum(),
            "clip_low": (sur.clipped_low.float() * m).sum(),
            "clip_high": (sur.clipped_high.float() * m).sum(),
            "kl": (kl * m).sum() if kl is not None else torch.zeros(()),
            "ratio": (torch.exp(logp - old_logp) * m).sum(),
        }
        for name, (value, where) in (sur.diagnostics or {}).items():
            stats[name] = (value * where).sum()
            stats[name + "#n"] = where.float().sum()
    return loss, stats


def clipped_surrogate_loss(logp, old_logp, ref_logp, advantages, completion_mask, weights,
                           settings: LossSettings):
    """GRPO's loss (the token clip with a k3 KL term: LossSettings' own loss_type and kl_estimator),
    with the clipped tokens of both sides as stats["clip"]. Kept as the paper's name for `policy_loss`."""
    loss, stats = policy_loss(logp, old_logp, ref_logp, advantages, completion_mask, weights, settings)
    stats["clip"] = stats["clip_low"] + stats["clip_high"]
    return loss, stats
