"""The lean decoder against Hugging Face's forward, on Llama and Qwen2 models with left padding."""

import pytest
import torch

from grpo.models.decoder import Decoder, supports
from grpo.models import build_tiny, load_policy


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp(request.param), hidden_size=32, layers=2, heads=4,
                      architecture=request.param)
    policy = load_policy(str(path))
    if request.param == "qwen2":  # grouped-query attention: 4 query heads share 2 key/value heads
        path = tmp_path_factory.mktemp("gqa")
        policy.config.num_key_value_heads = 2
        from transformers import AutoModelForCausalLM
        torch.manual_seed(1)
        policy = AutoModelForCausalLM.from_config(policy.config)
    return policy.float()


def batch():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [0, 0, 0, 0, 15, 16]])
    mask = (ids != 0).long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def assert_hidden_and_gradients_match_hugging_face(model, ids, mask, pos):
    backbone = getattr(model, model.base_model_prefix)
    want = backbone(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    got = Decoder(model).hidden(ids, mask, pos)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()  # padding rows attend to themselves: no NaN anywhere
    (want[real] ** 2).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (Decoder(model).hidden(ids, mask, pos)[real] ** 2).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    model.zero_grad()


def test_hidden_states_and_gradients_match_hugging_face(model):
    assert supports(model)
    assert_hidden_and_gradients_match_hugging_face(model, *batch())


def test_a_sampled_pad_token_takes_no_input_gradient_as_in_the_model(model):
    """A policy can sample its pad token as an ordinary token. The model's nn.Embedding has
    padding_idx, so that row gets no gradient from the input side; the decoder must agree (it once
    did not, which moved the gradient of one measured step by 5%)."""
    pad = model.get_input_embeddings().padding_idx
    assert pad is not None
    ids = torch.tensor([[5, 6, pad, 7, pad, 8], [9, pad, 11, 12, 13, 14]])
    mask = torch.ones_like(ids)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    backbone = getattr(model, model.base_model_prefix)
    model.zero_grad()
    (backbone(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state ** 2).sum().backward()
    want = model.get_input_embeddings().weight.grad.clone()
    model.zero_grad()
    (Decoder(model).hidden(ids, mask, pos) ** 2).sum().backward()
    got = model.get_input_embeddings().weight.grad
    assert want[pad].abs().max() == 0 and got[pad].abs().max() == 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    model.zero_grad()


def last_logits(model, seq, seq_mask):
    pos = (seq_mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=seq, attention_mask=seq_mask, position_ids=pos).logits[:, -1].detach()


def append(seq, seq_mask, tokens):
    return (torch.cat([seq, tokens[:, None]], 1),
            torch.cat([seq_mask, torch.ones(len(seq), 1, dtype=torch.long)], 1))


def test_cached_decoding_matches_a_full_forward_even_after_dropping_rows(model):
    ids, mask, _ = batch()
    dec = Decoder(model)
    logits, state = dec.start(ids, mask, max_new_tokens=3)
    torch.testing.assert_close(logits, last_logits(model, ids, mask), rtol=1e-4, atol=1e-5)
    tokens = torch.tensor([20, 21, 22])
    logits = dec.step(tokens, state)
    seq, seq_mask = append(ids, mask, tokens)
    torch.testing.assert_close(logits, last_logits(model, seq, seq_mask), rtol=1e-4, atol=1e-5)
    keep = torch.tensor([0, 2])            # row 1 ended: it leaves the cache
    Decoder.keep(state, keep)
    tokens = torch.tensor([23, 24])
    logits = dec.step(tokens, state)
    seq, seq_mask = append(seq[keep], seq_mask[keep], tokens)
    torch.testing.assert_close(logits, last_logits(model, seq, seq_mask), rtol=1e-4, atol=1e-5)


def test_a_group_shares_its_prompts_prefill_and_decodes_as_if_each_row_had_its_own(model):
    # start(repeat=G) prefills each prompt once and copies its cache to G rows; decoding from it
    # must give what prefilling the G copies separately gives.
    ids, mask, _ = batch()
    dec = Decoder(model)
    shared_logits, shared = dec.start(ids, mask, max_new_tokens=2, repeat=2)
    own_logits, own = dec.start(ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), 2)
    assert shared_logits.shape == own_logits.shape == (2 * len(ids), model.config.vocab_size)
    torch.testing.assert_close(shared_logits, own_logits, rtol=1e-5, atol=1e-6)
    tokens = torch.arange(20, 20 + 2 * len(ids))     # the two rows of a prompt now differ
    torch.testing.assert_close(dec.step(tokens, shared), dec.step(tokens, own), rtol=1e-5, atol=1e-6)
    seq, seq_mask = append(ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), tokens)
    torch.testing.assert_close(dec.step(tokens + 5, shared),
                               last_logits(model, *append(seq, seq_mask, tokens + 5)),
                               rtol=1e-4, atol=1e-5)


