"""The clipped surrogate, the k3 KL penalty and the sequence-mean aggregation, against hand numbers."""

import math
import random

import pytest
import torch

from grpo.algorithm.loss import AGGREGATIONS, LossSettings, clipped_surrogate_loss, k3_kl, sequence_mean_weights

LN2 = math.log(2.0)
E = math.e


# ---------------------------------------------------------------------------------------- k3 KL

@pytest.mark.parametrize("logp, ref, expected", [
    (0.0, LN2, 0.3068528),    # ref - logp = ln2: e^ln2 - ln2 - 1 = 2 - 0.6931472 - 1
    (LN2, 0.0, 0.1931472),    # ref - logp = -ln2: 0.5 + 0.6931472 - 1
    (-1.7, -1.7, 0.0),        # distributions agree: 1 - 0 - 1
    (0.0, 1.0, E - 2.0),      # ref - logp = 1: e - 1 - 1 = 0.7182818
])
def test_k3_kl_values(logp, ref, expected):
    kl = k3_kl(torch.tensor([logp]), torch.tensor([ref]))
    assert kl.item() == pytest.approx(expected, abs=1e-6)


def test_k3_kl_is_elementwise_and_non_negative():
    logp = torch.tensor([[0.0, LN2], [-3.0, 2.0]])
    ref = torch.tensor([[LN2, 0.0], [-3.0, 0.0]])
    # [[0.3068528, 0.1931472], [0, e^-2 + 2 - 1 = 1.1353353]]
    kl = k3_kl(logp, ref)
    assert kl.tolist() == [pytest.approx([0.3068528, 0.1931472], abs=1e-6),
                           pytest.approx([0.0, 1.1353353], abs=1e-6)]


# ------------------------------------------------------------------- clipping, one token at a time

def one_token(log_ratio, advantage, eps_low=0.2, eps_high=0.2):
    """One completion of one token with weight 1: loss = -term. Returns loss, d loss/d logp, stats."""
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-log_ratio]])  # ratio = exp(logp - old) = exp(log_ratio)
    loss, stats = clipped_surrogate_loss(
        logp, old, None, torch.tensor([advantage]), torch.ones(1, 1), torch.ones(1, 1),
        LossSettings(beta=0.0, eps_low=eps_low, eps_high=eps_high))
    loss.backward()
    return loss.item(), logp.grad.item(), stats


def test_ratio_inside_clip_range():
    # ratio 1.1, A = 2: unclipped = clipped = 2.2 -> loss -2.2; d term/d logp = ratio*A = 2.2
    loss, grad, stats = one_token(math.log(1.1), 2.0)
    assert loss == pytest.approx(-2.2, abs=1e-6)
    assert grad == pytest.approx(-2.2, abs=1e-6)
    assert stats["clip"].item() == 0.0
    assert stats["ratio"].item() == pytest.approx(1.1, abs=1e-6)


def test_ratio_e_positive_advantage_is_clipped():
    # ratio e = 2.7182818, A = 1.5, eps 0.2: min(e*1.5 = 4.0774227, 1.2*1.5 = 1.8) = 1.8
    # -> loss -1.8, and the clipped branch is constant in logp -> zero gradient
    loss, grad, stats = one_token(1.0, 1.5)
    assert loss == pytest.approx(-1.8, abs=1e-6)
    assert grad == 0.0
    assert stats["clip"].item() == 1.0


def test_ratio_e_negative_advantage_is_not_clipped():
    # ratio e, A = -1.5: min(e*-1.5 = -4.0774227, 1.2*-1.5 = -1.8) = -4.0774227 (the unclipped one)
    # -> loss 4.0774227, d loss/d logp = -ratio*A = 4.0774227
    loss, grad, stats = one_token(1.0, -1.5)
    assert loss == pytest.approx(4.0774227, abs=1e-6)
    assert grad == pytest.approx(4.0774227, abs=1e-6)
    assert stats["clip"].item() == 0.0


