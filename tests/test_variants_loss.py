"""Policy-loss variants (dual clip, GSPO, CISPO), k1/k2/k3, the four aggregations, importance weights,
and micro-batching of every combination, against hand numbers and a naive float64 reference."""

import dataclasses
import math
import random

import pytest
import torch

from grpo.algorithm.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, LossSettings, policy_loss
from grpo.algorithm.loss import surrogate as loss_surrogate
from helpers import T, grads_and_stats, make_rollout
from grpo.update import logprobs_of

LN2 = math.log(2.0)
E = math.e


def surrogate(name, log_ratio, adv, eps_low=0.2, eps_high=0.2, clip_c=3.0):
    """One token per row (n rows, T = 1), logp = 0 with gradient, old = -log_ratio.

    Returns (objective [n], d objective / d logp [n], clipped_low [n], clipped_high [n]).
    """
    logp = torch.zeros(len(log_ratio), 1, dtype=torch.float64, requires_grad=True)
    old = -torch.tensor(log_ratio, dtype=torch.float64).unsqueeze(-1)
    a = torch.tensor(adv, dtype=torch.float64).unsqueeze(-1)
    settings = LossSettings(loss_type=name, eps_low=eps_low, eps_high=eps_high, clip_c=clip_c)
    sur = loss_surrogate(logp, old, a, torch.ones(len(log_ratio), 1), settings)
    sur.objective.sum().backward()
    return (sur.objective[:, 0].tolist(), logp.grad[:, 0].tolist(), sur.clipped_low[:, 0].tolist(),
            sur.clipped_high[:, 0].tolist())


def test_registry_names():
    assert list(POLICY_LOSSES) == ["clip", "dual_clip", "gspo", "cispo", "sapo", "gmpo", "clip_cov",
                                   "kl_cov"]
    assert list(KL_ESTIMATORS) == ["k1", "k2", "k3"]
    assert list(AGGREGATIONS) == ["sequence_mean", "token_mean", "constant", "sequence_sum"]


# ----------------------------------------------------------------------------------- token clip

def test_token_clip_hand_values():
    # eps 0.2 both sides:
    # ratio e,   A = +1.5: min(4.0774227, 1.2*1.5 = 1.8) = 1.8, clip acts (high), gradient 0
    # ratio e,   A = -1.5: min(-4.0774227, -1.8) = -4.0774227, unclipped, gradient r A
    # ratio 1/e, A = -1.5: min(-0.5518192, 0.8*-1.5 = -1.2) = -1.2, clip acts (low), gradient 0
    # ratio 1.1, A = 2:    2.2 either way, gradient r A = 2.2
    obj, grad, low, high = surrogate("clip", [1.0, 1.0, -1.0, math.log(1.1)], [1.5, -1.5, -1.5, 2.0])
    assert obj == pytest.approx([1.8, -1.5 * E, -1.2, 2.2], rel=1e-14)
    assert grad == pytest.approx([0.0, -1.5 * E, 0.0, 2.2], rel=1e-14, abs=0)
    assert low == [False, False, True, False]
    assert high == [True, False, False, False]


# ------------------------------------------------------------------------------------ dual clip

def test_dual_clip_floors_negative_advantage_terms_at_c_times_a():
    # eps 0.2, c = 3:
    # ratio e^2 = 7.3890561, A = -1: token clip min(-7.3890561, 1.2*-1 = -1.2) = -7.3890561;
    #   dual clip floors it at c A = -3 -> -3, and the floor is constant in logp -> gradient 0.
    #   The convention (Surrogate docstring: "the upper clip bound is what acted") files it under
    #   clipped_high: the floor acts because the ratio went above c.
    # ratio e^2, A = +1: token clip min(7.3890561, 1.2) = 1.2 (ordinary high clip), dual does nothing.
    # ratio 2, A = -1: min(-2, -1.2) = -2 > -3: no floor, unclipped, gradient r A = -2.
    # ratio 1/e, A = -1: min(-0.3678794, -0.8) = -0.8: ordinary low clip, -0.8 > -3, gradient 0.
    # ratio e^2, A = -0.5: min(-3.6945280, -0.6) = -3.6945280 < c A = -1.5 -> -1.5, gradient 0
    obj, grad, low, high = surrogate("dual_clip", [2.0, 2.0, LN2, -1.0, 2.0],
                                     [-1.0, 1.0, -1.0, -1.0, -0.5])
    assert obj == pytest.approx([-3.0, 1.2, -2.0, -0.8, -1.5], rel=1e-14)
    assert grad == [0.0, 0.0, pytest.approx(-2.0, rel=1e-14), 0.0, 0.0]
    assert low == [False, False, False, True, False]
    assert high == [True, True, False, False, True]
    # token clip on the same tokens: the first and last are unclipped there (-e^2, -e^2/2, with
    # gradient r A), and not counted as clipped
    obj, grad, low, high = surrogate("clip", [2.0, 2.0, LN2, -1.0, 2.0], [-1.0, 1.0, -1.0, -1.0, -0.5])
    assert obj == pytest.approx([-E ** 2, 1.2, -2.0, -0.8, -E ** 2 / 2], rel=1e-14)
    assert grad == pytest.approx([-E ** 2, 0.0, -2.0, 0.0, -E ** 2 / 2], rel=1e-14, abs=0)
    assert high == [False, True, False, False, False]


def test_dual_clip_counts_in_clip_high_stat():
    # the five tokens above through policy_loss, weights 1: clip_high counts tokens 0, 1, 4 = 3,
    # clip_low token 3 = 1; loss = -(-3 + 1.2 - 2 - 0.8 - 1.5) = 6.1
    logp = torch.zeros(5, 1, requires_grad=True)
    old = -torch.tensor([[2.0], [2.0], [LN2], [-1.0], [2.0]])
    loss, stats = policy_loss(logp, old, None, torch.tensor([-1.0, 1.0, -1.0, -1.0, -0.5]),
                              torch.ones(5, 1), torch.ones(5, 1), LossSettings(loss_type="dual_clip",
                              eps_low=0.2, eps_high=0.2, clip_c=3.0))
    assert loss.item() == pytest.approx(6.1, rel=1e-6)
    assert stats["clip_high"].item() == 3.0
    assert stats["clip_low"].item() == 1.0


# ----------------------------------------------------------------------------------------- GSPO

def gspo_example():
    """Four rows, T = 3, eps 0.2 both sides. log-ratio per token (x = masked padding):

    row  log-ratios           length  mean    s = exp(mean)   A
    0    0.2   0.4   x(5.0)   2       0.3     1.3498588       +1
    1    0.2   0.4   x(5.0)   2       0.3     1.3498588       -1
    2    -0.5  x(3)  x(-4)    1       -0.5    0.6065307       +2
    3    -0.1  -0.3  -0.5     3       -0.3    0.7408182       -0.5
    """
    log_ratio = torch.tensor([[0.2, 0.4, 5.0], [0.2, 0.4, 5.0], [-0.5, 3.0, -4.0], [-0.1, -0.3, -0.5]],
                             dtype=torch.float64)
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, -2.5], [-0.7, -1.0, -1.0],
                         [-2.0, -0.2, -1.1]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - log_ratio
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0, 2.0, -0.5], dtype=torch.float64)
    return logp, old, adv, mask