def prompts_and_completions():
    """Three rows: left-padded prompts of 2, 4 and 1 tokens, right-padded completions of 3, 1, 2."""
    prompt = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 11]])
    completion = torch.tensor([[12, 13, 14], [15, 0, 0], [16, 17, 0]])
    ids = torch.cat([prompt, completion], 1)
    mask = torch.cat([(prompt != 0), (completion != 0)], 1).long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


class AttentionCalls:
    """Records the mask of every attention call the decoder makes."""

    def __init__(self, monkeypatch):
        import grpo.models.decoder
        self.masks, real = [], grpo.models.decoder.F.scaled_dot_product_attention

        def record(q, k, v, attn_mask=None, **kw):
            self.masks.append(attn_mask)
            return real(q, k, v, attn_mask=attn_mask, **kw)
        monkeypatch.setattr(grpo.models.decoder.F, "scaled_dot_product_attention", record)


def test_left_and_right_padded_rows_need_no_mask_and_match_hugging_face(model, monkeypatch):
    assert_hidden_and_gradients_match_hugging_face(model, *prompts_and_completions())
    calls = AttentionCalls(monkeypatch)      # (it also sees Hugging Face's calls: set it after)
    Decoder(model).hidden(*prompts_and_completions())
    assert calls.masks and all(m is None for m in calls.masks)   # causal, no [N, 1, L, L] mask


def test_a_row_with_a_hole_falls_back_to_a_mask_and_still_matches(model, monkeypatch):
    ids, mask, pos = prompts_and_completions()
    mask[0, 5] = 0                    # a hole inside row 0's run of real tokens
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    backbone = getattr(model, model.base_model_prefix)
    want = backbone(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    calls = AttentionCalls(monkeypatch)
    got = Decoder(model).hidden(ids, mask, pos)
    assert all(m is not None for m in calls.masks)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_shared_prompts_of_different_lengths_match_each_row_computed_whole(model, monkeypatch):
    # completion_hidden lays each row out as [prompt | completion | prompt padding] and attends
    # causally: the hidden states and the gradients equal Hugging Face's on the whole rows.
    ids, mask, pos = prompts_and_completions()
    ids, mask, pos = (t.repeat_interleave(2, 0) for t in (ids, mask, pos))   # groups of two
    ids[1, 4:], ids[3, 4:] = torch.tensor([18, 19, 20]), torch.tensor([21, 22, 0])
    mask[1, 4:], mask[3, 4:] = 1, torch.tensor([1, 1, 0])
    P, T = 4, 3
    backbone = getattr(model, model.base_model_prefix)
    torch.manual_seed(0)
    weights = torch.randn(6, T, model.config.hidden_size) * mask[:, P:, None]
    want = backbone(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state[:, P - 1:-1]
    (want * weights).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    prompts, prompt_of = torch.unique(torch.cat([ids[:, :P], mask[:, :P]], 1), dim=0, return_inverse=True)
    assert len(prompts) == 3
    calls = AttentionCalls(monkeypatch)
    got = Decoder(model).completion_hidden(prompts[:, :P], prompts[:, P:], prompt_of, ids[:, P:])
    assert calls.masks and all(m is None for m in calls.masks)
    real = mask[:, P:].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    (got * weights).sum().backward()
    scale = max(g.abs().max().item() for g in want_grads.values())
    for name, p in model.named_parameters():   # float32 sums in another order
        torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-4, atol=1e-6 * scale, msg=name)
    model.zero_grad()


def test_prefill_of_ragged_prompts_needs_no_mask(model, monkeypatch):
    ids, mask, _ = batch()
    calls = AttentionCalls(monkeypatch)
    logits, _ = Decoder(model).start(ids, mask, max_new_tokens=2)
    assert calls.masks and all(m is None for m in calls.masks)
    torch.testing.assert_close(logits, last_logits(model, ids, mask), rtol=1e-4, atol=1e-5)