def test_ratio_inverse_e_negative_advantage_is_clipped():
    # ratio e^-1 = 0.3678794, A = -1.5: min(-0.5518192, 0.8*-1.5 = -1.2) = -1.2 -> loss 1.2, grad 0
    loss, grad, stats = one_token(-1.0, -1.5)
    assert loss == pytest.approx(1.2, abs=1e-6)
    assert grad == 0.0
    assert stats["clip"].item() == 1.0


def test_ratio_inverse_e_positive_advantage_is_not_clipped():
    # ratio e^-1, A = 1.5: clip(e^-1) = 0.8, min(e^-1*1.5 = 0.5518192, 0.8*1.5 = 1.2) = 0.5518192
    # -> loss -0.5518192, d loss/d logp = -ratio*A = -0.5518192
    loss, grad, stats = one_token(-1.0, 1.5)
    assert loss == pytest.approx(-0.5518192, abs=1e-6)
    assert grad == pytest.approx(-0.5518192, abs=1e-6)
    assert stats["clip"].item() == 0.0


@pytest.mark.parametrize("ratio, advantage, expected_term, clipped", [
    (1.25, 1.0, 1.25, 0),    # 1.25 < 1 + 0.28: inside (symmetric 0.2 would clip to 1.2)
    (1.3, 1.0, 1.28, 1),     # 1.3 > 1.28: clipped to 1 + eps_high
    (0.75, -1.0, -0.8, 1),   # 0.75 < 1 - 0.2: clipped to 1 - eps_low: min(-0.75, -0.8) = -0.8
    (0.75, 1.0, 0.75, 0),    # A > 0 and ratio low: the unclipped 0.75 is the min
    (0.78, -1.0, -0.8, 1),   # 0.78 < 0.8 -> still clipped at the low edge (0.72 = 1 - 0.28 is not it)
])
def test_asymmetric_clip_range(ratio, advantage, expected_term, clipped):
    loss, _, stats = one_token(math.log(ratio), advantage, eps_low=0.2, eps_high=0.28)
    assert -loss == pytest.approx(expected_term, abs=1e-6)
    assert stats["clip"].item() == clipped


def test_zero_advantage_gives_zero_loss_and_no_clip():
    # A = 0: both branches are 0 whatever the ratio; nothing counts as clipped.
    loss, grad, stats = one_token(2.0, 0.0)
    assert loss == 0.0 and grad == 0.0
    assert stats["clip"].item() == 0.0


# ------------------------------------------------------------------------------------ aggregation

def test_sequence_mean_weights_lengths_1_and_3():
    # 2 completions, lengths 1 and 3: weight 1/(1*2) = 1/2 on the first's token, 1/(3*2) = 1/6 on
    # each of the second's, 0 on padding; the weights sum to 1.
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    w = sequence_mean_weights(mask)
    assert w.tolist() == [pytest.approx([0.5, 0.0, 0.0], abs=1e-7),
                          pytest.approx([1 / 6, 1 / 6, 1 / 6], abs=1e-7)]
    assert w.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert AGGREGATIONS["sequence_mean"] is sequence_mean_weights


def test_sequence_mean_weights_empty_row_gets_no_weight():
    # An all-padding row has length 0 (clamped to 1 in the division): weight 0 everywhere, and it
    # still counts in the number of completions: the other row (length 2) gets 1/(2*2) = 0.25.
    w = sequence_mean_weights(torch.tensor([[0, 0], [1, 1]]))
    assert w.tolist() == [[0.0, 0.0], [0.25, 0.25]]


# ------------------------------------------------------------------------------ a full example

