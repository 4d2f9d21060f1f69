"""The plan (config/plan.py): each decision the config makes about the algorithm, made once."""

import pytest

from grpo.algorithm import loss
from grpo.config import build_config
from grpo.config.plan import COVARIANCE_LOSSES, plan_of


def plan(**keys):
    return plan_of(build_config(keys))


def test_the_reference_and_where_the_kl_acts():
    assert (plan(beta=0.0).reference, plan(beta=0.0).kl_in) == ("none", "none")
    assert (plan(beta=0.04).reference, plan(beta=0.04).kl_in) == ("copy", "loss")
    assert (plan(beta=0.04, lora_r=8).reference, plan(beta=0.04, lora_r=8).kl_in) == ("adapter_off", "loss")
    assert plan(beta=0.04, kl_in_reward=True).kl_in == "reward"


def test_what_pi_old_is():
    # mu = 1 with nothing that reads pi_old: the update's own log-probs stand for it (ratio 1)
    assert plan(num_iterations=1, beta=0.0).pi_old == "current"
    assert plan(num_iterations=2).pi_old == "recomputed"
    assert plan(num_iterations=1, tis_cap=2.0).pi_old == "recomputed"          # the correction reads it
    assert plan(num_iterations=1, beta=0.04, kl_in_reward=True).pi_old == "recomputed"
    assert plan(num_iterations=1, loss_type="clip_cov").pi_old == "recomputed"  # its selection reads it
    behaviour = plan(async_steps=1, proximal="behaviour")
    assert (behaviour.pi_old, behaviour.first_update_on_policy) == ("behaviour", False)
    decoupled = plan(async_steps=1, proximal="decoupled")
    assert (decoupled.pi_old, decoupled.first_update_on_policy) == ("recomputed", True)


def test_the_correction_and_where_groups_come_from():
    assert plan().correction is None and plan().groups == "inline"
    assert plan(tis_cap=2.0).correction == ("tis", 2.0, 0.0)
    assert plan(correction="icepop", correction_cap=5.0, correction_cap_low=0.5).correction == ("icepop", 5.0, 0.5)
    decoupled = plan(async_steps=2, proximal="decoupled", correction_cap=3.0)
    assert (decoupled.correction, decoupled.groups, decoupled.async_steps) == (("is", 3.0, 0.0), "workers", 2)
    # where the groups come from: forked workers only for grpo's own sampler with rollout_workers > 0
    assert plan(async_steps=1, rollout_workers=0).groups == "client"       # a thread of the trainer
    assert plan(async_steps=1, rollout_workers=2).groups == "workers"
    assert plan(async_steps=1, sampler="vllm").groups == "client"
    assert plan(async_steps=1, sampler="vllm_server", vllm_url=["http://h:1"]).groups == "client"
    assert plan(async_steps=0, sampler="vllm").groups == "inline"



def test_a_new_outer_iteration_resets_the_reference_every_ref_reset_every_steps():
    p = plan(beta=0.04, ref_reset_every=3)
    assert [s for s in range(1, 11) if p.reset_reference_before(s)] == [4, 7, 10]
    assert not any(plan(beta=0.0, ref_reset_every=3).reset_reference_before(s) for s in range(1, 11))
    assert not any(plan(beta=0.04).reset_reference_before(s) for s in range(1, 11))


def test_the_plan_is_frozen_and_its_covariance_losses_are_the_losses():
    with pytest.raises(AttributeError):
        plan().pi_old = "behaviour"
    assert COVARIANCE_LOSSES == loss.COVARIANCE_LOSSES
    assert plan(beta=0.04, ref_reset_every=2).lines()[0] == "reference: copy, reset every 2 steps (rate 1)"
