"""The one per-token log-prob function every stage uses (token_logprobs) and the chunked output
head under it (selected_logprobs, _SelectedLogprobs), which never holds the [N, T, V] logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo import vision
from grpo.models import decoder, packed
from grpo.models.cuts import Cut, Penalty


LOGIT_CHUNK_ELEMENTS = 1 << 24  # logits held at once by the chunked head: 16M floats, 64 MiB


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[target] for M rows of hidden states, never holding [M, V] logits.

    Forward and backward walk the rows in chunks of `chunk` and recompute each chunk's logits, so
    memory is O(chunk * V) whatever M is. Also returns each row's entropy (no gradient).
    d logp / d logits = onehot(target) - softmax(logits), scaled by 1/temperature.
    Each pass works in two [chunk, V] buffers allocated once and reused, in place: allocating
    and freeing large blocks chunk after chunk fragments the C allocator's heap (measured: a
    12 GiB peak for a 151,936-token vocabulary, against 0.6 GiB with reuse).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temp: float, chunk: int, top_p: float = 1.0,
                top_k: int = 0, min_p: float = 0.0, penalty: "Penalty | None" = None):
        cut = Cut(top_p, top_k, min_p)
        M = hidden.shape[0]
        logp, lse, entropy = (hidden.new_empty(M, dtype=torch.float32) for _ in range(3))
        buffers = _Buffers(min(chunk, M), weight.shape[0], hidden.device)
        # float32 hidden states and a bfloat16 head (FSDP2's mixed precision gathers the weights
        # in bfloat16): the head in float32, as the backward computes it
        w = weight.float() if hidden.dtype == torch.float32 else weight
        for start in range(0, M, chunk):
            rows = slice(start, start + chunk)
            shifted = buffers.logits(hidden[rows], w, bias, inv_temp)
            if penalty is not None:
                shifted.mul_(penalty.scale(shifted, rows))          # repeats penalized as sampled
            if cut.active:
                cut.apply_(shifted, targets[rows])           # -inf outside what the sampler drew from
            top = shifted.amax(-1, keepdim=True)
            shifted.sub_(top)                                      # logits - max
            probs = torch.exp(shifted, out=buffers.second(len(shifted)))
            total = probs.sum(-1, keepdim=True)
            log_total = total.log()
            logp[rows] = (shifted.gather(-1, targets[rows, None]) - log_total).squeeze(-1)
            lse[rows] = (top + log_total).squeeze(-1)
            if cut.active:
                shifted.clamp_(min=torch.finfo(torch.float32).min)  # 0 * -inf would be NaN
            # entropy = log Z - sum p * (logits - max) / Z, with Z = sum exp(logits - max)
            entropy[rows] = (log_total - probs.mul_(shifted).sum(-1, keepdim=True) / total).squeeze(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.inv_temp, ctx.chunk, ctx.cut, ctx.penalty = inv_temp, chunk, cut, penalty
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) \
            if bias is not None and ctx.needs_input_grad[2] else None
        buffers = _Buffers(min(ctx.chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        w = weight.float()
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows]
            d_logits = buffers.logits(h, w if h.dtype == torch.float32 else weight, bias, ctx.inv_temp)
            scale = None
            if ctx.penalty is not None:
                scale = ctx.penalty.scale(d_logits, rows)
                d_logits.mul_(scale)
            if ctx.cut.active:
                ctx.cut.apply_(d_logits, targets[rows])       # the same cut: exp -> 0 outside it
            g = grad_logp[rows].float()
            d_logits.sub_(lse[rows, None]).exp_().mul_(-g[:, None])   # -g * softmax
            d_logits.scatter_add_(-1, targets[rows, None], g[:, None])  # + g at the target
            if scale is not None:                                     # d penalized / d logit
                d_logits.mul_(scale)
            if ctx.inv_temp != 1.0:
                d_logits.mul_(ctx.inv_temp)
            if grad_hidden is not None:
                grad_hidden[rows] = (d_logits @ w).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(d_logits.T, h.float())
            if grad_bias is not None:
                grad_bias += d_logits.sum(0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None, None,
                None, None)



class _Buffers:
    """Two float32 [rows, V] work buffers for the chunked head, reused chunk after chunk."""

    def __init__(self, rows: int, vocab: int, device):
        self.first = torch.empty(rows, vocab, device=device)
        self._second = None

    def logits(self, h, weight, bias, inv_temp: float) -> torch.Tensor:
        out = self.first[: len(h)]
        if weight.dtype == torch.float32 and h.dtype == torch.float32:
            torch.matmul(h, weight.T, out=out)
        else:
            out.copy_(h @ weight.T)
        if bias is not None:
            out.add_(bias.float())
        if inv_temp != 1.0:
            out.mul_(inv_temp)
        return out

    def second(self, rows: int) -> torch.Tensor:
        if self._second is None:
            self._second = torch.empty_like(self.first)
        return self._second[:rows]


def selected_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                      temperature: float = 1.0, top_p: float = 1.0, banned: list[int] | None = None,
                      top_k: int = 0, min_p: float = 0.0, penalty: Penalty | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [M] of `targets` [M] and entropies [M] from final hidden states [M, H] and the
    output head, in chunks of about LOGIT_CHUNK_ELEMENTS logits (see `_SelectedLogprobs`); with
    top_p < 1, of the truncated, renormalized distribution the sampler drew from (`nucleus_`),
    in chunks a quarter as large (the sort needs room); top_k and min_p cut as `Cut` says, after
    the repetition `penalty` (for the M positions in order)."""
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0]
                // (4 if Cut(top_p, top_k, min_p).active or penalty is not None else 1))
    bias = head.bias
    if banned:      # tokens the sampler never draws (vision.placeholder_ids): the same distribution
        ban = torch.zeros(head.weight.shape[0], device=hidden.device)
        ban[list(banned)] = vision.BANNED_LOGIT
        bias = ban if bias is None else bias + ban
    return _SelectedLogprobs.apply(hidden, head.weight, bias, targets, 1.0 / temperature, chunk,
                                   top_p, top_k, min_p, penalty)


