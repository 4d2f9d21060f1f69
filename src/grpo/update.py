"""The policy update: micro-batching, the batch-wide loss weights, the optimizer step.

The aggregation weights are computed once for the whole batch, then each micro-batch contributes
`sum(weights * term)` over its rows, so accumulating micro-batches reproduces the whole-batch loss
and gradient exactly (up to float summation order).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from grpo.models import heap
from grpo.algorithm.loss import LossSettings, aggregation_weights, policy_loss
from grpo.models import token_logprobs
from grpo.rollout import Rollout


def length_batches(rollout: Rollout, max_rows: int, max_tokens: int = 0) -> list[list[int]]:
    """Row numbers of each micro-batch: rows sorted by length, then cut so that no batch has more
    than `max_rows` rows or (when `max_tokens` > 0) more than `max_tokens` padded tokens.

    Rows of similar length share a batch and each batch is trimmed to its own longest row
    (`Rollout.trimmed`), so padding costs little even when lengths are ragged. The loss weights
    are fixed for the whole step beforehand, so the grouping changes only the summation order.
    """
    prompt_len = rollout.prompt_mask.sum(-1).tolist()
    completion_len = rollout.real_mask.sum(-1).tolist()
    order = sorted(range(len(rollout)), key=lambda i: (completion_len[i], prompt_len[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest_p = longest_c = 0
    for i in order:
        p, c = max(longest_p, prompt_len[i]), max(longest_c, completion_len[i])
        if batch and (len(batch) >= max_rows or (max_tokens and (len(batch) + 1) * (p + c) > max_tokens)):
            batches.append(batch)
            batch, p, c = [], prompt_len[i], completion_len[i]
        batch.append(i)
        longest_p, longest_c = p, c
    return batches + [batch] if batch else batches


def packed_batches(rollout: Rollout, max_rows: int, max_tokens: int = 0) -> list[list[int]]:
    """Row numbers of each packed micro-batch (models/packed.py): rows in their order, so a
    group's rows share a pass and their prompt's, cut so that no batch has more than `max_rows`
    rows or (when `max_tokens` > 0) more than `max_tokens` real tokens, each distinct prompt
    counted once and every completion's tokens. No padding is counted: there is none."""
    prompt_len = rollout.prompt_mask.sum(-1).tolist()
    completion_len = rollout.real_mask.sum(-1).tolist()
    group = rollout.group_ids.tolist()
    batches: list[list[int]] = []
    batch: list[int] = []
    tokens, groups = 0, set()
    for i in range(len(rollout)):
        add = completion_len[i] + (0 if group[i] in groups else prompt_len[i])
        if batch and (len(batch) >= max_rows or (max_tokens and tokens + add > max_tokens)):
            batches.append(batch)
            batch, tokens, groups = [], 0, set()
            add = completion_len[i] + prompt_len[i]
        batch.append(i)
        tokens += add
        groups.add(group[i])
    return batches + [batch] if batch else batches


def micro_batches(rollout: Rollout, model, max_rows: int, micro_batch_tokens: int) -> list[list[int]]:
    """The passes a rollout is cut into: packed (`packing`, the model's `grpo_packing`) or
    length-sorted and padded (`length_batches`), within `token_budget`."""
    budget = token_budget(micro_batch_tokens, model)
    if getattr(model, "grpo_packing", False):
        return packed_batches(rollout, max_rows, budget)
    return length_batches(rollout, max_rows, budget)


ACTIVATION_ELEMENTS = {"cpu": 2 ** 20, "cuda": 2 ** 22}   # per [tokens x hidden] tensor, by device


