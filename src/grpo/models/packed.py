"""Padding-free passes of the lean decoder: a micro-batch's rows packed into one token stream.

`decoder.Decoder.completion_hidden` lays every row out at the micro-batch's full width (longest
prompt + longest completion): padding costs what real tokens cost, in every projection, MLP and
attention. Here no pass holds a padding token:

    stream      each distinct prompt's real tokens once (a group of G shares them), then each
                row's completion tokens but its last (whose hidden state predicts nothing)
    attention   one variable-length call a layer: a prompt attends causally within itself; a
                completion row's queries attend to its prompt's keys, then causally to its own
                (keys laid out [prompt | completion] per row: causal aligned at the lower right)
    out         the final hidden state at each selected completion position [M, H], in the
                row-major order of the selection mask: what the chunked head reads

`varlen` runs `torch.nn.attention.varlen.varlen_attn` (Flash Attention over cumulative
lengths) on CUDA in bf16/fp16, and elsewhere the same function one document at a time (any
dtype: the float64 tests, tests/test_packed.py, hold it to the padded pass to 1e-10).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo.models.decoder import Decoder, _linear, _rotate


def packable(attention_mask: torch.Tensor, T: int) -> bool:
    """Rows the stream can hold: left-padded prompts and right-padded completions, each
    completion's attended tokens one run from its start (a multi-turn episode's too)."""
    P = attention_mask.shape[1] - T
    prompt, completion = attention_mask[:, :P].bool(), attention_mask[:, P:].bool()
    left = bool((prompt[:, 1:] >= prompt[:, :-1]).all()) if P > 1 else True
    right = bool((completion[:, 1:] <= completion[:, :-1]).all()) if T > 1 else True
    return left and right


def distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, P: int):
    """The distinct prompts among rows [N, P+T] (ids and mask of their first P columns) [B, P]
    each, and which one each row continues [N]: a group of G shares one."""
    prompts, prompt_of = torch.unique(torch.cat([input_ids[:, :P], attention_mask[:, :P]], 1),
                                      dim=0, return_inverse=True)
    return prompts[:, :P], prompts[:, P:], prompt_of


def selected_hidden(lean: Decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int,
                    select: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states [M, H] that predict the `select`ed completion tokens [N, T]
    (M = select.sum(), row-major), for rows [N, P+T] as `packable` says, in one packed pass."""
    N, width = input_ids.shape
    P = width - T
    device = input_ids.device
    prompt_ids, prompt_mask, prompt_of = distinct_prompts(input_ids, attention_mask, P)
    prompt_mask = prompt_mask.bool()
    B = len(prompt_ids)
    p = prompt_mask.sum(-1)                                           # [B] real prompt tokens
    c = (attention_mask[:, P:].sum(-1) - 1).clamp(min=0)              # [N] completion tokens fed
    Lp = int(p.sum())                                                 # prompt tokens in the stream
    cu_p = F.pad(p.cumsum(0), (1, 0))                                 # [B + 1]
    cu_c = F.pad(c.cumsum(0), (1, 0))                                 # [N + 1]
    # the stream: prompts' real tokens, then completions' fed tokens
    fed = torch.arange(T, device=device)[None] < c[:, None]           # [N, T]
    ids = torch.cat([prompt_ids[prompt_mask], input_ids[:, P:][fed]])
    positions = torch.cat([(prompt_mask.cumsum(-1) - 1)[prompt_mask],
                           (p[prompt_of, None] + torch.arange(T, device=device))[fed]])
    # keys per query document: a prompt's own; a completion's [its prompt's | its own]
    k_len = torch.cat([p, p[prompt_of] + c])                          # [B + N]
    q_len = torch.cat([p, c])
    cu_q, cu_k = F.pad(q_len.cumsum(0), (1, 0)), F.pad(k_len.cumsum(0), (1, 0))
    doc_start = torch.cat([cu_p[:-1], Lp + cu_c[:-1]])                # each document's stream start
    key_index = _key_index(k_len, p, prompt_of, cu_p, doc_start, B, device)
    x = lean._embed(ids)[None]                                        # [1, L, H]
    cos, sin = (t[0][:, None] for t in lean.rotary(x, positions[None]))     # [L, 1, d]
    x = x[0]
    lengths = (int(q_len.max()) if len(q_len) else 0, int(k_len.max()) if len(k_len) else 0)

    def block(layer, x):
        attn = layer.self_attn
        h = lean._norm(x, layer.input_layernorm)
        L = len(h)
        q = _rotate(_linear(attn.q_proj, h).view(L, lean.heads, lean.head_dim), cos, sin)
        k = _rotate(_linear(attn.k_proj, h).view(L, lean.kv_heads, lean.head_dim), cos, sin)
        v = _linear(attn.v_proj, h).view(L, lean.kv_heads, lean.head_dim)
        out = varlen(q, k[key_index], v[key_index], cu_q, cu_k, *lengths,
                     gqa=lean.kv_heads != lean.heads)
        x = x + _linear(attn.o_proj, out.reshape(L, lean.heads * lean.head_dim))
        return x + lean._mlp(layer.mlp, lean._norm(x, layer.post_attention_layernorm))
    for layer in lean.layers:
        x = lean._run(block, layer, x)
    # the state that predicts token t of row i: its prompt's last token (t = 0), else its t-1-th
    row, t = select.nonzero(as_tuple=True)
    at = torch.where(t == 0, cu_p[1:][prompt_of[row]] - 1, Lp + cu_c[row] + t - 1)
    return lean._norm(x[at], lean.norm)