def test_gspo_sequence_ratio_and_clip():
    logp, old, adv, mask = gspo_example()
    sur = POLICY_LOSSES["gspo"](logp, old, adv.unsqueeze(-1), mask, eps_low=0.2, eps_high=0.2)
    # row 0: min(1.3498588 * 1, 1.2 * 1) = 1.2 on every token (padding's 5.0 is not in the mean:
    #        with it, s would be exp(5.6/3) = 6.47)
    # row 1: min(-1.3498588, -1.2) = -1.3498588 (A < 0: the high clip does not act)
    # row 2: min(0.6065307 * 2, 0.8 * 2) = 1.2130613 (A > 0 and s low: unclipped)
    # row 3: min(0.7408182 * -0.5 = -0.3704091, 0.8 * -0.5 = -0.4) = -0.4 (low clip acts)
    s = math.exp(0.3)
    expected = [1.2, -s, 2 * math.exp(-0.5), -0.4]
    for i in range(4):
        assert sur.objective[i].tolist() == pytest.approx([expected[i]] * 3, rel=1e-14)
    assert sur.clipped_high[:, 0].tolist() == [True, False, False, False]
    assert sur.clipped_low[:, 0].tolist() == [False, False, False, True]


def test_gspo_loss_gradient_and_stats_with_sequence_mean_weights():
    logp, old, adv, mask = gspo_example()
    # sequence_mean weights 1/(|o_i| N) sum to 1/N over a row, so the loss is
    # -(1/N) sum_i min(s_i A_i, clip(s_i) A_i) = -(1/4)(1.2 - 1.3498588 + 1.2130613 - 0.4)
    #   = -(1/4)(0.6632025) = -0.1658006
    w = torch.tensor([[0.125, 0.125, 0.0], [0.125, 0.125, 0.0], [0.25, 0.0, 0.0], [1 / 12] * 3],
                     dtype=torch.float64)
    loss, stats = policy_loss(logp, old, None, adv, mask, w, LossSettings(loss_type="gspo", eps_low=0.2,
                              eps_high=0.2))
    s0, s2 = math.exp(0.3), math.exp(-0.5)
    assert loss.item() == pytest.approx(-(1.2 - s0 + 2 * s2 - 0.4) / 4, rel=1e-14)
    assert loss.item() == pytest.approx(-0.1658006, abs=1e-7)
    loss.backward()
    # d s_i / d logp_t = s_i / |o_i| on real tokens; clipped rows (0, 3) and padding get 0:
    # row 1: -(1/4) * A s / 2 = -(1/4)(-1.3498588/2) = 0.1687324 on each real token
    # row 2: -(1/4) * 2 * 0.6065307 / 1 = -0.3032653
    assert logp.grad.tolist() == [[0.0, 0.0, 0.0],
                                  pytest.approx([s0 / 8, s0 / 8, 0.0], rel=1e-14, abs=0),
                                  pytest.approx([-s2 / 2, 0.0, 0.0], rel=1e-14, abs=0),
                                  [0.0, 0.0, 0.0]]
    # real tokens: 2 + 2 + 1 + 3 = 8; row 0's 2 real tokens clipped high, row 3's 3 clipped low
    assert stats["tokens"].item() == 8.0
    assert stats["clip_high"].item() == 2.0
    assert stats["clip_low"].item() == 3.0


