"""Group-relative advantages: A_i = (r_i - mean(r)) / (std(r) + eps), sample std, per group id."""

import math

import pytest
import torch

from grpo.algorithm.advantages import ADVANTAGES, group_normalized, zero_std_fraction

NAN = math.nan


def test_hand_computed_group():
    # rewards [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], sum of squares 14,
    # sample var 14/3, std sqrt(14/3) = 2.1602469 -> A = dev / 2.1602469 (eps = 0)
    #   = [-0.9258201, -0.4629100, 0, 1.3887301]
    adv = group_normalized(torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    assert adv.tolist() == pytest.approx([-0.9258201, -0.4629100, 0.0, 1.3887301], abs=1e-6)


def test_binary_group_uses_sample_std():
    # rewards [1, 0, 0, 1]: mean .5, sample std sqrt(1/3) = 0.5773503 -> A = ±0.5/0.5773503 = ±0.8660254
    # (the population std 0.5 would give ±1.0)
    adv = group_normalized(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254], abs=1e-6)


def test_interleaved_groups_are_tracked_by_id():
    # group 7 sits at rows 0, 2, 4 with rewards [1, 2, 3]: mean 2, var (1+0+1)/2 = 1 -> A = [-1, 0, 1]
    # group 3 sits at rows 1, 3, 5 with rewards [0, 0, 6]: mean 2, var (4+4+16)/2 = 12,
    #   std 3.4641016 -> A = [-0.5773503, -0.5773503, 1.1547005]
    # (contiguous blocks [1,0,2] / [0,3,6] would give entirely different numbers)
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0, 6.0])
    group_ids = torch.tensor([7, 3, 7, 3, 7, 3])
    adv = group_normalized(rewards, group_ids, eps=0.0)
    assert adv.tolist() == pytest.approx(
        [-1.0, -0.5773503, 0.0, -0.5773503, 1.0, 1.1547005], abs=1e-6)


def test_all_equal_group_is_exactly_zero():
    # Seven rewards of 0.7 in float32: the naive formula gives r - mean = 5.96e-08 (float rounding of
    # the mean), std ~ 0 -> a spurious A of about 0.056 with eps 1e-6. The group carries no signal, so
    # every advantage must be exactly 0.0. The second group [0, 1] is there to show it is still scored:
    # mean .5, sample std sqrt(.5) = 0.7071068 -> ±0.5/(0.7071068 + 1e-6) = ±0.7071058.
    rewards = torch.tensor([0.7] * 7 + [0.0, 1.0])
    group_ids = torch.tensor([0] * 7 + [1, 1])
    adv = group_normalized(rewards, group_ids, eps=1e-6)
    assert adv[:7].tolist() == [0.0] * 7
    assert adv[7:].tolist() == pytest.approx([-0.7071058, 0.7071058], abs=1e-6)


def test_all_equal_tenths_are_exactly_zero():
    adv = group_normalized(torch.tensor([0.1, 0.1, 0.1]), torch.tensor([2, 2, 2]), eps=1e-6)
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_nan_rewards_are_left_out_and_get_zero():
    # group 0: [1, NaN, 0, 0, 1] -> scorable [1, 0, 0, 1] -> ±0.8660254 as above; the NaN row gets 0.0.
    # If the NaN took part, mean and std would be NaN and every advantage NaN.
    rewards = torch.tensor([1.0, NAN, 0.0, 0.0, 1.0])
    adv = group_normalized(rewards, torch.zeros(5, dtype=torch.long), eps=0.0)
    assert not torch.isnan(adv).any()
    assert adv[1].item() == 0.0
    assert adv[[0, 2, 3, 4]].tolist() == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254],
                                                       abs=1e-6)


def test_group_with_one_scorable_row_gets_zero():
    # group 0 has one scorable reward (2.0): no contrast, sample std undefined -> all 0.
    # group 1 is a single row -> 0. group 2 [0, 4]: mean 2, std sqrt(8) = 2.8284271
    #   -> ±2/(2.8284271 + 1e-6) = ±0.7071065.
    rewards = torch.tensor([NAN, 2.0, NAN, 5.0, 0.0, 4.0])
    group_ids = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = group_normalized(rewards, group_ids, eps=1e-6)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4:].tolist() == pytest.approx([-0.7071065, 0.7071065], abs=1e-6)


def test_all_nan_group_gets_zero():
    adv = group_normalized(torch.tensor([NAN, NAN]), torch.tensor([0, 0]), eps=1e-6)
    assert adv.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("eps, expected", [
    # rewards [0, 2]: mean 1, deviations ±1, sample std sqrt(2) = 1.4142136
    (0.0, 0.7071068),  # 1 / 1.4142136
    (1.0, 0.4142136),  # 1 / (1.4142136 + 1) = sqrt(2) - 1
])
def test_eps_is_added_to_the_std(eps, expected):
    adv = group_normalized(torch.tensor([0.0, 2.0]), torch.tensor([0, 0]), eps=eps)
    assert adv.tolist() == pytest.approx([-expected, expected], abs=1e-6)


def test_registry_entry_is_group_normalized():
    # [1, 0]: mean .5, sample std sqrt(.5) -> ±0.7071068 through the registry the trainer uses.
    adv = ADVANTAGES["group_norm"](torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), 0.0)
    assert adv.tolist() == pytest.approx([0.7071068, -0.7071068], abs=1e-6)


def test_zero_std_fraction():
    # group 0 [1, 1, 1]       flat
    # group 1 [0, 1, 0]       has contrast
    # group 2 [NaN, 1, NaN]   one scorable row -> flat
    # group 3 [.5, .5, NaN]   scorable rows equal -> flat
    # -> 3 of 4 groups flat = 0.75
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, NAN, 1.0, NAN, 0.5, 0.5, NAN])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert zero_std_fraction(rewards, group_ids) == 0.75


def test_zero_std_fraction_interleaved_ids():
    # ids [5, 9, 4, 5, 9, 4], rewards [1, 1, 1, 1, 0, 0]:
    # group 5 = rows 0,3 = [1, 1] flat; group 9 = rows 1,4 = [1, 0]; group 4 = rows 2,5 = [1, 0] -> 1/3
    # (contiguous pairs [1,1] [1,1] [0,0] would all be flat -> 1.0)
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    group_ids = torch.tensor([5, 9, 4, 5, 9, 4])
    assert zero_std_fraction(rewards, group_ids) == pytest.approx(1 / 3, abs=1e-12)
