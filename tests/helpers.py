"""Shared test helpers: a hand-built rollout with completions of known lengths."""

import dataclasses

import torch

from grpo.algorithm.loss import LossSettings
from grpo.rollout import Rollout
from grpo.update import accumulate_gradients
from grpo.sampling import completion_lengths, mask_from_lengths

# Completion texts per row; the EOS (or its absence: truncated) decides each row's length.
COMPLETIONS = ["12+3=", "7", "no", "<think>x</think>", "", "abcdefg"]
WITH_EOS = [False, True, True, True, True, False]
T = 5


def make_rollout(tok) -> Rollout:
    """Six rows (two prompts of different lengths, group size 3), completions of lengths 5,2,3,4,1,5."""
    prompts = ["ab", "hello"]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    rows = []
    for text, eos in zip(COMPLETIONS, WITH_EOS):
        ids = tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if eos else [])
        ids = ids[:T]
        rows.append(ids + [tok.pad_token_id] * (T - len(ids)))
    completion_ids = torch.tensor(rows)
    lengths = completion_lengths(completion_ids, tok.eos_token_id)
    completion_mask = mask_from_lengths(lengths, T)
    return Rollout(
        prompts=[p for p in prompts for _ in range(3)], completions=COMPLETIONS,
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        prompt_ids=enc.input_ids.repeat_interleave(3, 0),
        prompt_mask=enc.attention_mask.repeat_interleave(3, 0),
        completion_ids=completion_ids, completion_mask=completion_mask,
        sampler_logprobs=torch.zeros(6, T), truncated=torch.tensor([not e for e in WITH_EOS]),
    )


def grads_and_stats(policy, rollout, micro_batch_size, **kw):
    """Gradients (by parameter name) and stats of one accumulate_gradients call, from zero."""
    policy.zero_grad(set_to_none=True)
    fields = {f.name for f in dataclasses.fields(LossSettings)}
    loss = LossSettings(**{k: v for k, v in kw.items() if k in fields})
    stats = accumulate_gradients(policy, rollout, micro_batch_size=micro_batch_size, settings=loss,
                                 **{k: v for k, v in kw.items() if k not in fields})
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    return grads, stats
