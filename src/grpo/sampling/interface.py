"""What every engine that samples meets and shares: the `Sampler` protocol the trainer, the
rollout workers and evaluation ask of it, `SharesThePolicy` for one that samples from the policy
module itself, and the pieces a `Rollout` is built from on any engine: EOS ids, lengths and masks
from them, and prompts with images encoded through the model's processor (`vision_prompts`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from grpo import vision
from grpo.rollout import Rollout


@runtime_checkable
class Sampler(Protocol):
    """What the trainer, the rollout workers and evaluation ask of an engine that samples: its
    groups, the policy's new weights, its memory freed around the update, and the settings it
    samples with (evaluation sets `temperature` and the cut, and puts them back)."""
    max_new_tokens: int            # a completion's tokens at most (an episode's, multi-turn)
    temperature: float
    top_p: float                   # the cut: 1.0, 0, 0.0 and 1.0 are none. top_k, min_p and the
    top_k: int                     # repetition penalty only grpo's single-turn sampler applies
    min_p: float                   # (config.sampler_own_keys): the others hold them at none
    repetition_penalty: float

    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False,
               uniforms: torch.Tensor | None = None, rows: list[dict] | None = None) -> Rollout:
        """`rows` (the dataset rows of the prompts) reset a multi-turn run's environments; a
        single-turn sampler ignores them."""

    def sync(self, policy) -> None:
        """Sample from `policy`'s current weights from now on: an engine with weights of its own
        loads them; one that samples from the policy itself has nothing to do."""

    def sleep(self) -> None:
        """Free what the engine holds on the device while the policy is updated (nothing, for
        one that samples from the policy itself)."""

    def wake(self) -> None:
        """Take back what `sleep` freed (`sample` and `sync` wake it when it sleeps)."""

    def device(self) -> torch.device | None:
        """The device whose random generator its draws use (None: the engine draws its own)."""

    def health(self) -> str | None:
        """None when it can sample; else what is wrong with its engine, in words."""

    def close(self) -> None:
        """Let go of what it made for itself (an engine it started, a server's weights files);
        an engine given to it is left open."""


class SharesThePolicy:
    """The engine's life of a sampler that samples from the policy module itself: there are no
    weights of its own to load and no memory of its own to free."""

    def sync(self, policy) -> None:
        """Nothing to load: the policy's weights are the ones it samples from."""

    def sleep(self) -> None:
        """Nothing to free."""

    def wake(self) -> None:
        """Nothing to take back."""

    def device(self) -> torch.device | None:
        return next(self.model.parameters()).device

    def health(self) -> str | None:
        """None: the policy itself is always there."""
        return None

    def close(self) -> None:
        """Nothing of its own to let go of."""


def eos_ids(eos_token_id: int | list[int], device=None) -> torch.Tensor:
    """A tokenizer's EOS id, or its list of them, as a tensor for `torch.isin`."""
    return torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id], device=device)


def completion_lengths(completion_ids: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """Tokens up to and including the first EOS, or all T when none. [N, T] -> [N]."""
    is_eos = torch.isin(completion_ids, eos_ids(eos_token_id))
    T = completion_ids.shape[1]
    first_eos = is_eos.float().argmax(-1) + 1
    return torch.where(is_eos.any(-1), first_eos, torch.full_like(first_eos, T)).long()


def mask_from_lengths(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[N] -> [N, T] with 1 on the first `length` positions."""
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()


def vision_prompts(tokenizer, prompts: list[str], rows: list[dict]):
    """Prompt ids, mask [B, P] and a vision.Visual per prompt, through the model's processor,
    for rows whose `images` (sources, vision.row_images) are decoded here."""
    processor = getattr(tokenizer, "grpo_processor", None)
    if processor is None:
        raise ValueError("these prompts hold images, but the model is text-only (it has no image "
                         "processor); use a vision-language model, or a dataset without images")
    pictures = [[vision.load_image(s, f"row {r.get('_row', i) + 1}") for s in r.get("images") or []]
                for i, r in enumerate(rows)]
    return vision.encode(processor, prompts, pictures)
