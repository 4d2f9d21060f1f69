"""The chunked, selective log-prob head against the plain full-logits computation."""

import pytest
import torch
import torch.nn.functional as F

from grpo import models
from grpo.models import selected_logprobs, token_logprobs


def naive(hidden, head, targets, temperature):
    logp_all = F.log_softmax(head(hidden).double() / temperature, -1)
    return logp_all.gather(-1, targets[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def test_selected_logprobs_match_full_softmax_in_value_and_gradient(monkeypatch):
    torch.manual_seed(0)
    M, H, V = 7, 5, 11
    head = torch.nn.Linear(H, V, bias=True).double()
    hidden = torch.randn(M, H, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (M,))
    monkeypatch.setattr(models.logprobs, "LOGIT_CHUNK_ELEMENTS", 3 * V)  # 3 rows per chunk: 3 chunks
    logp, entropy = selected_logprobs(hidden, head, targets, temperature=0.7)
    want_logp, want_entropy = naive(hidden, head, targets, 0.7)
    torch.testing.assert_close(logp.double(), want_logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=1e-6, atol=1e-6)
    g = torch.randn(M, dtype=torch.float64)
    got = torch.autograd.grad((logp * g).sum(), [hidden, head.weight, head.bias])
    want = torch.autograd.grad((want_logp * g).sum(), [hidden, head.weight, head.bias])
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)


def test_selected_logprobs_hand_value():
    # One row, logits (0, ln 3) over two tokens: p = (1/4, 3/4); log p[1] = ln 0.75.
    head = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0], [torch.log(torch.tensor(3.0))]]))
    logp, entropy = selected_logprobs(torch.ones(1, 1), head, torch.tensor([1]))
    assert abs(logp.item() - torch.log(torch.tensor(0.75)).item()) < 1e-6
    want_entropy = -(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))
    assert abs(entropy.item() - want_entropy.item()) < 1e-6


def test_token_logprobs_equal_the_full_logits_path_on_the_tiny_model(tiny):
    policy, tok = tiny
    policy.zero_grad(set_to_none=True)
    enc = tok(["ab", "abcd"], return_tensors="pt", padding=True, add_special_tokens=False)
    completion = torch.tensor([[5, 6, 7], [8, 9, 0]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ids = torch.cat([enc.input_ids, completion], 1)
    attn = torch.cat([enc.attention_mask, completion_mask], 1)
    logp, entropy = token_logprobs(policy, ids, attn, 3, with_entropy=True, temperature=0.8)
    logp.sum().backward()
    fast_grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = policy(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, -4:-1] / 0.8
    logp_all = F.log_softmax(logits, -1)
    want = logp_all.gather(-1, completion[..., None]).squeeze(-1) * completion_mask
    want.sum().backward()
    torch.testing.assert_close(logp, want, rtol=1e-5, atol=1e-6)
    want_entropy = -(logp_all.exp() * logp_all).sum(-1) * completion_mask
    torch.testing.assert_close(entropy, want_entropy.detach(), rtol=1e-5, atol=1e-6)
    assert logp[1, 2] == 0 and entropy[1, 2] == 0
    for a, p in zip(fast_grads, policy.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_generate_matches_hugging_face_greedy_decoding_while_dropping_ended_rows(tiny):
    from grpo.sampling import generate
    policy, tok = tiny
    enc = tok(["abc", "x", "hello wor", "12+3="], return_tensors="pt", padding=True,
              add_special_tokens=False)
    free = policy.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=False,
                           max_new_tokens=12, pad_token_id=tok.pad_token_id)[:, enc.input_ids.shape[1]:]
    # Rows 0 and 2's first tokens made end tokens: those rows end at once and leave the batch, and
    # rows 1 and 3 go on decoding from the pruned cache.
    ends = [tok.eos_token_id, int(free[0, 0]), int(free[2, 0])]
    ours, logp = generate(policy.eval(), enc.input_ids, enc.attention_mask, 12, ends,
                          tok.pad_token_id, greedy=True)
    theirs = policy.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=False,
                             max_new_tokens=12, eos_token_id=ends, pad_token_id=tok.pad_token_id)
    theirs = theirs[:, enc.input_ids.shape[1]:]
    lengths = [next((i + 1 for i, t in enumerate(row) if t in ends), len(row)) for row in theirs.tolist()]
    assert len(set(lengths)) > 1, "the test needs rows that end at different steps"
    for row, n in enumerate(lengths):
        assert ours[row, :n].tolist() == theirs[row, :n].tolist()
        assert (ours[row, n:] == tok.pad_token_id).all() and (logp[row, n:] == 0).all()
    assert ours.shape[1] == max(lengths)
    assert (logp[ours != tok.pad_token_id] <= 0).all()


def test_a_shared_prompt_gives_the_same_logprobs_and_gradients(tiny):
    # Two groups of three completions: the prompt of each group is computed once and shared.
    policy, tok = tiny
    policy.zero_grad(set_to_none=True)
    enc = tok(["ab", "abcd"], return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc.input_ids.repeat_interleave(3, 0), enc.attention_mask.repeat_interleave(3, 0)
    completion = torch.tensor([[5, 6, 7], [8, 9, 0], [10, 0, 0], [11, 12, 13], [14, 0, 0], [5, 6, 0]])
    completion_mask = (completion != 0).long()
    ids = torch.cat([prompt_ids, completion], 1)
    attn = torch.cat([prompt_mask, completion_mask], 1)
    logp, _ = token_logprobs(policy, ids, attn, 3)
    (logp * torch.arange(1.0, 19.0).view(6, 3)).sum().backward()
    shared_grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = policy(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, -4:-1]
    want = F.log_softmax(logits, -1).gather(-1, completion[..., None]).squeeze(-1) * completion_mask
    (want * torch.arange(1.0, 19.0).view(6, 3)).sum().backward()
    torch.testing.assert_close(logp, want, rtol=1e-5, atol=1e-6)
    scale = max(p.grad.abs().max().item() for p in policy.parameters())
    for a, p in zip(shared_grads, policy.parameters()):  # float32 sums in another order
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6 * scale)


def test_draw_follows_the_distribution_and_never_picks_a_zero_probability_token():
    from grpo.sampling import draw
    torch.manual_seed(0)
    # p = (0.5, 0, 0.2, 0.3) for every row; token 1 has probability 0 (score -inf, as after top-p).
    scores = torch.log(torch.tensor([0.5, 0.0, 0.2, 0.3])).repeat(20000, 1)
    picks, lse = draw(scores)
    torch.testing.assert_close(lse, torch.zeros(20000, 1), rtol=0, atol=1e-6)  # log(sum p) = log 1
    freq = torch.bincount(picks, minlength=4).float() / len(picks)
    assert freq[1] == 0
    # binomial standard error at n = 20000 is at most 0.0036; allow 4 of them
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.0, 0.2, 0.3]), rtol=0, atol=0.015)


