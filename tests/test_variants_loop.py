"""Variants that live in the loop: presets, dynamic sampling, overlong shaping, truncated masking,
KL in the reward, soft reference refresh, truncated importance sampling."""

import json
import math
import subprocess
import sys

import pytest
import torch
import yaml

from grpo.config import ALGORITHMS, build_config
from grpo.algorithm.corrections import truncated_importance_weights
from grpo.algorithm.loss import LossSettings, kl_penalized_rewards
from grpo.models import update_reference
from grpo.algorithm.shaping import overlong_penalty
from grpo.train import train

PAPER_SETTINGS = {
    "dapo": {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "aggregation": "token_mean",
             "dynamic_sampling": True, "overlong_buffer": 0.2},
    "dr_grpo": {"advantage": "group_mean", "aggregation": "constant", "beta": 0.0},
    "gspo": {"loss_type": "gspo", "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
    "cispo": {"loss_type": "cispo", "aggregation": "token_mean", "epsilon_high": 0.28},
    "rloo": {"advantage": "rloo", "kl_in_reward": True, "kl_estimator": "k1"},
    "grpo": {"advantage": "group_norm", "loss_type": "clip", "aggregation": "sequence_mean",
             "beta": 0.04, "kl_estimator": "k3"},
    "sapo": {"loss_type": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "beta": 0.0},
    "gmpo": {"loss_type": "gmpo", "epsilon": 0.4, "epsilon_high": 0.4, "beta": 0.0,
             "aggregation": "sequence_mean"},
    "clip_cov": {"loss_type": "clip_cov", "clip_cov_fraction": 2e-4, "clip_cov_low": 1.0,
                 "clip_cov_high": 5.0, "aggregation": "token_mean", "beta": 0.0},
    "kl_cov": {"loss_type": "kl_cov", "kl_cov_fraction": 2e-3, "kl_cov_coef": 1.0,
               "aggregation": "token_mean", "beta": 0.0},
    "reinforce_pp": {"advantage": "reinforce_pp", "reinforce_pp_batch_norm": True, "loss_type": "clip",
                     "kl_in_reward": True, "kl_estimator": "k1", "beta": 0.001,
                     "aggregation": "sequence_mean"},
    "reinforce_pp_baseline": {"advantage": "reinforce_pp_baseline", "reinforce_pp_batch_norm": True,
                              "kl_in_reward": False, "kl_estimator": "k2", "beta": 0.001},
    "distill": {"distill": "alone", "aggregation": "token_mean", "beta": 0.0},
}


def test_every_preset_has_its_paper_settings_listed_here():
    assert set(PAPER_SETTINGS) == set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_preset_trains_from_the_command_line(name, tmp_path):
    teacher = []
    if name == "distill":        # a teacher sharing the tiny model's tokenizer
        from grpo.models import build_tiny
        teacher = [f"teacher={build_tiny(tmp_path / 'teacher', hidden_size=32, layers=2, heads=2)}"]
    out = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "train", f"algorithm={name}", "steps=2",
                          "sft_steps=2", "eval_every=0", "prompts_per_step=4", "group_size=4",
                          f"output_dir={tmp_path / 'run'}", *teacher], capture_output=True, text=True,
                         timeout=300)
    tmp_path = tmp_path / "run"
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert {k: resolved[k] for k in PAPER_SETTINGS[name]} == PAPER_SETTINGS[name]
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in metrics)


def test_explicit_key_wins_over_preset():
    c = build_config({"algorithm": "dapo", "epsilon_high": 0.3})
    assert c.loss.epsilon_high == 0.3 and c.sampling.dynamic_sampling is True


def test_unknown_table_choice_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"config key 'loss_type': unknown choice 'ppo2'.*cispo"):
        build_config({"loss_type": "ppo2", "output_dir": str(tmp_path)})


def test_overlong_penalty_hand_values():
    # max 10 tokens, buffer 4: free up to 6, then (6 - L) / 4: L=7 -> -0.25, L=9 -> -0.75, L=10 -> -1
    assert overlong_penalty([5, 6, 7, 9, 10], 10, 4) == [0.0, 0.0, -0.25, -0.75, -1.0]
    assert overlong_penalty([8], 10, 4, penalty=0.5) == [-0.25]   # (6-8)/4 * 0.5
    assert overlong_penalty([10], 10, 0) == [0.0]                 # buffer 0: off


def test_kl_in_reward_hand_values():
    # two tokens with log(pi/pi_ref) = ln 2: k1 sum = 2 ln 2 = 1.386294; beta 0.05 -> 1 - 0.0693147
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])                                # the third token is padding
    out = kl_penalized_rewards(torch.tensor([1.0]), logp, ref, mask, beta=0.05, estimator="k1")
    assert out.item() == pytest.approx(1 - 0.05 * 2 * math.log(2), abs=1e-6)


