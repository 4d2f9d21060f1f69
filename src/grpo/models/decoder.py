"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Mistral), on the model's own weights.

Hugging Face's forward is general: it builds masks, dispatches attention, runs hooks. For the
small and medium models GRPO is run with on CPUs, that overhead is a large share of each step.
`Decoder` computes the same function with a few fused torch calls per layer, reading the very
same `Parameter`s, so gradients land in the Hugging Face model and its optimizer as usual.

    hidden(ids, mask, positions)    final-norm hidden states [N, L, H], for log-probs and training
    start(ids, mask, max_new)       prefill a static KV cache; logits of the last position [N, V]
    step(tokens, state)             one decoding step for every row still in `state`
    keep(state, rows)               drop ended rows from the cache

`supports(model)` says whether a model can take this path; any other model (or rope scaling,
sliding windows, soft-capping) uses Hugging Face's forward, which gives the same numbers.
tests/test_decoder.py checks both paths against each other.

Memory grows with the length, not its square: training and prefill attend causally with no mask
(rows rotated so their real tokens come first), so the fused kernel never forms [L, L] scores;
a decoding step's mask is [rows, 1, 1, t]. tests/test_long.py checks every tensor's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo.models import heap
from grpo.vision.inputs import share

SUPPORTED = {"llama", "qwen2", "mistral"}


def supports(model) -> bool:
    """True for the architectures this file computes exactly: rotary embeddings come from the
    model's own rotary module, so any rope scaling it implements is honoured."""
    model = unwrap(model)
    config = getattr(model, "config", None)
    if sharded(model) or config is None or getattr(config, "model_type", None) not in SUPPORTED:
        return False
    sliding = getattr(config, "use_sliding_window", False) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None))
    head = model.get_output_embeddings()
    return (not sliding and all(_plain_lora(m) for m in model.modules() if hasattr(m, "lora_A")) and getattr(config, "hidden_act", "silu") == "silu"
            and not getattr(config, "mlp_bias", False) and getattr(config, "pretraining_tp", 1) == 1
            and isinstance(head, torch.nn.Linear))