def _head_is_plain(model) -> bool:
    """True when logits are exactly lm_head(backbone output): no soft-capping or logit scaling."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings()
    return (isinstance(head, torch.nn.Linear) and hasattr(model, model.base_model_prefix)
            and not getattr(config, "final_logit_softcapping", None)
            and getattr(config, "logit_scale", 1.0) in (None, 1.0))


def _lean_hidden(lean, input_ids, attention_mask, position_ids, T: int) -> torch.Tensor:
    """Hidden states [N, T, H] that predict the last T tokens, by the lean decoder; completions
    of one prompt (a group) share the prompt's forward pass when they are right-padded."""
    P = input_ids.shape[1] - T
    prompt_ids, prompt_mask, prompt_of = packed.distinct_prompts(input_ids, attention_mask, P)
    completion_attention = attention_mask[:, P:]
    right_padded = bool((completion_attention[:, 1:] <= completion_attention[:, :-1]).all())
    if len(prompt_ids) < len(input_ids) and right_padded:
        return lean.completion_hidden(prompt_ids, prompt_mask, prompt_of, input_ids[:, P:])
    return lean.hidden(input_ids, attention_mask, position_ids)[:, -T - 1:-1]


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_len: int, with_entropy: bool = False, temperature: float = 1.0,
                   completion_mask: torch.Tensor | None = None, top_p: float = 1.0,
                   visuals: list | None = None, top_k: int = 0, min_p: float = 0.0,
                   repetition_penalty: float = 1.0):
    """Log-probabilities of the last `completion_len` tokens of `input_ids` under `model`.

    input_ids, attention_mask: [N, P+T], prompts left-padded, completions right-padded.
    `temperature` divides the logits, `repetition_penalty` penalizes the tokens already in the
    prompt or the completion (`Penalty`), and `top_p`, `top_k` and `min_p` cut them as the sampler
    did (`Cut`), so the policy trained is the distribution that sampled.
    Returns logp [N, T] (0 where `completion_mask`, default the last T of `attention_mask`, is 0)
    and, if asked, the entropy of each next-token distribution [N, T] (0 there too, no gradient).

    Only the masked completion positions go through the output head, in chunks, so neither the
    prompt positions, nor padding, nor the full [N, T, V] logits tensor ever cost time or memory.
    `visuals` [N] (vision.Visual or None) are the rows' prompt images: the image encoder runs once
    per distinct prompt (vision.encoder_outputs) and the model's own forward merges the features.
    """
    T = completion_len
    if hasattr(model, "get_base_model"):  # a peft model: its adapters live inside the base model
        model = model.get_base_model()
    compute = getattr(model, "grpo_autocast", None)
    if compute is not None and not decoder.sharded(model):   # FSDP2 casts by its own policy
        with torch.autocast(input_ids.device.type, dtype=compute):
            hidden_or_logp = _token_logprobs(model, input_ids, attention_mask, T, with_entropy,
                                             temperature, completion_mask, top_p, head_in_fp32=True,
                                             visuals=visuals, top_k=top_k, min_p=min_p,
                                             repetition_penalty=repetition_penalty)
        return hidden_or_logp
    return _token_logprobs(model, input_ids, attention_mask, T, with_entropy, temperature,
                           completion_mask, top_p, visuals=visuals, top_k=top_k, min_p=min_p,
                           repetition_penalty=repetition_penalty)


