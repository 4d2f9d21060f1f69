"""Step 1 of GRPO: sample a group of G completions per prompt from the current policy.

A `Sampler` returns a `Rollout` with completion masks built from the generated lengths (the EOS
token included), never from the pad id, which often equals EOS. It also returns the log-probs it
drew each token with, after temperature and top-p.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from grpo.rollout import Rollout


class Sampler(Protocol):
    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False) -> Rollout: ...


def completion_lengths(completion_ids: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """Tokens up to and including the first EOS, or all T when none. [N, T] -> [N]."""
    eos_ids = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id])
    is_eos = torch.isin(completion_ids, eos_ids)
    T = completion_ids.shape[1]
    first_eos = is_eos.float().argmax(-1) + 1
    return torch.where(is_eos.any(-1), first_eos, torch.full_like(first_eos, T)).long()


def mask_from_lengths(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[N] -> [N, T] with 1 on the first `length` positions."""
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()


class HFSampler:
    """Sampling with Hugging Face `generate`; works on any device the policy is on."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p

    @torch.no_grad()
    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False) -> Rollout:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = enc.input_ids.repeat_interleave(group_size, dim=0)       # [N, P]
        prompt_mask = enc.attention_mask.repeat_interleave(group_size, dim=0)  # [N, P]
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        sampling = {} if greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0}
        out = self.model.generate(
            input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
            do_sample=not greedy, max_new_tokens=self.max_new_tokens,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            output_scores=True, return_dict_in_generate=True, **sampling,
        )
        self.model.train(was_training)
        completion_ids = out.sequences[:, prompt_ids.shape[1]:].cpu()          # [N, T]
        T = completion_ids.shape[1]
        lengths = completion_lengths(completion_ids, tok.eos_token_id)
        truncated = ~torch.isin(completion_ids, torch.tensor([tok.eos_token_id])).any(-1)
        completion_mask = mask_from_lengths(lengths, T)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
        scores = torch.stack(out.scores, dim=1).float().cpu()                  # [N, T, V] processed logits
        sampler_logprobs = F.log_softmax(scores, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        sampler_logprobs = sampler_logprobs.masked_fill(completion_mask == 0, 0.0)
        texts = tok.batch_decode([ids[:n] for ids, n in zip(completion_ids, lengths)],
                                 skip_special_tokens=True)
        return Rollout(
            prompts=[p for p in prompts for _ in range(group_size)],
            completions=texts,
            group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompt_ids=prompt_ids, prompt_mask=prompt_mask,
            completion_ids=completion_ids, completion_mask=completion_mask,
            sampler_logprobs=sampler_logprobs, truncated=truncated,
            temperature=1.0 if greedy else self.temperature,
        )
