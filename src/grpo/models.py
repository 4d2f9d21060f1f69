"""Loading the policy, the reference model and the tokenizer; the one per-token log-prob function.

Any Hugging Face causal LM directory or hub name loads through `load_policy`. `build_tiny` makes a
small Llama-architecture model with a character-level tokenizer, written as an ordinary Hugging Face
model directory, so tests and the demo run with no download.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
import torch.nn.functional as F

# The R1 template's tags are single tokens in the tiny tokenizer so a small model can emit them.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}


def build_tiny_tokenizer():
    """A character-level tokenizer over printable ASCII plus the R1 tags; no file, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = list(SPECIAL_TOKENS.values()) + sorted(set(string.printable) - set("\t\n\r\x0b\x0c"))
    symbols += ["\n"]
    vocab = {s: i for i, s in enumerate(symbols)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **SPECIAL_TOKENS)
    tokenizer.add_tokens(TAG_TOKENS)
    return tokenizer


def build_tiny(output_dir: str | Path, *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0) -> Path:
    """Write a randomly initialised tiny Llama and its tokenizer to `output_dir`; return the path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def load_tokenizer(name_or_path: str, chat_template: str = "auto"):
    """Load a tokenizer; pad on the left for generation; `chat_template=none` drops any template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if chat_template == "none":
        tokenizer.chat_template = None
    elif chat_template != "auto":
        raise ValueError(f"chat_template must be 'auto' or 'none', got {chat_template!r}")
    return tokenizer


def load_policy(name_or_path: str, dtype: str = "float32"):
    """Load any causal LM by directory or hub name, in train mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    model.train()
    # Dropout would make pi_theta differ from pi_old at ratio 1; GRPO's ratio assumes it does not.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def frozen_copy(model):
    """The reference model: a copy of the policy that takes no gradients."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


@torch.no_grad()
def update_reference(ref, policy, rate: float = 1.0) -> None:
    """ref <- rate * policy + (1 - rate) * ref; rate 1 is a hard reset (iterative GRPO)."""
    for ref_param, param in zip(ref.parameters(), policy.parameters()):
        if rate >= 1.0:
            ref_param.copy_(param)
        else:
            ref_param.lerp_(param, rate)


LOGIT_CHUNK_ELEMENTS = 1 << 22  # logits held at once by the chunked head: 4M floats, 16 MiB


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[target] for M rows of hidden states, never holding [M, V] logits.

    Forward and backward walk the rows in chunks of `chunk` and recompute each chunk's logits, so
    memory is O(chunk * V) whatever M is. Also returns each row's entropy (no gradient).
    d logp / d logits = onehot(target) - softmax(logits), scaled by 1/temperature.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temp: float, chunk: int):
        logps, lses, entropies = [], [], []
        for start in range(0, hidden.shape[0], chunk):
            logits = _chunk_logits(hidden[start:start + chunk], weight, bias, inv_temp)
            lse = torch.logsumexp(logits, -1)
            logps.append(logits.gather(-1, targets[start:start + chunk, None]).squeeze(-1) - lse)
            lses.append(lse)
            entropies.append(lse - (torch.softmax(logits, -1) * logits).sum(-1))
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lses))
        ctx.inv_temp, ctx.chunk = inv_temp, chunk
        entropy = torch.cat(entropies)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logps), entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) \
            if bias is not None and ctx.needs_input_grad[2] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows]
            logits = _chunk_logits(h, weight, bias, ctx.inv_temp)
            g = grad_logp[rows].float()
            d_logits = torch.exp(logits - lse[rows, None]).mul_(-g[:, None])  # -g * softmax
            d_logits.scatter_add_(-1, targets[rows, None], g[:, None])          # + g at the target
            d_logits.mul_(ctx.inv_temp)
            if grad_hidden is not None:
                grad_hidden[rows] = (d_logits @ weight.float()).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(d_logits.T, h.float())
            if grad_bias is not None:
                grad_bias += d_logits.sum(0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None)


def _chunk_logits(h, weight, bias, inv_temp: float) -> torch.Tensor:
    logits = F.linear(h, weight, bias).float()
    return logits * inv_temp if inv_temp != 1.0 else logits


def selected_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [M] of `targets` [M] and entropies [M] from final hidden states [M, H] and the
    output head, in chunks of about LOGIT_CHUNK_ELEMENTS logits (see `_SelectedLogprobs`)."""
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0])
    return _SelectedLogprobs.apply(hidden, head.weight, head.bias, targets, 1.0 / temperature, chunk)


def _head_is_plain(model) -> bool:
    """True when logits are exactly lm_head(backbone output): no soft-capping or logit scaling."""
    config = model.config
    head = model.get_output_embeddings()
    return (isinstance(head, torch.nn.Linear) and hasattr(model, model.base_model_prefix)
            and not getattr(config, "final_logit_softcapping", None)
            and getattr(config, "logit_scale", 1.0) in (None, 1.0))


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_len: int, with_entropy: bool = False, temperature: float = 1.0,
                   completion_mask: torch.Tensor | None = None):
    """Log-probabilities of the last `completion_len` tokens of `input_ids` under `model`.

    input_ids, attention_mask: [N, P+T], prompts left-padded, completions right-padded.
    `temperature` divides the logits, so the policy trained is the one that sampled.
    Returns logp [N, T] (0 where `completion_mask`, default the last T of `attention_mask`, is 0)
    and, if asked, the entropy of each next-token distribution [N, T] (0 there too, no gradient).

    Only the masked completion positions go through the output head, in chunks, so neither the
    prompt positions, nor padding, nor the full [N, T, V] logits tensor ever cost time or memory.
    """
    T = completion_len
    mask = (attention_mask[:, -T:] if completion_mask is None else completion_mask).bool()
    mask = mask.to(input_ids.device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    targets = input_ids[:, -T:]
    if not _head_is_plain(model):  # a model whose head is more than a linear layer
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids, use_cache=False).logits[:, -T - 1:-1].float()
        logp_all = F.log_softmax(logits / temperature, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
        entropy = (-(logp_all.exp() * logp_all).sum(-1) * mask).detach()
        return logp, entropy if with_entropy else None
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state[:, -T - 1:-1]       # [N, T, H]
    logp_sel, entropy_sel = selected_logprobs(hidden[mask], model.get_output_embeddings(),
                                              targets[mask], temperature)    # [M]
    logp = logp_sel.new_zeros(mask.shape).masked_scatter(mask, logp_sel)
    if not with_entropy:
        return logp, None
    return logp, entropy_sel.new_zeros(mask.shape).masked_scatter(mask, entropy_sel)