def test_gspo_token_with_per_token_advantages_hand_values_float64():
    # GSPO-token (arXiv:2507.18071): s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]: value s_i, gradient
    # s_i * d logp_t; each token's term min(s_it A_it, clip(s_it) A_it) uses its own advantage.
    # row 0: log-ratios [0.3, -0.1, 0.1], mean 0.1, s0 = e^0.1 = 1.1051709, A = [2, 2, -1]: no clip
    # row 1: log-ratios [0.6, 0.6, (padding 5.0)], mean 0.6, s1 = e^0.6 = 1.8221188, A = [1, -0.5, 0]:
    #        token 0 (A > 0): min(1.8221188, 1.2) = 1.2, clipped high, no gradient;
    #        token 1 (A < 0): min(-0.9110594, -0.6) = -0.9110594, unclipped
    # sequence_mean weights: row 0 1/(3*2) = 1/6 per token, row 1 1/(2*2) = 1/4 per token
    # loss = -[(1/6) s0 (2 + 2 - 1) + (1/4)(1.2 - 0.5 s1)] = -[0.5525855 + 0.0722351] = -0.6248206
    # d loss / d logp_t = -w_t s_i A_t (unclipped tokens), 0 where clipped or padding:
    #   row 0: [-(1/6) 2 s0, -(1/6) 2 s0, (1/6) s0] = [-0.3683903, -0.3683903, 0.1841952]
    #   row 1: [0, -(1/4)(-0.5) s1, 0] = [0, 0.2277649, 0]
    # (the first column's advantage for the whole row, as before, would give row 0 A = 2 on all)
    log_ratio = torch.tensor([[0.3, -0.1, 0.1], [0.6, 0.6, 5.0]], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=torch.float64,
                        requires_grad=True)
    old = logp.detach() - log_ratio
    adv = torch.tensor([[2.0, 2.0, -1.0], [1.0, -0.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = torch.tensor([[1 / 6] * 3, [0.25, 0.25, 0.0]], dtype=torch.float64)
    loss, stats = policy_loss(logp, old, None, adv, mask, w, LossSettings(loss_type="gspo", eps_low=0.2,
                              eps_high=0.2))
    s0, s1 = math.exp(0.1), math.exp(0.6)
    assert loss.item() == pytest.approx(-(s0 * 3 / 6 + (1.2 - 0.5 * s1) / 4), rel=1e-14)
    assert loss.item() == pytest.approx(-0.6248206, abs=1e-7)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx([-s0 / 3, -s0 / 3, s0 / 6], rel=1e-14, abs=0),
                                  pytest.approx([0.0, s1 / 8, 0.0], rel=1e-14, abs=0)]
    assert [round(g, 7) for g in logp.grad.flatten().tolist()] == \
        [-0.3683903, -0.3683903, 0.1841952, 0.0, 0.2277649, 0.0]
    assert stats["clip_high"].item() == 1.0 and stats["clip_low"].item() == 0.0


def test_gspo_token_with_constant_per_token_advantages_is_gspo():
    # A_it = A_i on every token, sequence_mean weights: the same value and gradient as GSPO
    logp, old, adv, mask = gspo_example()
    w = torch.tensor([[0.125, 0.125, 0.0], [0.125, 0.125, 0.0], [0.25, 0.0, 0.0], [1 / 12] * 3],
                     dtype=torch.float64)
    results = []
    for a in (adv, adv.unsqueeze(-1).expand(-1, 3)):
        x = logp.detach().clone().requires_grad_()
        loss, stats = policy_loss(x, old, None, a, mask, w, LossSettings(loss_type="gspo", eps_low=0.2,
                                  eps_high=0.2))
        loss.backward()
        results.append((loss.item(), x.grad, stats["clip_high"].item(), stats["clip_low"].item()))
    (l1, g1, h1, lo1), (l2, g2, h2, lo2) = results
    assert l2 == pytest.approx(l1, rel=1e-14) and (h1, lo1) == (h2, lo2)
    torch.testing.assert_close(g2, g1, rtol=1e-14, atol=1e-17)


# ---------------------------------------------------------------------------------------- CISPO

# ratio e (A = 1.5), 1/e (A = -1.5), 1.1 (A = 2), e (A = -1); logp values so objective = w A logp
CISPO_LOGP = [-0.5, -2.0, -1.0, -0.25]
CISPO_LOG_RATIO = [1.0, -1.0, math.log(1.1), 1.0]
CISPO_ADV = [1.5, -1.5, 2.0, -1.0]


def cispo_case(loss_type):
    logp = torch.tensor([CISPO_LOGP], dtype=torch.float64).T.requires_grad_()
    old = logp.detach() - torch.tensor([CISPO_LOG_RATIO], dtype=torch.float64).T
    loss, stats = policy_loss(logp, old, None, torch.tensor(CISPO_ADV, dtype=torch.float64),
                              torch.ones(4, 1), torch.ones(4, 1, dtype=torch.float64),
                              LossSettings(loss_type=loss_type, eps_low=0.2, eps_high=0.28))
    loss.backward()
    return loss.item(), logp.grad[:, 0].tolist(), stats


def test_cispo_objective_and_gradient():
    # weight = sg(clip(ratio, 0.8, 1.28)): [1.28, 0.8, 1.1, 1.28]
    # objective w A logp: 1.28*1.5*-0.5 = -0.96; 0.8*-1.5*-2 = 2.4; 1.1*2*-1 = -2.2;
    #   1.28*-1*-0.25 = 0.32; sum -0.96 + 2.4 - 2.2 + 0.32 = -0.44 -> loss 0.44
    # d objective / d logp = w A (the weight is detached): [1.92, -1.2, 2.2, -1.28]; loss = -sum
    loss, grad, stats = cispo_case("cispo")
    assert loss == pytest.approx(0.44, rel=1e-14)
    assert grad == pytest.approx([-1.92, 1.2, -2.2, 1.28], rel=1e-14)
    # CISPO's clip acts on the weight whatever the sign of A: ratio > 1.28 at tokens 0, 3,
    # ratio < 0.8 at token 1
    assert stats["clip_high"].item() == 2.0
    assert stats["clip_low"].item() == 1.0


def test_token_clip_on_the_cispo_tokens_drops_the_clipped_gradients():
    # token clip, same tokens: token 0 (ratio e > 1.28, A > 0) and token 1 (ratio 1/e < 0.8, A < 0)
    # are clipped -> gradient 0, where CISPO kept 1.92 and -1.2. Token 2 (inside): r A = 2.2 as in
    # CISPO. Token 3 (ratio e, A < 0) unclipped: r A = -e (CISPO: 1.28 * -1).
    # loss = -(1.28*1.5 + 0.8*-1.5 + 1.1*2 + e*-1) = -(1.92 - 1.2 + 2.2 - 2.7182818) = -0.2017182
    loss, grad, stats = cispo_case("clip")
    assert loss == pytest.approx(-(1.92 - 1.2 + 2.2 - E), rel=1e-14)
    assert grad == [0.0, 0.0, pytest.approx(-2.2, rel=1e-14), pytest.approx(E, rel=1e-14)]
    assert stats["clip_high"].item() == 1.0
    assert stats["clip_low"].item() == 1.0


# -------------------------------------------------------------------------------- KL estimators

@pytest.mark.parametrize("name, d, value, grad", [
    # d = logp - ref; k1 = d, d k1/d logp = 1
    ("k1", LN2, 0.6931472, 1.0),
    ("k1", -LN2, -0.6931472, 1.0),
    ("k1", 0.0, 0.0, 1.0),
    # k2 = d^2/2 = 0.2402265 at ±ln 2; d k2/d logp = d
    ("k2", LN2, 0.2402265, LN2),
    ("k2", -LN2, 0.2402265, -LN2),
    ("k2", 0.0, 0.0, 0.0),
    # k3 = e^-d + d - 1: at ln 2: 0.5 + 0.6931472 - 1 = 0.1931472; at -ln 2: 2 - 0.6931472 - 1 =
    # 0.3068528; d k3/d logp = 1 - e^-d: 0.5 and -1
    ("k3", LN2, 0.1931472, 0.5),
    ("k3", -LN2, 0.3068528, -1.0),
    ("k3", 0.0, 0.0, 0.0),
])
def test_kl_estimator_values_and_gradients(name, d, value, grad):
    ref = torch.tensor([-1.3], dtype=torch.float64)
    logp = (ref + d).requires_grad_()
    kl = KL_ESTIMATORS[name](logp, ref)
    kl.sum().backward()
    assert kl.item() == pytest.approx(value, abs=1e-7)
    assert logp.grad.item() == pytest.approx(grad, abs=1e-12)
    if d == 0.0:
        assert kl.item() == 0.0


@pytest.mark.parametrize("name, expected", [("k1", LN2), ("k2", LN2 ** 2 / 2),
                                            ("k3", 0.5 + LN2 - 1)])
def test_policy_loss_uses_the_chosen_kl_estimator(name, expected):
    # one token, ratio 1, A = 0 -> the surrogate is 0; logp - ref = ln 2, beta 0.1, weight 1:
    # loss = beta * KL; stats["kl"] = KL
    logp = torch.tensor([[-1.0]], dtype=torch.float64)
    loss, stats = policy_loss(logp, logp, logp - LN2, torch.tensor([0.0], dtype=torch.float64),
                              torch.ones(1, 1), torch.ones(1, 1, dtype=torch.float64),
                              LossSettings(beta=0.1, kl_estimator=name))
    assert loss.item() == pytest.approx(0.1 * expected, rel=1e-14)
    assert stats["kl"].item() == pytest.approx(expected, rel=1e-14)


# --------------------------------------------------------------------------------- aggregations

@pytest.mark.parametrize("name, row0, row1, total", [
    # mask lengths [1, 3], T = 4, N = 2, max_tokens = 4
    ("sequence_mean", 1 / 2, 1 / 6, 1.0),   # 1 / (|o_i| N): 1/(1*2), 1/(3*2)
    ("token_mean", 1 / 4, 1 / 4, 1.0),      # 1 / sum|o_i| = 1/4
    ("constant", 1 / 8, 1 / 8, 0.5),        # 1 / (max_tokens N) = 1/8; 4 tokens -> 1/2
    ("sequence_sum", 1 / 2, 1 / 2, 2.0),    # 1 / N; 4 tokens -> 2
])
def test_aggregation_weights(name, row0, row1, total):
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    w = AGGREGATIONS[name](mask, 4)
    assert w.dtype == torch.float32
    assert w.tolist() == [pytest.approx([row0, 0.0, 0.0, 0.0], rel=1e-7, abs=0),
                          pytest.approx([row1, row1, row1, 0.0], rel=1e-7, abs=0)]
    assert w.sum().item() == pytest.approx(total, rel=1e-6)


# ------------------------------------------------------------------------------ importance weights

def test_is_weights_multiply_the_surrogate_not_the_kl():
    # one row of two tokens, ratio 1, A = 1, beta 0.1, k3, weights 1/2 each (sequence mean, N = 1)
    # token 0: logp - ref = ln 2 -> k3 0.1931472, d k3 = 0.5;  is weight 0.5
    # token 1: logp - ref = -ln 2 -> k3 0.3068528, d k3 = -1;  is weight 2
    # loss = -(1/2)[(0.5*1 - 0.1*0.1931472) + (2*1 - 0.1*0.3068528)] = -(1/2)(2.5 - 0.05) = -1.225
    #   (weighting the KL too would give -(1/2)(2.5 - 0.0096574 - 0.0613706) = -1.2144860)
    # gradient -(1/2)[is_t r A - beta d k3_t]: token 0 -(1/2)(0.5 - 0.05) = -0.225,
    #   token 1 -(1/2)(2 + 0.1) = -1.05
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = logp.detach() - torch.tensor([[LN2, -LN2]], dtype=torch.float64)
    loss, _ = policy_loss(logp, logp.detach(), ref, torch.tensor([1.0], dtype=torch.float64),
                          torch.ones(1, 2), torch.full((1, 2), 0.5, dtype=torch.float64), LossSettings(beta=0.1),
                          is_weights=torch.tensor([[0.5, 2.0]], dtype=torch.float64))
    loss.backward()
    assert loss.item() == pytest.approx(-1.225, rel=1e-14)
    assert logp.grad.tolist() == [pytest.approx([-0.225, -1.05], rel=1e-14)]


@pytest.mark.parametrize("keys, floor, cap", [
    ({"algorithm": "cispo"}, None, 1.28),                  # the paper: clipped above only
    ({"loss_type": "cispo"}, None, 1.2),                   # no preset: no lower bound either
    ({"loss_type": "cispo", "epsilon_high": 0.0}, None, 1.2),  # "equal to epsilon" keeps 1.2
    ({"loss_type": "cispo", "epsilon": 0.2}, 0.8, 1.2),    # a lower bound only when asked for
    ({"algorithm": "cispo", "epsilon": 0.2}, 0.8, 1.28),
])
def test_cispo_weight_has_no_lower_bound_unless_epsilon_is_set(keys, floor, cap):
    from grpo.config import build_config
    c = build_config(keys).loss
    # ratio 1/e with A = -1 and ratio e with A = +1: objective sg(w) A logp, so d objective / d logp
    # = w A. No lower bound: w = 1/e = 0.3678794 -> -0.3678794 (with the floor 0.8: -0.8). Above,
    # w = min(e, cap) -> cap. The weight is detached: the gradient is w A, not d(w A logp).
    objective, grad, low, high = surrogate("cispo", [-1.0, 1.0], [-1.0, 1.0],
                                           eps_low=c.epsilon, eps_high=c.epsilon_high or c.epsilon)
    w = floor if floor is not None else math.exp(-1.0)
    assert grad == [pytest.approx(-w, rel=1e-14), pytest.approx(cap, rel=1e-14)]
    assert objective == [0.0, 0.0]        # logp = 0 in `surrogate`
    assert low == [floor is not None, False] and high == [False, True]


# ------------------------------------------------------------- gradient against a naive reference

N_ROWS, T_NAIVE = 8, 6
LENGTHS = [6, 3, 1, 5, 2, 4, 1, 6]
ADV = [1.3, -0.7, 0.4, -1.1, 2.0, -1.6, -0.5, 0.9]
BETA, EPS_LOW, EPS_HIGH, CLIP_C = 0.04, 0.2, 0.28, 3.0
KL_COV_COEF = 0.7


def naive_selected(i, t):
    """The tokens clip_cov and kl_cov treat as selected in these tests: every third one."""
    return (i + t) % 3 == 0


def naive_data():
    rng = random.Random(1)
    logp = [[-rng.uniform(0.05, 3.0) for _ in range(T_NAIVE)] for _ in range(N_ROWS)]
    log_ratio = [[rng.uniform(-1.6, 1.6) for _ in range(T_NAIVE)] for _ in range(N_ROWS)]
    old = [[logp[i][t] - log_ratio[i][t] for t in range(T_NAIVE)] for i in range(N_ROWS)]
    ref = [[logp[i][t] + rng.gauss(0.0, 0.5) for t in range(T_NAIVE)] for i in range(N_ROWS)]
    return logp, old, ref


def clamp(x, lo, hi):
    return min(max(x, lo), hi)


def naive_kl(name, lp, rf):
    """KL value and its derivative in logp, per the docstrings."""
    d = lp - rf
    if name == "k1":
        return d, 1.0
    if name == "k2":
        return 0.5 * d * d, d
    return math.exp(-d) + d - 1, 1 - math.exp(-d)


def naive_loss_and_grad(loss_type, kl_name, logp, old, ref):
    """-(1/N) sum_i 1/|o_i| sum_{t < |o_i|} (term_it - beta KL_it) and its gradient, plain floats.

    clip:      term = min(r A, clip(r) A); d term = r A when the unclipped branch is the min, else 0
    dual_clip: for A < 0, term = max(clip's term, c A); d term = 0 where c A wins
    gspo:      s_i = exp(mean_t (logp - old)); term_it = min(s A, clip(s) A) for every t;
               d (sum_t w_t term_i) / d logp_t = (1/N) * (s A / |o_i| if unclipped else 0)
    cispo:     term = clip(r) A logp with clip(r) a constant; d term = clip(r) A
    sapo:      term = (4/tau) sigmoid(tau (r - 1)) A, tau = 1.0 for A > 0 else 1.05;
               d term = 4 sigmoid (1 - sigmoid) r A
    gmpo:      J_i = A exp(mean_t k_t), k_t = log r_t unless the one-sided log-space clip (eps as a
               log bound) replaced it; term_it = J_i for every t; d / d logp_t = (1/N) J_i / |o_i|
               where k_t is log r_t, else 0
    clip_cov:  term = r A, or 0 on a selected token; d term = r A, or 0
    kl_cov:    term = r A - coef |log r| on a selected token; d term = r A - coef sgn(log r)
    """
    n = len(logp)
    total = 0.0
    grad = [[0.0] * len(logp[0]) for _ in range(n)]
    for i in range(n):
        L, a = LENGTHS[i], ADV[i]
        if loss_type == "gspo":
            s = math.exp(sum(logp[i][t] - old[i][t] for t in range(L)) / L)
            unclipped, clipped = s * a, clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH) * a
            seq_term = min(unclipped, clipped)
            seq_grad = s * a / L if unclipped <= clipped else 0.0
        if loss_type == "gmpo":
            logs = [logp[i][t] - old[i][t] for t in range(L)]
            free = [not ((a > 0 and x > EPS_HIGH) or (a < 0 and x < -EPS_LOW)) for x in logs]
            kept = [x if f else (EPS_HIGH if a > 0 else -EPS_LOW) for x, f in zip(logs, free)]
            seq_term = a * math.exp(sum(kept) / L)
            gmpo_grads = [seq_term / L if f else 0.0 for f in free]
        row = 0.0
        for t in range(L):
            r = math.exp(logp[i][t] - old[i][t])
            if loss_type == "gspo":
                term, dterm_total = seq_term, seq_grad  # seq_grad already summed over the row
            elif loss_type == "gmpo":
                term, dterm_total = seq_term, gmpo_grads[t]
            elif loss_type == "sapo":
                tau = 1.0 if a > 0 else 1.05
                gate = 1 / (1 + math.exp(-tau * (r - 1)))
                term, dterm = 4 / tau * gate * a, 4 * gate * (1 - gate) * r * a
            elif loss_type == "clip_cov":
                term = dterm = 0.0 if naive_selected(i, t) else r * a
            elif loss_type == "kl_cov":
                lr = logp[i][t] - old[i][t]
                term, dterm = r * a, r * a
                if naive_selected(i, t):
                    term, dterm = term - KL_COV_COEF * abs(lr), dterm - KL_COV_COEF * math.copysign(1.0, lr)
            elif loss_type == "cispo":
                term, dterm_total = clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH) * a * logp[i][t], None
                dterm = clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH) * a
            else:
                unclipped, clipped = r * a, clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH) * a
                term, dterm = min(unclipped, clipped), (r * a if unclipped <= clipped else 0.0)
                if loss_type == "dual_clip" and a < 0 and term < CLIP_C * a:
                    term, dterm = CLIP_C * a, 0.0
            kl, dkl = naive_kl(kl_name, logp[i][t], ref[i][t])
            row += term - BETA * kl
            if loss_type in ("gspo", "gmpo"):
                grad[i][t] = -(dterm_total - BETA * dkl / L) / n
            else:
                grad[i][t] = -(dterm - BETA * dkl) / L / n
        total += row / L
    return -total / n, grad