def test_generate_with_a_group_size_equals_repeating_each_prompt(tiny, monkeypatch):
    # Prompts are prefilled once per group (the lean path copies the cache; Hugging Face's path
    # repeats the rows): the same draws must give the same tokens and log-probs either way.
    from grpo.sampling import own
    policy, tok = tiny
    enc = tok(["abc", "hello wor"], return_tensors="pt", padding=True, add_special_tokens=False)
    uniforms = torch.rand(6, 10, generator=torch.Generator().manual_seed(0))
    repeated = own.generate(policy.eval(), enc.input_ids.repeat_interleave(3, 0),
                            enc.attention_mask.repeat_interleave(3, 0), 10, tok.eos_token_id,
                            tok.pad_token_id, uniforms=uniforms)
    for lean in (True, False):
        monkeypatch.setattr(own.decoder, "supports", lambda model: lean)
        tokens, logp = own.generate(policy, enc.input_ids, enc.attention_mask, 10,
                                    tok.eos_token_id, tok.pad_token_id, uniforms=uniforms,
                                    group_size=3)
        assert torch.equal(tokens, repeated[0])
        torch.testing.assert_close(logp, repeated[1], rtol=1e-5, atol=1e-6)
    assert len(set(map(tuple, repeated[0].tolist()))) > 2, "the draws should differ within a group"


