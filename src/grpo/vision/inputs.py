"""Prompts with images as token ids plus pixels, and the forward inputs that share one prompt's
image features among its group's rows.

`encode` runs the model's processor on each prompt (text and its images), which expands each image
placeholder into the model's image tokens and makes the pixel tensors; a prompt's pixels become one
`Visual`, referenced by every row of its group.

`encoder_outputs` gives a forward over N rows the image features of its distinct prompts only: one
call of the model's `get_image_features` on the pixels of the distinct `Visual`s, whose per-image
(or, for Idefics3 and SmolVLM, per-prompt) features are then indexed out to the rows, which is
where the forward's autograd graph joins them. `forward_inputs` adds what each family's forward
needs beside them: the images' grids for multimodal RoPE, and token types (Gemma 3's image blocks
attend both ways; Qwen's RoPE index finds images by them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


TOWERS = ("vision_tower", "visual", "vision_model")   # what each family calls its image encoder
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


@dataclass(eq=False)          # compared (and deduplicated) by identity: one object per prompt
class Visual:
    """One prompt's images as the processor made them (pixel_values and, per family,
    image_grid_thw, pixel_attention_mask, image_sizes)."""
    pixels: dict[str, torch.Tensor]
    images: int               # how many images the prompt holds


class _Share(torch.autograd.Function):
    """x[index] whose backward sums each source row's gradients with a matrix product, in a fixed
    order; indexing's own backward accumulates with threads in an order that varies run to run."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        onehot = torch.zeros(ctx.rows, len(index), dtype=grad.dtype, device=grad.device)
        onehot[index, torch.arange(len(index), device=grad.device)] = 1.0
        return (onehot @ grad.reshape(len(index), -1)).view(ctx.rows, *grad.shape[1:]), None


def share(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of `x` picked by `index` (prompt rows for their completions), deterministically."""
    return _Share.apply(x, index)


def _inner(model):
    """The model whose forward takes the images (through a peft wrapper)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_vision_model(model) -> bool:
    return callable(getattr(_inner(model), "get_image_features", None))


def tower_of(model) -> torch.nn.Module | None:
    """The image encoder (the vision tower; Qwen's `visual` includes its patch merger)."""
    base = _inner(model)
    holder = getattr(base, "model", base)
    for name in TOWERS:
        for owner in (holder, base):
            if isinstance(getattr(owner, name, None), torch.nn.Module):
                return getattr(owner, name)
    return None


def freeze_tower(model) -> int:
    """Stop gradients into the image encoder; returns how many parameters it holds."""
    tower = tower_of(model)
    if tower is None:
        return 0
    tower.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters())


def encode(processor, texts: list[str], images: list[list]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     list[Visual | None]]:
    """Left-padded prompt ids and mask [B, P] and one Visual (None without images) per prompt.

    Each prompt goes through the processor on its own, so its pixels are its own tensors whatever
    the family's batched layout; `images[i]` are prompt i's PIL images."""
    tokenizer = getattr(processor, "tokenizer", processor)
    rows, visuals = [], []
    for text, pictures in zip(texts, images):
        out = processor(text=[text], images=[list(pictures)] if pictures else None,
                        return_tensors="pt", add_special_tokens=False)
        rows.append(out["input_ids"][0])
        pixels = {k: v for k, v in out.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}
        visuals.append(Visual(pixels, len(pictures)) if pictures else None)
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), P, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):], mask[i, P - len(r):] = r, 1
    return ids, mask, visuals


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along the first dimension, zero-padding the others where they differ
    (Idefics3's images per prompt and image sizes; padding images are all zero, which it skips)."""
    if all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors)
    widest = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        pad = []
        for d in reversed(range(1, t.dim())):
            pad += [0, widest[d - 1] - t.shape[d]]
        padded.append(torch.nn.functional.pad(t, pad))
    return torch.cat(padded)


def _pick(x, units: list[int]):
    """Feature sets by unit, repeats included; a tensor through share, whose backward
    sums a unit's rows in a fixed order (indexing's own accumulates in a varying one)."""
    if isinstance(x, torch.Tensor):
        return share(x, torch.tensor(units, dtype=torch.long, device=x.device))
    return [x[u] for u in units]


def parts_of(row) -> tuple:
    """A row's Visuals in the order of their tokens: none, its prompt's, or (in an episode whose
    observations hold images) a tuple of its prompt's and its observations'."""
    if row is None:
        return ()
    return tuple(row) if isinstance(row, (tuple, list)) else (row,)