def test_naive_data_cover_every_branch():
    logp, old, _ = naive_data()
    tokens = [(math.exp(logp[i][t] - old[i][t]), ADV[i])
              for i in range(N_ROWS) for t in range(LENGTHS[i])]
    seqs = [(math.exp(sum(logp[i][t] - old[i][t] for t in range(LENGTHS[i])) / LENGTHS[i]), ADV[i])
            for i in range(N_ROWS)]
    for pairs in (tokens, seqs):
        assert any(r > 1 + EPS_HIGH and a > 0 for r, a in pairs)   # high clip acts
        assert any(r > 1 + EPS_HIGH and a < 0 for r, a in pairs)   # high ratio, not clipped
        assert any(r < 1 - EPS_LOW and a < 0 for r, a in pairs)    # low clip acts
        assert any(r < 1 - EPS_LOW and a > 0 for r, a in pairs)    # low ratio, not clipped
        assert any(1 - EPS_LOW < r < 1 + EPS_HIGH for r, a in pairs)
    assert any(r > CLIP_C and a < 0 for r, a in tokens)             # the dual floor acts
    assert any(1 + EPS_HIGH < r < CLIP_C and a < 0 for r, a in tokens)  # ... and does not


@pytest.mark.parametrize("kl_name", list(KL_ESTIMATORS))
@pytest.mark.parametrize("loss_type", list(POLICY_LOSSES))
def test_gradient_matches_naive_reference_float64(loss_type, kl_name):
    logp, old, ref = naive_data()
    expected_loss, expected_grad = naive_loss_and_grad(loss_type, kl_name, logp, old, ref)

    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1 if t < LENGTHS[i] else 0 for t in range(T_NAIVE)] for i in range(N_ROWS)])
    # sequence_mean weights 1/(|o_i| N), built in float64 (the aggregation returns float32)
    weights = torch.tensor([[1.0 / (LENGTHS[i] * N_ROWS) if t < LENGTHS[i] else 0.0
                             for t in range(T_NAIVE)] for i in range(N_ROWS)], dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    selected = torch.tensor([[naive_selected(i, t) for t in range(T_NAIVE)] for i in range(N_ROWS)])
    loss, _ = policy_loss(lp, torch.tensor(old, **f64), torch.tensor(ref, **f64),
                          torch.tensor(ADV, **f64), mask, weights, LossSettings(loss_type=loss_type, beta=BETA,
                          kl_estimator=kl_name, eps_low=EPS_LOW, eps_high=EPS_HIGH, clip_c=CLIP_C,
                          kl_cov_coef=KL_COV_COEF), selected=selected)
    loss.backward()
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor(expected_grad, dtype=torch.float64),
                               rtol=1e-10, atol=1e-15)
    assert (lp.grad[mask == 0] == 0).all()  # padding gets exactly no gradient


