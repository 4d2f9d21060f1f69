"""The asynchronous pipeline on one CUDA GPU: one command, needing only torch, transformers and
this package (no vLLM, no download).

    python benchmarks/async_gpu_check.py            # a Qwen2.5-0.5B-shaped model, ~3-4 min on an H200
    python benchmarks/async_gpu_check.py --smoke    # tiny shapes: checks the script (CPU too)

With async_steps the groups are sampled by an engine client, a thread of the trainer (no fork,
so a CUDA context is fine); with sampler=hf and rollout_workers=0 it samples with grpo's own
sampler on a copy of the policy, on a CUDA stream of its own. For a random Qwen2.5-0.5B-shaped
model (mixed_precision=bf16, 8 prompts x 8 completions of up to `--tokens` new tokens) it runs:

    sync        async_steps=0 (decode=auto: on CUDA, the static cache with CUDA graphs)
    sync_decode_eager  the same with decode=eager: the step before the static cache
    async       async_steps=1 rollout_workers=0, twice: do the two runs repeat each other?
    fsdp        the same under torchrun (one process) with parallel=fsdp: FSDP2 and the client
    resume      (tiny shape) async_steps=1 killed with SIGKILL in its 4th sampling, resumed with
                resume=auto: metrics.jsonl and final weights against an unbroken run

and reports the median step time of each, the trainer's idle fraction (its wait for groups over
the step time), the staleness, and the differences. One JSON file goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import SHAPES, SMOKE, build   # noqa: E402

CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")


def distinct(prompts, completions, **columns):
    """Varies between a random model's completions, so advantages and updates are not 0."""
    return [len(set(c[:200])) / 100 for c in completions]


def rows() -> list[dict]:
    return [{"prompt": f"Say something about {i}.", "answer": "x"} for i in range(64)]


def keys(model_dir: str, args, **more) -> dict:
    return {"model": model_dir, "dtype": "float32", "mixed_precision": "bf16",
            "gradient_checkpointing": True, "prompts_per_step": args.prompts,
            "group_size": args.group, "max_new_tokens": args.tokens, "steps": args.steps,
            "sft_steps": 0, "eval_every": 0, "save_every": 0, "beta": 0.04, "lr": 1e-6,
            "report_to": [], **more}


def train_with(config_keys: dict, write_files: bool = False):
    from grpo.config import build_config
    from grpo.train import train
    return train(build_config(config_keys), dataset=rows(), reward_fns=[distinct],
                 log=lambda line: print(f"    {line}", file=sys.stderr), write_files=write_files)


def exact(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(CLOCKS)} for row in history]


