"""The other advantage estimators (Dr. GRPO, batch scale, RLOO, REINFORCE++ and its baseline
variant) and process supervision, by hand."""

import math

import pytest
import torch

from grpo.algorithm.advantages import (ADVANTAGES, batch_scaled, batch_token_normalized,
                                       group_centered, group_normalized, leave_one_out,
                                       process_supervision, reinforce_baseline, reinforce_outcome,
                                       token_returns, zero_std_fraction)

NAN = math.nan


# ------------------------------------------------------------------------ group_centered (Dr. GRPO)

def test_group_centered_subtracts_the_group_mean_only():
    # group 0 [1, 2, 3, 6]: mean 3 -> [-2, -1, 0, 3]; group 1 [0, 10]: mean 5 -> [-5, 5].
    # No division: group_normalized would give [-0.9258201, ...] and [±0.7071068].
    # eps is not used (there is no std to add it to), so eps = 1 changes nothing.
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 10.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    for eps in (0.0, 1.0):
        adv = group_centered(rewards, group_ids, eps=eps)
        assert adv.tolist() == [-2.0, -1.0, 0.0, 3.0, -5.0, 5.0]  # exact in float32


# ------------------------------------------------------------------------------- batch_scaled

def test_batch_scaled_divides_by_the_whole_batch_std():
    # group 0 [1, 0], group 1 [3, 1]; centered within the group: [.5, -.5] and [1, -1].
    # batch [1, 0, 3, 1]: mean 5/4, deviations [-.25, -1.25, 1.75, -.25], squares
    #   .0625 + 1.5625 + 3.0625 + .0625 = 4.75, sample var 4.75/3 = 1.5833333, std 1.2583057
    # -> A = [.5, -.5, 1, -1] / 1.2583057 = [0.3973597, -0.3973597, 0.7947194, -0.7947194]
    # (per-group std would give ±0.7071068 for both groups)
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    adv = batch_scaled(rewards, group_ids, eps=0.0)
    assert adv.tolist() == pytest.approx([0.3973597, -0.3973597, 0.7947194, -0.7947194], abs=1e-6)
    # eps is added to the batch std: 1 / (1.2583057 + 1) = 0.4428098 -> [.5, -.5, 1, -1] * that
    adv = batch_scaled(rewards, group_ids, eps=1.0)
    assert adv.tolist() == pytest.approx([0.2214049, -0.2214049, 0.4428098, -0.4428098], abs=1e-6)


def test_batch_scaled_std_counts_flat_groups_but_not_nan_rows():
    # group 0 [1, 0, NaN], group 1 [3, 1], group 2 [2, 2] (flat).
    # scorable [1, 0, 3, 1, 2, 2]: mean 9/6 = 1.5, deviations [-.5, -1.5, 1.5, -.5, .5, .5],
    #   squares .25 + 2.25 + 2.25 + .25 + .25 + .25 = 5.5, sample var 5.5/5 = 1.1, std 1.0488088
    # -> group 0 [.5, -.5, 0] / 1.0488088 = [0.4767313, -0.4767313, 0]; group 1 [±1] -> ±0.9534626;
    #    the flat group 2 still gets exactly 0 and the NaN row exactly 0.
    rewards = torch.tensor([1.0, 0.0, NAN, 3.0, 1.0, 2.0, 2.0])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    adv = batch_scaled(rewards, group_ids, eps=0.0)
    assert adv[[0, 1, 3, 4]].tolist() == pytest.approx([0.4767313, -0.4767313, 0.9534626, -0.9534626],
                                                       abs=1e-6)
    assert adv[[2, 5, 6]].tolist() == [0.0, 0.0, 0.0]


def test_batch_scaled_with_fewer_than_two_scorable_rewards_is_zero():
    # one scorable reward: no std at all -> every advantage 0 (no NaN from std of one element)
    adv = batch_scaled(torch.tensor([NAN, 1.0, NAN]), torch.tensor([0, 0, 0]), eps=1e-6)
    assert adv.tolist() == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------------------ leave_one_out

