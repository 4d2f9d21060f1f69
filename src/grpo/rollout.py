"""The `Rollout`: everything one step samples and scores, with shapes spelled out.

Shape glossary:
    B  prompts in the step            (`prompts_per_step`)
    G  completions per prompt          (`group_size`)
    N  = B*G completions, one row each
    P  prompt tokens (left-padded)     T  completion tokens (right-padded, EOS included)

Groups are tracked by `group_ids`, not by position, so reordering or splitting rows cannot mix them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Rollout:
    prompts: list[str]                  # [N] prompt text, repeated for each member of its group
    completions: list[str]              # [N] decoded completion text (EOS and padding stripped)
    group_ids: torch.Tensor             # [N] long; rows with the same id share a prompt
    prompt_ids: torch.Tensor            # [N, P] left-padded
    prompt_mask: torch.Tensor           # [N, P] 1 on real prompt tokens
    completion_ids: torch.Tensor        # [N, T] right-padded
    completion_mask: torch.Tensor       # [N, T] 1 on generated tokens up to and including EOS
    sampler_logprobs: torch.Tensor      # [N, T] log-probs the sampler drew each token with
    truncated: torch.Tensor             # [N] bool; hit max_new_tokens before EOS
    temperature: float = 1.0            # the sampler's; log-probs of pi are taken at this temperature
    columns: dict[str, list] = field(default_factory=dict)  # dataset columns, each [N]
    rewards: torch.Tensor | None = None          # [N] float; NaN where no function could score
    rewards_per_fn: dict[str, list] = field(default_factory=dict)  # name -> [N] float | None
    advantages: torch.Tensor | None = None       # [N]
    old_logprobs: torch.Tensor | None = None     # [N, T] pi_old, fixed for the mu updates
    ref_logprobs: torch.Tensor | None = None     # [N, T] pi_ref; None when beta = 0

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def input_ids(self) -> torch.Tensor:       # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def rows(self, index: slice) -> "Rollout":
        """A view of some rows, for micro-batching; tensors are sliced, lists too."""
        def cut(x):
            if x is None:
                return None
            return x[index]
        return replace(
            self,
            prompts=self.prompts[index], completions=self.completions[index],
            group_ids=cut(self.group_ids), prompt_ids=cut(self.prompt_ids),
            prompt_mask=cut(self.prompt_mask), completion_ids=cut(self.completion_ids),
            completion_mask=cut(self.completion_mask), sampler_logprobs=cut(self.sampler_logprobs),
            truncated=cut(self.truncated),
            columns={k: v[index] for k, v in self.columns.items()},
            rewards=cut(self.rewards),
            rewards_per_fn={k: v[index] for k, v in self.rewards_per_fn.items()},
            advantages=cut(self.advantages), old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs),
        )