def encoder_outputs(model, visuals: list):
    """The image encoder's outputs for rows whose images are `visuals` ([N]: a Visual, shared by
    a group's rows, or a tuple of them, or None): the encoder runs once on the distinct Visuals;
    None if no row has images."""
    distinct: dict[int, int] = {}
    unique: list[Visual] = []
    for v in (part for row in visuals for part in parts_of(row)):
        if id(v) not in distinct:
            distinct[id(v)] = len(unique)
            unique.append(v)
    if not unique:
        return None
    device = next(_inner(model).parameters()).device
    batch = {k: _stack([v.pixels[k] for v in unique]).to(device) for k in unique[0].pixels}
    if callable(getattr(model, "unshard", None)):   # FSDP2: the encoder runs before the root's
        state = model._get_fsdp_state()              # forward, which would set FSDP up as root
        state._lazy_init()                           # and gather its weights: do both first
        model.unshard()
    out = _inner(model).get_image_features(**batch, return_dict=True)
    counts = [v.images for v in unique]
    in_order = [v for row in visuals for v in parts_of(row)]          # as their tokens come
    if len(out.pooler_output) == sum(counts):          # features per image
        starts = torch.tensor([0] + counts).cumsum(0).tolist()
        units = [u for v in in_order for u in range(starts[distinct[id(v)]], starts[distinct[id(v)]] + v.images)]
    elif len(out.pooler_output) == len(unique):        # features per prompt (Idefics3, SmolVLM)
        units = [distinct[id(v)] for v in in_order]
    else:
        raise ValueError(f"{type(_inner(model)).__name__}.get_image_features gave "
                         f"{len(out.pooler_output)} feature sets for {len(unique)} prompts holding "
                         f"{sum(counts)} images; grpo does not know how to share them")
    shared = type(out)(**{k: v for k, v in out.items()})
    shared.pooler_output = _pick(out.pooler_output, units)
    if getattr(out, "deepstack_features", None) is not None:     # Qwen3-VL: features per layer
        shared.deepstack_features = [_pick(layer, units) for layer in out.deepstack_features]
    return shared


BANNED_LOGIT = -1.0e4     # exp(-1e4) is 0 in float32: the token is never drawn, and 0 * logit stays 0


def placeholder_ids(model) -> list[int]:
    """Token ids the forward reads as image (or video) placeholders. A completion must never hold
    one, or the next forward would look for features that do not exist: the sampler never draws
    them and the trained log-probs are of the same distribution without them (models.BANNED)."""
    config = _inner(model).config
    ids = {getattr(config, name, None) for name in
           ("image_token_id", "image_token_index", "video_token_id", "video_token_index")}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def _image_token(config) -> int | None:
    """The image placeholder's id (LLaVA-style configs name it image_token_index)."""
    token = getattr(config, "image_token_id", None)
    return token if token is not None else getattr(config, "image_token_index", None)


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(_inner(model).forward).parameters


def uses_mrope(model) -> bool:
    """Qwen-VL's multimodal RoPE: positions come from the images' grids, not from counting."""
    base = _inner(model)
    return callable(getattr(getattr(base, "model", base), "get_rope_index", None))


def forward_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   visuals: list[Visual | None], features=None) -> dict:
    """Keyword arguments for the model's forward over rows [N, L] whose prompts are `visuals`:
    the shared image features (computed here unless given), the grids of the rows' images, token
    types, and position ids (counted from the mask, except where multimodal RoPE derives them)."""
    kwargs: dict = {"input_ids": input_ids, "attention_mask": attention_mask}
    counted = (attention_mask.cumsum(-1) - 1).clamp(min=0)                 # [N, L]
    if not any(parts_of(v) for v in visuals):
        kwargs["position_ids"] = counted[None].expand(3, -1, -1) if uses_mrope(model) else counted
        return kwargs
    if not uses_mrope(model):
        kwargs["position_ids"] = counted
    features = encoder_outputs(model, visuals) if features is None else features
    kwargs["mm_encoder_outputs"] = {"image": features}
    rows = [v for row in visuals for v in parts_of(row)]
    for key in ("image_grid_thw",):
        if key in rows[0].pixels and _accepts(model, key):
            kwargs[key] = torch.cat([v.pixels[key] for v in rows]).to(input_ids.device)
    image_token = _image_token(_inner(model).config)
    types = (input_ids == image_token).long() if image_token is not None else None
    for key in ("mm_token_type_ids", "token_type_ids"):
        if types is not None and _accepts(model, key):
            kwargs[key] = types
            break
    return kwargs


