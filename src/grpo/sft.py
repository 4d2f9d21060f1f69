"""Cold start: supervised tuning on (prompt, completion) pairs before GRPO.

A model that cannot yet produce the task's format gets no reward signal to learn from; a short
supervised run on demonstrations gives it the format. The loss is cross-entropy on the completion
tokens and the EOS that ends them; prompt tokens are context only.

SIGTERM or Ctrl-C during a cold start finishes the supervised step under way, writes the model as
it is then to OUTPUT_DIR/cold_start/ (a model directory) and stops, saying how to go on from it:
AdamW's state and the steps not taken are what is lost (`stopped`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import torch

from grpo.run.checkpoint import save_model_dir
from grpo.models import token_logprobs
from grpo.run.resume import Stopped
from grpo.sampling import vision_prompts


def encode_pairs(tokenizer, pairs: list[tuple]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list | None]:
    """[(prompt, completion)] -> input_ids, attention_mask [n, P+T], completion mask [n, T] and
    the prompts' images (vision.Visual per pair, or None): a pair's optional third element, its
    image sources, goes with the prompt through the model's processor."""
    visuals = None
    if any(len(pair) > 2 and pair[2] for pair in pairs):
        ids, mask, visuals = vision_prompts(tokenizer, [p[0] for p in pairs],
                                            [{"images": p[2]} for p in pairs])
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    else:
        prompts = tokenizer([p[0] for p in pairs], add_special_tokens=False).input_ids
    completions = tokenizer([p[1] for p in pairs], add_special_tokens=False).input_ids
    completions = [ids + [tokenizer.eos_token_id] for ids in completions]
    P, T = max(map(len, prompts)), max(map(len, completions))
    pad = tokenizer.pad_token_id
    input_ids, attention, target_mask = [], [], []
    for p, c in zip(prompts, completions):
        input_ids.append([pad] * (P - len(p)) + p + c + [pad] * (T - len(c)))
        attention.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
        target_mask.append([1] * len(c) + [0] * (T - len(c)))
    return torch.tensor(input_ids), torch.tensor(attention), torch.tensor(target_mask), visuals


def supervised_finetune(model, tokenizer, pairs: list[tuple], *, steps: int, lr: float,
                        batch_size: int, seed: int,
                        on_step: Callable[[int, float, float], None] | None = None,
                        stop: Callable[[], int] | None = None) -> list[float]:
    """AdamW on the mean completion-token cross-entropy; returns the loss of each step. `stop()`
    after each step: a signal number ends the tuning there (fewer losses than `steps`)."""
    if not pairs:
        raise ValueError("cold start needs demonstrations, but none were given")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses, order = [], []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        if len(order) < batch_size:
            order += rng.sample(range(len(pairs)), len(pairs))
        batch = [pairs[order.pop()] for _ in range(min(batch_size, len(pairs)))]
        input_ids, attention_mask, target_mask, visuals = encode_pairs(tokenizer, batch)
        logp, _ = token_logprobs(model, input_ids, attention_mask, target_mask.shape[1],
                                 visuals=visuals)
        loss = -(logp * target_mask).sum() / target_mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1], time.perf_counter() - start)
        if stop is not None and stop():
            break
    return losses


def stopped(signum: int, done: int, steps: int, model, tokenizer, save_to: Path | None) -> Stopped:
    """What a cold start stopped after `done` of `steps` steps keeps: the model as it is, in
    `save_to`/cold_start (None: nothing is written, and the message says so)."""
    import signal
    name = signal.Signals(signum).name
    if save_to is None:
        return Stopped(f"stopped by {name} after cold-start step {done}/{steps}, before any GRPO "
                       "step; nothing was written", signum)
    path = save_model_dir(model, tokenizer, Path(save_to) / "cold_start")
    if done == steps:
        return Stopped(f"stopped by {name} after the cold start's last step ({done}/{steps}), "
                       f"before any GRPO step. The cold-started model is in {path}; go on from it "
                       f"with model={path} sft_steps=0", signum)
    return Stopped(
        f"stopped by {name} after cold-start step {done}/{steps}, before any GRPO step. The model "
        f"after those {done} supervised steps is in {path}; AdamW's state and the other "
        f"{steps - done} steps are not kept. Go on from it with model={path} sft_steps={steps - done} "
        "(the same steps are not redrawn, so the result differs from an unstopped run's), or run "
        "the same command again to start over", signum)
