"""The lean decoder against Hugging Face's forward, on Llama and Qwen2 models with left padding."""

import pytest
import torch

from grpo.decoder import Decoder, supports
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


def test_hidden_states_and_gradients_match_hugging_face(model):
    assert supports(model)
    ids, mask, pos = batch()
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