def full_example():
    """Two completions, T = 3. Row 0: length 1, A = +1. Row 1: length 2, A = -0.5.

    token   logp-old   ratio   ref-logp   k3
    (0,0)   ln 1.1     1.1     ln 2       0.3068528
    (1,0)   1          e       0          0
    (1,1)   -ln 2      0.5     -ln 2      0.1931472
    padding positions carry arbitrary values (one of them would count as clipped) with weight 0.
    """
    logp = torch.tensor([[-1.0, 0.5, 3.0], [-2.0, -1.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.0 - math.log(1.1), 0.0, 0.0], [-3.0, -1.0 + LN2, 0.0]])
    ref = torch.tensor([[-1.0 + LN2, 7.0, -2.0], [-2.0, -1.0 - LN2, 5.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -0.5])
    return logp, old, ref, adv, mask


def test_full_example_loss_stats_and_gradient():
    logp, old, ref, adv, mask = full_example()
    weights = sequence_mean_weights(mask)  # row 0: [1/2, 0, 0]; row 1: [1/4, 1/4, 0]
    loss, stats = clipped_surrogate_loss(logp, old, ref, adv, mask, weights,
                                         LossSettings(beta=0.1, eps_low=0.2, eps_high=0.2))
    # term(0,0) = 1.1*1 - 0.1*0.3068528                          =  1.0693147 (inside the range)
    # term(1,0) = min(e*-0.5, 1.2*-0.5) - 0.1*0 = -1.3591409          (unclipped, A < 0)
    # term(1,1) = min(0.5*-0.5, 0.8*-0.5) - 0.1*0.1931472 = -0.4 - 0.0193147 = -0.4193147 (clipped)
    # objective = 1/2 * 1.0693147 + 1/4 * (-1.3591409 - 0.4193147) = 0.0900435; loss = -0.0900435
    assert loss.item() == pytest.approx(-0.0900435, abs=1e-6)
    # stats are sums over real tokens: 3 tokens; one clipped (1,1) -- padding (1,2) has ratio e^-3
    # and A < 0 but is masked; kl 0.3068528 + 0 + 0.1931472 = 0.5; ratio 1.1 + e + 0.5 = 4.3182818
    assert stats["tokens"].item() == 3.0
    assert stats["clip"].item() == 1.0
    assert stats["kl"].item() == pytest.approx(0.5, abs=1e-6)
    assert stats["ratio"].item() == pytest.approx(4.3182818, abs=1e-6)
    loss.backward()
    # d k3/d logp = 1 - exp(ref - logp); d loss/d logp = -w * (d surrogate - beta * d k3)
    # (0,0): -1/2 * (1.1 - 0.1*(1 - 2))    = -1/2 * 1.2         = -0.6
    # (1,0): -1/4 * (e*-0.5 - 0.1*(1 - 1)) =  1/4 * 1.3591409   =  0.3397852
    # (1,1): -1/4 * (0 - 0.1*(1 - 0.5))    =  1/4 * 0.05        =  0.0125
    # padding: 0
    assert logp.grad.tolist() == [pytest.approx([-0.6, 0.0, 0.0], abs=1e-6),
                                  pytest.approx([0.3397852, 0.0125, 0.0], abs=1e-6)]


def test_beta_zero_ignores_kl_in_the_loss_but_reports_it():
    logp, old, ref, adv, mask = full_example()
    weights = sequence_mean_weights(mask)
    loss, stats = clipped_surrogate_loss(logp, old, ref, adv, mask, weights,
                                         LossSettings(beta=0.0, eps_low=0.2, eps_high=0.2))
    # objective = 1/2 * 1.1 + 1/4 * (-1.3591409 - 0.4) = 0.55 - 0.4397852 = 0.1102148
    assert loss.item() == pytest.approx(-0.1102148, abs=1e-6)
    assert stats["kl"].item() == pytest.approx(0.5, abs=1e-6)


def test_split_rows_sum_to_whole_batch_loss():
    # Weights from the whole batch; rows computed separately must add up to the whole-batch loss.
    logp, old, ref, adv, mask = full_example()
    weights = sequence_mean_weights(mask)
    kw = dict(beta=0.1, eps_low=0.2, eps_high=0.2)
    whole, _ = clipped_surrogate_loss(logp, old, ref, adv, mask, weights, LossSettings(**kw))
    parts = [clipped_surrogate_loss(logp[i:i + 1], old[i:i + 1], ref[i:i + 1], adv[i:i + 1],
                                    mask[i:i + 1], weights[i:i + 1], LossSettings(**kw))[0] for i in range(2)]
    # row 0: -1/2 * 1.0693147 = -0.5346574; row 1: -1/4 * -1.7784556 = 0.4446139
    assert parts[0].item() == pytest.approx(-0.5346574, abs=1e-6)
    assert parts[1].item() == pytest.approx(0.4446139, abs=1e-6)
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), abs=1e-7)