def test_truncated_importance_weights_hand_values():
    # pi_old / pi_sampler = 2, 0.5, 5 -> capped at 3: 2, 0.5, 3; padding 0
    old = torch.log(torch.tensor([[0.4, 0.1, 0.5, 0.3]]))
    sampler = torch.log(torch.tensor([[0.2, 0.2, 0.1, 0.3]]))
    w = truncated_importance_weights(old, sampler, torch.tensor([[1, 1, 1, 0]]), cap=3.0)
    assert w.tolist()[0] == pytest.approx([2.0, 0.5, 3.0, 0.0], abs=1e-6)


def test_soft_and_hard_reference_refresh():
    ref, policy = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        ref.weight.fill_(0.0)
        policy.weight.fill_(1.0)
    update_reference(ref, policy, rate=0.25)   # 0.25 * 1 + 0.75 * 0
    assert ref.weight.item() == 0.25
    update_reference(ref, policy, rate=0.25)   # 0.25 * 1 + 0.75 * 0.25 = 0.4375
    assert ref.weight.item() == 0.4375
    update_reference(ref, policy, rate=1.0)
    assert ref.weight.item() == 1.0


def _dataset(tmp_path, prompts):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p, "answer": "x"}) for p in prompts))
    return str(f)


def test_dynamic_sampling_gives_up_after_the_cap(tmp_path):
    # Every group's rewards are equal, so every round drops all 4 groups: 1 round + 3 extra rounds
    # = 16 dropped groups, and the step falls back to the last round (all advantages 0).
    def constant(prompts, completions, **columns):
        return [1.0] * len(completions)

    c = build_config({"dataset": _dataset(tmp_path, [f"q{i}" for i in range(8)]), "sft_steps": 0,
                      "steps": 1, "eval_every": 0, "prompts_per_step": 4, "group_size": 3,
                      "dynamic_sampling": True, "max_sampling_rounds": 3, "output_dir": str(tmp_path)})
    m = train(c, reward_fns=[constant], log=lambda s: None, write_files=False).history[0]
    assert m["sampling/dropped_groups"] == 16 and m["sampling/extra_rounds"] == 3
    assert m["advantage/zero_std_frac"] == 1.0


def test_dynamic_sampling_fills_the_step_with_groups_that_have_contrast(tmp_path):
    # Prompts starting with "a" score a constant; the others score the completion's length, which
    # differs within a group of 6 random completions. Only the latter are kept.
    def mixed(prompts, completions, **columns):
        return [0.0 if p.startswith("a") else float(len(c)) for p, c in zip(prompts, completions)]

    prompts = [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)]
    c = build_config({"dataset": _dataset(tmp_path, prompts), "sft_steps": 0, "steps": 2,
                      "eval_every": 0, "prompts_per_step": 4, "group_size": 6, "max_new_tokens": 6,
                      "dynamic_sampling": True, "max_sampling_rounds": 8, "output_dir": str(tmp_path)})
    result = train(c, reward_fns=[mixed], log=lambda s: None)
    for m in result.history:
        assert m["advantage/zero_std_frac"] == 0.0
        assert m["sampling/dropped_groups"] >= 1 or m["sampling/extra_rounds"] == 0
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all(s["prompt"].startswith("b") for s in samples)
    assert len(samples) == 2 * 4 * 6


def test_masked_truncated_rows_take_no_part(tiny_model_dir):
    # token_mean weights are 1 / (tokens in the loss): masking row 1 out leaves row 0's loss and
    # gradient exactly those of a batch holding row 0 alone.
    from grpo.models import load_policy, load_tokenizer
    from grpo.sampling import HFSampler
    from grpo.update import accumulate_gradients

    torch.manual_seed(0)
    policy, tok = load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    r = HFSampler(policy, tok, max_new_tokens=4).sample(["ab", "cd"], 1)
    r.advantages = torch.tensor([1.0, -1.0])
    r.loss_mask = r.completion_mask.clone()
    r.loss_mask[1] = 0

    def grads(rollout):
        policy.zero_grad(set_to_none=True)
        stats = accumulate_gradients(policy, rollout, micro_batch_size=2, aggregation="token_mean",
                                     settings=LossSettings(beta=0.0, eps_low=0.2, eps_high=0.2))
        return stats["loss"], [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    loss_masked, g_masked = grads(r)
    alone = r.rows([0])
    loss_alone, g_alone = grads(alone)
    assert loss_masked == pytest.approx(loss_alone, abs=1e-7)
    for a, b in zip(g_masked, g_alone):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_and_trainer_log_probs_agree(tmp_path, temperature):
    # HF generate and the trainer's forward see the same tempered distribution, so truncated
    # importance sampling measures a difference at float noise level and weights of 1.
    c = build_config({"steps": 1, "sft_steps": 0, "eval_every": 0, "tis_cap": 2.0,
                      "temperature": temperature, "prompts_per_step": 4, "group_size": 4,
                      "output_dir": str(tmp_path)})
    m = train(c, log=lambda s: None, write_files=False).history[0]
    assert m["sampler/logp_diff"] < 1e-4
    assert m["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4)
