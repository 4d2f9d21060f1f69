"""Off-policy corrections (corrections.CORRECTIONS): each against numbers derived by hand, in float64.

Three rows of log rho = log pi_old - log pi_behaviour, cap C = 2 (so the band is [0.5, 2]):
    row 0: rho = 0.6, 1.5, 4.0          product 3.6,  geometric mean 3.6^(1/3) = 1.533
    row 1: rho = 0.4, 3.0, 1.0          product 1.2,  geometric mean 1.2^(1/3) = 1.063
    row 2: rho = 0.1, 0.2, (padding)    product 0.02, geometric mean 0.02^(1/2) = 0.141
"""

import math

import pytest
import torch

from grpo.algorithm.corrections import CORRECTIONS
from grpo.algorithm.loss import LossSettings, policy_loss

RHO = [[0.6, 1.5, 4.0, 1.0], [0.4, 3.0, 1.0, 1.0], [0.1, 0.2, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
LOG_RHO = torch.tensor([[math.log(r) for r in row] for row in RHO], dtype=torch.float64)

EXPECTED = {
    # the plain ratio (AReaL's decoupled objective)
    "is": [[0.6, 1.5, 4.0, 0], [0.4, 3.0, 1.0, 0], [0.1, 0.2, 0, 0]],
    # min(rho, 2)
    "tis": [[0.6, 1.5, 2.0, 0], [0.4, 2.0, 1.0, 0], [0.1, 0.2, 0, 0]],
    # rho, 0 where rho > 2
    "token_mis": [[0.6, 1.5, 0, 0], [0.4, 0, 1.0, 0], [0.1, 0.2, 0, 0]],
    # the sequence's product on every token, 0 for the whole row where it is > 2 (3.6)
    "seq_mis": [[0, 0, 0, 0], [1.2, 1.2, 1.2, 0], [0.02, 0.02, 0, 0]],
    # rho inside [0.5, 2], else 0
    "icepop": [[0.6, 1.5, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 0]],
    # 1 where the geometric mean is inside [0.5, 2], the whole row 0 otherwise (0.141)
    "geo_mask": [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_correction_gives_the_hand_derived_weights(name):
    got = CORRECTIONS[name](LOG_RHO, MASK, 2.0)
    assert got.dtype == torch.float64
    assert torch.allclose(got, torch.tensor(EXPECTED[name], dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_the_table_has_every_documented_correction():
    assert set(CORRECTIONS) == set(EXPECTED)


def test_a_long_sequence_whose_ratio_overflows_is_masked_not_infinite():
    log_rho = torch.full((1, 4000), 0.5, dtype=torch.float64)      # product e^2000: inf in float64
    mask = torch.ones(1, 4000)
    assert torch.equal(CORRECTIONS["seq_mis"](log_rho, mask, 2.0), torch.zeros(1, 4000, dtype=torch.float64))
    assert torch.isfinite(CORRECTIONS["tis"](log_rho * 2000, mask, 2.0)).all()


def test_the_decoupled_objective_weighs_the_clipped_term_by_pi_prox_over_pi_behaviour():
    # pi_theta = 0.3, pi_prox = 0.25, pi_behaviour = 0.2, A = 1, eps = 0.2:
    # u = 0.3 / 0.25 = 1.2 = 1 + eps, so min(u A, clip(u) A) = 1.2; the weight 0.25 / 0.2 = 1.25
    # gives an objective of 1.5 (loss -1.5); truncated at C = 1.1 it is 1.32.
    logp = torch.tensor([[math.log(0.3)]], dtype=torch.float64)
    prox = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    behaviour = torch.tensor([[math.log(0.2)]], dtype=torch.float64)
    mask, agg = torch.ones(1, 1), torch.ones(1, 1, dtype=torch.float64)
    for name, cap, expected in (("is", 2.0, -1.5), ("tis", 1.1, -1.32)):
        w = CORRECTIONS[name](prox - behaviour, mask, cap)
        loss, _ = policy_loss(logp, prox, None, torch.ones(1, dtype=torch.float64), mask, agg,
                              LossSettings(eps_low=0.2, eps_high=0.2), is_weights=w)
        assert loss.item() == pytest.approx(expected, rel=1e-12)


# A lower threshold, as verl's rollout_rs_threshold_lower: the same three rows, each correction
# with a band of its own.
LOW_EXPECTED = {
    # [0.5, 2]: row 0 keeps 0.6 and 1.5 (4.0 > 2); row 1 loses 0.4 (< 0.5) and 3.0; row 2 loses both
    ("token_mis", 0.5, 2.0): [[0.6, 1.5, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 0]],
    # [0.5, 2] on the product: 3.6 above, 1.2 inside, 0.02 below (kept without a lower bound)
    ("seq_mis", 0.5, 2.0): [[0, 0, 0, 0], [1.2, 1.2, 1.2, 0], [0, 0, 0, 0]],
    # IcePop's band [0.5, 5]: 4.0 and 3.0 are inside it now, 0.4 is still below
    ("icepop", 0.5, 5.0): [[0.6, 1.5, 4.0, 0], [0, 3.0, 1.0, 0], [0, 0, 0, 0]],
    # [0.1, 2] on the geometric mean: 0.141 is inside (outside [1/2, 2], the default band)
    ("geo_mask", 0.1, 2.0): [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]],
}


@pytest.mark.parametrize("name, low, cap", sorted(LOW_EXPECTED))
def test_a_lower_threshold_masks_ratios_below_it(name, low, cap):
    got = CORRECTIONS[name](LOG_RHO, MASK, cap, low)
    assert got.dtype == torch.float64
    expected = torch.tensor(LOW_EXPECTED[(name, low, cap)], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["token_mis", "seq_mis", "icepop", "geo_mask"])
def test_a_lower_threshold_of_0_is_each_methods_own(name):
    assert torch.equal(CORRECTIONS[name](LOG_RHO, MASK, 2.0, 0.0), CORRECTIONS[name](LOG_RHO, MASK, 2.0))
    assert torch.allclose(CORRECTIONS[name](LOG_RHO, MASK, 2.0), torch.tensor(EXPECTED[name], dtype=torch.float64),
                          rtol=1e-12, atol=1e-15)


def test_a_verl_band_carries_over_from_the_config():
    from types import SimpleNamespace
    from grpo.config import ConfigError, build_config
    from grpo.config.plan import correction_of
    from grpo.step import off_policy_weights
    c = build_config({"correction": "icepop", "correction_cap": 5, "correction_cap_low": 0.5})
    assert correction_of(c) == ("icepop", 5.0, 0.5)
    rollout = SimpleNamespace(completion_mask=MASK, old_logprobs=LOG_RHO,
                              sampler_logprobs=torch.zeros_like(LOG_RHO))
    weights, stats = off_policy_weights(rollout, *correction_of(c))
    assert torch.allclose(weights, torch.tensor(LOW_EXPECTED[("icepop", 0.5, 5.0)], dtype=torch.float64),
                          rtol=1e-12, atol=1e-15)
    assert stats["offpolicy/masked_frac"] == 3 / 8        # 0.4, 0.1 and 0.2 of the 8 real tokens
    assert correction_of(build_config({"correction": "seq_mis"})) == ("seq_mis", 2.0, 0.0)
    with pytest.raises(ConfigError, match=r"^config key 'correction_cap_low' must be in \[0, 1\), got 1.5"):
        build_config({"correction": "icepop", "correction_cap_low": 1.5})
    with pytest.raises(ConfigError, match=r"^config key 'correction_cap_low' masks ratios below it, and "
                                          r"correction=tis masks none"):
        build_config({"correction": "tis", "correction_cap_low": 0.5})