def token_budget(micro_batch_tokens: int, model) -> int:
    """Padded tokens per forward/backward pass: `micro_batch_tokens` when set, else a budget that
    keeps a [tokens x hidden] activation near ACTIVATION_ELEMENTS values: on a CPU 2^20 (8,192
    tokens at hidden 128, 2,048 at 512), on a GPU 2^22 (4,681 tokens at Qwen2.5-0.5B's 896).

    Measured on a 2-core CPU: at hidden 128 one pass of 3,456 tokens beat passes of 2,048 (demo
    step 0.25 -> 0.21 s); at hidden 512 passes of 4,096 tokens were slower than 2,048 (ragged W4
    step 9.2 -> 12.2 s, 1.3 GB more memory), because larger passes pad more and leave the cache.
    The GPU figure is an estimate (a few GB of activations for a 0.5B model), not a measurement.
    """
    if micro_batch_tokens > 0:
        return micro_batch_tokens
    if getattr(model, "grpo_packing", False) and next(model.parameters()).is_cuda:
        return packed_budget(model)
    embedding = model.get_input_embeddings()     # the width, also through peft, FSDP2, multimodal
    hidden = embedding.embedding_dim
    device = embedding.weight.device.type
    return max(256, ACTIVATION_ELEMENTS.get(device, ACTIVATION_ELEMENTS["cuda"]) // hidden)


PACKED_MEMORY_SHARE = 0.25   # of the free GPU memory, for one packed pass's activations


def packed_budget(model, free_bytes: int | None = None) -> int:
    """Real tokens per packed pass on a GPU, from its free memory: a decoder layer keeps about
    34 x hidden values a token for its backward (Korthikanti et al. 2022, with attention's
    scores never stored: Flash Attention), so a pass of n tokens holds n x 34 x hidden x layers
    of them in the compute dtype; with activation checkpointing, each layer's input (hidden
    values) and one layer's 34. PACKED_MEMORY_SHARE of the free memory goes to them."""
    config = getattr(model, "config", None) or model.get_base_model().config
    hidden, layers = config.hidden_size, config.num_hidden_layers
    compute = getattr(model, "grpo_autocast", None) or next(model.parameters()).dtype
    width = torch.empty(0, dtype=compute).element_size()
    kept = hidden * layers + 34 * hidden if getattr(model, "grpo_checkpointing", False) else 34 * hidden * layers
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(next(model.parameters()).device)[0]
    return max(256, int(free_bytes * PACKED_MEMORY_SHARE) // (kept * width))


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def logprobs_of(model, rollout: Rollout, micro_batch_size: int, max_tokens: int = 0) -> torch.Tensor:
    """Per-token log-probs [N, T] of the rollout's completions under `model`, without gradient,
    in passes of at most `micro_batch_size` rows and `token_budget(max_tokens, model)` tokens."""
    T = rollout.completion_ids.shape[1]
    out = torch.zeros(len(rollout), T)
    device = next(model.parameters()).device
    for rows in micro_batches(rollout, model, micro_batch_size, max_tokens):
        part = rollout.rows(rows).trimmed().to(device)
        logp, _ = token_logprobs(model, part.input_ids, part.attention_mask,
                                 part.completion_ids.shape[1], temperature=part.temperature, top_p=part.top_p,
                                 top_k=part.top_k, min_p=part.min_p,
                                 repetition_penalty=part.repetition_penalty,
                                 completion_mask=part.completion_mask, visuals=part.visuals)
        out[torch.tensor(rows)] = _pad_right(logp.float().cpu(), T)
        del logp, part
        heap.release(device)                      # each pass's shapes differ: see grpo.models.heap
    return out * rollout.completion_mask


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; the fused kernel (one pass over all parameters) where this torch has it for the
    parameters' device, which on a CPU is several times faster than the per-tensor loop."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def moved_fraction(params, lr: float) -> float:
    """The share of these weights that a step of size `lr` changes in their own dtype: AdamW's
    step is at most about lr per weight (exactly lr on its first step), and a weight moves only
    where that is at least half the spacing between its dtype's neighbouring values. In bfloat16
    (8 significant bits) a step of 1e-6 moves only weights below 2^-11 (about 4.9e-4), so on
    a pretrained model almost every update rounds away; in float32 almost every weight moves."""
    moved = total = 0
    with torch.no_grad():
        for p in params:
            for part in p.detach().reshape(-1).split(1 << 22):
                step = torch.full_like(part, lr)
                moved += int(((part + step) != part).logical_or_((part - step) != part).sum())
                total += part.numel()
    return moved / total if total else 1.0


def make_scheduler(optimizer, warmup_steps: int, total_steps: int, schedule: str):
    """Linear warmup reaching the full rate after `warmup_steps`, then constant or cosine decay to
    0 at `total_steps`. Stepped once per GRPO step, however many updates (mu) a step makes."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "cosine":
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def accumulate_gradients(policy, rollout: Rollout, *, micro_batch_size: int,
                         aggregation: str = "sequence_mean", max_tokens: int = 0,
                         is_weights: torch.Tensor | None = None, micro_batch_tokens: int = 0,
                         weights: torch.Tensor | None = None, reduce=None,
                         passes: Callable[[int], int] | None = None,
                         selected: torch.Tensor | None = None,
                         settings: LossSettings) -> dict[str, float]:
    """Backward the whole step's loss in micro-batches; return the loss and token-mean diagnostics.

    `settings` (a LossSettings record: step.loss_settings) go to `loss.policy_loss`; `selected`
    [N, T] are clip_cov's or kl_cov's tokens of the batch (`step.covariance_selection`); `weights`
    the `aggregation_weights` over the whole step's mask (step.update_policy; else made here from
    `aggregation` and this rollout's mask), so micro-batching changes nothing.
    Micro-batches are length-sorted and trimmed (`length_batches`), or packed (`packed_batches`),
    at most `micro_batch_size` rows and at most `token_budget(micro_batch_tokens, policy)` tokens
    each (`micro_batches`).

    Skipped, because they cannot change the gradient: rows whose advantage is 0 on every token
    when there is no KL term (beta = 0) and no token of theirs is `selected`. The diagnostics then
    cover the rows that were updated.

    With several processes, `weights` span every process's mask (`distributed`), and
    `reduce` sums the loss and the diagnostics' numerators and token counts over processes.
    With sharded parameters (FSDP2) every process must run as many forward/backward passes as
    the others: `passes(n)` returns that number and the extra ones contribute zero.
    Longer than about 60 lines: one backward of the whole step in micro-batches with the global
    normalizer; its arguments are the loss's.
    """
    if weights is None:
        weights = aggregation_weights(aggregation, rollout.tokens_in_loss, max_tokens)  # [N, T]
    totals = dict.fromkeys(["loss", "tokens", "clip_low", "clip_high", "kl", "ratio", "entropy"], 0.0)
    needed = rollout
    if not settings.beta:
        adv = rollout.advantages if rollout.advantages.dim() == 2 else rollout.advantages.unsqueeze(-1)
        live = (adv * rollout.tokens_in_loss != 0).any(-1)
        if selected is not None:
            live = live | selected.any(-1)
        live = live.nonzero().squeeze(-1).tolist()
        if not live:
            live = [0]  # keep one row so the step still reports its diagnostics
        needed = rollout.rows(live)
        weights, is_weights = weights[live], None if is_weights is None else is_weights[live]
        selected = None if selected is None else selected[live]
    device = next(policy.parameters()).device
    batches = micro_batches(needed, policy, micro_batch_size, micro_batch_tokens)
    if passes is not None:
        _zero_passes(policy, needed.rows(batches[-1][:1]).trimmed().to(device),
                     passes(len(batches)) - len(batches))
    for rows in batches:
        part = needed.rows(rows).trimmed().to(device)
        T = part.completion_ids.shape[1]
        logp, entropy = token_logprobs(policy, part.input_ids, part.attention_mask, T,
                                       with_entropy=True, temperature=part.temperature, top_p=part.top_p,
                                       top_k=part.top_k, min_p=part.min_p,
                                       repetition_penalty=part.repetition_penalty,
                                       completion_mask=part.completion_mask, visuals=part.visuals)
        old = part.old_logprobs if part.old_logprobs is not None else logp.detach()
        if part.old_logprobs is None and part.sampler_logprobs is not None:   # pi_old is the
            gap = (logp.detach() - part.sampler_logprobs).abs() * part.completion_mask   # update's own
            totals["sampler/logp_diff"] = totals.get("sampler/logp_diff", 0.0) + gap.sum().item()
            totals["sampler/logp_diff#n"] = totals.get("sampler/logp_diff#n", 0.0) + part.completion_mask.sum().item()
        loss, stats = policy_loss(logp, old, part.ref_logprobs, part.advantages,
                                  part.tokens_in_loss, weights[rows][:, :T].to(device), settings,
                                  is_weights=None if is_weights is None else is_weights[rows][:, :T].to(device),
                                  selected=None if selected is None else selected[rows][:, :T].to(device))
        loss.backward()
        totals["loss"] += loss.item()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value.item()
        totals["entropy"] += (entropy.detach() * part.tokens_in_loss).sum().item()
        del logp, entropy, old, loss, stats, part
        heap.release(device)                      # each pass's shapes differ: see grpo.models.heap
    if reduce is not None:
        totals = reduce(totals)
    tokens = max(totals.pop("tokens"), 1.0)
    own = {name: totals[name] / totals[name + "#n"] if totals[name + "#n"] else math.nan
           for name in totals if name + "#n" in totals}          # a variant's own diagnostics
    return {**own, "loss": totals["loss"], "kl": totals["kl"] / tokens,
            "clip/frac": (totals["clip_low"] + totals["clip_high"]) / tokens,
            "clip/frac_low": totals["clip_low"] / tokens, "clip/frac_high": totals["clip_high"] / tokens,
            "ratio/mean": totals["ratio"] / tokens, "entropy": totals["entropy"] / tokens}


def _zero_passes(policy, part: Rollout, n: int) -> None:
    """`n` forward/backward passes on `part` that add 0 to every gradient: under FSDP2 they take
    part in the same gathers and reductions as the other processes' real passes."""
    for _ in range(n):
        logp, _ = token_logprobs(policy, part.input_ids, part.attention_mask,
                                 part.completion_ids.shape[1], temperature=part.temperature, top_p=part.top_p,
                                 top_k=part.top_k, min_p=part.min_p,
                                 repetition_penalty=part.repetition_penalty,
                                 visuals=part.visuals)
        (logp.sum() * 0.0).backward()


def optimizer_step(policy, optimizer, max_grad_norm: float, loss: float = 0.0) -> tuple[float, bool]:
    """Clip, step, zero; return the gradient norm before clipping and whether the update was made.

    A loss or gradient norm that is not finite skips the update (the gradients are dropped), so one
    bad batch cannot write NaN into the weights or the optimizer's moments.
    """
    params = [p for p in policy.parameters() if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(
        params, max_grad_norm if max_grad_norm > 0 else float("inf")))
    stepped = math.isfinite(norm) and math.isfinite(loss)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped
