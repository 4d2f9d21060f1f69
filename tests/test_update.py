"""The policy update: micro-batching must not change the loss or the gradient; the LR schedules."""

import pytest
import torch

from helpers import grads_and_stats, make_rollout
from grpo.update import logprobs_of, make_scheduler





def test_hand_built_rollout_has_the_intended_lengths(tiny):
    _, tok = tiny
    r = make_rollout(tok)
    # "12+3=" 5 chars, no EOS -> 5; "7"+EOS -> 2; "no"+EOS -> 3; "<think>" "x" "</think>" are 3
    # tokens +EOS -> 4; ""+EOS -> 1; "abcdefg" cut to 5, no EOS -> 5
    assert r.completion_mask.sum(-1).tolist() == [5, 2, 3, 4, 1, 5]
    # prompts left-padded: "ab" gets 3 pads before it, "hello" none
    assert r.prompt_mask[0].tolist() == [0, 0, 0, 1, 1]
    assert r.prompt_mask[3].tolist() == [1, 1, 1, 1, 1]


def test_micro_batching_leaves_loss_and_gradient_unchanged(tiny):
    policy, tok = tiny
    rollout = make_rollout(tok)
    gen = torch.Generator().manual_seed(0)
    current = logprobs_of(policy, rollout, micro_batch_size=6)
    mask = rollout.completion_mask
    # old log-probs off by N(0, 0.3) so ratios differ from 1 (some beyond 0.8 / 1.28); ref off too
    rollout.old_logprobs = (current + 0.3 * torch.randn(current.shape, generator=gen)) * mask
    rollout.ref_logprobs = (current + 0.2 * torch.randn(current.shape, generator=gen)) * mask
    rollout.advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4])
    kw = dict(beta=0.04, eps_low=0.2, eps_high=0.28)

    whole_grads, whole = grads_and_stats(policy, rollout, 6, **kw)
    scale = max(g.abs().max().item() for g in whole_grads.values())
    assert scale > 1e-3  # the gradient is not trivially zero
    assert 0 < whole["clip/frac"] < 1  # some tokens clipped, some not: both branches exercised
    for size in (4, 2, 1):
        grads, stats = grads_and_stats(policy, rollout, size, **kw)
        assert grads.keys() == whole_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, whole_grads[name], rtol=1e-5, atol=1e-6 * scale,
                                       msg=lambda m: f"micro_batch_size={size}, {name}: {m}")
        for key in ("loss", "kl", "clip/frac", "ratio/mean", "entropy"):
            assert stats[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), (size, key)


def test_on_policy_loss_is_minus_mean_advantage(tiny):
    # With no old log-probs (mu = 1) the ratio is exactly 1 and, with beta = 0, every token's term is
    # A_i: the per-sequence mean is A_i and the loss is -mean(A) = -(1 - .5 + .3 - 1.2 + .8 + .6)/6
    # = -1/6 = -0.1666667, for any micro-batch size. ratio/mean is 1, nothing clipped, kl 0.
    policy, tok = tiny
    rollout = make_rollout(tok)
    rollout.advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.6])
    for size in (6, 4, 1):
        _, stats = grads_and_stats(policy, rollout, size, beta=0.0, eps_low=0.2, eps_high=0.2)
        assert stats["loss"] == pytest.approx(-1 / 6, abs=1e-6)
        assert stats["ratio/mean"] == pytest.approx(1.0, abs=1e-6)
        assert stats["clip/frac"] == 0.0
        assert stats["kl"] == 0.0


def test_logprobs_of_is_independent_of_micro_batch_size_and_zero_on_padding(tiny):
    policy, tok = tiny
    rollout = make_rollout(tok)
    whole = logprobs_of(policy, rollout, 6)
    for size in (4, 1):
        torch.testing.assert_close(logprobs_of(policy, rollout, size), whole, rtol=1e-5, atol=1e-6)
    assert (whole[rollout.completion_mask == 0] == 0).all()
    assert (whole[rollout.completion_mask == 1] < 0).all()


# ------------------------------------------------------------------------------------ schedules

def lr_factors(warmup, total, schedule, steps):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = make_scheduler(opt, warmup, total, schedule)
    factors = []
    for _ in range(steps):
        factors.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return factors


def test_warmup_then_constant():
    # warmup 3: factor (step+1)/(3+1) = .25, .5, .75 for steps 0..2, then 1.0 for good
    assert lr_factors(3, 10, "constant", 8) == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0], abs=1e-12)


def test_constant_without_warmup():
    assert lr_factors(0, 5, "constant", 4) == [1.0, 1.0, 1.0, 1.0]


