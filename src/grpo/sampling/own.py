"""grpo's own sampler (`sampler=hf`): `HFSampler` samples from the policy module itself, on the
device it is on, with a KV cache (`_Cache`: decoder.Decoder for the architectures it supports,
Hugging Face's forward for any other model).

`generate_with_lengths` is its decode loop: one token per row per step (`draw`, from the scores
`drawn_from` makes), ended rows dropped from the batch. `vision_turns` is the same loop for one
turn of multi-turn episodes on a vision-language model (episodes.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo import vision
from grpo.models import Cut, decoder, heap, penalize_
from grpo.rollout import Rollout
from grpo.sampling.interface import SharesThePolicy, eos_ids, mask_from_lengths, vision_prompts


class HFSampler(SharesThePolicy):
    """Sampling from any Hugging Face causal LM on the device the policy is on, with a KV cache.

    The loop asks the model for the last position's logits only, draws one token per row, and
    drops rows from the batch (and their cache) as they end, so a ragged batch costs what its
    tokens cost; it stops when every row has ended or `max_new_tokens` is reached.
    """

    def __init__(self, model, tokenizer, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, stop: tuple = (),
                 repetition_penalty: float = 1.0):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.top_k, self.min_p, self.stop = top_k, min_p, tuple(stop)
        self.repetition_penalty = repetition_penalty

    @torch.no_grad()
    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False,
               uniforms: torch.Tensor | None = None, rows: list[dict] | None = None) -> Rollout:
        """`uniforms` [N, max_new_tokens], if given, are the draws each row's tokens are sampled
        with; the caller then decides the randomness, so a row's completion does not depend on
        which other rows share its batch (or its process)."""
        tok = self.tokenizer
        visuals = None
        if rows is not None and any(r.get("images") for r in rows):
            prompt_ids, prompt_mask, visuals = vision_prompts(tok, prompts, rows)
        else:
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            prompt_ids, prompt_mask = enc.input_ids, enc.attention_mask
        was_training = self.model.training
        self.model.eval()
        try:
            completion_ids, sampler_logprobs, lengths = self.generate(
                prompt_ids, prompt_mask, group_size, greedy=greedy, uniforms=uniforms,
                visuals=visuals)
        finally:
            self.model.train(was_training)
        T = completion_ids.shape[1]
        truncated = lengths == 0               # neither EOS nor a stop string: cut at the limit
        lengths = torch.where(truncated, torch.full_like(lengths, T), lengths)
        completion_mask = mask_from_lengths(lengths, T)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
        sampler_logprobs = sampler_logprobs.masked_fill(completion_mask == 0, 0.0)
        texts = tok.batch_decode([ids[:n] for ids, n in zip(completion_ids, lengths)],
                                 skip_special_tokens=True)
        return Rollout(
            prompts=[p for p in prompts for _ in range(group_size)],
            completions=texts,
            group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompt_ids=prompt_ids.repeat_interleave(group_size, dim=0),        # [N, P]
            prompt_mask=prompt_mask.repeat_interleave(group_size, dim=0),
            completion_ids=completion_ids, completion_mask=completion_mask,
            sampler_logprobs=sampler_logprobs, truncated=truncated,
            temperature=1.0 if greedy else self.temperature, top_p=1.0 if greedy else self.top_p,
            top_k=0 if greedy else self.top_k, min_p=0.0 if greedy else self.min_p,
            repetition_penalty=1.0 if greedy else self.repetition_penalty,
            visuals=None if visuals is None else [v for v in visuals for _ in range(group_size)],
        )

    def generate(self, prompt_ids, prompt_mask, group_size: int, *, greedy: bool, uniforms,
                 visuals) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """generate_with_lengths with this sampler's settings (static.StaticSampler decodes
        another way)."""
        tok = self.tokenizer
        return generate_with_lengths(
            self.model, prompt_ids, prompt_mask, self.max_new_tokens, tok.eos_token_id,
            tok.pad_token_id, temperature=1.0 if greedy else self.temperature,
            top_p=self.top_p, greedy=greedy, uniforms=uniforms, group_size=group_size,
            visuals=visuals, top_k=self.top_k, min_p=self.min_p,
            repetition_penalty=1.0 if greedy else self.repetition_penalty,
            stopped=stop_check(tok, self.stop) if self.stop else None)


@torch.no_grad()
def vision_turns(model, tokenizer, histories: list[list[int]], room: list[int], stop: str, *,
                 visuals: list, temperature: float = 1.0, top_p: float = 1.0,
                 greedy: bool = False) -> list[tuple[list[int], list[float], bool]]:
    """One turn of each episode on a vision-language model (episodes.sample_episodes_on_engine's
    `generate_turns`): each history, left-padded, is prefilled with its images (`visuals`, each
    distinct one encoded once), then decoded to EOS, the `stop` text (kept) or its `room` of
    tokens. Returns per history (token ids, their log-probs, cut at room)."""
    from transformers.generation.logits_process import TopPLogitsWarper

    device = next(model.parameters()).device
    n, width = len(histories), max(map(len, histories))
    ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, h in enumerate(histories):
        ids[i, width - len(h):], mask[i, width - len(h):] = torch.tensor(h, dtype=torch.long), 1
    cache = _Cache(model, ids.to(device), mask.to(device), max(room), 1, visuals)
    logits = cache.logits
    banned = placeholders(model, device)
    warper = TopPLogitsWarper(top_p) if (top_p < 1.0 and not greedy) else None
    eos = set(eos_ids(tokenizer.eos_token_id).tolist())
    tokens, logprobs = [[] for _ in range(n)], [[] for _ in range(n)]
    open_, cut = [True] * n, [False] * n
    for _ in range(max(room)):
        scores = drawn_from(logits, banned, temperature, warper, greedy)
        chosen, lse = draw(scores, greedy)
        chosen_logp = (scores.gather(-1, chosen[:, None]) - lse).squeeze(-1).tolist()
        for i, token in enumerate(chosen.tolist()):
            if not open_[i]:
                continue
            tokens[i].append(token)
            logprobs[i].append(chosen_logp[i])
            if token in eos or (stop and tokenizer.decode(tokens[i]).endswith(stop)):
                open_[i] = False
            elif len(tokens[i]) >= room[i]:
                open_[i], cut[i] = False, True
        if not any(open_):
            break
        logits = cache.step(chosen)
    return [(tokens[i], logprobs[i], cut[i]) for i in range(n)]


def placeholders(model, device) -> torch.Tensor | None:
    """A vision-language model's image placeholder ids, which are never drawn; None for text."""
    ids = vision.placeholder_ids(model) if vision.is_vision_model(model) else []
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def drawn_from(logits: torch.Tensor, banned: torch.Tensor | None, temperature: float, warper,
               greedy: bool, seen: torch.Tensor | None = None, penalty: float = 1.0) -> torch.Tensor:
    """The scores [n, V] a token is drawn from: placeholders out, then temperature, the
    repetition penalty on the `seen` [n, V] tokens (models.Penalty) and the cut (`warper`)."""
    scores = logits.float()
    if banned is not None:
        scores = scores.index_fill(-1, banned, vision.BANNED_LOGIT)
    if not greedy and temperature != 1.0:
        scores = scores / temperature
    if seen is not None:
        scores = penalize_(scores.clone() if scores is logits else scores, seen, penalty)
    return scores if warper is None else warper(None, scores)