def test_k3_on_padding_with_very_negative_logp_does_not_poison_the_loss():
    # accumulate_gradients passes the unmasked logp of padding tokens (log p of the pad token) with
    # ref_logprobs that logprobs_of zeroed there. At a low sampling temperature that logp can be below
    # -88.7, where exp(0 - logp) overflows float32. The padding token has weight 0, so the loss must
    # equal the one with a harmless padding value: one real token, ratio 1, A = 1, logp = ref
    # -> loss = -1 and d loss / d logp = [-1, 0] (k3 and its gradient are 0 at logp = ref).
    logp = torch.tensor([[-1.0, -100.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])
    ref = torch.tensor([[-1.0, 0.0]])
    mask = torch.tensor([[1, 0]])
    loss, stats = policy_loss(logp, old, ref, torch.tensor([1.0]), mask, torch.tensor([[1.0, 0.0]]),
                              LossSettings(beta=0.04, kl_estimator="k3"))
    loss.backward()
    assert loss.item() == -1.0
    assert logp.grad.tolist() == [[-1.0, 0.0]]
    assert stats["kl"].item() == 0.0


# ------------------------------------------------------------------ micro-batching, tiny model

def rollout_with(policy, tok, log_ratios, advantages):
    """The six-row rollout with old = current - log_ratio (so ratio = exp(log_ratio) on real tokens,
    up to float32 recomputation) and a ref off by N(0, 0.2)."""
    rollout = make_rollout(tok)
    assert rollout.completion_mask.sum(-1).tolist() == [5, 2, 3, 4, 1, 5]
    mask = rollout.completion_mask
    current = logprobs_of(policy, rollout, micro_batch_size=6)
    gen = torch.Generator().manual_seed(0)
    rollout.old_logprobs = (current - torch.tensor(log_ratios)) * mask
    rollout.ref_logprobs = (current + 0.2 * torch.randn(current.shape, generator=gen)) * mask
    rollout.advantages = torch.tensor(advantages)
    return rollout


# Per-token log-ratios (padding entries unused). Row means -> sequence ratio s for GSPO:
#   row 0 (A  1.0): mean 0.4   s 1.49 > 1.28, clipped;   token 1.5: ratio 4.48
#   row 1 (A -0.5): mean 1.15  s 3.16, A < 0 unclipped;  tokens e^1.4 = 4.06, e^0.9 = 2.46: one
#                   beyond c = 3 (dual floor), one between 1.28 and 3
#   row 2 (A  0.3): mean -0.25 s 0.78 < 0.8, A > 0 unclipped
#   row 3 (A -1.2): mean -0.175 s 0.84, inside; token -0.5 -> 0.61 < 0.8, A < 0: low clip
#   row 4 (A  0.8): 0.35 -> 1.42, clipped high
#   row 5 (A -0.4): mean -0.3  s 0.74 < 0.8, A < 0: low clip
MIXED_LOG_RATIOS = [[0.5, -0.4, 0.1, 1.5, 0.3],
                    [1.4, 0.9, 0.0, 0.0, 0.0],
                    [-0.6, -0.2, 0.05, 0.0, 0.0],
                    [-0.5, -0.1, -0.3, 0.2, 0.0],
                    [0.35, 0.0, 0.0, 0.0, 0.0],
                    [-0.9, -0.3, 0.2, -0.4, -0.1]]
MIXED_ADV = [1.0, -0.5, 0.3, -1.2, 0.8, -0.4]
LOSS_KW = dict(beta=0.04, kl_estimator="k3", eps_low=0.2, eps_high=0.28, clip_c=3.0)


@pytest.fixture(scope="module")
def mixed_rollout(tiny):
    policy, tok = tiny
    return rollout_with(policy, tok, MIXED_LOG_RATIOS, MIXED_ADV)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("loss_type", list(POLICY_LOSSES))
def test_micro_batching_leaves_loss_and_gradient_unchanged(tiny, mixed_rollout, loss_type,
                                                           aggregation):
    policy, _ = tiny
    kw = dict(aggregation=aggregation, max_tokens=T, loss_type=loss_type, **LOSS_KW)
    if loss_type in ("clip_cov", "kl_cov"):   # the batch's selection, every third token
        kw["selected"] = torch.tensor([[naive_selected(i, t) for t in range(T)] for i in range(6)])
        kw["kl_cov_coef"] = KL_COV_COEF
    whole_grads, whole = grads_and_stats(policy, mixed_rollout, 6, **kw)
    scale = max(g.abs().max().item() for g in whole_grads.values())
    assert scale > 1e-3  # the gradient is not trivially zero
    if loss_type == "sapo":   # a soft gate, no bound: its own diagnostic instead
        assert whole["clip/frac"] == 0 and 0 < whole["sapo/gate_neg"] < 1
    elif loss_type in ("clip_cov", "kl_cov"):   # no clip range at all
        assert whole["clip/frac"] == 0
    else:
        assert 0 < whole["clip/frac"] < 1  # some tokens clipped, some not
    for size in (2, 1):
        grads, stats = grads_and_stats(policy, mixed_rollout, size, **kw)
        assert grads.keys() == whole_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, whole_grads[name], rtol=1e-6, atol=1e-6 * scale,
                                       msg=lambda m: f"micro_batch_size={size}, {name}: {m}")
        # abs 1e-6 for the loss: CISPO's loss sums w c A logp terms with |logp| ~ 4.6 (about 11 in
        # all under sequence_sum) that cancel to ~0.02, so float32 summation order moves it ~4e-7
        assert stats["loss"] == pytest.approx(whole["loss"], rel=1e-6, abs=1e-6), size
        for key in ("kl", "clip/frac_low", "clip/frac_high", "ratio/mean", "entropy",
                    *(k for k in whole if k.startswith("sapo/"))):
            assert stats[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-7), (size, key)


