"""The chunked, selective log-prob head against the plain full-logits computation."""

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
    monkeypatch.setattr(models, "LOGIT_CHUNK_ELEMENTS", 3 * V)  # 3 rows per chunk: 3 chunks
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