def test_warmup_then_cosine_to_zero():
    # warmup 2, total 6: steps 0, 1 -> 1/3, 2/3; then progress p = (step - 2)/4 and factor
    # 0.5 (1 + cos(pi p)): p = 0 -> 1; 1/4 -> 0.8535534; 1/2 -> 0.5; 3/4 -> 0.1464466; 1 -> 0,
    # and it stays 0 after total_steps (progress is capped at 1).
    assert lr_factors(2, 6, "cosine", 9) == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.8535534, 0.5, 0.1464466, 0.0, 0.0, 0.0], abs=1e-7)


def test_cosine_without_warmup_reaches_zero_at_total_steps():
    # total 4: 0.5 (1 + cos(pi k/4)) for k = 0..4 -> 1, 0.8535534, 0.5, 0.1464466, 0
    factors = lr_factors(0, 4, "cosine", 5)
    assert factors == pytest.approx([1.0, 0.8535534, 0.5, 0.1464466, 0.0], abs=1e-7)
    assert factors[-1] == pytest.approx(0.0, abs=1e-15)


def test_length_batches_sort_by_length_and_respect_the_token_budget(tiny):
    from grpo.update import length_batches
    _, tok = tiny
    rollout = make_rollout(tok)
    # Real lengths (prompt + completion) of rows 0..5: 2+5, 2+2, 2+3, 5+4, 5+1, 5+5.
    # Sorted by completion length: rows 4 (5+1), 1 (2+2), 2 (2+3), 3 (5+4), 0 (2+5), 5 (5+5).
    assert length_batches(rollout, 6) == [[4, 1, 2, 3, 0, 5]]
    assert length_batches(rollout, 2) == [[4, 1], [2, 3], [0, 5]]
    # Budget 16 padded tokens: [4, 1] pads to 2 x (5+2) = 14; adding 2 would make 3 x (5+3) = 24.
    # [2, 3] is 2 x (5+4) = 18 > 16, so 3 goes alone; [0] then [5] (2 x (5+5) = 20 > 16).
    assert length_batches(rollout, 6, max_tokens=16) == [[4, 1], [2], [3], [0], [5]]


def test_token_budget_and_trimming_leave_loss_and_gradient_unchanged(tiny):
    policy, tok = tiny
    rollout = make_rollout(tok)
    rollout.ref_logprobs = logprobs_of(policy, rollout, 6) * 0.9
    rollout.advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, -0.4])
    kw = dict(beta=0.04, eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    whole_grads, whole = grads_and_stats(policy, rollout, 6, **kw)
    grads, stats = grads_and_stats(policy, rollout, 6, micro_batch_tokens=16, **kw)
    scale = max(g.abs().max().item() for g in whole_grads.values())
    for name, g in grads.items():
        torch.testing.assert_close(g, whole_grads[name], rtol=1e-5, atol=1e-6 * scale)
    assert stats["loss"] == pytest.approx(whole["loss"], rel=1e-5)


def test_rows_with_zero_advantage_are_skipped_without_changing_the_gradient(tiny, monkeypatch):
    # beta = 0: group 0's advantages are all 0, so its rows cannot change the gradient and are not
    # run. The gradient must equal the one computed over all six rows.
    import grpo.update as update
    policy, tok = tiny
    rollout = make_rollout(tok)
    rollout.advantages = torch.tensor([0.0, 0.0, 0.0, -1.2, 0.8, 0.4])
    kw = dict(beta=0.0, eps_low=0.2, eps_high=0.2, aggregation="token_mean")
    seen = []
    real = update.token_logprobs
    monkeypatch.setattr(update, "token_logprobs", lambda m, ids, *a, **k: seen.append(len(ids)) or real(m, ids, *a, **k))
    grads, stats = grads_and_stats(policy, rollout, 6, **kw)
    assert seen == [3]
    # The full computation: -(sum over all tokens of A_i * 1) / all tokens, with ratio 1.
    policy.zero_grad()
    logp, _ = real(policy, rollout.input_ids, rollout.attention_mask, rollout.completion_ids.shape[1])
    m = rollout.completion_mask.float()
    ratio = torch.exp(logp - logp.detach())
    (-(ratio * rollout.advantages[:, None] * m).sum() / m.sum()).backward()
    for name, p in policy.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7)


def test_the_automatic_token_budget_follows_the_hidden_size():
    from types import SimpleNamespace
    from grpo.update import token_budget

    def model(hidden):   # what token_budget reads: the input embedding's width and device
        embedding = torch.nn.Embedding(3, hidden)
        return SimpleNamespace(get_input_embeddings=lambda: embedding)
    assert token_budget(0, model(128)) == 8192      # 2^20 / 128 on a CPU
    assert token_budget(0, model(512)) == 2048
    assert token_budget(0, model(8192)) == 256      # never below 256 tokens
    assert token_budget(3000, model(128)) == 3000   # an explicit budget wins