def prompt_tokens_seen(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab: int,
                       repeat: int) -> torch.Tensor:
    """[B * repeat, V] bool: the tokens of each prompt (its real tokens, not padding), each
    prompt's row repeated `repeat` times, as its rows are."""
    counts = torch.zeros(len(prompt_ids), vocab, dtype=torch.int32, device=prompt_ids.device)
    counts.scatter_add_(1, prompt_ids, prompt_mask.int())
    return (counts > 0).repeat_interleave(repeat, 0)


PRUNE_FRACTION = 0.125  # drop ended rows from the batch once this share of the running ones has ended


def generate(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
             eos_token_id: int | list[int], pad_token_id: int, *, temperature: float = 1.0,
             top_p: float = 1.0, greedy: bool = False, uniforms: torch.Tensor | None = None,
             group_size: int = 1, visuals: list | None = None, top_k: int = 0,
             min_p: float = 0.0, repetition_penalty: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """generate_with_lengths without the lengths: the tokens [N, T] and their log-probs [N, T]."""
    tokens, logprobs, _ = generate_with_lengths(
        model, prompt_ids, prompt_mask, max_new_tokens, eos_token_id, pad_token_id,
        temperature=temperature, top_p=top_p, greedy=greedy, uniforms=uniforms,
        group_size=group_size, visuals=visuals, top_k=top_k, min_p=min_p,
        repetition_penalty=repetition_penalty)
    return tokens, logprobs


def stop_check(tokenizer, stop: tuple[str, ...]) -> Callable[[list[int]], bool]:
    """Whether a row's tokens so far end it at a stop string: the text of its last few tokens
    (enough for the longest stop string) holds one. A stop string found there is new, since the
    row would have ended at an earlier one."""
    window = max(len(s) for s in stop) + 8

    def stopped(ids: list[int]) -> bool:
        tail = tokenizer.decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop)
    return stopped


