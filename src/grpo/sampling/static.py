"""grpo's own sampler with a static cache (`decode=static|graphs|compiled`): every tensor of a
`sample` call allocated once, each decoding step of a bucket of slots replayable as one CUDA graph.

The rows and their draws are today's (own.generate_with_lengths): row i continues prompt
i // G, token t of row i is drawn at `uniforms[i, t]` by inverting the cumulative distribution
after the temperature, the repetition penalty and the cut, and its log-prob is recorded in
float32. What changes is the schedule:

- **Slots and buckets.** Rows run in S slots (`decode_slots`, default all rows). A step computes
  the first n slots, n the smallest bucket (`buckets`) holding every running row; a row that ends
  keeps its slot, computing a token nobody keeps, until the next check.
- **Checks, not a sync a token.** The host looks every `CHECK_EVERY` tokens: it reads which rows
  ended (EOS and the length limit are found on the device), finds stop strings in the new tokens
  (a row is ended at the token that completes one; what it drew after is dropped), then moves the
  running rows to the front (a smaller bucket) and fills the freed slots.
- **Continuous batching.** With fewer slots than rows, rows wait in order; at each check, free
  slots take the next ones (their prompts prefilled once per check, G rows of a group sharing one).
  A row's tokens depend only on its prompt, its own draws and the weights: never on its slot or
  on which rows share the step (tests/test_static_decode.py runs S=N against S=3).
- **Graphs.** `graphs` (CUDA) captures each bucket's step (the model's step, the draw, the
  bookkeeping) in a CUDA graph the first time the bucket is used and replays it per token;
  `compiled` runs it under torch.compile(mode="reduce-overhead"), which captures graphs itself on
  CUDA (on a CPU it compiles the kernels). Either falls back to `static` (the same step, eager)
  with one line if capture or compilation fails.

Longer than about 400 lines: the sampler, the decoder it keeps and the loop are one schedule
(slots, looks, captures, stop strings) read together; the package holds its eight modules.

A slot that has ended writes its key past its row's end (slots.SlotDecoder.step) and its token
into a dump row (index N) of the outputs, so a step never needs to know, on the host, which rows
run.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable

import torch

from grpo import vision
from grpo.config import ConfigError
from grpo.models import decoder
from grpo.models.slots import SlotDecoder, Slots
from grpo.sampling.interface import eos_ids
from grpo.sampling.own import HFSampler, cut_warper, draw, drawn_from, stop_check

CHECK_EVERY = 8          # tokens decoded between two looks from the host
CAPACITY_ROUND = 64      # the prompt part of the cache is rounded up to this, so it is reused
SPAN_ROUND = 128         # the keys a step attends over are rounded up to this (static.span_for)


def buckets(top: int, *, few: bool = False) -> list[int]:
    """The batch sizes a step is run at, up to `top` (itself always one): vLLM's capture sizes
    (1, 2, 4, then multiples of 8 to 256, then of 16); `few`: powers of two, for `compiled`,
    where each size is compiled on its own."""
    if few:
        sizes = [1 << k for k in range(top.bit_length()) if (1 << k) < top]
    else:
        sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, top, 16))
    return sorted({s for s in sizes if s < top} | {top})


def bucket_of(n: int, sizes: list[int]) -> int:
    return next(s for s in sizes if s >= n)


def static_mode(model, decode: str) -> str:
    """The decoding `decode` resolves to for `model`: `auto` is `graphs` on CUDA where the lean
    decoder runs the model (without images), `eager` otherwise; a static mode the model cannot
    take is refused in one line."""
    device = next(model.parameters()).device
    plain = decoder.supports(model) and not vision.is_vision_model(model)
    rope = rope_of(model) if plain else "default"
    if rope in BATCH_ROPE:
        if decode not in ("auto", "eager"):
            raise ConfigError(f"config key 'decode': decode={decode} runs rows of different "
                              f"lengths in one step; {rope} rotary embeddings depend on "
                              "the batch's longest position. Use decode=eager")
        plain = False
    if decode == "auto":
        return "graphs" if device.type == "cuda" and plain else "eager"
    if decode != "eager" and not plain:
        raise ConfigError(f"config key 'decode': decode={decode} needs a model grpo's lean decoder runs (Llama, Qwen2, "
                         f"Mistral, without images); this one decodes with decode=eager")
    if decode == "graphs" and device.type != "cuda":
        raise ConfigError(f"config key 'decode': decode={decode} captures CUDA graphs; the policy is on {device.type}. "
                         "Use decode=static or compiled there")
    return decode


BATCH_ROPE = {"dynamic", "longrope"}   # their frequencies follow the batch's longest position


def rope_of(model) -> str:
    backbone = getattr(decoder.unwrap(model), decoder.unwrap(model).base_model_prefix)
    return getattr(backbone.rotary_emb, "rope_type", "default")


def own_sampler(model, tokenizer, *, decode: str = "auto", decode_slots: int = 0, log=None,
                **settings) -> HFSampler:
    """grpo's own sampler decoding as `decode` says (static_mode): HFSampler's eager loop, or
    StaticSampler."""
    mode = static_mode(model, decode)
    if mode == "eager":
        return HFSampler(model, tokenizer, **settings)
    return StaticSampler(model, tokenizer, mode=mode, slots=decode_slots, log=log, **settings)


class StaticSampler(HFSampler):
    """HFSampler decoding on the static cache: the same rows from the same draws."""

    def __init__(self, model, tokenizer, *, mode: str = "static", slots: int = 0, log=None,
                 **settings):
        super().__init__(model, tokenizer, **settings)
        self.mode, self.slots, self.log = mode, slots, log
        self._kept = None            # (settings, StaticDecode): kept while they hold
        self._shadow = None          # (weights_key, bf16 copy of the policy) under mixed precision

    def close(self) -> None:
        """Free the kept cache, graphs and bf16 copy (between calls they stay: the update runs
        beside them, and the next call replays them)."""
        self._kept = self._shadow = None

    def _compute_dtype(self):
        """mixed_precision=bf16 (the policy's `grpo_autocast`) on CUDA: the static step computes
        in bf16, as the trainer's forward does; on a CPU it samples in the weights' dtype, as
        the eager loop does."""
        on_cuda = next(self.model.parameters()).device.type == "cuda"
        return getattr(self.model, "grpo_autocast", None) if on_cuda else None

    @torch.no_grad()
    def _decoding_model(self):
        """The model a step reads. Under mixed precision with float32 weights: a copy of the
        policy in the compute dtype, refreshed from the policy at each call (one cast pass a call,
        where autocast would cast every weight at every token); otherwise the policy itself."""
        dtype = self._compute_dtype()
        if dtype is None or next(self.model.parameters()).dtype == dtype:
            self._shadow = None
            return self.model
        key = weights_key(self.model)
        if self._shadow is None or self._shadow[0] != key:
            self._shadow = None
            copy_ = copy.deepcopy(self.model).to(dtype).requires_grad_(False).eval()
            self._shadow = (key, copy_)
        for mine, theirs in zip(self._shadow[1].parameters(), self.model.parameters()):
            mine.copy_(theirs)
        return self._shadow[1]

    @torch.no_grad()
    def generate(self, prompt_ids, prompt_mask, group_size: int, *, greedy: bool, uniforms,
                 visuals) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if visuals is not None:
            raise ValueError(f"decode={self.mode} decodes text prompts; these have images. "
                             "Use decode=eager")
        N, T = len(prompt_ids) * group_size, self.max_new_tokens
        if uniforms is None:        # the draws made here, once, so no row's depend on its slot
            uniforms = torch.rand(N, T)
        P = -(-int(prompt_mask.sum(-1).max()) // CAPACITY_ROUND) * CAPACITY_ROUND
        model = self._decoding_model()
        temperature = 1.0 if greedy else self.temperature
        penalty = 1.0 if greedy else self.repetition_penalty
        settings = (T, temperature, penalty, (self.top_p, self.top_k, self.min_p), greedy,
                    self.mode, self.slots, weights_key(model))
        kept = self._kept[1] if self._kept is not None and self._kept[0] == settings else None
        if kept is None or kept.N < N or kept.slots.capacity < P + T:
            # sized for the largest call so far: smaller ones reuse it, its graphs included
            rows = max(N, kept.N if kept is not None else 0)
            capacity = max(P + T, kept.slots.capacity if kept is not None else 0)
            self._kept = kept = None                             # its memory first
            tok = self.tokenizer
            kept = StaticDecode(
                model, rows=rows, slots=self.slots or slots_that_fit(model, rows, capacity),
                capacity=capacity, max_new_tokens=T,
                vocab=decoder.unwrap(model).get_output_embeddings().weight.shape[0],
                eos=eos_ids(tok.eos_token_id), pad=tok.pad_token_id, temperature=temperature,
                warper=cut_warper(self.top_p, self.top_k, self.min_p, greedy), greedy=greedy,
                penalty=penalty, mode=self.mode, log=self.log)
            self._kept = (settings, kept)
        out = generate_static(kept, prompt_ids, prompt_mask, group_size, uniforms,
                              stop_check(self.tokenizer, self.stop) if self.stop else None)
        self.mode = kept.mode                       # a fallback to static holds for later calls
        return out


CACHE_SHARE = 0.3     # decode_slots=0 on CUDA: the cache takes at most this share of free memory


def slots_that_fit(model, rows: int, capacity: int, free_bytes: int | None = None) -> int:
    """decode_slots=0: every row at once where their cache fits in CACHE_SHARE of the device's
    free memory (on a CPU, always); otherwise as many slots as fit there, the other rows
    waiting for freed ones (continuous batching). A slot holds `capacity` keys and values in
    every layer."""
    if free_bytes is None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            return rows
        free_bytes = torch.cuda.mem_get_info(device)[0]
    d = SlotDecoder(model)
    per_slot = 2 * len(d.layers) * d.kv_heads * d.head_dim * capacity * d.embed.weight.element_size()
    return max(1, min(rows, int(free_bytes * CACHE_SHARE) // per_slot))


def weights_key(model) -> tuple:
    """What a captured step read of the model: each parameter's storage, and each LoRA layer's
    switches (merged, disabled, active adapters, scaling). A change in either (a fresh adapter, weights
    loaded into new tensors, a model moved) makes the kept decoder a new one, so a graph never
    replays on weights the model no longer has."""
    ptrs = tuple(p.data_ptr() for p in model.parameters())
    switches = tuple((m.merged, m.disable_adapters, tuple(m.active_adapters),
                      tuple(sorted(m.scaling.items())))
                     for m in model.modules() if hasattr(m, "lora_A"))
    return hash(ptrs), switches


class StaticDecode:
    """One configuration of the static path: slots, outputs and captured steps, kept from one
    `sample` call to the next while the shapes and settings stay the same."""

    def __init__(self, model, *, rows: int, slots: int, capacity: int, max_new_tokens: int,
                 vocab: int, eos: torch.Tensor, pad: int, temperature: float, warper, greedy: bool,
                 penalty: float, mode: str, log=None):
        self.decoder = SlotDecoder(model)
        device = self.decoder.embed.weight.device
        self.device, self.mode = device, mode
        self.log = log or (lambda line: print(line, file=sys.stderr))
        self.N, self.S, self.T, self.V = rows, slots, max_new_tokens, vocab
        self.eos, self.pad = eos.to(device), pad
        self.temperature, self.warper, self.greedy, self.penalty = temperature, warper, greedy, penalty
        self.slots: Slots = self.decoder.allocate(slots, capacity)
        N, T, S = rows, max_new_tokens, slots
        self.uniforms = torch.zeros(N + 1, T + 1, device=device)
        self.tokens = torch.full((N + 1, T + 1), pad, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(N + 1, T + 1, device=device)
        self.lengths = torch.zeros(N + 1, dtype=torch.long, device=device)
        self.next = torch.full((S,), pad, dtype=torch.long, device=device)     # each slot's input
        self.row = torch.full((S,), N, dtype=torch.long, device=device)        # N: no row
        self.drawn = torch.zeros(S, dtype=torch.long, device=device)           # the row's next t
        self.live = torch.zeros(S, dtype=torch.bool, device=device)
        self.seen = None if penalty == 1.0 else torch.zeros(S, vocab, dtype=torch.bool, device=device)
        self.sizes = buckets(S, few=mode == "compiled")
        self.graphs: dict[int, object] = {}
        self.compiled = None
        self._warm = False

    # -- the step ---------------------------------------------------------------------------
    def _draw_into(self, logits: torch.Tensor, lo: int, hi: int) -> None:
        """Draw each running slot's token in [lo, hi) from `logits` [hi - lo, V] and record it."""
        N, T = self.N, self.T
        seen = None if self.seen is None else self.seen[lo:hi]
        scores = drawn_from(logits, None, self.temperature, self.warper, self.greedy, seen,
                            self.penalty)
        row, t, live = self.row[lo:hi], self.drawn[lo:hi].clone(), self.live[lo:hi].clone()
        chosen, lse = draw(scores, self.greedy, self.uniforms[row, t][:, None])
        logp = scores.gather(-1, chosen[:, None]).squeeze(-1) - lse.squeeze(-1)
        out_row = torch.where(live, row, N)
        out_t = torch.where(live, t, T)
        self.tokens[out_row, out_t] = chosen
        self.logprobs[out_row, out_t] = logp
        ending = live & (chosen[:, None] == self.eos).any(-1)      # no isin: it may sync
        self.lengths[out_row] = torch.where(ending, t + 1, self.lengths[out_row])
        self.live[lo:hi] = live & ~ending & (t + 1 < T)
        self.drawn[lo:hi] = t + live.long()
        if seen is not None:
            seen.scatter_(1, chosen[:, None], True)
        self.next[lo:hi] = chosen

    def _tick(self, n: int, span: int) -> None:
        self._draw_into(self.decoder.step(self.next[:n], self.slots, span), 0, n)

    def span_for(self, longest: int) -> int:
        """The slots attention reads when no running row has more than `longest` keys: a
        multiple of SPAN_ROUND (few distinct spans, so few graphs), all of them for `compiled`
        (each span would be compiled on its own)."""
        if self.mode == "compiled":
            return self.slots.capacity
        return min(self.slots.capacity, -(-longest // SPAN_ROUND) * SPAN_ROUND)

    def tick(self, n: int, span: int) -> None:
        if self.mode == "graphs":
            graph = self.graphs.get((n, span)) or self._capture(n, span)
            if graph is not None:
                graph.replay()
                return
        elif self.mode == "compiled":
            if self.compiled is None:
                self._compile()
            if self.compiled is not None:
                try:
                    self.compiled(n, span)
                    return
                except Exception as e:      # noqa: BLE001  the eager step is the same function
                    self._fall_back(f"torch.compile failed ({type(e).__name__}: {e})")
        self._tick(n, span)

    def _fall_back(self, why: str) -> None:
        self.log(f"sampler: decode={self.mode} is not available here ({why}); decoding with "
                 "decode=static (the same step, not captured)")
        self.mode, self.graphs, self.compiled = "static", {}, None

    def _capture(self, n: int, span: int):
        """The step of (n, span) as a CUDA graph. The first capture is preceded by one eager
        step on a side stream (kernels chosen, workspaces made, as torch.cuda.graph asks): a
        real step of the running rows, which it advances by one token."""
        try:
            if not self._warm:
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    self._tick(n, span)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                self._warm = True
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream(self.device)     # this decoder's captures'
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread (the trainer, while this one samples ahead of it)
            # may use CUDA as it likes during the capture
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                  capture_error_mode="thread_local"):
                self._tick(n, span)
        except Exception as e:   # noqa: BLE001
            self._fall_back(f"capturing a CUDA graph failed ({type(e).__name__}: {e})")
            return None
        self.graphs[(n, span)] = graph
        return graph

    def _compile(self) -> None:
        try:
            import torch._dynamo as dynamo
            for t in (*self.slots.buffers(), self.uniforms, self.tokens, self.logprobs,
                      self.lengths, self.next, self.row, self.drawn, self.live,
                      *(() if self.seen is None else (self.seen,))):
                dynamo.mark_static_address(t)
            # Each bucket is one specialization of the step (its n a constant in it), cached on
            # the code object all decoders share: a new decoder starts from an empty cache,
            # and one past the limit fails (and falls back, saying so) rather than running
            # eagerly in silence.
            dynamo.reset()
            dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, len(self.sizes) + 2)
            dynamo.config.fail_on_recompile_limit_hit = True
            self.compiled = torch.compile(self._tick, mode="reduce-overhead", dynamic=False)
        except Exception as e:   # noqa: BLE001
            self._fall_back(f"torch.compile failed ({type(e).__name__}: {e})")

    # -- a call -----------------------------------------------------------------------------
    def reset(self, uniforms: torch.Tensor) -> None:
        self.uniforms[:len(uniforms), :uniforms.shape[1]] = uniforms.to(self.device)
        self.tokens.fill_(self.pad)
        self.logprobs.zero_()
        self.lengths.zero_()
        self.row.fill_(self.N)
        self.live.zero_()
        self.drawn.zero_()

    @torch.no_grad()
    def admit(self, lo: int, rows: list[int], group_size: int, prompt_ids: torch.Tensor,
              prompt_mask: torch.Tensor) -> None:
        """Put `rows` into slots [lo, lo + len(rows)): their prompts prefilled once each, their
        first tokens drawn."""
        hi = lo + len(rows)
        prompts = sorted({r // group_size for r in rows})
        index = {p: i for i, p in enumerate(prompts)}
        picked_ids, picked_mask = prompt_ids[prompts], prompt_mask[prompts]
        width = int(picked_mask.sum(-1).max())
        picked_ids, picked_mask = picked_ids[:, -width:], picked_mask[:, -width:]   # left-padded
        of = torch.tensor([index[r // group_size] for r in rows], device=self.device)
        into = torch.arange(lo, hi, device=self.device)
        picked_ids, picked_mask = picked_ids.to(self.device), picked_mask.to(self.device)
        logits = self.decoder.prefill(self.slots, into, picked_ids, picked_mask, of)
        self.row[lo:hi] = torch.tensor(rows, device=self.device)
        self.drawn[lo:hi] = 0
        self.live[lo:hi] = True
        if self.seen is not None:
            seen = torch.zeros(len(prompts), self.V, dtype=torch.int32, device=self.device)
            seen.scatter_add_(1, picked_ids, picked_mask.int())
            self.seen[lo:hi] = (seen > 0)[of]
        self._draw_into(logits, lo, hi)

    def compact(self, keep: torch.Tensor) -> None:
        """Move the slots `keep` [m] (their cache up to the longest one's keys, and their
        bookkeeping) to slots [0, m); the slots after hold no row."""
        m = len(keep)
        self.slots.compact(keep, int(self.slots.write[keep].max()) + 1 if m else 0)
        for t in (self.next, self.row, self.drawn, self.live,
                  *(() if self.seen is None else (self.seen,))):
            t[:m] = t[keep]
        self.row[m:] = self.N
        self.live[m:] = False


@torch.no_grad()
def generate_static(decode: StaticDecode, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    group_size: int, uniforms: torch.Tensor,
                    stopped: Callable[[list[int]], bool] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """own.generate_with_lengths's contract on `decode`: tokens [N, steps] (pad after a row's
    end), their log-probs [N, steps] (0 after it), lengths [N] (0: cut at the limit), for the
    N = B * group_size rows of the B prompts (at most the rows `decode` was made for)."""
    N, T, S = len(prompt_ids) * group_size, decode.T, decode.S
    decode.reset(uniforms)
    waiting = list(range(N))
    seen: dict[int, list[int]] = {}   # a row's tokens the host has read, for stop strings
    running = 0                       # slots [0, running) hold rows
    while True:
        if waiting and running < S:
            take, waiting = waiting[:S - running], waiting[S - running:]
            decode.admit(running, take, group_size, prompt_ids, prompt_mask)
            running += len(take)
        live = decode.live[:running].cpu()
        if not bool(live.any()) and not waiting:
            break
        n = bucket_of(running, decode.sizes)
        drawn = decode.drawn[:running].cpu()
        left = int((T - drawn[live]).min()) if bool(live.any()) else 1
        ticks = max(1, min(CHECK_EVERY, left))
        span = decode.span_for(int(decode.slots.write[:running].max()) + ticks + 1)
        for _ in range(ticks):
            decode.tick(n, span)
        if stopped is not None:
            _stop_strings(decode, running, seen, stopped)
        keep = decode.live[:running].cpu().nonzero().squeeze(-1)
        smaller = bucket_of(max(len(keep), 1), decode.sizes) < n
        if len(keep) < running and (waiting or smaller):   # the running rows move to the front
            decode.compact(keep.to(decode.device))
            running = len(keep)
    lengths = decode.lengths[:N].cpu()
    steps = T if bool((lengths == 0).any()) else int(lengths.max())
    tokens, logprobs = decode.tokens[:N, :steps].cpu(), decode.logprobs[:N, :steps].cpu()
    after = torch.arange(steps) >= torch.where(lengths == 0, T, lengths)[:, None]
    return tokens.masked_fill(after, decode.pad), logprobs.masked_fill(after, 0.0), lengths


def _stop_strings(decode: StaticDecode, running: int, seen: dict[int, list[int]],
                  stopped: Callable[[list[int]], bool]) -> None:
    """End each row in slots [0, running) at the first new token that completes a stop string
    (before the token that ended it otherwise): its length set there, its slot no longer
    running. Only the tokens drawn since the last look are read from the device."""
    rows = decode.row[:running].cpu()
    slots = (rows < decode.N).nonzero().squeeze(-1)
    if not len(slots):
        return
    rows = rows[slots]
    lengths = decode.lengths[rows.to(decode.device)].cpu().tolist()
    drawn = decode.drawn[:running][slots.to(decode.device)].cpu().tolist()
    start = min(len(seen.get(r, ())) for r in rows.tolist())
    new = decode.tokens[rows.to(decode.device), start:max(drawn)].cpu().tolist()
    for slot, r, length, upto, fresh in zip(slots.tolist(), rows.tolist(), lengths, drawn, new):
        ids = seen.setdefault(r, [])
        checked = len(ids)
        ids.extend(fresh[checked - start:upto - start])
        end = length - 1 if length else upto         # EOS at length - 1 is not looked at
        for t in range(checked, end):
            if stopped(ids[:t + 1]):
                decode.lengths[r] = t + 1
                decode.live[slot] = False
                break