def test_leave_one_out_binary_group():
    # [1, 0, 0, 1]: r_i - mean of the other three:
    #   1 - (0+0+1)/3 = 2/3;  0 - (1+0+1)/3 = -2/3  -> [2/3, -2/3, -2/3, 2/3]
    # (= k/(k-1) (r - mean) = 4/3 * ±.5)
    adv = leave_one_out(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-7)


def test_leave_one_out_counts_scorable_members_only():
    # [1, NaN, 0, 1]: scorable [1, 0, 1], k = 3:
    #   row 0: 1 - (0+1)/2 = .5;  row 2: 0 - (1+1)/2 = -1;  row 3: 1 - (1+0)/2 = .5;  NaN row: 0
    # (k = 4 with the NaN row counted would give (4*1 - 2)/3 = 2/3 for row 0)
    adv = leave_one_out(torch.tensor([1.0, NAN, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    assert adv.tolist() == [0.5, 0.0, -1.0, 0.5]  # exact: (3 - 2)/2, (0 - 2)/2


def test_leave_one_out_unequal_rewards():
    # [2, 5, 11]: 2 - (5+11)/2 = -6; 5 - (2+11)/2 = -1.5; 11 - (2+5)/2 = 7.5; they sum to 0
    adv = leave_one_out(torch.tensor([2.0, 5.0, 11.0]), torch.tensor([1, 1, 1]), eps=0.0)
    assert adv.tolist() == [-6.0, -1.5, 7.5]


# ------------------------------------------------------------------ shared rules, every estimator

def test_registry_names():
    assert ADVANTAGES == {"group_norm": group_normalized, "group_mean": group_centered,
                          "batch_norm": batch_scaled, "rloo": leave_one_out,
                          "reinforce_pp": reinforce_outcome,
                          "reinforce_pp_baseline": reinforce_baseline}


@pytest.mark.parametrize("name, contrast", [
    # the contrast group [0, 1], eps = 0:
    ("group_norm", 0.7071068),  # ±.5 / sqrt(.5)
    ("group_mean", 0.5),        # ±.5
    ("reinforce_pp_baseline", 0.5),   # the group mean only, as group_mean (normalized later)
    ("rloo", 1.0),              # 1 - 0, 0 - 1
    # batch [0.7 x7, 0, 1]: mean 5.9/9; sum of squared deviations = sum r^2 - 9 mean^2
    #   = 7*.49 + 1 - 5.9^2/9 = 4.43 - 3.8677778 = 0.5622222; var /8 = 0.0702778, std 0.2650996
    #   -> ±.5 / 0.2650996 = ±1.8860838
    ("batch_norm", 1.8860838),
])
def test_all_equal_group_is_exactly_zero(name, contrast):
    # Seven rewards of 0.7 in float32: r - mean is 5.96e-08, not 0, by rounding of the mean; the group
    # carries no signal, so every advantage must be exactly 0.0 whatever the estimator.
    rewards = torch.tensor([0.7] * 7 + [0.0, 1.0])
    group_ids = torch.tensor([0] * 7 + [1, 1])
    adv = ADVANTAGES[name](rewards, group_ids, 0.0)
    assert adv[:7].tolist() == [0.0] * 7
    assert adv[7:].tolist() == pytest.approx([-contrast, contrast], rel=1e-6)


@pytest.mark.parametrize("name, a", [
    # group 0 [1, NaN, 0, 0, 1] -> scorable [1, 0, 0, 1]; group 1 all NaN; group 2 [NaN, 1] (one row)
    ("group_norm", 0.8660254),  # ±.5 / sqrt(1/3)
    ("group_mean", 0.5),
    ("reinforce_pp_baseline", 0.5),
    ("rloo", 2 / 3),            # k = 4 scorable: 4/3 * .5
    # batch scorable [1, 0, 0, 1, 1] (group 2's single reward counts): mean .6, squares
    #   .16 + .36 + .36 + .16 + .16 = 1.2, var 1.2/4 = .3, std 0.5477226 -> ±.5/0.5477226 = ±0.9128709
    ("batch_norm", 0.9128709),
])
def test_nan_rows_get_exactly_zero(name, a):
    rewards = torch.tensor([1.0, NAN, 0.0, 0.0, 1.0, NAN, NAN, NAN, 1.0])
    group_ids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 2])
    adv = ADVANTAGES[name](rewards, group_ids, 0.0)
    assert not torch.isnan(adv).any()
    assert adv[[1, 5, 6, 7, 8]].tolist() == [0.0] * 5
    assert adv[[0, 2, 3, 4]].tolist() == pytest.approx([a, -a, -a, a], rel=1e-6)


@pytest.mark.parametrize("name, expected", [
    # group 7 = rows 0, 2, 4 = [1, 2, 3]: mean 2, centered [-1, 0, 1]
    # group 3 = rows 1, 3, 5 = [0, 0, 6]: mean 2, centered [-2, -2, 4]
    ("group_mean", [-1.0, -2.0, 0.0, -2.0, 1.0, 4.0]),
    ("reinforce_pp_baseline", [-1.0, -2.0, 0.0, -2.0, 1.0, 4.0]),
    # group std: group 7 var (1+0+1)/2 = 1; group 3 var (4+4+16)/2 = 12, std 3.4641016
    ("group_norm", [-1.0, -0.5773503, 0.0, -0.5773503, 1.0, 1.1547005]),
    # k = 3: 3/2 * centered
    ("rloo", [-1.5, -3.0, 0.0, -3.0, 1.5, 6.0]),
    # batch [1, 0, 2, 0, 3, 6]: mean 2, squares 1+4+0+4+1+16 = 26, var 26/5 = 5.2, std 2.2803509
    #   -> centered / 2.2803509
    ("batch_norm", [-0.4385290, -0.8770580, 0.0, -0.8770580, 0.4385290, 1.7541160]),
])
def test_interleaved_groups_are_tracked_by_id(name, expected):
    # (contiguous blocks [1, 0, 2] / [0, 3, 6] would give different numbers for every estimator)
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0, 6.0])
    group_ids = torch.tensor([7, 3, 7, 3, 7, 3])
    adv = ADVANTAGES[name](rewards, group_ids, 0.0)
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------------- process supervision