# --------------------------------------------------------------- gradient against a naive version

def naive_loss_and_grad(logp, old, ref, adv, lengths, beta, eps_low, eps_high):
    """Plain-Python GRPO objective and its analytic gradient, in float64.

    objective = 1/n sum_i 1/|o_i| sum_t [min(r A, clip(r) A) - beta k3], r = exp(logp - old)
    d/d logp of the surrogate: r A when the unclipped branch is the min, else 0 (clip constant);
    d/d logp of k3 = exp(ref - logp) - (ref - logp) - 1 is 1 - exp(ref - logp).
    """
    n, T = len(logp), len(logp[0])
    total = 0.0
    grad = [[0.0] * T for _ in range(n)]
    for i in range(n):
        seq = 0.0
        for t in range(lengths[i]):
            r = math.exp(logp[i][t] - old[i][t])
            unclipped = r * adv[i]
            clipped = min(max(r, 1 - eps_low), 1 + eps_high) * adv[i]
            d = ref[i][t] - logp[i][t]
            kl = math.exp(d) - d - 1
            seq += min(unclipped, clipped) - beta * kl
            dsurr = r * adv[i] if unclipped <= clipped else 0.0
            dkl = 1 - math.exp(d)
            grad[i][t] = -(dsurr - beta * dkl) / lengths[i] / n
        total += seq / lengths[i]
    return -total / n, grad


def test_gradient_matches_naive_reference_float64():
    rng = random.Random(1234)
    n, T = 5, 7
    lengths = [7, 3, 1, 5, 2]
    adv = [1.3, -0.7, 0.4, -1.1, 2.0]
    beta, eps_low, eps_high = 0.04, 0.2, 0.28
    logp = [[-rng.uniform(0.05, 3.0) for _ in range(T)] for _ in range(n)]
    old = [[logp[i][t] - rng.gauss(0.0, 0.5) for t in range(T)] for i in range(n)]
    ref = [[logp[i][t] + rng.gauss(0.0, 0.5) for t in range(T)] for i in range(n)]
    # the data exercise both clip edges with both signs of A
    ratios = [(math.exp(logp[i][t] - old[i][t]), adv[i]) for i in range(n) for t in range(lengths[i])]
    assert any(r > 1 + eps_high and a > 0 for r, a in ratios)
    assert any(r > 1 + eps_high and a < 0 for r, a in ratios)
    assert any(r < 1 - eps_low and a < 0 for r, a in ratios)
    assert any(r < 1 - eps_low and a > 0 for r, a in ratios)
    assert any(1 - eps_low < r < 1 + eps_high for r, a in ratios)

    expected_loss, expected_grad = naive_loss_and_grad(logp, old, ref, adv, lengths,
                                                       beta, eps_low, eps_high)

    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1 if t < lengths[i] else 0 for t in range(T)] for i in range(n)])
    # weights 1/(|o_i| n) built in float64 (sequence_mean_weights returns float32)
    weights = torch.tensor([[1.0 / (lengths[i] * n) if t < lengths[i] else 0.0 for t in range(T)]
                            for i in range(n)], dtype=torch.float64)
    loss, _ = clipped_surrogate_loss(
        lp, torch.tensor(old, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64), mask, weights,
        LossSettings(beta=beta, eps_low=eps_low, eps_high=eps_high))
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor(expected_grad, dtype=torch.float64),
                               rtol=1e-10, atol=1e-15)
    # padding positions get exactly no gradient
    assert (lp.grad[mask == 0] == 0).all()