def sharded(model) -> bool:
    """True when some parameter is an FSDP2 shard (a DTensor) rather than a whole tensor."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


START_ROOM = 256   # new-token slots the decoding cache starts with; it grows by a quarter when full


@dataclass
class DecodeState:
    keys: list[torch.Tensor]       # per layer [n, kv_heads, capacity, head_dim]; [:length] filled
    values: list[torch.Tensor]
    key_valid: torch.Tensor        # [n, capacity] bool; False on left padding
    positions: torch.Tensor        # [n] position id of the next token
    length: int                    # filled cache length
    room: int = 0                  # the capacity growth aims for first (P + max_new_tokens)


class Decoder:
    def __init__(self, model):
        model = unwrap(model)
        self.model = model
        backbone = getattr(model, model.base_model_prefix)
        self.embed, self.layers, self.norm = backbone.embed_tokens, backbone.layers, backbone.norm
        self.rotary = backbone.rotary_emb
        self.head = model.get_output_embeddings()
        c = model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        # activation checkpointing (train.py sets it from `gradient_checkpointing`): in passes
        # that build a graph, each layer keeps only its input and is recomputed in the backward
        self.checkpointing = bool(getattr(model, "grpo_checkpointing", False))

    def _run(self, fn, *args):
        """fn(*args), through torch.utils.checkpoint when checkpointing a pass with gradients."""
        if self.checkpointing and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    # -- building blocks -------------------------------------------------------------------
    def _embed(self, ids):
        # padding_idx as the model's own nn.Embedding has it: that row takes no gradient from
        # the input side, even when the pad token is sampled as an ordinary token.
        return F.embedding(ids, self.embed.weight, padding_idx=self.embed.padding_idx)

    def _norm(self, x, module):
        return F.rms_norm(x, (x.shape[-1],), module.weight, self.eps)

    def _qkv(self, attn, h, cos, sin):
        n, L, _ = h.shape
        q = _linear(attn.q_proj, h).view(n, L, self.heads, self.head_dim)
        k = _linear(attn.k_proj, h).view(n, L, self.kv_heads, self.head_dim)
        v = _linear(attn.v_proj, h).view(n, L, self.kv_heads, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [n, heads, L, d]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _mlp(self, mlp, h):
        return _linear(mlp.down_proj, F.silu(_linear(mlp.gate_proj, h)) * _linear(mlp.up_proj, h))

    def _sdpa(self, q, k, v, mask=None):
        """Attention [n, heads, L, d]; with no mask, causal (query j sees keys 0..j), which the
        fused kernel computes block by block without any [L, L] tensor."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                              enable_gqa=self.kv_heads != self.heads)

    def _out(self, attn, out):
        n, _, L, _ = out.shape
        return _linear(attn.o_proj, out.transpose(1, 2).reshape(n, L, self.heads * self.head_dim))

    def _attend(self, attn, q, k, v, mask=None):
        return self._out(attn, self._sdpa(q, k, v, mask))

    # -- full sequences ----------------------------------------------------------------------
    # No pass builds a [rows, tokens, tokens] mask. Each row's real tokens are one run (prompts
    # left-padded, completions right-padded), so the rows are rotated to put that run first; then
    # plain causal attention is exact for every real token (it sees only real tokens before it),
    # positions travel with the tokens, and the fused kernel never forms the [L, L] scores.
    def hidden(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Final hidden states [N, L, H] of left- or right-padded rows."""
        valid = attention_mask.bool()
        if not one_run(valid):     # holes inside a row: an explicit mask, [N, 1, L, L]
            return self._masked_hidden(input_ids, valid, position_ids)
        L = input_ids.shape[1]
        first = valid.int().argmax(-1)                                        # leading padding
        ahead = (torch.arange(L, device=valid.device) + first[:, None]) % L   # [N, L]
        x = self._embed(input_ids.gather(1, ahead))
        x = self._stack(x, *self.rotary(x, position_ids.gather(1, ahead)))
        back = (torch.arange(L, device=valid.device) - first[:, None]) % L
        return self._norm(x, self.norm).gather(1, back[..., None].expand(-1, -1, x.shape[-1]))

    def _masked_hidden(self, input_ids, valid, position_ids) -> torch.Tensor:
        x = self._embed(input_ids)
        cos, sin = self.rotary(x, position_ids)
        L = input_ids.shape[1]
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        # A padding query may see only itself, so no row of the mask is empty (that would be NaN).
        mask = ((causal & valid[:, None, :]) | torch.eye(L, dtype=torch.bool, device=x.device)).unsqueeze(1)
        return self._norm(self._stack(x, cos, sin, mask), self.norm)

    def _stack(self, x, cos, sin, mask=None):
        """Every decoder layer over x [N, L, H]; causal attention when `mask` is None."""
        def block(layer, x):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            x = x + self._attend(attn, q, k, v, mask)
            return x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        for layer in self.layers:
            x = self._run(block, layer, x)
        return x

    def completion_hidden(self, prompt_ids, prompt_mask, prompt_of, completion_ids) -> torch.Tensor:
        """Hidden states [N, T, H] at the positions that predict each completion token, for N
        completions of B distinct left-padded prompts [B, P]; row i continues prompt
        `prompt_of[i]`. Each prompt's projections and MLP are computed once and its keys and
        values are shared by its completions (a group of G shares one prompt), so the prompt
        costs 1/G of a padded batch. The gradient reaches the prompt through the shared keys,
        values and queries.

        Attention runs on each completion row laid out as [prompt's real tokens | completion |
        prompt's padding], causal: exact for every real token with no mask at all. The prompt's
        own queries ride along in that layout (their outputs are read from one row per prompt),
        which costs G-fold prompt attention and saves any [T, P + T] mask.
        """
        B, P = prompt_ids.shape
        N, T = completion_ids.shape
        device = completion_ids.device
        length = prompt_mask.sum(-1)                                          # [B] real prompt tokens
        prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        completion_positions = length[prompt_of, None] + torch.arange(T, device=device)
        x_p = self._embed(prompt_ids)
        x_c = self._embed(completion_ids)
        cos_p, sin_p = self.rotary(x_p, prompt_positions)
        cos_c, sin_c = self.rotary(x_c, completion_positions)
        # the layout's gather index from [prompt (left-padded) | completion], and its inverse
        p = length[prompt_of, None]                                            # [N, 1]
        pad = P - p
        j = torch.arange(P + T, device=device)[None]
        take = torch.where(j < p, pad + j, torch.where(j < p + T, P + j - p, j - p - T))
        back = torch.where(j < pad, p + T + j, torch.where(j < P, j - pad, j - P + p))
        first = torch.full((B,), N, device=device, dtype=torch.long).scatter_reduce(
            0, prompt_of, torch.arange(N, device=device), "amin")             # a row of each prompt

        def laid_out(x_prompt, x_completion):
            both = torch.cat([share(x_prompt, prompt_of), x_completion], dim=2)  # [N, h, P+T, d]
            return both.gather(2, take[:, None, :, None].expand(-1, both.shape[1], -1, both.shape[3]))

        def block(layer, x_p, x_c):
            attn = layer.self_attn
            q_p, k_p, v_p = self._qkv(attn, self._norm(x_p, layer.input_layernorm), cos_p, sin_p)
            q_c, k_c, v_c = self._qkv(attn, self._norm(x_c, layer.input_layernorm), cos_c, sin_c)
            out = self._sdpa(laid_out(q_p, q_c), laid_out(k_p, k_c), laid_out(v_p, v_c))
            out = out.gather(2, back[:, None, :, None].expand(-1, out.shape[1], -1, out.shape[3]))
            x_p = x_p + self._out(attn, out[first, :, :P])
            x_c = x_c + self._out(attn, out[:, :, P:])
            x_p = x_p + self._mlp(layer.mlp, self._norm(x_p, layer.post_attention_layernorm))
            return x_p, x_c + self._mlp(layer.mlp, self._norm(x_c, layer.post_attention_layernorm))
        for layer in self.layers:
            x_p, x_c = self._run(block, layer, x_p, x_c)
        last_prompt = share(self._norm(x_p[:, -1:], self.norm), prompt_of)          # [N, 1, H]
        return torch.cat([last_prompt, self._norm(x_c[:, :-1], self.norm)], dim=1)

    # -- decoding with a static cache -------------------------------------------------------
    @torch.no_grad()
    def start(self, input_ids, attention_mask, max_new_tokens: int,
              repeat: int = 1) -> tuple[torch.Tensor, DecodeState]:
        """Prefill B prompts [B, P] once each; the cache holds `repeat` copies of each, B * repeat
        rows in order (a group of G completions shares its prompt's keys and values)."""
        b, P = input_ids.shape
        n = b * repeat
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        x = self._embed(input_ids)
        cos, sin = self.rotary(x, position_ids)
        # the cache starts with room for START_ROOM new tokens and grows as it fills (`_ensure`)
        size = (n, self.kv_heads, P + min(max_new_tokens, START_ROOM), self.head_dim)
        keys = [x.new_empty(size) for _ in self.layers]
        values = [x.new_empty(size) for _ in self.layers]
        key_valid = torch.cat([attention_mask.bool(),
                               attention_mask.new_ones(b, size[2] - P, dtype=torch.bool)], 1)
        # left-padded prompts rotated to [real tokens | padding] for mask-free causal attention;
        # the cache keeps the original layout (step and extend read `key_valid`)
        length = attention_mask.sum(-1)
        ahead = (torch.arange(P, device=x.device) + (P - length)[:, None]) % P            # [b, P]
        back = (torch.arange(P, device=x.device) - (P - length)[:, None]) % P

        def unrotate(t):                                                   # [b, kv, P, d]
            return t.gather(2, back[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))
        x = x.gather(1, ahead[..., None].expand(-1, -1, x.shape[-1]))
        cos, sin = (t.gather(1, ahead[..., None].expand(-1, -1, t.shape[-1])) for t in (cos, sin))
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            # the cache seen as [B, repeat, ...]: each prompt's k, v broadcast to its rows
            keys[i].view(b, repeat, *size[1:])[:, :, :, :P] = unrotate(k)[:, None]
            values[i].view(b, repeat, *size[1:])[:, :, :, :P] = unrotate(v)[:, None]
            x = x + self._attend(attn, q, k, v)
            x = x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        last = (length - 1).clamp(min=0)
        logits = self._logits(self._norm(x[torch.arange(b, device=x.device), last][:, None], self.norm))
        if repeat > 1:
            logits, key_valid, position_ids = (t.repeat_interleave(repeat, 0)
                                               for t in (logits, key_valid, position_ids))
        state = DecodeState(keys, values, key_valid, position_ids[:, -1] + 1, P, P + max_new_tokens)
        return logits, state

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, state: DecodeState,
             valid: torch.Tensor | None = None) -> torch.Tensor:
        """Feed one token per row [n]; return the next logits [n, V]. Rows where `valid` [n] is
        False write a slot that no later query sees and keep their position (a row waiting for
        the others to end their turn)."""
        if valid is not None:
            return self.extend(tokens[:, None], valid[:, None], state)
        x = self._embed(tokens[:, None])                   # [n, 1, H]
        cos, sin = self.rotary(x, state.positions[:, None])
        t = state.length
        self._ensure(state, 1)
        mask = state.key_valid[:, None, None, :t + 1]                         # [n, 1, 1, t+1]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            state.keys[i][:, :, t:t + 1], state.values[i][:, :, t:t + 1] = k, v
            x = x + self._attend(attn, q, state.keys[i][:, :, :t + 1], state.values[i][:, :, :t + 1], mask)
            x = x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        state.length, state.positions = t + 1, state.positions + 1
        return self._logits(self._norm(x, self.norm))

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, valid: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Feed L tokens per row [n, L], of which `valid` [n, L] are real (an environment's answer,
        right-padded to the longest); return the logits after each row's last real token [n, V]
        (for a row with none, the logits of a position it never had: the caller keeps its own).
        Costs the new tokens only: the history is read from the cache."""
        n, L = tokens.shape
        t = state.length
        self._ensure(state, L)
        valid = valid.bool().to(state.key_valid.device)
        state.key_valid[:, t:t + L] = valid
        positions = state.positions[:, None] + valid.long().cumsum(-1) - 1               # [n, L]
        x = self._embed(tokens)
        cos, sin = self.rotary(x, positions.clamp(min=0))
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        mask = torch.cat([state.key_valid[:, None, :t].expand(n, L, t),
                          causal & valid[:, None, :]], dim=-1)
        mask = (mask | torch.cat([torch.zeros(n, L, t, dtype=torch.bool, device=x.device),
                                  torch.eye(L, dtype=torch.bool, device=x.device).expand(n, L, L)],
                                 dim=-1)).unsqueeze(1)                         # [n, 1, L, t+L]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            state.keys[i][:, :, t:t + L], state.values[i][:, :, t:t + L] = k, v
            x = x + self._attend(attn, q, state.keys[i][:, :, :t + L],
                                 state.values[i][:, :, :t + L], mask)
            x = x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        last = (valid.long().cumsum(-1).argmax(-1))                                    # [n]
        state.length, state.positions = t + L, state.positions + valid.long().sum(-1)
        h = x[torch.arange(n, device=x.device), last][:, None]
        return self._logits(self._norm(h, self.norm))

    @staticmethod
    def _ensure(state: DecodeState, extra: int) -> None:
        """Room for `extra` more slots. A full cache grows by a quarter (at least START_ROOM
        slots), up to `state.room` while the slots fit in it (a turn's room; episodes that go
        past it grow on): a copy every few hundred tokens, and at most a quarter unused."""
        have, need = state.keys[0].shape[2], state.length + extra
        if need <= have:
            return
        capacity = have + max(extra, have // 4, START_ROOM)
        if need <= state.room:
            capacity = min(capacity, state.room)
        Decoder._move(state, None, capacity)

    @staticmethod
    def keep(state: DecodeState, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current batch) in the cache."""
        Decoder._move(state, rows, state.keys[0].shape[2])
        state.positions = state.positions[rows]

    @staticmethod
    def _move(state: DecodeState, rows: torch.Tensor | None, capacity: int) -> None:
        """Copy `rows` (all when None) of the cache into new tensors of `capacity` slots, one
        layer at a time (each old layer is freed before the next is copied). Only the filled
        slots are copied: the rest stays unwritten, so on a CPU its pages are not touched until
        decoding reaches them; a ragged batch's cache holds about what its running rows wrote."""
        t = state.length
        pick = (lambda x: x) if rows is None else (lambda x: x[rows])
        for cache in (state.keys, state.values):
            for i, old in enumerate(cache):
                kept = pick(old[:, :, :t])
                new = old.new_empty(len(kept), old.shape[1], capacity, old.shape[3])
                new[:, :, :t] = kept
                cache[i] = new
                del kept, old
        valid = state.key_valid.new_ones(len(state.key_valid) if rows is None else len(rows), capacity)
        valid[:, :t] = pick(state.key_valid[:, :t])
        state.key_valid = valid
        heap.release(valid.device)           # the old cache's pages, and holes of the old sizes

    def _logits(self, h):
        return F.linear(h[:, -1], self.head.weight, self.head.bias)


def one_run(valid: torch.Tensor) -> bool:
    """True when each row's True entries [N, L] are contiguous (or the row has none)."""
    starts = (valid[:, 1:] & ~valid[:, :-1]).sum(-1) + valid[:, 0].long()
    return bool((starts <= 1).all())


def unwrap(model):
    """The Hugging Face model inside a peft wrapper (its LoRA layers are in place within it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _plain_lora(module) -> bool:
    """A peft LoRA layer this file computes exactly: a plain linear base, no dropout, no variant
    (DoRA and the like run through Hugging Face's forward instead)."""
    return (type(getattr(module, "base_layer", None)) is torch.nn.Linear
            and not getattr(module, "lora_variant", {})
            and all(isinstance(d, torch.nn.Identity) for d in module.lora_dropout.values()))


def _linear(module, h):
    """A linear layer, or a LoRA-adapted one: base(h) + sum of B(A(h)) * scaling over the active
    adapters, unless the adapters are switched off (the reference) or merged into the base."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return F.linear(h, module.weight, module.bias)
    out = F.linear(h, base.weight, base.bias)
    if module.disable_adapters or module.merged:
        return out
    for name in module.active_adapters:
        if name in module.lora_A:
            out = out + F.linear(F.linear(h, module.lora_A[name].weight),
                                 module.lora_B[name].weight) * module.scaling[name]
    return out


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
