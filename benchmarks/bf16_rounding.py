"""How much of a model an update moves, in bfloat16 weights and in float32 weights.

AdamW's step is at most about lr a weight; in bfloat16 (8 significant bits) a step of 1e-6 is
below half the spacing between neighbouring values of every weight above 2^-11 (about 4.9e-4) in
magnitude, so it rounds away. This trains the tiny model for a few GRPO steps at the GPU recipes'
learning rate (examples/*.yaml, lr=1e-6) two ways and counts the trainable weights that changed:

    bfloat16 weights     dtype=bfloat16 (the recipes before), start-up check bypassed
    float32 weights      dtype=float32 mixed_precision=bf16 (the recipes now)

beside the share the start-up check predicts (update.moved_fraction: the weights an lr-sized step
moves in their own dtype), which grpo refuses under 50% and notes under 90%.

    python benchmarks/bf16_rounding.py [--steps 5] [--lr 1e-6]
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

import grpo.assembly.run as assembly_run
from grpo.config import build_config
from grpo.models import build_tiny, load_policy
from grpo.train import train
from grpo.update import moved_fraction


def distinct_characters(prompts, completions, **columns):
    """Rewards that differ within a group, so every step has a gradient."""
    return [float(len(set(c))) for c in completions]


def changed_share(before: dict, policy) -> float:
    after = {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    return changed / sum(t.numel() for t in before.values())


def measure(base: str, dtype: str, mixed: str, lr: float, steps: int) -> dict:
    model = load_policy(base, dtype)
    predicted = moved_fraction([p for p in model.parameters() if p.requires_grad], lr)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    config = build_config({"model": base, "dtype": dtype, "mixed_precision": mixed, "lr": lr,
                           "steps": steps, "sft_steps": 0, "eval_every": 0, "group_size": 4,
                           "prompts_per_step": 4, "max_new_tokens": 8})
    check = assembly_run.check_precision
    assembly_run.check_precision = lambda *a, **k: None     # the run grpo now refuses, measured
    try:
        result = train(config, reward_fns=[distinct_characters], log=lambda line: None,
                       write_files=False)
    finally:
        assembly_run.check_precision = check
    return {"dtype": dtype, "mixed_precision": mixed, "lr": lr, "steps": steps,
            "weights": sum(t.numel() for t in start.values()),
            "predicted_moved": round(predicted, 4),
            "measured_changed": round(changed_share(start, result.policy), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = str(build_tiny(tempfile.mkdtemp(prefix="grpo-bf16-"), seed=0))
    for dtype, mixed in (("bfloat16", "no"), ("float32", "bf16")):
        print(json.dumps(measure(base, dtype, mixed, args.lr, args.steps)))


if __name__ == "__main__":
    main()