def test_micro_batching_with_is_weights(tiny, mixed_rollout):
    policy, _ = tiny
    gen = torch.Generator().manual_seed(1)
    is_weights = (0.5 + torch.rand(6, T, generator=gen)) * mixed_rollout.completion_mask
    kw = dict(aggregation="token_mean", max_tokens=T, loss_type="clip", is_weights=is_weights,
              **LOSS_KW)
    whole_grads, whole = grads_and_stats(policy, mixed_rollout, 6, **kw)
    plain_grads, plain = grads_and_stats(policy, mixed_rollout, 6, **{**kw, "is_weights": None})
    assert whole["loss"] != pytest.approx(plain["loss"], rel=1e-3)  # the weights do act
    scale = max(g.abs().max().item() for g in whole_grads.values())
    for size in (4, 1):
        grads, stats = grads_and_stats(policy, mixed_rollout, size, **kw)
        for name, g in grads.items():
            torch.testing.assert_close(g, whole_grads[name], rtol=1e-6, atol=1e-6 * scale)
        assert stats["loss"] == pytest.approx(whole["loss"], rel=1e-6)


@pytest.mark.parametrize("loss_type, low, high", [
    # one log-ratio per row, lengths [5, 2, 3, 4, 1, 5] = 20 tokens:
    #   row 0: +1   (ratio e = 2.72),  A +1    row 1: -1 (ratio 0.37), A -0.5
    #   row 2: +1   (ratio e),         A -1    row 3: -1 (ratio 0.37), A +0.8
    #   row 4: 0    (ratio 1),         A +0.5  row 5: +1.5 (ratio 4.48 > c = 3), A -0.4
    # clip:      high row 0 (5), low row 1 (2); rows 2, 5 (A < 0, high ratio), 3 (A > 0, low) not
    ("clip", 2, 5),
    # dual_clip: as clip, plus row 5's 5 tokens floored at c A -> counted high: 10
    #            (row 2's ratio e < 3: no floor)
    ("dual_clip", 2, 10),
    # gspo: a constant log-ratio per row makes s equal to the token ratio: same as clip
    ("gspo", 2, 5),
    # cispo: whatever A: ratio < 0.8 rows 1, 3 (2 + 4 = 6); ratio > 1.28 rows 0, 2, 5 (5 + 3 + 5 = 13)
    ("cispo", 6, 13),
])
def test_clip_fractions_from_accumulate_gradients(tiny, loss_type, low, high):
    policy, tok = tiny
    log_ratios = [[r] * T for r in (1.0, -1.0, 1.0, -1.0, 0.0, 1.5)]
    rollout = rollout_with(policy, tok, log_ratios, [1.0, -0.5, -1.0, 0.8, 0.5, -0.4])
    _, stats = grads_and_stats(policy, rollout, 2, aggregation="sequence_mean", max_tokens=T,
                               loss_type=loss_type, **LOSS_KW)
    assert stats["clip/frac_low"] == pytest.approx(low / 20, abs=1e-12)
    assert stats["clip/frac_high"] == pytest.approx(high / 20, abs=1e-12)
    assert stats["clip/frac"] == pytest.approx((low + high) / 20, abs=1e-12)
    # token ratios: 5e + 2/e + 3e + 4/e + 1 + 5 e^1.5 = 8e + 6/e + 1 + 5 e^1.5
    #   = 21.7462546 + 2.2072766 + 1 + 22.4084454 = 47.3619766 over 20 tokens = 2.3680988
    assert stats["ratio/mean"] == pytest.approx((8 * E + 6 / E + 1 + 5 * math.exp(1.5)) / 20, rel=1e-6)


# ----------------------------------------------------------------------------- SAPO and GMPO

def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_gate_value_and_gradient_by_hand_float64():
    # Three tokens: rho = 1.5 with A = +2 (tau_pos 1), rho = 0.5 with A = -1 (tau_neg 1.05), and
    # rho = 1 with A = +2, where the gate's slope is exactly 1: the plain policy gradient.
    from grpo.algorithm.loss import sapo
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0, 2.0]], dtype=torch.float64)
    sur = sapo(logp, old, adv, torch.ones(1, 3), tau_pos=1.0, tau_neg=1.05)
    s1, s2 = _sigmoid(0.5), _sigmoid(1.05 * -0.5)
    expected = [4 * s1 * 2.0, 4 / 1.05 * s2 * -1.0, 4 * 0.5 * 2.0]       # (4/tau) sigma(tau(rho-1)) A
    assert sur.objective.detach()[0].tolist() == pytest.approx(expected, rel=1e-12)
    sur.objective.sum().backward()
    # d/dlogp = (4/tau) sigma' tau * rho * A = 4 sigma (1 - sigma) rho A
    grads = [4 * s1 * (1 - s1) * 1.5 * 2.0, 4 * s2 * (1 - s2) * 0.5 * -1.0, 2.0]
    assert logp.grad[0].tolist() == pytest.approx(grads, rel=1e-12)
    assert not sur.clipped_low.any() and not sur.clipped_high.any()
    weight, positive = sur.diagnostics["sapo/gate_pos"]
    assert weight[positive].tolist() == pytest.approx([4 * s1 * (1 - s1), 1.0], rel=1e-12)


