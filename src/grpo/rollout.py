"""The `Rollout`: everything one step samples and scores, with shapes spelled out.

Shape glossary:
    B  prompts in the step            (`prompts_per_step`)
    G  completions per prompt          (`group_size`)
    N  = B*G completions, one row each
    P  prompt tokens (left-padded)     T  completion tokens (right-padded, EOS included)

Groups are tracked by `group_ids`, not by position, so reordering or splitting rows cannot mix them.

A multi-turn episode (episodes.py) is the same structure: its "completion" is every token after
the prompt, the policy's turns and the tools' and environment's answers, in order, as one token
sequence. `completion_mask` marks the tokens the policy wrote (the loss, the KL, the entropy and
every aggregation see only those); `context_mask` marks every real token (what attention sees).
A single-turn completion has `context_mask` None: the two are the same.
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
    top_p: float = 1.0                  # and with this nucleus (models.nucleus_)
    top_k: int = 0                      # and this top-k (0: none), and
    min_p: float = 0.0                  # this min-p (0: none), cut as models.Cut says, after
    repetition_penalty: float = 1.0     # this repetition penalty (1: none; models.Penalty)
    columns: dict[str, list] = field(default_factory=dict)  # dataset columns, each [N]
    rewards: torch.Tensor | None = None          # [N] float; NaN where no function could score
    rewards_per_fn: dict[str, list] = field(default_factory=dict)  # name -> [N] float | None
    advantages: torch.Tensor | None = None       # [N], or [N, T] per token (turn rewards, REINFORCE++)
    old_logprobs: torch.Tensor | None = None     # [N, T] pi_old, fixed for the mu updates
    ref_logprobs: torch.Tensor | None = None     # [N, T] pi_ref; None when beta = 0
    loss_mask: torch.Tensor | None = None        # [N, T] tokens that enter the loss; None = completion_mask
    context_mask: torch.Tensor | None = None     # [N, T] every real token after the prompt; None = completion_mask
    episodes: dict[str, list] = field(default_factory=dict)  # multi-turn bookkeeping, each [N]
    versions: torch.Tensor | None = None         # [N, T] long: the weight version (optimizer steps
    #                                              behind it) that drew each token; None: this step's
    visuals: list | None = None                  # [N] vision.Visual or None: the prompt's images as
    #                                              the processor made them, one object per group

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def input_ids(self) -> torch.Tensor:       # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def real_mask(self) -> torch.Tensor:       # [N, T] tokens after the prompt that exist
        return self.completion_mask if self.context_mask is None else self.context_mask

    @property
    def attention_mask(self) -> torch.Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.real_mask], dim=1)

    def rows(self, index: slice | list[int]) -> "Rollout":
        """Some rows (a slice for micro-batching, or a list of row numbers); lists and tensors alike."""
        positions = list(range(len(self)))[index] if isinstance(index, slice) else list(index)
        tensor_index = index if isinstance(index, slice) else torch.tensor(positions, dtype=torch.long)

        def cut(x):
            if x is None:
                return None
            if isinstance(x, list):
                return [x[i] for i in positions]
            return x[tensor_index]
        return replace(
            self,
            prompts=cut(self.prompts), completions=cut(self.completions),
            group_ids=cut(self.group_ids), prompt_ids=cut(self.prompt_ids),
            prompt_mask=cut(self.prompt_mask), completion_ids=cut(self.completion_ids),
            completion_mask=cut(self.completion_mask), sampler_logprobs=cut(self.sampler_logprobs),
            truncated=cut(self.truncated),
            columns={k: cut(v) for k, v in self.columns.items()},
            rewards=cut(self.rewards),
            rewards_per_fn={k: cut(v) for k, v in self.rewards_per_fn.items()},
            advantages=cut(self.advantages), old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs), loss_mask=cut(self.loss_mask),
            context_mask=cut(self.context_mask),
            episodes={k: cut(v) for k, v in self.episodes.items()}, versions=cut(self.versions),
            visuals=cut(self.visuals),
        )

    def trimmed(self) -> "Rollout":
        """The same rows without the prompt columns that are padding in every row (on the left)
        and the completion columns past the longest completion (on the right)."""
        real_prompt = self.prompt_mask.any(0).nonzero()
        start = int(real_prompt[0]) if len(real_prompt) else self.prompt_mask.shape[1]
        end = max(1, int(self.real_mask.sum(-1).max())) if len(self) else 1

        def cut(x, left: bool):
            if x is None or x.dim() < 2:
                return x
            return x[:, start:] if left else x[:, :end]
        return replace(
            self, prompt_ids=cut(self.prompt_ids, True), prompt_mask=cut(self.prompt_mask, True),
            completion_ids=cut(self.completion_ids, False), completion_mask=cut(self.completion_mask, False),
            sampler_logprobs=cut(self.sampler_logprobs, False), old_logprobs=cut(self.old_logprobs, False),
            ref_logprobs=cut(self.ref_logprobs, False), loss_mask=cut(self.loss_mask, False),
            context_mask=cut(self.context_mask, False), advantages=cut(self.advantages, False),
            versions=cut(self.versions, False))

    def to(self, device) -> "Rollout":
        """The same rows with every tensor on `device` (the model's, for a forward pass)."""
        return replace(self, **{f: getattr(self, f).to(device) for f in (
            "group_ids", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
            "sampler_logprobs", "truncated", "rewards", "advantages", "old_logprobs", "ref_logprobs",
            "loss_mask", "context_mask") if isinstance(getattr(self, f), torch.Tensor)})

    @property
    def tokens_in_loss(self) -> torch.Tensor:  # [N, T]
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def scored_tokens(self) -> torch.Tensor:  # [N, T]: tokens_in_loss of the rows with a reward
        return self.tokens_in_loss * (~torch.isnan(self.rewards)).long().unsqueeze(-1)


def concat(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Rows of several sampled (and perhaps scored) rollouts in one: prompts re-padded on the left,
    completions on the right, group ids offset so groups from different parts never merge."""
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.completion_ids.shape[1] for p in parts)

    def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    group_ids, offset = [], 0
    for p in parts:
        group_ids.append(p.group_ids + offset)
        offset += int(p.group_ids.max()) + 1 if len(p) else 0
    columns = {k: [v for p in parts for v in p.columns[k]] for k in parts[0].columns}
    return Rollout(
        prompts=[x for p in parts for x in p.prompts],
        completions=[x for p in parts for x in p.completions],
        group_ids=torch.cat(group_ids),
        prompt_ids=torch.cat([left(p.prompt_ids, P, pad_token_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, P, 0) for p in parts]),
        completion_ids=torch.cat([right(p.completion_ids, T, pad_token_id) for p in parts]),
        completion_mask=torch.cat([right(p.completion_mask, T, 0) for p in parts]),
        sampler_logprobs=torch.cat([right(p.sampler_logprobs, T, 0.0) for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        temperature=parts[0].temperature, top_p=parts[0].top_p, top_k=parts[0].top_k,
        min_p=parts[0].min_p, repetition_penalty=parts[0].repetition_penalty,
        columns=columns,
        rewards=torch.cat([p.rewards for p in parts]) if parts[0].rewards is not None else None,
        rewards_per_fn={k: [v for p in parts for v in p.rewards_per_fn[k]]
                        for k in parts[0].rewards_per_fn},
        context_mask=(torch.cat([right(p.real_mask, T, 0) for p in parts])
                      if any(p.context_mask is not None for p in parts) else None),
        episodes={k: [v for p in parts for v in p.episodes[k]] for k in parts[0].episodes},
        versions=(torch.cat([right(p.versions, T, -1) for p in parts])
                  if all(p.versions is not None for p in parts) else None),
        visuals=([v for p in parts for v in (p.visuals or [None] * len(p))]
                 if any(p.visuals is not None for p in parts) else None),
    )
