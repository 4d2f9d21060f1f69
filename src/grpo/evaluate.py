"""Held-out evaluation, as papers and leaderboards report it.

With `eval_samples=1` (the default) each prompt gets one greedy completion and `eval/accuracy` is
the mean of the accuracy reward (build.choose_accuracy; in a run on an environment's reward alone,
the environment's episode reward). With n > 1 each prompt gets n completions sampled at
`eval_temperature`, and the metrics are pass@1 (the mean over samples) with its spread over the
sample positions, pass@k for every k in `eval_k` (unbiased estimator) and, for tasks whose answers
can be extracted, maj@k (passk.py). Sampling for evaluation draws from its own random generator,
seeded by the run's seed and the step, so it neither depends on nor disturbs training's.
Every row's completions, scores and answers go to a JSONL file.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from grpo import build
from grpo.config import TrainConfig
from grpo.data import columns_of
from grpo.passk import summarize
from grpo.rewards import reward_name
from grpo.rewards.answers import extract_answer

BATCH_COMPLETIONS = 64   # completions per sampling call


@contextmanager
def sampling_at(sampler, temperature: float, seed: int, device):
    """The sampler at `temperature` (no top-p) under a forked, seeded random generator."""
    saved = sampler.temperature, getattr(sampler, "top_p", 1.0)
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        sampler.temperature, sampler.top_p = temperature, 1.0
        try:
            yield sampler
        finally:
            sampler.temperature, sampler.top_p = saved


def evaluate(c: TrainConfig, sampler, tokenizer, data: build.Data, record, step: int,
             on_batch: Callable[[int, float], None] | None = None,
             rows_file: str | Path | None = None) -> float:
    """Score the held-out prompts; `record(metrics, step)`; return eval/accuracy (pass@1).
    `on_batch(prompts done, accuracy so far)` after each sampling call."""
    n = c.eval.eval_samples
    by_environment = data.accuracy_fn is None    # the environment's episode reward is the score
    with_votes = not by_environment and reward_name(data.accuracy_fn) != "code_tests"
    per_call = max(1, BATCH_COMPLETIONS // n)
    results: list[dict] = []
    device = next(sampler.model.parameters()).device if hasattr(sampler, "model") else None
    with sampling_at(sampler, c.eval.eval_temperature, c.run.seed * 1_000_003 + step, device):
        for start in range(0, len(data.eval_rows), per_call):
            rows = data.eval_rows[start:start + per_call]
            rollout = sampler.sample(build.prompt_texts(c, tokenizer, rows), n, greedy=n == 1,
                                     rows=rows)
            if by_environment:
                scores = [0.0 if r is None else float(r) for r in rollout.episodes["env_reward"]]
            else:
                scores = data.accuracy_fn(rollout.prompts, rollout.completions, **columns_of(rows, n))
            calls = rollout.episodes["tool_calls"] if rollout.episodes else None
            for i, row in enumerate(rows):
                completions = rollout.completions[i * n:(i + 1) * n]
                results.append({
                    "row": row.get("_row", start + i), "prompt": row["prompt"],
                    "answer": row.get("answer"), "completions": completions,
                    "scores": list(scores[i * n:(i + 1) * n]),
                    "answers": [extract_answer(x) if with_votes else None for x in completions]})
                if calls is not None:
                    results[-1]["tool_calls"] = list(calls[i * n:(i + 1) * n])
            if on_batch is not None:
                so_far = summarize(results, [], with_votes)["eval/accuracy"]
                on_batch(start + len(rows), so_far)
    metrics = summarize(results, list(c.eval.eval_k), with_votes)
    episodes = [k for r in results for k in r.get("tool_calls", [])]
    if episodes:   # an agent task: the share of held-out episodes that called a tool
        metrics["eval/tool_use_frac"] = sum(k > 0 for k in episodes) / len(episodes)
    record(metrics, step)
    if rows_file is not None:
        write_rows(rows_file, results)
    return metrics["eval/accuracy"]


def write_rows(path: str | Path, results: list[dict]) -> None:
    """One JSON object per prompt: its row, prompt, gold, completions, scores, answers; written
    to a temporary file and renamed, so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as f:
        for r in results:
            f.write(json.dumps(r, default=str) + "\n")
    partial.replace(path)