def test_gmpo_geometric_mean_clipped_in_log_space_by_hand_float64():
    # A = +1, log-ratios [0.1, 0.6], eps 0.4: the second is clipped to 0.4, J = e^(0.25), and only
    # the first token has a gradient, J / 2. A = -1, log-ratios [-0.6, 0.2]: the first is clipped
    # (below -0.4 with A < 0), J = -e^((-0.4 + 0.2) / 2), gradient -e^(-0.1) / 2 on the second.
    from grpo.algorithm.loss import gmpo, policy_loss, sequence_mean_weights
    logp = torch.tensor([[0.1, 0.6], [-0.6, 0.2]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    sur = gmpo(logp, old, adv, torch.ones(2, 2), eps_low=0.4, eps_high=0.4)
    assert sur.objective.detach()[:, 0].tolist() == pytest.approx([math.exp(0.25), -math.exp(-0.1)], rel=1e-12)
    assert sur.clipped_high.tolist() == [[False, True], [False, False]]
    assert sur.clipped_low.tolist() == [[False, False], [True, False]]
    mask = torch.ones(2, 2)
    loss, _ = policy_loss(logp, old, None, adv.squeeze(-1), mask, sequence_mean_weights(mask).double(),
                          LossSettings(loss_type="gmpo", eps_low=0.4, eps_high=0.4))
    assert loss.item() == pytest.approx(-(math.exp(0.25) - math.exp(-0.1)) / 2, rel=1e-12)
    loss.backward()
    # -loss = (J_1 + J_2) / 2 (sequence_mean: each token weighs 1 / (|o| N) and carries its J)
    expected = [[-math.exp(0.25) / 2 / 2, 0.0], [0.0, math.exp(-0.1) / 2 / 2]]
    assert logp.grad.tolist()[0] == pytest.approx(expected[0], rel=1e-12, abs=1e-15)
    assert logp.grad.tolist()[1] == pytest.approx(expected[1], rel=1e-12, abs=1e-15)


def test_gmpo_refuses_per_token_advantages():
    from grpo.algorithm.loss import gmpo
    with pytest.raises(ValueError, match="gmpo needs one advantage per completion"):
        gmpo(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
             eps_low=0.4, eps_high=0.4)


def test_sapo_and_gmpo_presets_set_the_papers_settings():
    from grpo.config import load_config
    sapo = load_config(overrides=["algorithm=sapo"]).loss
    assert (sapo.loss_type, sapo.sapo_tau_pos, sapo.sapo_tau_neg, sapo.beta) == ("sapo", 1.0, 1.05, 0.0)
    gmpo = load_config(overrides=["algorithm=gmpo"]).loss
    assert (gmpo.loss_type, gmpo.epsilon, gmpo.epsilon_high, gmpo.aggregation) == ("gmpo", 0.4, 0.4, "sequence_mean")


# ------------------------------------------------------------------------ Clip-Cov and KL-Cov


def test_token_covariance_by_hand():
    # tokens: log pi [ln .5, ln .25 | ln 1, (pad)], A [1 | -1]. N = 3 counted tokens:
    #   mean log pi = (-ln2 - 2 ln2 + 0) / 3 = -ln2; mean A = (1 + 1 - 1) / 3 = 1/3
    #   Cov = (log pi + ln2) (A - 1/3): [0, -ln2 * 2/3 | ln2 * -4/3, 0]
    from grpo.algorithm.loss import token_covariance
    logp = torch.tensor([[math.log(0.5), math.log(0.25)], [0.0, -7.0]], dtype=torch.float64)
    cov = token_covariance(logp, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([[1, 1], [1, 0]]))
    assert cov.tolist()[0] == pytest.approx([0.0, -LN2 * 2 / 3], abs=1e-15)
    assert cov.tolist()[1] == pytest.approx([-LN2 * 4 / 3, 0.0], abs=1e-15)
    # per-token advantages [N, T] are read token by token
    per_token = token_covariance(logp, torch.tensor([[1.0, 1.0], [-1.0, 5.0]], dtype=torch.float64),
                                 torch.tensor([[1, 1], [1, 0]]))
    torch.testing.assert_close(per_token, cov)


COV = torch.tensor([[3.0, 1.0, 2.0], [5.0, 0.0, -1.0]])


def test_kl_cov_tokens_are_the_top_k_fraction():
    from grpo.algorithm.loss import kl_cov_tokens
    everything = torch.ones(2, 3)
    # floor(0.34 * 6) = 2 tokens: the covariances 5 and 3
    assert kl_cov_tokens(COV, everything, 0.34).tolist() == [[True, False, False], [True, False, False]]
    # floor(0.1 * 6) = 0: none (a batch needs 1 / k tokens for one to be selected)
    assert not kl_cov_tokens(COV, everything, 0.1).any()
    # a token outside the mask is never ranked: without the 5, the 3 and the 2
    masked = torch.tensor([[1, 1, 1], [0, 1, 1]])
    assert kl_cov_tokens(COV, masked, 0.5).tolist() == [[True, False, True], [False, False, False]]


def test_clip_cov_tokens_are_drawn_from_the_band():
    from grpo.algorithm.loss import clip_cov_tokens
    everything = torch.ones(2, 3)
    band = torch.tensor([[True, True, True], [False, False, False]])   # 1 <= cov <= 3
    draws = [clip_cov_tokens(COV, everything, 0.34, 1.0, 3.0, torch.Generator().manual_seed(s))
             for s in range(40)]
    for chosen in draws:
        assert int(chosen.sum()) == 2 and not (chosen & ~band).any()   # floor(0.34 * 6) in the band
    # uniform without replacement: each of the 3 band tokens is left out in some draws
    assert {tuple(d.flatten().tolist()) for d in draws} == {
        (False, True, True, False, False, False), (True, False, True, False, False, False),
        (True, True, False, False, False, False)}
    # the same generator state draws the same tokens (a resumed run selects what the first did)
    again = clip_cov_tokens(COV, everything, 0.34, 1.0, 3.0, torch.Generator().manual_seed(7))
    assert torch.equal(again, draws[7])
    # more asked for than the band holds: the whole band
    assert torch.equal(clip_cov_tokens(COV, everything, 1.0, 1.0, 3.0, torch.Generator()), band)
    # the bounds are inclusive and the mask excludes: 5 alone qualifies for [4, 5]
    assert clip_cov_tokens(COV, everything, 1.0, 4.0, 5.0, torch.Generator()).tolist() == [
        [False, False, False], [True, False, False]]
    assert not clip_cov_tokens(COV, torch.tensor([[1, 1, 1], [0, 1, 1]]), 1.0, 4.0, 5.0,
                               torch.Generator()).any()


def test_clip_cov_detaches_the_selected_tokens_by_hand_float64():
    # rho = [1.5, 0.5, 1], A = [2, -1, 2], the middle token selected:
    #   objective [1.5 * 2, 0, 2] = [3, 0, 2]; d/dlogp (rho A) = rho A -> [3, 0, 2]. No PPO clip:
    #   token 0's ratio 1.5 is beyond 1 + epsilon and keeps its gradient.
    from grpo.algorithm.loss import clip_cov
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], dtype=torch.float64, requires_grad=True)
    sur = clip_cov(logp, torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[2.0, -1.0, 2.0]], dtype=torch.float64),
                   torch.ones(1, 3), selected=torch.tensor([[False, True, False]]))
    assert sur.objective.detach().tolist() == [pytest.approx([3.0, 0.0, 2.0], rel=1e-14)]
    sur.objective.sum().backward()
    assert logp.grad.tolist() == [pytest.approx([3.0, 0.0, 2.0], rel=1e-14)]
    assert not sur.clipped_low.any() and not sur.clipped_high.any()


def test_kl_cov_penalizes_the_selected_tokens_by_hand_float64():
    # rho = [1.5, 0.5, 1], A = [2, -1, 2], tokens 0 and 1 selected, coef 1:
    #   objective [3 - ln 1.5, -0.5 - ln 2, 2]
    #   d/dlogp [rho A - sgn(log rho)] = [3 - 1, -0.5 + 1, 2] = [2, 0.5, 2]
    from grpo.algorithm.loss import kl_cov
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], dtype=torch.float64, requires_grad=True)
    sur = kl_cov(logp, torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[2.0, -1.0, 2.0]], dtype=torch.float64),
                 torch.ones(1, 3), kl_cov_coef=1.0, selected=torch.tensor([[True, True, False]]))
    assert sur.objective.detach().tolist() == [pytest.approx([3 - math.log(1.5), -0.5 - LN2, 2.0], rel=1e-14)]
    sur.objective.sum().backward()
    assert logp.grad.tolist() == [pytest.approx([2.0, 0.5, 2.0], rel=1e-14)]
    # at rho = 1 (pi_theta = pi_old) the term is 0 and so is its gradient: the policy gradient A
    at_one = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    sur = kl_cov(at_one, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64),
                 torch.ones(1, 1), kl_cov_coef=1.0, selected=torch.tensor([[True]]))
    sur.objective.sum().backward()
    assert (sur.objective.item(), at_one.grad.item()) == (2.0, 2.0)


def test_covariance_presets_set_the_papers_settings():
    from grpo.config import load_config
    clip = load_config(overrides=["algorithm=clip_cov"]).loss
    assert (clip.loss_type, clip.clip_cov_fraction, clip.clip_cov_low, clip.clip_cov_high, clip.beta,
            clip.aggregation) == ("clip_cov", 2e-4, 1.0, 5.0, 0.0, "token_mean")
    kl = load_config(overrides=["algorithm=kl_cov"]).loss
    assert (kl.loss_type, kl.kl_cov_fraction, kl.kl_cov_coef, kl.beta, kl.aggregation) == (
        "kl_cov", 2e-3, 1.0, 0.0, "token_mean")


