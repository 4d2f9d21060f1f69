"""`grpo bench`: a few GRPO steps of one configuration, measured, printed as one JSON line.

    sec_per_step       median wall time of the steps after the first (the first pays warm-up)
    step_times         every step's wall time, the first included
    split_s            median seconds per step in sampling, reward, reference (pi_ref and pi_old
                       log-probs), advantage (rewards to advantages, the correction's weights and
                       the selected tokens) and update (forward, backward, optimizer)
    tokens_per_s       completion tokens sampled per second of step, median over the same steps
    peak_rss_mb        peak resident memory of this process
    model_flops_per_s  estimated model FLOPs per second: 2*params per token for each forward
                       (sampling, pi_old when mu > 1, the reference when beta > 0) and 6*params per
                       token for each of the mu forward+backward passes, over the tokens computed:
                       each completion's, and each prompt's once (a group of G shares its prompt's
                       pass; `flops_per_step`)
    matmul_peak_flops  this machine's matrix-multiply rate, measured now (`matmul_peak`): float32
                       on a CPU; on a CUDA GPU (where the run trains) bfloat16, its tensor cores' rate
    peak_fraction      model_flops_per_s / matmul_peak_flops
    peak_gpu_memory_mb on a CUDA GPU: the most memory its tensors held there during the run
                       (peak_gpu_reserved_mb: the most torch's allocator reserved)
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import replace as dc_replace

import torch

from grpo.run.progress import to_stderr
from grpo.config import ConfigError, TrainConfig

SPLIT = ("sample", "reward", "reference", "advantage", "update")


def flops_per_step(params: int, tokens: float, num_iterations: int, beta: float) -> float:
    """Model FLOPs of one GRPO step over `tokens` tokens: 2 * params per token for each forward
    (sampling, pi_old when mu > 1, the reference when beta > 0), 6 * params for each of the mu
    forward+backward passes. Attention's own products are left out (small at these lengths)."""
    forwards = 1 + (1 if num_iterations > 1 else 0) + (1 if beta > 0 else 0)
    return 2 * params * tokens * forwards + 6 * params * tokens * num_iterations


def matmul_peak(size: int = 2048, repeats: int = 7, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> float:
    """Median FLOP/s of a [size x size] @ [size x size] product of `dtype` on `device` (on a CPU,
    with torch's threads), on random data."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    a @ b  # warm-up
    rates = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        rates.append(2 * size ** 3 / (time.perf_counter() - start))
    return statistics.median(rates)


def peak_rss_kb() -> float:
    """This process's peak resident memory in KiB: VmHWM from /proc (ru_maxrss on Linux also
    counts the memory of the process that started this one, up to its exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def summarize(history: list[dict], params: int, num_iterations: int, beta: float,
              group_size: int = 1) -> dict:
    """The figures of the module docstring from the step metrics. `tokens/prompt` counts each
    row's prompt; a group's prompt is counted once, divided by `group_size`. That is a lower bound
    of the work done: a pass computes a prompt once for the rows of its group it holds, and a
    group split across micro-batches (or a model off the lean path) computes it more often."""
    steps = [m for m in history if "time/step_s" in m]
    timed = steps[1:] if len(steps) > 1 else steps
    sec = statistics.median(m["time/step_s"] for m in timed)
    tokens_per_s = statistics.median(m["tokens/completion"] / m["time/step_s"] for m in timed)
    flops = statistics.median(
        flops_per_step(params, m["tokens/prompt"] / group_size + m["tokens/completion"],
                       num_iterations, beta)
        / m["time/step_s"] for m in timed)
    peak_kb = peak_rss_kb()
    return {"sec_per_step": round(sec, 4),
            "split_s": {k: round(statistics.median(m.get(f"time/{k}_s", 0.0) for m in timed), 4)
                        for k in SPLIT},
            "tokens_per_s": round(tokens_per_s, 1),
            "completion_len_mean": round(statistics.mean(m["completion/len_mean"] for m in timed), 2),
            "peak_rss_mb": round(peak_kb / 1024, 1), "model_flops_per_s": float(f"{flops:.4g}"),
            "steps": len(steps), "params": params,
            "step_times": [round(m["time/step_s"], 4) for m in steps]}


def bench(config: TrainConfig, log=to_stderr) -> dict:
    """Run `steps` steps with no cold start, evaluation or files; return the measured figures."""
    from grpo.train import train
    from grpo.update import token_budget

    if config.run.steps < 1:
        raise ConfigError("config key 'steps': grpo bench measures steps, so it needs steps=1 or "
                          "more (the first pays warm-up: the median is over the others)")
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    cuda = torch.cuda.is_available()       # the run trains there (assembly.model)
    peak = matmul_peak(8192, device="cuda", dtype=torch.bfloat16) if cuda else matmul_peak()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    config = dc_replace(config, run=dc_replace(config.run, sft_steps=0, eval_every=0))
    result = train(config, log=log, write_files=False)
    params = sum(p.numel() for p in result.policy.parameters())
    out = summarize(result.history, params, config.optim.num_iterations, config.loss.beta,
                    config.sampling.group_size)
    if cuda:     # what tensors held at most, and what torch's allocator reserved for them
        out["peak_gpu_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
        out["peak_gpu_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2 ** 20, 1)
    out["matmul_peak_flops"] = float(f"{peak:.4g}")
    out["matmul_dtype"] = "bfloat16" if cuda else "float32"
    out["peak_fraction"] = round(out["model_flops_per_s"] / peak, 3)
    out["threads"] = torch.get_num_threads()
    out["config"] = {k: v for k, v in config.flat().items()
                     if k in ("model", "task", "dataset", "prompts_per_step", "group_size",
                              "max_new_tokens", "beta", "num_iterations", "micro_batch_size", "lr",
                              "dtype", "mixed_precision", "gradient_checkpointing", "decode",
                              "packing", "loss_type", "temperature")}
    out["config"]["micro_batch_tokens"] = token_budget(config.optim.micro_batch_tokens, result.policy)
    return out


def main(config: TrainConfig) -> None:
    print(json.dumps(bench(config)))
