"""Held-out evaluation, as papers and leaderboards report it.

With `eval_samples=1` (the default) each prompt gets one greedy completion and `eval/accuracy` is
the mean of the accuracy reward (the assembly's choose_accuracy: the first of `eval_rewards` when set; in a
run on an environment's reward alone, the environment's episode reward), and each of
`eval_rewards` has its mean as `eval/reward/NAME/mean`. `eval/n` counts the prompts scored and
`eval/rows` those the held-out data holds less the prompts `long_prompts=skip` left out as too
long for the model (`eval/skipped_long_prompts`, logged with skip), so a cut by `eval_size` shows
in every record and a skipped prompt is never counted as evaluated.
With n > 1 each prompt gets n completions sampled at `eval_temperature`, and the metrics are
pass@1 (the mean over samples) with its spread over the sample positions, pass@k for every k
in `eval_k` (unbiased estimator) and, for tasks whose answers can be extracted, maj@k (passk.py).
pass@k and maj@k count a completion right when its score is 1, so they are logged only when
every score is 0 or 1; a graded reward (0.5, 2.0) gets pass@1, its mean, alone.
Sampling for evaluation draws from its own random generator, seeded by the run's seed and the
step, so it neither depends on nor disturbs training's.
Every row's completions, scores and answers go to a JSONL file.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from grpo import inputs
from grpo.config import TrainConfig
from grpo.data import columns_of
from grpo.algorithm.passk import binary_scores, summarize
from grpo.run.progress import Progress, to_stderr
from grpo.rewards import columns_for, faults, reward_name, score, unique_names
from grpo.rewards.answers import extract_answer
from grpo.sampling import Sampler

BATCH_COMPLETIONS = 64   # completions per sampling call
PROGRESS_LINES = 10      # progress lines an evaluation prints, about: one every tenth of the rows


@contextmanager
def sampling_at(sampler: Sampler, temperature: float, seed: int, device):
    """The sampler at `temperature` with no cut (no top-p, top-k or min-p) nor repetition penalty
    (pass@k is measured on the model's own distribution) under a forked, seeded random generator."""
    cuts = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    saved = sampler.temperature, {k: getattr(sampler, k) for k in cuts}
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        sampler.temperature = temperature
        for k in saved[1]:
            setattr(sampler, k, cuts[k])
        try:
            yield sampler
        finally:
            sampler.temperature = saved[0]
            for k, v in saved[1].items():
                setattr(sampler, k, v)


def evaluate(c: TrainConfig, sampler: Sampler, tokenizer, data: inputs.Data, record, step: int,
             on_batch: Callable[[int, float], None] | None = None,
             rows_file: str | Path | None = None,
             log: Callable[[str], None] | None = None, kept: list | None = None) -> float:
    """Score the held-out prompts; `record(metrics, step)`; return eval/accuracy (pass@1).
    `on_batch(prompts done, accuracy so far)` after each sampling call (`progress` shows it);
    `log` hears why pass@k and maj@k are left out when they are; `kept` gets the per-row results
    (as `rows_file` holds them)."""
    n = c.eval.eval_samples
    by_environment = data.accuracy_fn is None    # the environment's episode reward is the score
    with_votes = not by_environment and reward_name(data.accuracy_fn) != "code_tests"
    per_call = max(1, BATCH_COMPLETIONS // n)
    results: list[dict] = []
    names = unique_names(data.eval_fns)
    per_fn: dict[str, list[float]] = {name: [] for name in names}   # eval_rewards: scored values
    device = sampler.device()
    # its own scope of fault counts (faults.py): zeros of held-out completions are no step's
    with sampling_at(sampler, c.eval.eval_temperature, c.run.seed * 1_000_003 + step, device), \
            faults.counting():
        for start in range(0, len(data.eval_rows), per_call):
            rows = data.eval_rows[start:start + per_call]
            rollout = sampler.sample(inputs.prompt_texts(c, tokenizer, rows, data.agent), n, greedy=n == 1,
                                     rows=rows)
            columns = columns_of(rows, n)
            if by_environment:
                scores = [0.0 if r is None else float(r) for r in rollout.episodes.env_reward]
            elif data.eval_fns:    # eval_rewards, their values checked as training checks rewards
                _, values = score(data.eval_fns, [1.0] * len(names), rollout.prompts,
                                  rollout.completions, columns, on_error=c.reward.reward_on_error)
                for name in names:
                    per_fn[name] += [v for v in values[name] if v is not None]
                scores = values[names[0]]
            else:
                scores = data.accuracy_fn(rollout.prompts, rollout.completions,
                                          **columns_for(data.accuracy_fn, columns))
            calls = rollout.episodes.tool_calls if rollout.episodes else None
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
    skipped = data.skipped_long_eval_prompts
    metrics["eval/rows"] = float(max(data.eval_rows_available - skipped, len(data.eval_rows)))
    if c.data.long_prompts == "skip":
        metrics["eval/skipped_long_prompts"] = float(skipped)
    if log is not None and any(k > 1 for k in c.eval.eval_k) and not binary_scores(results):
        log(graded_note(c, data, results))
    for name, values in per_fn.items():
        if values:   # every completion unscorable: counted in eval/unscorable, no mean to log
            metrics[f"eval/reward/{name}/mean"] = sum(values) / len(values)
    episodes = [k for r in results for k in r.get("tool_calls", [])]
    if episodes:   # an agent task: the share of held-out episodes that called a tool
        metrics["eval/tool_use_frac"] = sum(k > 0 for k in episodes) / len(episodes)
    record(metrics, step)
    if rows_file is not None:
        write_rows(rows_file, results)
    (kept if kept is not None else []).extend(results)
    return metrics["eval/accuracy"]


def graded_note(c: TrainConfig, data: inputs.Data, results: list[dict]) -> str:
    """Why pass@k and maj@k are left out: a score other than 0 and 1."""
    graded = next(v for r in results for v in r["scores"] if v not in (None, 0.0, 1.0))
    return (f"pass@k and maj@k left out (eval_k={list(c.eval.eval_k)}): eval/accuracy's reward, "
            f"{inputs.accuracy_text(data)}, gave scores other than 0 and 1 (such as {graded:g}), "
            "and they count a completion right only when its score is 1; pass@1 is its mean")


def evaluate_held_out(c: TrainConfig, sampler: Sampler, tokenizer, data: inputs.Data,
                      log: Callable[[str], None], rows_file: str | Path | None = None
                      ) -> tuple[dict, list[dict]]:
    """One whole evaluation, its progress shown (`grpo eval`'s and grpo.train.evaluate's): the
    metrics and the per-row results."""
    records: list[dict] = []
    rows: list[dict] = []
    with progress(len(data.eval_rows), log) as bar:
        evaluate(c, sampler, tokenizer, data, lambda m, step: records.append(m), step=0,
                 on_batch=lambda done, accuracy: bar.update(done, f"pass@1 {accuracy:.3f}"),
                 rows_file=rows_file, log=log, kept=rows)
    return records[0], rows


def progress(total: int, log: Callable[[str], None]) -> Progress:
    """The progress of an evaluation of `total` prompts: a line about every tenth of them (a
    sampling call can hold one prompt: a line each would flood a log), and one at the end."""
    return Progress("eval", total, log, every=max(1, round(total / PROGRESS_LINES)))


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


# ---------------------------------------------------------------- where results go


def beside(thing: Path, what: str) -> Path:
    """THING-what.jsonl next to a local file or directory (its data suffixes dropped), else in the
    working directory under the last part of its name."""
    name = thing.name
    for suffix in (".gz", ".bz2", ".xz", ".zst", ".jsonl", ".json", ".parquet", ".csv"):
        name = name.removesuffix(suffix)
    where = thing.parent if thing.exists() else Path(".")
    return where / f"{name or 'model'}-{what}.jsonl"


def say_replacing(path: Path, log: Callable[[str], None] = to_stderr) -> None:
    """Nothing is overwritten unsaid."""
    if path.exists():
        log(f"replacing {path} (written earlier)")
