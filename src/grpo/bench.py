"""`grpo bench`: a few GRPO steps of one configuration, measured, printed as one JSON line.

    sec_per_step       median wall time of the steps after the first (the first pays warm-up)
    tokens_per_s       completion tokens sampled per second, median over the same steps
    peak_rss_mb        peak resident memory of this process
    model_flops_per_s  estimated model FLOPs per second: 2*params per token for each forward
                       (sampling, pi_old when mu > 1, the reference when beta > 0) and 6*params per
                       token for each of the mu forward+backward passes, over prompt+completion tokens
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from dataclasses import replace as dc_replace

from grpo.config import TrainConfig


def flops_per_step(params: int, tokens: float, num_iterations: int, beta: float) -> float:
    forwards = 1 + (1 if num_iterations > 1 else 0) + (1 if beta > 0 else 0)
    return 2 * params * tokens * forwards + 6 * params * tokens * num_iterations


def summarize(history: list[dict], params: int, num_iterations: int, beta: float) -> dict:
    steps = [m for m in history if "time/step_s" in m]
    timed = steps[1:] if len(steps) > 1 else steps
    sec = statistics.median(m["time/step_s"] for m in timed)
    tokens_per_s = statistics.median(m["tokens/completion"] / m["time/step_s"] for m in timed)
    flops = statistics.median(
        flops_per_step(params, m["tokens/prompt"] + m["tokens/completion"], num_iterations, beta)
        / m["time/step_s"] for m in timed)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return {"sec_per_step": round(sec, 4), "tokens_per_s": round(tokens_per_s, 1),
            "peak_rss_mb": round(peak_kb / 1024, 1), "model_flops_per_s": float(f"{flops:.4g}"),
            "steps": len(steps), "params": params}


def bench(config: TrainConfig) -> dict:
    """Run `steps` steps with no cold start, evaluation or files; return the measured figures."""
    from grpo.train import train

    config = dc_replace(config, run=dc_replace(config.run, sft_steps=0, eval_every=0))
    result = train(config, log=lambda line: print(line, file=sys.stderr), write_files=False)
    params = sum(p.numel() for p in result.policy.parameters())
    out = summarize(result.history, params, config.optim.num_iterations, config.loss.beta)
    out["config"] = {k: v for k, v in config.flat().items()
                     if k in ("model", "task", "prompts_per_step", "group_size", "max_new_tokens",
                              "beta", "num_iterations", "micro_batch_size")}
    return out


def main(config: TrainConfig) -> None:
    print(json.dumps(bench(config)))