def cut_warper(top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, greedy: bool = False):
    """`drawn_from`'s warper for a cut (models.Cut), or None when nothing is cut."""
    cut = Cut(top_p, top_k, min_p)
    if greedy or not cut.active:
        return None
    return lambda _ids, scores: cut.apply_(scores.clone())


def generate_with_lengths(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          max_new_tokens: int, eos_token_id: int | list[int], pad_token_id: int, *,
                          temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                          uniforms: torch.Tensor | None = None, group_size: int = 1,
                          visuals: list | None = None, top_k: int = 0, min_p: float = 0.0,
                          repetition_penalty: float = 1.0,
                          stopped: Callable[[list[int]], bool] | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode up to `max_new_tokens` tokens for `group_size` rows of each left-padded prompt
    [B, P]: N = B * group_size rows, a prompt's rows next to each other. Each prompt is prefilled
    once and its keys and values are copied to its rows.

    `visuals` [B] (vision.Visual or None) are the prompts' images: each prompt's image features
    are computed once, in its prefill. A row ends at EOS, or where `stopped` (stop_check) says
    its tokens reach a stop string.

    Returns the tokens [N, T] (pad after a row's end; T is the longest row), the log-prob each
    token was drawn with [N, T], from the logits after temperature, the repetition penalty
    (models.Penalty) and the cut (top_k, top_p, min_p: models.Cut), and each row's length [N] up to and including the token that ended it
    (0 for a row that reached `max_new_tokens` without ending).
    """
    device = next(model.parameters()).device
    N = prompt_ids.shape[0] * group_size
    eos = eos_ids(eos_token_id, device)
    warper = cut_warper(top_p, top_k, min_p, greedy)
    tokens = torch.full((N, max_new_tokens), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros(N, max_new_tokens)
    lengths = torch.zeros(N, dtype=torch.long)
    rows = torch.arange(N)                        # which original rows are still in the batch
    cache = _Cache(model, prompt_ids.to(device), prompt_mask.to(device), max_new_tokens, group_size,
                   visuals)
    logits = cache.logits
    banned = placeholders(model, device)
    seen = None if repetition_penalty == 1.0 else prompt_tokens_seen(
        prompt_ids.to(device), prompt_mask.to(device), logits.shape[-1], group_size)
    ended = torch.zeros(N, dtype=torch.bool, device=device)
    steps = 0
    for t in range(max_new_tokens):
        steps = t + 1
        scores = drawn_from(logits, banned, temperature, warper, greedy, seen, repetition_penalty)
        u = None if uniforms is None else uniforms[rows, t, None].to(scores.device)
        chosen, lse = draw(scores, greedy, u)
        chosen_logp = (scores.gather(-1, chosen[:, None]) - lse).squeeze(-1)
        chosen = chosen.masked_fill(ended, pad_token_id)
        if seen is not None:
            seen[torch.arange(len(chosen), device=device), chosen] = True
        tokens[rows, t] = chosen.cpu()
        logprobs[rows, t] = chosen_logp.cpu()
        ending = ~ended & torch.isin(chosen, eos)
        if stopped is not None:
            for i in (~ended & ~ending).nonzero().squeeze(-1).tolist():
                if stopped(tokens[rows[i], :t + 1].tolist()):
                    ending[i] = True
        lengths[rows[ending.cpu()]] = t + 1
        ended = ended | ending
        if bool(ended.all()) or t + 1 == max_new_tokens:
            break
        if ended.float().mean() >= PRUNE_FRACTION:   # drop the ended rows and their cache
            keep = (~ended).nonzero().squeeze(-1)
            cache.keep(keep)
            rows, chosen, ended = rows[keep.cpu()], chosen[keep], ended[keep]
            seen = None if seen is None else seen[keep]
        logits = cache.step(chosen)
    return tokens[:, :steps], logprobs[:, :steps], lengths


def draw(scores: torch.Tensor, greedy: bool = False,
         u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from softmax(scores) [n, V], and logsumexp(scores) [n, 1].

    Sampling inverts the cumulative distribution at a uniform draw: exact, in a few passes over
    V (torch.multinomial draws V exponentials per row, which costs more than the model's step
    when V is 150k). Greedy takes the argmax.
    """
    top = scores.amax(-1, keepdim=True)
    probs = (scores - top).exp_()                                      # unnormalized, max 1
    total = probs.sum(-1, keepdim=True)
    lse = top + total.log()
    if greedy:
        return scores.argmax(-1), lse
    cdf = probs.cumsum_(-1)
    if u is None:
        u = torch.rand(len(scores), 1, device=scores.device)
    u = u * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=scores.shape[-1] - 1)
    return chosen, lse


class _Cache:
    """The KV cache and one-token steps: `decoder.Decoder` for the architectures it supports,
    Hugging Face's forward and DynamicCache for any other model."""

    def __init__(self, model, prompt_ids, prompt_mask, max_new_tokens: int, repeat: int = 1,
                 visuals: list | None = None):
        self.model = model
        self.mrope = False
        if visuals is not None or vision.is_vision_model(model):
            self._prefill_vision(model, prompt_ids, prompt_mask, repeat, visuals)
            return
        if decoder.supports(model):
            self.fast = decoder.Decoder(model)
            self.logits, self.state = self.fast.start(prompt_ids, prompt_mask, max_new_tokens, repeat)
            return
        if repeat > 1:
            prompt_ids = prompt_ids.repeat_interleave(repeat, 0)
            prompt_mask = prompt_mask.repeat_interleave(repeat, 0)
        from transformers import DynamicCache
        self.fast = None
        self.attention = prompt_mask
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        self.with_cache = {vision.cache_argument(model): self.cache, "use_cache": True}
        self.logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                            logits_to_keep=1, **self.with_cache).logits[:, -1]
        self.next_position = positions[:, -1:] + 1

    def _prefill_vision(self, model, prompt_ids, prompt_mask, repeat: int, visuals) -> None:
        """Each prompt prefilled once with its images (their features computed once), its keys
        and values then copied to its `repeat` rows."""
        from transformers import DynamicCache
        self.fast = None
        inputs = vision.forward_inputs(model, prompt_ids, prompt_mask,
                                       visuals if visuals is not None else [None] * len(prompt_ids))
        positions = vision.prompt_positions(model, inputs)        # [B, P] or [3, B, P] (mRoPE)
        inputs["position_ids"] = positions
        self.mrope = positions.dim() == 3
        self.cache = DynamicCache(config=model.config)
        self.with_cache = {vision.cache_argument(model): self.cache, "use_cache": True}
        self.logits = model(**inputs, logits_to_keep=1, **self.with_cache).logits[:, -1]
        last = positions.amax(0) if self.mrope else positions                         # [B, P]
        self.next_position = last.amax(-1, keepdim=True) + 1                           # [B, 1]
        self.attention = prompt_mask
        if repeat > 1:
            self.cache.batch_repeat_interleave(repeat)
            self.logits = self.logits.repeat_interleave(repeat, 0)
            self.next_position = self.next_position.repeat_interleave(repeat, 0)
            self.attention = prompt_mask.repeat_interleave(repeat, 0)

    def keep(self, rows: torch.Tensor) -> None:
        if self.fast is not None:
            self.fast.keep(self.state, rows)
            return
        self.cache.batch_select_indices(rows)
        self.attention, self.next_position = self.attention[rows], self.next_position[rows]
        heap.release(rows.device)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.fast is not None:
            return self.fast.step(tokens, self.state)
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(tokens), 1)], dim=1)
        positions = self.next_position[None].expand(3, -1, -1) if self.mrope else self.next_position
        logits = self.model(input_ids=tokens[:, None], attention_mask=self.attention,
                            position_ids=positions, **self.with_cache).logits[:, -1]
        self.next_position = self.next_position + 1
        return logits