@pytest.mark.parametrize("keys, message", [
    (["clip_cov_fraction=1.5"], "'clip_cov_fraction' must be in \\[0, 1\\], got 1.5: a share of the batch's tokens"),
    (["kl_cov_fraction=-0.1"], "'kl_cov_fraction' must be in \\[0, 1\\], got -0.1: a share"),
    (["clip_cov_low=6", "clip_cov_high=5"], "'clip_cov_low' \\(6.0\\) and 'clip_cov_high' \\(5.0\\)"),
    (["kl_cov_coef=-1"], "'kl_cov_coef' must be 0 or more"),
    (["advantage=reinforce_pp", "turn_rewards=true"], "reinforce_pp builds each token's return"),
])
def test_bad_covariance_and_reinforce_settings_are_named(keys, message):
    from grpo.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=keys)


def test_covariance_selection_leaves_out_environment_tokens_and_unscorable_rows():
    # Two rows, T = 3; token (0, 2) came from the environment (not in the loss mask) with a wild
    # log-prob of -50; row 2 could not be scored. Counted: 5 tokens,
    #   log pi [-1, -1 | -1, -3, -1], A [1, 1 | -1, -1, -1]: means -7/5 = -1.4 and -1/5
    #   Cov = (log pi + 1.4)(A + .2) = [.48, .48 | -.32, 1.28, -.32], mean 1.6 / 5 = .32
    # kl_cov at k = .2 selects floor(.2 * 5) = 1 token: (1, 1). Were the environment token counted
    # (N = 6, means -9.5 and 0), token (0, 0) would lead with Cov 8.5.
    from grpo.config import load_config
    from grpo.run.distributed import World
    from grpo.rollout import Rollout
    from grpo.step import covariance_selection
    r = Rollout.__new__(Rollout)
    r.completion_ids = torch.zeros(3, 3, dtype=torch.long)
    r.completion_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    r.loss_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    r.rewards = torch.tensor([1.0, 0.0, math.nan])
    r.advantages = torch.tensor([1.0, -1.0, 0.0])
    r.old_logprobs = torch.tensor([[-1.0, -1.0, -50.0], [-1.0, -3.0, -1.0], [-9.0, -9.0, -9.0]])
    c = load_config(overrides=["algorithm=kl_cov", "kl_cov_fraction=0.2"])
    chosen, stats = covariance_selection(c, r, World(), step=1)
    assert chosen.tolist() == [[False, False, False], [False, True, False], [False, False, False]]
    assert stats["cov/selected_frac"] == pytest.approx(1 / 5)
    assert stats["cov/mean"] == pytest.approx(0.32, abs=1e-6)
    # clip_cov over the band [.4, 2]: tokens (0, 0), (0, 1), (1, 1) qualify; floor(.6 * 5) = 3
    c = load_config(overrides=["algorithm=clip_cov", "clip_cov_fraction=0.6", "clip_cov_low=0.4",
                               "clip_cov_high=2"])
    chosen, stats = covariance_selection(c, r, World(), step=1)
    assert chosen.tolist() == [[True, True, False], [False, True, False], [False, False, False]]
    assert stats["cov/selected_frac"] == pytest.approx(3 / 5)


@pytest.mark.parametrize("keys, noted", [
    (["algorithm=clip_cov"], True),                              # 2e-4 x 1,024 tokens < 1
    (["algorithm=clip_cov", "clip_cov_fraction=0.001"], False),  # 1.02 tokens: one can be selected
    (["algorithm=kl_cov", "prompts_per_step=4", "num_iterations=2"], True),   # 2e-3 x 256 < 1
    (["algorithm=kl_cov", "num_iterations=2"], False),
    # an episode's policy tokens: 3 turns of 12 -> 16 x 8 x 36 = 4,608 tokens, 2e-4 x 4,608 < 1
    (["algorithm=clip_cov", "environment=guess_number", "max_turns=3", "turn_tokens=12"], True),
    (["algorithm=clip_cov", "environment=guess_number", "max_turns=3", "turn_tokens=12",
      "clip_cov_fraction=0.0003"], False),                       # 1.38 tokens
    (["algorithm=grpo"], False),
])
def test_a_share_that_cannot_select_a_token_is_noted_at_start(keys, noted):
    from grpo.assembly import check_selection
    from grpo.config import load_config
    lines: list[str] = []
    check_selection(load_config(overrides=keys), lines.append)
    assert bool(lines) == noted
    if noted:
        assert "will select none" in lines[0] and "_cov_fraction" in lines[0]


def test_kl_cov_with_one_update_per_batch_is_noted_at_start():
    from grpo.assembly import check_selection
    from grpo.config import load_config
    lines: list[str] = []
    check_selection(load_config(overrides=["algorithm=kl_cov", "num_iterations=1"]), lines.append)
    assert len(lines) == 1 and "num_iterations=1" in lines[0] and "never acts" in lines[0]


def test_gmpo_with_reinforce_pp_returns_is_refused_and_its_baseline_trains_the_counted_tokens():
    from grpo.config import ConfigError, load_config
    from grpo.algorithm.loss import gmpo
    with pytest.raises(ConfigError, match="gmpo takes one advantage per completion"):
        load_config(overrides=["algorithm=reinforce_pp", "loss_type=gmpo"])
    # the baseline variant without KL in the reward: one value per completion on its counted
    # tokens, 0 on padding (as the batch normalization leaves it) -> accepted, A = 2 on row 0
    sur = gmpo(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]]),
               torch.tensor([[1, 1, 0], [1, 1, 1]]), eps_low=0.4, eps_high=0.4)
    assert sur.objective[:, 0].tolist() == [2.0, -1.0]


def test_a_loss_takes_exactly_the_settings_it_uses_and_a_misspelled_one_is_an_error():
    # The losses swallowed unknown settings with **_: a misspelled one was silently dropped.
    import inspect
    taken = {name: [p for p, v in inspect.signature(fn).parameters.items() if v.kind is v.KEYWORD_ONLY]
             for name, fn in POLICY_LOSSES.items()}
    assert taken == {"clip": ["eps_low", "eps_high"], "dual_clip": ["eps_low", "eps_high", "clip_c"],
                     "gspo": ["eps_low", "eps_high"], "cispo": ["eps_low", "eps_high"],
                     "sapo": ["tau_pos", "tau_neg"], "gmpo": ["eps_low", "eps_high"],
                     "clip_cov": ["selected"], "kl_cov": ["selected", "kl_cov_coef"]}
    logp, old = torch.zeros(1, 2), torch.zeros(1, 2)
    with pytest.raises(TypeError, match="clip_c"):
        POLICY_LOSSES["clip"](logp, old, torch.ones(1, 1), torch.ones(1, 2), eps_low=0.2, eps_high=0.2,
                              clip_c=3.0)
    with pytest.raises(TypeError, match="eps_hihg"):
        LossSettings(eps_hihg=0.28)
    with pytest.raises(ValueError, match="'clipp' is not one of"):
        LossSettings(loss_type="clipp")
    with pytest.raises(TypeError, match="eps_hihg"):
        policy_loss(logp, old, None, torch.ones(1), torch.ones(1, 2), torch.ones(1, 2), eps_hihg=0.28)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LossSettings().beta = 1.0
    # sapo reads its temperatures and nothing else: the clip's bounds do not change it
    a = LossSettings(loss_type="sapo", eps_low=0.1, eps_high=0.1)
    b = LossSettings(loss_type="sapo", eps_low=0.3, eps_high=0.5)
    ratio = torch.tensor([[0.3, -0.2]])
    assert torch.equal(loss_surrogate(ratio, old, torch.ones(1, 1), torch.ones(1, 2), a).objective,
                       loss_surrogate(ratio, old, torch.ones(1, 1), torch.ones(1, 2), b).objective)
