"""A static-shape KV cache in slots, and the decoding step on it that CUDA graphs can capture.

`decoder.Decoder.start/step` grow their cache as it fills and drop ended rows by re-indexing: right
for a CPU, where each step's tensors are allocated anyway, but every shape change rules out a
captured graph. Here every tensor is allocated once per `sample` call:

    Slots          per layer keys and values [S, kv_heads, C, d]; `valid` [S, C] marks the filled
                   slots; `write` [S] is where each slot's next key goes, `positions` [S] its
                   next position id. A slot holds one row: its prompt's keys at [0, p), then
                   its completion's, one a step.
    prefill        computes B prompts once each and copies their keys and values into the
                   slots of their rows (a group of G shares one prefill).
    step(n, span)  one token for slots [0, n), attending over their first `span` slots: reads
                   and writes only those views, with no shape that depends on the data, so
                   each (n, span) is one graph.
    compact        moves the slots still running to the front (their keys so far only), for a
                   smaller bucket.

Attention in `step` reads a row's first `span` slots (a multiple of 128 past the longest running
row) under the `valid` mask: the masked ones add exact zeros, so a row's numbers are today's decoder's with a longer sum (bit-equal in float64 up to
summation order; tests/test_static_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.models.decoder import Decoder


@dataclass
class Slots:
    keys: list[torch.Tensor]       # per layer [S, kv_heads, C, d]
    values: list[torch.Tensor]
    valid: torch.Tensor            # [S, C] bool: the filled slots a query may see
    write: torch.Tensor            # [S] long: where the slot's next key and value go
    positions: torch.Tensor        # [S] long: the position id of the slot's next token

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def buffers(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values, self.valid, self.write, self.positions]

    def compact(self, keep: torch.Tensor, width: int) -> None:
        """Move slots `keep` [m] to slots [0, m), in place (the tensors keep their storage, so a
        graph captured on a prefix of them still reads them); `width` covers every key they
        hold. Past it a moved slot is marked empty: whatever an earlier row left there is
        never read."""
        m = len(keep)
        width = min(width, self.capacity)
        for cache in (self.keys, self.values):
            for t in cache:
                t[:m, :, :width] = t[keep, :, :width]
        self.valid[:m, :width] = self.valid[keep, :width]
        self.valid[:m, width:] = False
        for t in (self.write, self.positions):
            t[:m] = t[keep]


class SlotDecoder(Decoder):
    """`Decoder` (the same weights and blocks) decoding into `Slots`."""

    def allocate(self, slots: int, capacity: int) -> Slots:
        """An empty cache of `slots` x `capacity`, in the weights' dtype, on their device."""
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        size = (slots, self.kv_heads, capacity, self.head_dim)
        return Slots([torch.zeros(size, dtype=dtype, device=device) for _ in self.layers],
                     [torch.zeros(size, dtype=dtype, device=device) for _ in self.layers],
                     torch.zeros(slots, capacity, dtype=torch.bool, device=device),
                     torch.zeros(slots, dtype=torch.long, device=device),
                     torch.zeros(slots, dtype=torch.long, device=device))

    @torch.no_grad()
    def prefill(self, s: Slots, into: torch.Tensor, prompt_ids: torch.Tensor,
                prompt_mask: torch.Tensor, prompt_of: torch.Tensor) -> torch.Tensor:
        """Compute the B left-padded prompts [B, P] once each and fill slot `into[i]` [m] with
        prompt `prompt_of[i]`: its real tokens at [0, p), nothing valid after. Returns the logits
        after each filled slot's last prompt token [m, V]."""
        b, P = prompt_ids.shape
        if P > s.capacity:
            raise ValueError(f"a prompt of {P} tokens does not fit a cache of {s.capacity} slots")
        length = prompt_mask.sum(-1)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        ahead = (torch.arange(P, device=prompt_ids.device) + (P - length)[:, None]) % P
        x = self._embed(prompt_ids.gather(1, ahead))          # [real tokens | padding]: causal
        cos, sin = self.rotary(x, positions.gather(1, ahead))
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            s.keys[i][into, :, :P] = k[prompt_of].to(s.keys[i].dtype)
            s.values[i][into, :, :P] = v[prompt_of].to(s.values[i].dtype)
            x = x + self._attend(attn, q, k, v)
            x = x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        last = (length - 1).clamp(min=0)
        h = self._norm(x[torch.arange(b, device=x.device), last][:, None], self.norm)
        s.valid[into] = torch.arange(s.capacity, device=s.valid.device) < length[prompt_of, None]
        s.write[into] = length[prompt_of]
        s.positions[into] = length[prompt_of]
        return self._logits(h)[prompt_of]

    def step(self, tokens: torch.Tensor, s: Slots,  # type: ignore[override]
             span: int | None = None) -> torch.Tensor:
        """Feed one token to each of the first n = len(tokens) slots; their next logits [n, V].
        Static in shape, with no host synchronization. Attention reads the first `span` slots of
        each row (all when None): the caller keeps every running row's keys inside it. A slot
        past its capacity (one that has ended and waits to be dropped) overwrites its last slot,
        which it never reads."""
        n = len(tokens)
        span = span or s.capacity
        at = s.write[:n].clamp(max=s.capacity - 1)
        x = self._embed(tokens[:, None])                                   # [n, 1, H]
        cos, sin = self.rotary(x, s.positions[:n, None])
        valid = s.valid[:n]
        valid.scatter_(1, at[:, None], True)
        mask = valid[:, None, None, :span]                                 # [n, 1, 1, span]
        where = at[:, None, None, None].expand(n, self.kv_heads, 1, self.head_dim)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, self._norm(x, layer.input_layernorm), cos, sin)
            keys, values = s.keys[i][:n], s.values[i][:n]
            keys.scatter_(2, where, k.to(keys.dtype))
            values.scatter_(2, where, v.to(values.dtype))
            x = x + self._attend(attn, q, keys[:, :, :span], values[:, :, :span], mask)
            x = x + self._mlp(layer.mlp, self._norm(x, layer.post_attention_layernorm))
        s.write[:n] += 1
        s.positions[:n] += 1
        return self._logits(self._norm(x, self.norm))