def prompt_positions(model, inputs: dict) -> torch.Tensor:
    """Position ids of a prefill over `inputs` (forward_inputs' keywords): [N, P], or [3, N, P]
    from the model's multimodal RoPE index."""
    if "position_ids" in inputs:
        return inputs["position_ids"]
    base = _inner(model)
    inner = getattr(base, "model", base)
    types = inputs.get("mm_token_type_ids")
    if types is None:
        types = (inputs["input_ids"] == _image_token(inner.config)).long()
    positions, _ = inner.get_rope_index(inputs["input_ids"], mm_token_type_ids=types,
                                        image_grid_thw=inputs.get("image_grid_thw"),
                                        attention_mask=inputs["attention_mask"])
    return positions


def cache_argument(module) -> str:
    """Newer transformers name the KV-cache argument `cache`; older ones `past_key_values`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def _checkpointing(model) -> bool:
    base = _inner(model)
    name = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return bool(getattr(base, name, False))


def shared_prompt_hidden(model, backbone, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         visuals: list, T: int) -> torch.Tensor | None:
    """Hidden states [N, T, H] that predict the last T tokens, with each distinct prompt (its
    images included) run through the language model once: the prompts' keys and values, with
    their autograd graph, are indexed out to their rows, and the completions attend to them.
    The same numbers as one forward per row (causal attention: a prompt's states do not depend
    on what follows), at a group's prompt cost once. None where it does not apply: no prompt is
    shared, completions are not right-padded, or activation checkpointing is on (Hugging Face's
    checkpointing turns the cache off)."""
    from transformers import DynamicCache

    P = input_ids.shape[1] - T
    # a prompt is its tokens and its images: the same text with another picture is another prompt
    pictures: dict[tuple, int] = {}
    picture_of = torch.tensor([pictures.setdefault(tuple(map(id, parts_of(v))), len(pictures))
                               for v in visuals], device=input_ids.device)
    prompts, prompt_of = torch.unique(torch.cat([input_ids[:, :P], attention_mask[:, :P],
                                                 picture_of[:, None]], 1), dim=0, return_inverse=True)
    completion_attention = attention_mask[:, P:]
    right_padded = bool((completion_attention[:, 1:] <= completion_attention[:, :-1]).all())
    if (len(prompts) == len(input_ids) or not right_padded or T < 1 or _checkpointing(model)
            or any(isinstance(v, (tuple, list)) for v in visuals)):   # images after the prompt
        return None
    first = [int((prompt_of == u).nonzero()[0]) for u in range(len(prompts))]
    inputs = forward_inputs(model, prompts[:, :P], prompts[:, P:2 * P], [visuals[i] for i in first])
    positions = prompt_positions(model, inputs)                  # [U, P] or [3, U, P]
    inputs["position_ids"] = positions
    cache = DynamicCache(config=_inner(model).config)
    out = backbone(**inputs, **{cache_argument(backbone): cache}, use_cache=True)
    for layer in cache.layers:     # each prompt's keys and values to its rows, graph and all
        layer.keys, layer.values = share(layer.keys, prompt_of), share(layer.values, prompt_of)
    last = positions.amax(0) if positions.dim() == 3 else positions
    start = last.amax(-1)[prompt_of]                                            # [N]
    steps = start[:, None] + 1 + torch.arange(T, device=input_ids.device)[None]  # [N, T]
    rest = {"input_ids": input_ids[:, P:], "attention_mask": attention_mask,
            "position_ids": steps[None].expand(3, -1, -1) if positions.dim() == 3 else steps}
    for key in ("mm_token_type_ids", "token_type_ids"):
        if key in inputs:
            rest[key] = torch.zeros_like(input_ids[:, P:])
    completion = backbone(**rest, **{cache_argument(backbone): cache}, use_cache=True).last_hidden_state
    return torch.cat([share(out.last_hidden_state[:, -1:], prompt_of), completion[:, :-1]], 1)


def image_placeholder(processor) -> str:
    """The text one image is written as, which the processor expands into its image tokens
    (Gemma 3's begin-of-image; Qwen's pad token between its vision start and end)."""
    token = getattr(processor, "boi_token", None) or processor.image_token
    start, end = getattr(processor, "vision_start_token", None), getattr(processor, "vision_end_token", None)
    vocab = processor.tokenizer.get_vocab()
    if start is None and token == "<|image_pad|>" and "<|vision_start|>" in vocab:
        start, end = "<|vision_start|>", "<|vision_end|>"
    return (start or "") + token + (end or "")
