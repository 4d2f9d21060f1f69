"""What the samplers cut from or penalize in a next-token distribution (top-k, top-p, min-p and
the repetition penalty), applied the same way by the samplers and by the training log-probs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def nucleus_(logits: torch.Tensor, top_p: float, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Top-p in place on [rows, V] logits (already divided by the temperature): -inf outside the
    smallest set of most likely tokens whose probability reaches top_p, the rule of transformers'
    TopPLogitsWarper that the samplers draw with. A row's target is always kept: it was drawn, so
    it was in the sampler's nucleus (float noise between two computations can put it at the edge)."""
    ascending, order = torch.sort(logits, dim=-1)
    drop_sorted = ascending.softmax(-1).cumsum_(-1) <= (1 - top_p)
    drop_sorted[..., -1] = False                     # the most likely token always stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    if targets is not None:
        drop.scatter_(-1, targets[:, None], False)
    return logits.masked_fill_(drop, float("-inf"))


@dataclass(frozen=True)
class Cut:
    """What the samplers cut from a next-token distribution after the temperature, in the order
    transformers' warpers apply them: top-k (the k largest logits; ties with the k-th kept), top-p
    (nucleus_), min-p (tokens whose probability is below min_p times the largest one's). The
    training log-probs cut the same, so the policy trained is the distribution that sampled.
    0 (top_k, min_p) and 1 (top_p) mean no cut."""
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @property
    def active(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def apply_(self, logits: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """In place on [rows, V] logits (already divided by the temperature): -inf outside the
        cut. A row's target is always kept: it was drawn, so it was inside the sampler's cut
        (float noise between two computations can put it at the edge)."""
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            drop = logits < kth
            if targets is not None:
                drop.scatter_(-1, targets[:, None], False)
            logits.masked_fill_(drop, float("-inf"))
        if self.top_p < 1.0:
            nucleus_(logits, self.top_p, targets)
        if self.min_p > 0.0:
            # p_i < min_p * p_max  <=>  logit_i < max logit + log(min_p): no softmax needed
            drop = logits < logits.amax(-1, keepdim=True) + math.log(self.min_p)
            if targets is not None:
                drop.scatter_(-1, targets[:, None], False)
            logits.masked_fill_(drop, float("-inf"))
        return logits


class Penalty:
    """The repetition penalty (Keskar et al. 2019, CTRL, section 4.1) as transformers' and vLLM's
    samplers apply it: the logit of every token already in the prompt or in the completion so far
    is divided by `factor` where it is positive and multiplied by it where it is negative (a
    factor above 1 makes repeats less likely). The training log-probs penalize the same tokens at
    each position, so the policy trained is the distribution that sampled.

    `first` [N, V] holds, per row, the completion position from which each token is penalized:
    0 for a prompt token, j + 1 for a token first drawn at position j, never (T + 1) otherwise;
    `row` and `position` [M] say which row and position each of the M selected positions is."""

    def __init__(self, factor: float, first: torch.Tensor, row: torch.Tensor, position: torch.Tensor):
        self.factor, self.first, self.row, self.position = factor, first, row, position

    @staticmethod
    def of(factor: float, prompt_ids, prompt_mask, completion_ids, completion_mask,
           vocab: int) -> "Penalty | None":
        """The penalty for completions [N, T] (right-padded, `completion_mask` on their tokens)
        after prompts [N, P] (`prompt_mask` on real tokens, padding never penalized); None for
        factor 1 (no penalty)."""
        if factor == 1.0:
            return None
        N, T = completion_ids.shape
        never = T + 1
        first = torch.full((N, vocab), never, dtype=torch.int32, device=completion_ids.device)
        drawn = torch.arange(1, T + 1, dtype=torch.int32, device=first.device).expand(N, T)
        first.scatter_reduce_(1, completion_ids, torch.where(completion_mask.bool(), drawn, never),
                              reduce="amin")
        first.scatter_reduce_(1, prompt_ids, torch.where(prompt_mask.bool(), 0, never).int(),
                              reduce="amin")
        row, position = completion_mask.bool().nonzero(as_tuple=True)
        return Penalty(factor, first, row, position)

    def scale(self, logits: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """The factor [n, V] each of `logits` [n, V] (the selected positions `rows`) is
        multiplied by: 1 / factor on a penalized positive logit, factor on a negative one, 1 on
        the rest. It is also d penalized / d logit."""
        picked = slice(None) if rows is None else rows
        penalized = self.first[self.row[picked]] <= self.position[picked, None]
        return torch.where(penalized, torch.where(logits < 0, self.factor, 1.0 / self.factor),
                           1.0).to(logits.dtype)


def penalize_(scores: torch.Tensor, seen: torch.Tensor, factor: float) -> torch.Tensor:
    """The sampler's repetition penalty in place on [n, V] scores, `seen` [n, V] marking the
    tokens of each row's prompt and completion so far (Penalty says the rule)."""
    return scores.mul_(torch.where(seen, torch.where(scores < 0, factor, 1.0 / factor), 1.0))