def max_difference(a: list[dict], b: list[dict]) -> float:
    """The largest |difference| over the metrics two runs share (inf when their steps differ)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(exact(a), exact(b)):
        for k in x.keys() & y.keys():
            if isinstance(x[k], (int, float)) and isinstance(y[k], (int, float)):
                worst = max(worst, abs(x[k] - y[k]))
    return worst


def weights_difference(p, q) -> float:
    a, b = p.state_dict(), q.state_dict()
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def summary(result) -> dict:
    steps = [m for m in result.history if "time/step_s" in m]
    timed = steps[1:] if len(steps) > 1 else steps      # the first step pays the warm-up
    step_s = [m["time/step_s"] for m in timed]
    wait = sum(m.get("pipeline/trainer_wait_s", 0.0) for m in timed)
    out = {"steps": len(steps), "sec_per_step": round(statistics.median(step_s), 3),
           "sample_s": round(statistics.median(m["time/sample_s"] for m in timed), 3),
           "update_s": round(statistics.median(m["time/update_s"] for m in timed), 3),
           "completion_len_mean": round(statistics.mean(m["completion/len_mean"] for m in timed), 1)}
    if any("pipeline/staleness_max" in m for m in steps):
        out["staleness_max"] = [m["pipeline/staleness_max"] for m in steps]
        out["trainer_idle_fraction"] = round(wait / sum(step_s), 3)
    if torch.cuda.is_available():
        out["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    return out


def child(args) -> None:
    """One run in a process of its own (under torchrun for fsdp; killed and resumed for resume)."""
    config_keys = json.loads(args.child)
    result = train_with(config_keys, write_files=True)
    if int(os.environ.get("RANK", "0")) == 0 and args.child_out:
        Path(args.child_out).write_text(json.dumps(exact(result.history)))


def run_child(config_keys: dict, out: Path | None, work: Path, torchrun: bool = False,
              env: dict | None = None) -> int:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
               "--master-port", "29533"] if torchrun else [sys.executable]
    command += [str(Path(__file__).resolve()), "--child", json.dumps(config_keys)] + (["--child-out", str(out)] if out else [])
    done = subprocess.run(command, cwd=work, env={**os.environ, **(env or {})})
    return done.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and lengths (runs on a CPU)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    name, shape = next(iter((SMOKE if args.smoke else {"qwen2.5-0.5b": SHAPES["qwen2.5-0.5b"]}).items()))
    vocab = 512 if args.smoke else 151936
    args.tokens, args.prompts, args.group = (16, 2, 4) if args.smoke else (128, 8, 8)
    args.steps = 3 if args.smoke else 6
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "shape": name, "new_tokens": args.tokens,
              "prompts_x_group": [args.prompts, args.group], "steps": args.steps, "runs": {}}
    say = lambda what: print(f"== {what}", file=sys.stderr, flush=True)   # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = str(build(shape, vocab, work / name))
        runs = report["runs"]
        say("sync")
        sync = train_with(keys(model_dir, args, async_steps=0, output_dir=str(work / "sync")))
        runs["sync"] = summary(sync)
        say("sync, decode=eager (the sampler before its static cache)")
        before = train_with(keys(model_dir, args, async_steps=0, decode="eager",
                                 output_dir=str(work / "sync_eager")))
        runs["sync_decode_eager"] = summary(before)
        report["sync_over_decode_eager_step_time"] = round(
            runs["sync"]["sec_per_step"] / runs["sync_decode_eager"]["sec_per_step"], 3)
        del before
        say("async, twice")
        a1 = train_with(keys(model_dir, args, async_steps=1, rollout_workers=0, output_dir=str(work / "a1")))
        runs["async"] = summary(a1)
        a2 = train_with(keys(model_dir, args, async_steps=1, rollout_workers=0, output_dir=str(work / "a2")))
        runs["async_again"] = summary(a2)
        report["async_repeats"] = {"metrics_equal": exact(a1.history) == exact(a2.history),
                                   "metrics_max_abs_diff": max_difference(a1.history, a2.history),
                                   "weights_max_abs_diff": weights_difference(a1.policy, a2.policy)}
        report["async_over_sync_step_time"] = round(runs["async"]["sec_per_step"]
                                                    / runs["sync"]["sec_per_step"], 3)
        del sync, a2
        say("fsdp under torchrun")
        fsdp_out = work / "fsdp.json"
        code = run_child(keys(model_dir, args, async_steps=1, rollout_workers=0, parallel="fsdp",
                              output_dir=str(work / "fsdp")), fsdp_out, work, torchrun=True)
        fsdp = json.loads(fsdp_out.read_text()) if code == 0 and fsdp_out.exists() else None
        report["fsdp"] = {"exit": code, "steps": len(fsdp) if fsdp else 0,
                          "metrics_max_abs_diff_vs_async": max_difference(fsdp, exact(a1.history))
                          if fsdp else None,
                          "staleness_max": [m.get("pipeline/staleness_max") for m in fsdp] if fsdp else None}
        del a1
        say("resume after SIGKILL (tiny shape)")
        tiny = str(build(SMOKE["smoke"], 512, work / "tiny"))
        small = argparse.Namespace(tokens=16, prompts=2, group=4, steps=5)
        base = keys(tiny, small, async_steps=1, rollout_workers=0, save_every=1)
        whole_out, resumed_out = work / "whole.json", work / "resumed.json"
        codes = [run_child({**base, "output_dir": str(work / "whole")}, whole_out, work),
                 run_child({**base, "output_dir": str(work / "killed")}, None, work,
                           env={"GRPO_FAULT_KILL_AT": "rollout:4"}),
                 run_child({**base, "output_dir": str(work / "killed"), "resume": "auto"},
                           resumed_out, work)]
        same = None
        if codes[0] == 0 and codes[2] == 0:
            from safetensors.torch import load_file
            metrics = lambda d: [{k: v for k, v in json.loads(line).items() if not k.startswith(CLOCKS)}   # noqa: E731
                                 for line in (work / d / "metrics.jsonl").read_text().splitlines()]
            w1, w2 = (load_file(work / d / "final" / "model.safetensors") for d in ("whole", "killed"))
            same = {"metrics_equal": metrics("whole") == metrics("killed"),
                    "weights_max_abs_diff": max(float((w1[k] - w2[k]).abs().max()) for k in w1)}
        report["resume"] = {"exits": codes, "killed_exit_is_sigkill": codes[1] == -9, **(same or {})}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"async_gpu_check{'-smoke' if args.smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    print(path)


if __name__ == "__main__":
    main()
