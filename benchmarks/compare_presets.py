"""Held-out accuracy of every preset on the built-in demo task after the same number of steps.

    python benchmarks/compare_presets.py [--jobs 2] [key=value ...]

Runs `grpo train algorithm=NAME output_dir=runs/presets/NAME threads=1 ...` for each preset
(the demo's defaults otherwise), two at a time, and prints a Markdown table read from each run's
metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo.config import ALGORITHMS


def run(name: str, extra: list[str]) -> tuple[str, float]:
    start = time.perf_counter()
    out = Path("runs/presets") / name
    shutil.rmtree(out, ignore_errors=True)   # a fresh run each time (train refuses a used directory)
    cmd = [sys.executable, "-m", "grpo.cli", "train", f"algorithm={name}", f"output_dir={out}",
           "threads=1", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return name, time.perf_counter() - start


def table(seconds: dict[str, float]) -> str:
    lines = ["| preset | eval/accuracy at step 0 | best | at the last step | mean train reward, last 20 steps | steps | wall s |",
             "|---|---|---|---|---|---|---|"]
    for name in ALGORITHMS:
        path = Path("runs/presets") / name / "metrics.jsonl"
        metrics = [json.loads(x) for x in path.read_text().splitlines()]
        evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
        rewards = [m["reward/mean"] for m in metrics if "reward/mean" in m][-20:]
        wall = f"{seconds[name]:.0f}" if name in seconds else "-"
        lines.append(f"| {name} | {evals[0]:.3f} | {max(evals):.3f} | {evals[-1]:.3f} | "
                     f"{sum(rewards) / len(rewards):.3f} | {metrics[-1]['step']} | {wall} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--table-only", action="store_true", help="only read runs/presets/*")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    seconds: dict[str, float] = {}
    if not args.table_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            seconds = dict(pool.map(lambda n: run(n, args.overrides), ALGORITHMS))
    print(table(seconds))


if __name__ == "__main__":
    main()