def test_nucleus_by_hand_and_as_transformers_draws():
    from transformers.generation.logits_process import TopPLogitsWarper
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps {0.5, 0.3} (0.5 < 0.7 <= 0.8)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = models.nucleus_(logits.clone(), 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    # renormalized: log(0.5 / 0.8) for the first token
    logp = torch.log_softmax(models.nucleus_(logits.clone(), 0.7), -1)
    assert abs(logp[0, 0].item() - torch.tensor(0.625).log().item()) < 1e-6
    # a drawn token outside the nucleus is kept (it was drawn: float noise put it at the edge)
    assert models.nucleus_(logits.clone(), 0.7, torch.tensor([3])).isfinite().tolist() == \
        [[True, True, False, True]]
    torch.manual_seed(0)
    many = torch.randn(50, 300) * 3
    for p in (0.3, 0.9, 0.99):
        ours = models.nucleus_(many.clone(), p).isfinite()
        theirs = TopPLogitsWarper(p)(None, many.clone()).isfinite()
        assert torch.equal(ours, theirs), p


def test_top_p_logprobs_match_the_truncated_softmax_in_value_and_gradient(monkeypatch):
    torch.manual_seed(0)
    M, H, V = 7, 5, 11
    head = torch.nn.Linear(H, V, bias=True).double()
    hidden = torch.randn(M, H, dtype=torch.float64, requires_grad=True)
    monkeypatch.setattr(models.logprobs, "LOGIT_CHUNK_ELEMENTS", 4 * 3 * V)  # 3 rows a chunk with top_p
    with torch.no_grad():
        scaled = head(hidden) / 0.7
        keep = models.nucleus_(scaled.clone(), 0.8).isfinite()
    targets = torch.multinomial(keep.double(), 1).squeeze(-1)       # drawn from the nucleus
    logp, entropy = selected_logprobs(hidden, head, targets, temperature=0.7, top_p=0.8)
    logp_all = F.log_softmax((head(hidden) / 0.7).masked_fill(~keep, float("-inf")), -1)
    want = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    probs = logp_all.exp()
    want_entropy = -(probs * logp_all.masked_fill(~keep, 0)).sum(-1)
    torch.testing.assert_close(logp.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=1e-6, atol=1e-6)
    g = torch.randn(M, dtype=torch.float64)
    got = torch.autograd.grad((logp * g).sum(), [hidden, head.weight, head.bias])
    wanted = torch.autograd.grad((want * g).sum(), [hidden, head.weight, head.bias])
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)


def test_the_trainer_scores_what_a_top_p_sampler_drew(tiny):
    from grpo.sampling import HFSampler
    model, tok = tiny
    torch.manual_seed(0)
    r = HFSampler(model, tok, max_new_tokens=8, temperature=0.7, top_p=0.9).sample(["3 1 4:"] * 2, 4)
    assert r.top_p == 0.9 and r.temperature == 0.7
    for lean in (True, False):      # the chunked head, and the full-logits path
        if not lean:
            real = models.logprobs._head_is_plain
            models.logprobs._head_is_plain = lambda m: False
        try:
            logp, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1],
                                     temperature=r.temperature, top_p=r.top_p,
                                     completion_mask=r.completion_mask)
        finally:
            if not lean:
                models.logprobs._head_is_plain = real
        assert (logp - r.sampler_logprobs).abs().max().item() < 1e-4, lean
    untruncated, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1],
                                    temperature=r.temperature, completion_mask=r.completion_mask)
    assert (untruncated - r.sampler_logprobs).abs().max().item() > 1e-3   # the test can fail


def test_activation_checkpointing_gives_the_same_gradient(tiny_model_dir, monkeypatch):
    """The lean decoder (with the shared-prompt path and the padded path) and Hugging Face's
    forward, each with and without checkpointing: the same log-probs and gradients, while the
    checkpointed pass does recompute each layer in its backward (counted)."""
    import torch.utils.checkpoint as ckpt
    from grpo.assembly import set_checkpointing
    from grpo.models import load_policy
    calls = []
    real = ckpt.checkpoint
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = load_policy(str(tiny_model_dir))
    model.train()
    prompts = torch.tensor([[1, 5, 6], [0, 7, 8]]).repeat_interleave(2, 0)
    completion = torch.tensor([[5, 6, 7], [8, 9, 0], [10, 0, 0], [11, 12, 13]])
    ids = torch.cat([prompts, completion], 1)
    attn = torch.cat([(prompts != 0).long(), (completion != 0).long()], 1)
    weights = torch.arange(1.0, 13.0).view(4, 3)
    for path in ("shared prompts", "padded rows", "hugging face"):
        if path == "padded rows":          # distinct prompts: the plain padded forward
            ids[:, 0] = torch.arange(1, 5)
        if path == "hugging face":
            monkeypatch.setattr(models.logprobs, "_head_is_plain", lambda m: False)
        results = []
        for on in (False, True):
            set_checkpointing(model, on)
            for layer in model.model.layers:   # Hugging Face's layers checkpoint through this
                inner = getattr(layer, "_gradient_checkpointing_func", None)
                if inner is not None and on:
                    layer._gradient_checkpointing_func = \
                        lambda *a, inner=inner, **k: calls.append(1) or inner(*a, **k)
            model.zero_grad(set_to_none=True)
            calls.clear()
            logp, _ = token_logprobs(model, ids, attn, 3)
            (logp * weights).sum().backward()
            results.append((logp.detach(), [p.grad.clone() for p in model.parameters()], len(calls)))
        (logp_a, grads_a, calls_a), (logp_b, grads_b, calls_b) = results
        assert calls_a == 0 and calls_b == model.config.num_hidden_layers, (path, calls_a, calls_b)
        torch.testing.assert_close(logp_a, logp_b, rtol=0, atol=0)
        for a, b in zip(grads_a, grads_b):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    set_checkpointing(model, False)