S = 1 / math.sqrt(3)  # 0.5773503


def test_process_supervision_hand_example():
    # One group, two completions, T = 4.
    #   completion 0: step rewards [1, 0] ending at tokens [1, 3]; completion 1: [0] ending at 2.
    # pooled [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3], squares 4/9 + 1/9 + 1/9 = 2/3,
    #   sample var 1/3, std sqrt(1/3) = 0.5773503 (eps 0)
    #   -> r~ = [2/3 / 0.5773503, -1/3 / 0.5773503, same] = [1.1547005, -0.5773503, -0.5773503]
    # token t gets the sum of r~ over its completion's steps ending at or after t:
    #   completion 0: t = 0, 1: 1.1547005 - 0.5773503 = 0.5773503;  t = 2, 3: -0.5773503
    #   completion 1: t = 0, 1, 2: -0.5773503;  t = 3 (after its last step): 0
    adv = process_supervision([[1.0, 0.0], [0.0]], [[1, 3], [2]], torch.tensor([0, 0]), T=4, eps=0.0)
    assert adv.shape == (2, 4) and adv.dtype == torch.float32
    assert adv.tolist() == [pytest.approx([S, S, -S, -S], abs=1e-6),
                            pytest.approx([-S, -S, -S, 0.0], abs=1e-6)]