def _token_logprobs(model, input_ids, attention_mask, T: int, with_entropy: bool, temperature: float,
                    completion_mask, top_p: float, head_in_fp32: bool = False, visuals=None,
                    top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0):
    cut = Cut(top_p, top_k, min_p)
    mask = (attention_mask[:, -T:] if completion_mask is None else completion_mask).bool()
    mask = mask.to(input_ids.device)
    P = input_ids.shape[1] - T
    penalty = None if repetition_penalty == 1.0 else Penalty.of(
        repetition_penalty, input_ids[:, :P], attention_mask[:, :P], input_ids[:, P:], mask,
        model.get_output_embeddings().weight.shape[0])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    targets = input_ids[:, -T:]
    with_images = vision.is_vision_model(model)
    visuals = visuals if visuals is not None else [None] * len(input_ids)

    def inputs() -> dict:         # one forward over every row (a VLM's: its images merged in)
        if with_images:
            return vision.forward_inputs(model, input_ids, attention_mask, visuals)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if not _head_is_plain(model) or decoder.sharded(model):
        # A head that is more than a linear layer, or FSDP2 shards (gathered by the root's forward)
        return _full_logprobs(model, inputs(), T, targets, mask, temperature, penalty, cut,
                              with_images, with_entropy)
    banned = vision.placeholder_ids(model) if with_images else None
    if with_images:               # a vision-language model: its own forward merges the images
        backbone = getattr(model, model.base_model_prefix)
        hidden = vision.shared_prompt_hidden(model, backbone, input_ids, attention_mask, visuals, T)
        if hidden is None:
            hidden = backbone(**inputs(), use_cache=False).last_hidden_state[:, -T - 1:-1]
    elif getattr(model, "grpo_packing", False) and decoder.supports(model) and packed.packable(
            attention_mask, T):
        hidden = None               # padding-free: the selected positions' states only
        selected = packed.selected_hidden(decoder.Decoder(model), input_ids, attention_mask, T, mask)
    elif decoder.supports(model):
        hidden = _lean_hidden(decoder.Decoder(model), input_ids, attention_mask, position_ids, T)
    else:
        backbone = getattr(model, model.base_model_prefix)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False).last_hidden_state[:, -T - 1:-1]
    if hidden is not None:
        selected = hidden[mask]
    if head_in_fp32:      # the output head in float32, whatever the compute dtype
        with torch.autocast(input_ids.device.type, enabled=False):
            logp_sel, entropy_sel = selected_logprobs(selected.float(), model.get_output_embeddings(),
                                                      targets[mask], temperature, top_p, banned,
                                                      top_k, min_p, penalty)
    else:
        logp_sel, entropy_sel = selected_logprobs(selected, model.get_output_embeddings(),
                                                  targets[mask], temperature, top_p, banned,
                                                  top_k, min_p, penalty)    # [M]
    logp = logp_sel.new_zeros(mask.shape).masked_scatter(mask, logp_sel)
    if not with_entropy:
        return logp, None
    return logp, entropy_sel.new_zeros(mask.shape).masked_scatter(mask, entropy_sel)


def _full_logprobs(model, inputs: dict, T: int, targets, mask, temperature: float, penalty, cut,
                   with_images: bool, with_entropy: bool):
    """_token_logprobs through the model's whole forward and the full [N, T, V] logits, for a head
    that is more than a linear layer, or FSDP2 shards (gathered by the root's forward)."""
    logits = model(**inputs, use_cache=False).logits[:, -T - 1:-1].float()
    banned = vision.placeholder_ids(model) if with_images else []
    if banned:
        logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), vision.BANNED_LOGIT)
    # (under autocast the head ran in bfloat16 here: only a head that is not a plain linear
    # layer, or FSDP2, takes this path)
    logits = logits / temperature
    if penalty is not None:
        scale = penalty.scale(logits.detach().reshape(-1, logits.shape[-1])[mask.reshape(-1)])
        logits = logits.masked_scatter(mask[..., None], logits[mask] * scale)
    if cut.active:
        flat = logits.detach().reshape(-1, logits.shape[-1]).clone()
        keep = cut.apply_(flat, targets.reshape(-1)).view_as(logits).isfinite()
        logits = logits.masked_fill(~keep, float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
    entropy = (-(logp_all.exp() * logp_all.clamp(min=torch.finfo(logp_all.dtype).min)).sum(-1)
               * mask).detach()
    return logp, entropy if with_entropy else None