def _key_index(k_len, p, prompt_of, cu_p, doc_start, B: int, device) -> torch.Tensor:
    """For each key slot of each document, the stream position it reads: a prompt document its
    own tokens; completion document i its prompt's tokens, then its own."""
    total = int(k_len.sum())
    doc = torch.repeat_interleave(torch.arange(len(k_len), device=device), k_len)   # [total]
    within = torch.arange(total, device=device) - F.pad(k_len.cumsum(0), (1, 0))[:-1][doc]
    owner_p = torch.cat([p, p[prompt_of]])[doc]                       # the document's prompt length
    prompt_start = torch.cat([cu_p[:-1], cu_p[:-1][prompt_of]])[doc]
    in_prompt = (doc < B) | (within < owner_p)
    return torch.where(in_prompt, prompt_start + within, doc_start[doc] + within - owner_p)


def varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, *, gqa: bool) -> torch.Tensor:
    """Attention [Lq, heads, d] of query documents over key documents (cumulative lengths cu_q,
    cu_k), causal aligned at the lower right: query j of a document of lq queries and lk keys
    sees keys 0 .. j + lk - lq."""
    if q.is_cuda and torch.is_autocast_enabled("cuda"):    # rotary made q, k float32 under
        dtype = torch.get_autocast_dtype("cuda")            # autocast; Flash takes bf16/fp16
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and has_varlen_kernel():
        from torch.nn.attention.varlen import varlen_attn
        how = varlen_arguments(varlen_attn, gqa)
        if how is not None:
            kwargs, repeat = how
            if repeat:           # no enable_gqa in this torch: each key/value head, once per query head
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
            return varlen_attn(q, k, v, cu_q.int(), cu_k.int(), max_q, max_k, **kwargs)
    out = q.new_empty(q.shape)
    for start_q, end_q, start_k, end_k in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(),
                                              cu_k[:-1].tolist(), cu_k[1:].tolist()):
        lq, lk = end_q - start_q, end_k - start_k
        if lq == 0:
            continue
        see = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        out[start_q:end_q] = F.scaled_dot_product_attention(
            q[start_q:end_q].transpose(0, 1), k[start_k:end_k].transpose(0, 1),
            v[start_k:end_k].transpose(0, 1), attn_mask=see, enable_gqa=gqa).transpose(0, 1)
    return out


def varlen_arguments(fn, gqa: bool) -> tuple[dict, bool] | None:
    """How to ask torch's `varlen_attn` (whose arguments changed between releases) for attention
    causal at the lower right: (keyword arguments, whether keys and values must be repeated per
    query head), or None when this torch's version takes neither `window_size` nor `is_causal`
    (then the per-document reference runs)."""
    import inspect
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        kwargs = {"window_size": (-1, 0)}
    elif "is_causal" in params:       # Flash's causal mask aligns at the lower right
        kwargs = {"is_causal": True}
    else:
        return None
    if gqa and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs, gqa and "enable_gqa" not in params


def has_varlen_kernel() -> bool:
    """Whether this torch has `torch.nn.attention.varlen.varlen_attn` in a form varlen can ask
    for (varlen_arguments); without it, `packing=auto` stays off and `on` runs the reference."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    return varlen_arguments(varlen_attn, gqa=True) is not None