def test_process_supervision_groups_do_not_mix():
    # The example above as group 4 (rows 0, 2), interleaved with group 9 (rows 1, 3):
    #   row 1: [5] ending at 0; row 3: [1, 3] ending at [1, 3].
    # group 9 pooled [5, 1, 3]: mean 3, deviations [2, -2, 0], var (4+4+0)/2 = 4, std 2
    #   -> r~ = [1, -1, 0]
    #   row 1: t = 0: 1; t = 1..3: 0.   row 3: t = 0, 1: -1 + 0 = -1; t = 2, 3: 0
    # group 4's rows are unchanged from the single-group example (pooling all six step rewards
    # [1, 0, 5, 0, 1, 3] would change every number).
    adv = process_supervision([[1.0, 0.0], [5.0], [0.0], [1.0, 3.0]], [[1, 3], [0], [2], [1, 3]],
                              torch.tensor([4, 9, 4, 9]), T=4, eps=0.0)
    assert adv.tolist() == [pytest.approx([S, S, -S, -S], abs=1e-6),
                            [1.0, 0.0, 0.0, 0.0],
                            pytest.approx([-S, -S, -S, 0.0], abs=1e-6),
                            [-1.0, -1.0, 0.0, 0.0]]


def test_process_supervision_eps_is_added_to_the_std():
    # group 9 of the previous example alone, eps = 1: r~ = [2, -2, 0] / (2 + 1) = [2/3, -2/3, 0]
    #   row 0: t = 0: 2/3; row 1: t = 0, 1: -2/3
    adv = process_supervision([[5.0], [1.0, 3.0]], [[0], [1, 3]], torch.tensor([9, 9]), T=4, eps=1.0)
    assert adv.tolist() == [pytest.approx([2 / 3, 0.0, 0.0, 0.0], abs=1e-7),
                            pytest.approx([-2 / 3, -2 / 3, 0.0, 0.0], abs=1e-7)]


def test_process_supervision_all_equal_pooled_rewards_give_zeros():
    # group 0 pooled [0.1, 0.1, 0.1] (float rounding must not leak a tiny advantage): all 0.
    # group 1 pooled [1] (one step): no std -> all 0.
    adv = process_supervision([[0.1, 0.1], [0.1], [1.0]], [[0, 2], [1], [3]],
                              torch.tensor([0, 0, 1]), T=4, eps=1e-6)
    assert adv.tolist() == [[0.0] * 4] * 3


# ---------------------------------------------------------------------------- zero_std_fraction

def test_zero_std_fraction_with_float_rounding_nan_and_interleaving():
    # ids [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]:
    #   group 0 rows 0, 4, 8 = [.7, .7, .7]   flat (rounding in the mean must not count as contrast)
    #   group 1 rows 1, 5, 9 = [0, 1, NaN]    contrast
    #   group 2 rows 2, 6    = [NaN, .3]      one scorable row -> flat
    #   group 3 rows 3, 7    = [NaN, NaN]     nothing scorable -> flat
    # -> 3 of 4 = 0.75
    rewards = torch.tensor([0.7, 0.0, NAN, NAN, 0.7, 1.0, 0.3, NAN, 0.7, NAN])
    group_ids = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    assert zero_std_fraction(rewards, group_ids) == 0.75
    # and every estimator that compares within the group agrees: only group 1's rows are nonzero
    # (reinforce_pp has no group baseline: its outcome is the reward itself)
    for name, fn in ADVANTAGES.items():
        if name == "reinforce_pp":
            continue
        adv = fn(rewards, group_ids, 0.0)
        assert (adv != 0).tolist() == [False, True, False, False, False, True, False, False, False,
                                       False]


# ------------------------------------------------------------------------------- REINFORCE++

def test_reinforce_outcome_is_the_reward_with_unscorable_rows_at_zero():
    # no baseline: a group whose rewards are all equal keeps them (the batch normalization that
    # follows centres the whole batch, not the group)
    adv = reinforce_outcome(torch.tensor([1.0, 1.0, NAN, 0.5]), torch.tensor([0, 0, 1, 1]), 0.0)
    assert adv.tolist() == [1.0, 1.0, 0.0, 0.5]


