"""A 30-step run at the Qwen2.5-0.5B shape on one CUDA GPU, killed with SIGKILL and resumed.

    python benchmarks/gpu_resume.py             # on a CUDA GPU: 3 commands of at most 150 s each
    python benchmarks/gpu_resume.py --smoke     # a tiny shape, 6 steps: checks the script (CPU too)

Three `grpo train` commands, as a user runs them, on a random Qwen2.5-0.5B-shaped model (gpu_check.
build), float32 weights with bfloat16 autocast (mixed_precision=bf16), activation checkpointing,
8 prompts x 8 completions of up to 64 new tokens, a checkpoint every 10 steps (the last kept):

    whole       30 steps, unbroken
    killed      the same in another directory, SIGKILLed once metrics.jsonl holds 15 steps (past
                the checkpoint of step 10)
    resumed     the same command with resume=auto: from step 10's checkpoint to step 30

and reports: each command's exit status (the kill's is -9), the files each run directory holds
(metrics.jsonl, checkpoints, final/, report.html), whether metrics.jsonl of the resumed run equals
the unbroken run's (every metric but clocks), the first step where they differ and by how much,
and the largest difference between the two final weights. If the runs differ before the step
resumed from, the GPU did not repeat itself (its kernels' order of summation), not the resume.
One JSON file goes to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_check import REWARD, SHAPES, SMOKE, build   # noqa: E402

CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")


def command(args, model_dir: Path, data: Path, run_dir: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "grpo.commands.cli", "train", f"model={model_dir}", f"dataset={data}",
            "rewards=[gpu_check_reward:distinct]", f"steps={args.steps}", "prompts_per_step=8",
            "group_size=8", f"max_new_tokens={args.tokens}", "sft_steps=0", "eval_every=0",
            f"save_every={args.save_every}", "keep_last=1", "dtype=float32",
            f"mixed_precision={'bf16' if args.cuda else 'no'}", "gradient_checkpointing=true",
            "beta=0.04", "lr=1e-6", f"output_dir={run_dir}", *more]


RUNNING: list[subprocess.Popen] = []      # the run in flight, killed with us (on_term)


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def on_term(signum, frame) -> None:
    """Stopped from outside (gpu_all.sh's timeout): the run in flight, a session of its own that
    the timeout does not reach, goes too, so it holds no GPU after us."""
    for proc in RUNNING:
        kill(proc)
    raise SystemExit(128 + signum)


def run(cmd: list[str], log: Path, work: Path, limit_s: float, kill_at: int = 0,
        metrics: Path | None = None) -> dict:
    """Run `cmd` for at most `limit_s`; with `kill_at`, SIGKILL its process group once `metrics`
    holds that many steps."""
    started = time.perf_counter()
    with open(log, "a") as out:
        out.write("\n$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=work, start_new_session=True)
        RUNNING.append(proc)
        killed_after, stopped = None, False
        while proc.poll() is None:
            if killed_after is None and kill_at and metrics is not None and metrics.exists():
                steps = sum(1 for line in metrics.read_text().splitlines() if '"time/step_s"' in line)
                if steps >= kill_at:
                    kill(proc)
                    killed_after = steps
            if time.perf_counter() - started > limit_s:
                kill(proc)
                stopped = True
            time.sleep(0.05)
        RUNNING.remove(proc)
    return {"exit": proc.returncode, "wall_s": round(time.perf_counter() - started, 1),
            **({"killed_after_steps": killed_after} if kill_at else {}),
            **({"stopped": f"not done in {limit_s:.0f} s"} if stopped else {})}


def metrics_of(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(CLOCKS)} for r in rows]


def compare(a: list[dict], b: list[dict]) -> dict:
    """Equal or not; the first step that differs, and the largest |difference| there and after."""
    first, worst = None, 0.0
    for x, y in zip(a, b):
        if x != y and first is None:
            first = x.get("step")
        for k in x.keys() & y.keys():
            if isinstance(x[k], (int, float)) and isinstance(y[k], (int, float)):
                worst = max(worst, abs(x[k] - y[k]))
    return {"metrics_equal": a == b, "steps": [len(a), len(b)], "first_differing_step": first,
            "max_abs_diff": worst}


def files(run_dir: Path) -> dict:
    return {"metrics": (run_dir / "metrics.jsonl").exists(),
            "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").glob("*"))
            if (run_dir / "checkpoints").exists() else [],
            "final": (run_dir / "final" / "model.safetensors").exists(),
            "report": (run_dir / "report.html").exists()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape, 6 steps (runs on a CPU)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    args.cuda = torch.cuda.is_available()
    if not args.cuda and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    name, shape = next(iter((SMOKE if args.smoke else {"qwen2.5-0.5b": SHAPES["qwen2.5-0.5b"]}).items()))
    args.steps, args.save_every, kill_at = (6, 2, 3) if args.smoke else (30, 10, 15)
    args.tokens = 16 if args.smoke else 64
    limit = 240 if args.smoke else 150          # per command
    signal.signal(signal.SIGTERM, on_term)
    report = {"device": torch.cuda.get_device_name() if args.cuda else "cpu", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "shape": name, "steps": args.steps,
              "save_every": args.save_every, "kill_at_steps": kill_at, "new_tokens": args.tokens}
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"gpu_resume{'-smoke' if args.smoke else ''}-runs.log"
    path = out / f"gpu_resume{'-smoke' if args.smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    save = lambda: path.write_text(json.dumps(report, indent=1) + "\n")   # noqa: E731  after each run
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "gpu_check_reward.py").write_text(REWARD)
        model_dir = build(shape, 512 if args.smoke else 151936, work / name)
        data = work / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"Say something about {i}.", "answer": "x"}) + "\n"
                                for i in range(64)))
        whole, killed = work / "whole", work / "killed"
        report["free_disk_gb"] = round(shutil.disk_usage(work).free / 1e9, 1)
        report["whole"] = run(command(args, model_dir, data, whole), log, work, limit)
        save()
        report["killed"] = run(command(args, model_dir, data, killed), log, work, limit, kill_at,
                               killed / "metrics.jsonl")
        save()
        report["resumed"] = run(command(args, model_dir, data, killed, "resume=auto"), log, work, limit)
        save()
        report["files"] = {"whole": files(whole), "resumed": files(killed)}
        if report["whole"]["exit"] == 0 and report["resumed"]["exit"] == 0:
            report["resume"] = compare(metrics_of(whole), metrics_of(killed))
            from safetensors.torch import load_file
            w1, w2 = (load_file(d / "final" / "model.safetensors") for d in (whole, killed))
            report["resume"]["weights_max_abs_diff"] = max(float((w1[k].float() - w2[k].float()).abs().max())
                                                           for k in w1)
    save()
    print(json.dumps(report, indent=1), file=sys.stderr)
    print(path)


if __name__ == "__main__":
    main()