def test_mixed_precision_computes_in_bf16_and_keeps_float32_master_weights(tiny_model_dir, tmp_path):
    from grpo.config import build_config
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "mixed_precision": "bf16", "steps": 2,
                           "sft_steps": 0, "prompts_per_step": 2, "group_size": 4, "eval_every": 0,
                           "threads": 1, "tis_cap": 2.0, "lr": 1e-3, "save_every": 2,
                           "rewards": ["exact_answer"], "output_dir": str(tmp_path)})
    result = train(config, log=lambda line: None)
    assert all(p.dtype == torch.float32 for p in result.policy.parameters())
    # the optimizer's moments are float32 too (in the step-2 checkpoint)
    saved = torch.load(tmp_path / "checkpoints" / "step-2" / "optimizer.pt", weights_only=False)
    moments = [v for s in saved["state"].values() for k, v in s.items() if k.startswith("exp_avg")]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    # the trainer computed in bfloat16 (the sampler in float32): their log-probs differ a little
    diffs = [m["sampler/logp_diff"] for m in result.history]
    assert all(0 < d < 0.1 for d in diffs), diffs
    # and the log-probs themselves come out of the head in float32
    policy = result.policy
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    logp, _ = token_logprobs(policy, ids, torch.ones_like(ids), 3)
    assert logp.dtype == torch.float32
    policy.grpo_autocast = None
    exact, _ = token_logprobs(policy, ids, torch.ones_like(ids), 3)
    assert 0 < (logp - exact).abs().max().item() < 0.1


def test_mixed_precision_needs_float32_weights():
    import pytest
    from grpo.config import ConfigError, build_config
    with pytest.raises(ConfigError, match="'mixed_precision': bf16 keeps float32 master weights"):
        build_config({"mixed_precision": "bf16", "dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="'mixed_precision' must be no or bf16"):
        build_config({"mixed_precision": "fp8"})


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_the_samplers_gap_to_the_trainer_is_logged_on_every_step_without_a_correction(
        tiny_model_dir, tmp_path, num_iterations):
    """sampler/logp_diff, the mean |log pi_sampler - log pi_old| over the drawn tokens, with no
    correction set: measured by the first update where pi_old is the update's own log-probs
    (num_iterations=1), by the pass before the updates where pi_old is recomputed (2). grpo's own
    sampler draws from the trainer's weights: rounding only."""
    from grpo.config import build_config
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "steps": 3, "sft_steps": 0,
                           "prompts_per_step": 2, "group_size": 4, "eval_every": 0, "threads": 1,
                           "num_iterations": num_iterations, "lr": 1e-3, "save_every": 0,
                           "rewards": ["exact_answer"], "output_dir": str(tmp_path)})
    lines = []
    result = train(config, log=lines.append)
    diffs = [m["sampler/logp_diff"] for m in result.history]
    assert len(diffs) == 3 and all(0 <= d < 1e-5 for d in diffs), diffs
    assert not any("sampler's log-probs" in line for line in lines)


def test_a_sampler_that_draws_from_other_weights_is_measured_and_warned_once(tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    """A sampler whose log-probs are the trainer's + 0.3 on every drawn token (as an engine with
    weights of its own would be): sampler/logp_diff is 0.3 on every step (to rounding), and the
    run says once that the sampler is not sampling the weights being trained."""
    from grpo.config import build_config
    from grpo.sampling.own import HFSampler
    from grpo.train import train
    drawn = HFSampler.sample

    def elsewhere(self, *args, **kwargs):
        rollout = drawn(self, *args, **kwargs)
        rollout.sampler_logprobs = rollout.sampler_logprobs + 0.3 * rollout.completion_mask
        return rollout
    monkeypatch.setattr(HFSampler, "sample", elsewhere)
    config = build_config({"model": str(tiny_model_dir), "steps": 3, "sft_steps": 0,
                           "prompts_per_step": 2, "group_size": 4, "eval_every": 0, "threads": 1,
                           "lr": 1e-3, "save_every": 0, "rewards": ["exact_answer"],
                           "output_dir": str(tmp_path)})
    lines = []
    result = train(config, log=lines.append)
    assert [m["sampler/logp_diff"] for m in result.history] == pytest.approx([0.3] * 3, abs=1e-5)
    said = [line for line in lines if "the sampler's log-probs" in line]
    assert len(said) == 1 and said[0].startswith("warning: step 1: ") and "by 0.3 per token" in said[0]