def test_token_returns_subtract_the_kl_of_the_later_tokens():
    # outcome [1, 0], beta 0.5, per-token KL [[.1, .2, .3], [.5, -.1, (pad)]]:
    #   row 0: suffix sums [.6, .5, .3] -> 1 - .5 * [.6, .5, .3] = [.7, .75, .85]
    #   row 1: suffix sums [.4, -.1]    -> 0 - .5 * [.4, -.1]    = [-.2, .05], padding 0
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, -0.1, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    returns = token_returns(torch.tensor([1.0, 0.0], dtype=torch.float64), kl, 0.5, mask)
    assert returns.tolist()[0] == pytest.approx([0.7, 0.75, 0.85], abs=1e-12)
    assert returns.tolist()[1] == pytest.approx([-0.2, 0.05, 0.0], abs=1e-12)
    # no KL (beta 0, or no reference): every token of a completion carries its outcome
    plain = token_returns(torch.tensor([1.0, 0.0], dtype=torch.float64), kl, 0.0, mask)
    assert plain.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_batch_token_normalized_by_hand():
    # the five counted tokens of the test above: [.7, .75, .85, -.2, .05], sum 2.15, mean .43;
    # deviations [.27, .32, .42, -.63, -.38], squares sum .0729 + .1024 + .1764 + .3969 + .1444
    # = .893, sample variance .893 / 4 = .22325, std .4724934
    adv = torch.tensor([[0.7, 0.75, 0.85], [-0.2, 0.05, 123.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    std = math.sqrt(0.22325)
    out = batch_token_normalized(adv, mask, eps=0.0)
    expected = [[0.27 / std, 0.32 / std, 0.42 / std], [-0.63 / std, -0.38 / std, 0.0]]
    for row, want in zip(out.tolist(), expected):
        assert row == pytest.approx(want, abs=1e-12)
    with_eps = batch_token_normalized(adv, mask, eps=0.1)
    assert with_eps[0, 0].item() == pytest.approx(0.27 / (std + 0.1), abs=1e-12)
    # fewer than two counted tokens: no statistic, every advantage 0
    assert batch_token_normalized(adv, torch.tensor([[1, 0, 0], [0, 0, 0]]), 0.0).abs().sum() == 0


def test_batch_token_normalized_sums_over_processes_through_reduce():
    # Two halves of one batch, each normalized with the other's sums added by `reduce` (what
    # distributed.sum_values does over processes), equal the whole batch normalized at once.
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).long()
    whole = batch_token_normalized(adv, mask, eps=1e-4)
    halves = [(adv[:3], mask[:3]), (adv[3:], mask[3:])]
    calls: list[dict] = []

    def sums_of(a, m):   # what each process contributes, in the order the function asks
        m = m.bool()
        a = a.masked_fill(~m, 0.0)
        n, total = float(m.sum()), float(a.sum())
        return [{"n": n, "sum": total}, lambda mean: {"squares": float(((a - mean) ** 2).masked_fill(~m, 0).sum())}]

    parts = [sums_of(a, m) for a, m in halves]
    first = {k: parts[0][0][k] + parts[1][0][k] for k in ("n", "sum")}
    mean = first["sum"] / first["n"]
    second = {"squares": parts[0][1](mean)["squares"] + parts[1][1](mean)["squares"]}

    def reduce(local: dict) -> dict:
        calls.append(local)
        return first if "n" in local else second

    for (a, m), rows in zip(halves, (slice(0, 3), slice(3, 6))):
        torch.testing.assert_close(batch_token_normalized(a, m, eps=1e-4, reduce=reduce), whole[rows],
                                   rtol=0, atol=1e-12)
    assert [sorted(c) for c in calls] == [["n", "sum"], ["squares"]] * 2


def test_reinforce_pp_advantages_in_a_step_by_hand(tmp_path):
    # set_advantages on a rollout whose rewards, log-probs and mask are set by hand: two rows of
    # one group, rewards [1, 0], beta 0.5, k1 KL = old - ref per token.
    from grpo.config import load_config
    from grpo.config.plan import plan_of
    from grpo.rollout import Rollout
    from grpo.step import set_advantages
    from grpo.run.distributed import World
    c = load_config(overrides=["algorithm=reinforce_pp", "beta=0.5", "advantage_eps=0"])
    r = Rollout.__new__(Rollout)
    r.rewards = torch.tensor([1.0, 0.0])
    r.group_ids = torch.tensor([0, 0])
    r.completion_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r.loss_mask = None
    r.old_logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0]])
    r.ref_logprobs = torch.tensor([[-1.1, -2.2, -0.8], [-2.0, -0.9, 0.0]])
    extra = set_advantages(c, r, None, World(), plan_of(c))
    # KL [[.1, .2, .3], [.5, -.1]] -> returns [.7, .75, .85, -.2, .05] as above, then normalized
    std = math.sqrt(0.22325)
    expected = [[0.27 / std, 0.32 / std, 0.42 / std], [-0.63 / std, -0.38 / std, 0.0]]
    for row, want in zip(r.advantages.tolist(), expected):
        assert row == pytest.approx(want, abs=1e-5)
    # kl_reward/mean: beta * sum KL per row, [.3, .2] -> .25
    assert extra["kl_reward/mean"] == pytest.approx(0.25, abs=1e-6)
    # the baseline variant: r - mean_group = [.5, -.5] on every token, then normalized: the five
    # tokens [.5, .5, .5, -.5, -.5] have mean .1, deviations [.4, .4, .4, -.6, -.6], squares 1.2,
    # variance .3, std .5477226; its KL is a k2 loss term, not in the reward
    c = load_config(overrides=["algorithm=reinforce_pp_baseline", "advantage_eps=0"])
    assert (c.loss.kl_in_reward, c.loss.kl_estimator) == (False, "k2")
    extra = set_advantages(c, r, None, World(), plan_of(c))
    s = math.sqrt(0.3)
    assert r.advantages.tolist()[0] == pytest.approx([0.4 / s] * 3, abs=1e-6)
    assert r.advantages.tolist()[1] == pytest.approx([-0.6 / s, -0.6 / s, 0.0], abs=1e-6)
    assert "kl_reward/mean" not in extra
    # without the batch normalization the raw returns stay
    c = load_config(overrides=["algorithm=reinforce_pp_baseline", "reinforce_pp_batch_norm=false"])
    set_advantages(c, r, None, World(), plan_of(c))
    assert r.advantages.tolist() == [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]


def test_reinforce_pp_baseline_loss_value_and_gradient_by_hand_float64():
    # One completion of two tokens at ratio 1 (the first update), per-token advantages [1.5, -0.5]
    # (as set_advantages leaves them), the k2 KL term with beta 0.1 and log(pi / pi_ref) = [.5, -.2],
    # sequence_mean weights 1/2:
    #   -loss = 1/2 [(1.5 - .1 * .5 * .25) + (-.5 - .1 * .5 * .04)] = 1/2 (1.4875 - .502) = .49275
    #   d loss / d logp_t = -1/2 (A_t - beta * d_t) = [-1/2 (1.5 - .05), -1/2 (-.5 + .02)] = [-.725, .24]
    from grpo.algorithm.loss import LossSettings, policy_loss, sequence_mean_weights
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.8]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    loss, _ = policy_loss(logp, logp.detach(), ref, torch.tensor([[1.5, -0.5]], dtype=torch.float64),
                          mask, sequence_mean_weights(mask).double(), LossSettings(loss_type="clip", beta=0.1,
                          kl_estimator="k2", eps_low=0.2, eps_high=0.2))
    assert loss.item() == pytest.approx(-0.49275, rel=1e-12)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx([-0.725, 0.24], rel=1e-12)]
