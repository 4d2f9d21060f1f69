"""Held-out accuracy and entropy of every preset on the built-in demo task after the same number
of steps, over several seeds.

    python benchmarks/compare_presets.py [--jobs 2] [--seeds 0,1,2] [--variant LABEL=NAME:k=v,k=v ...]
                                         [key=value ...]

Runs `grpo train algorithm=NAME seed=S output_dir=runs/presets/NAME-S threads=1 ...` for each
preset and seed (the demo's defaults otherwise), `--jobs` at a time, and prints a Markdown table
read from each run's metrics.jsonl: per preset, the held-out accuracy at step 0 and at the last
step, and the entropy of the last step (the mean next-token entropy over its completion tokens),
each as the mean over seeds with every seed's value after it. A `--variant` is one more row: the
preset NAME with the keys after the colon (`runs/presets/LABEL-S`).
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

RUNS = Path("runs/presets")


def run(name: str, seed: int, extra: list[str], variants: dict) -> tuple[tuple[str, int], float]:
    start = time.perf_counter()
    out = RUNS / f"{name}-{seed}"
    shutil.rmtree(out, ignore_errors=True)   # a fresh run each time (train refuses a used directory)
    algorithm, keys = variants.get(name, (name, []))
    cmd = [sys.executable, "-m", "grpo.commands.cli", "train", f"algorithm={algorithm}", f"seed={seed}",
           f"output_dir={out}", "threads=1", *keys, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return (name, seed), time.perf_counter() - start


def _cell(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def table(seeds: list[int], seconds: dict, variants: dict) -> str:
    lines = ["| preset | eval/accuracy at step 0 | at the last step | entropy at the last step | "
             "steps | wall s per run |", "|---|---|---|---|---|---|"]
    for name in [*ALGORITHMS, *variants]:
        first, last, entropy, steps = [], [], [], 0
        for seed in seeds:
            path = RUNS / f"{name}-{seed}" / "metrics.jsonl"
            if not path.is_file():
                continue
            metrics = [json.loads(x) for x in path.read_text().splitlines()]
            evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
            train = [m for m in metrics if "entropy" in m]
            first.append(evals[0])
            last.append(evals[-1])
            entropy.append(train[-1]["entropy"])
            steps = train[-1]["step"]
        if not first:
            continue
        wall = [s for (n, _), s in seconds.items() if n == name]
        lines.append(f"| {name} | {_cell(first)} | {_cell(last)} | {_cell(entropy)} | {steps} | "
                     f"{sum(wall) / len(wall):.0f} |" if wall else
                     f"| {name} | {_cell(first)} | {_cell(last)} | {_cell(entropy)} | {steps} | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--presets", default="", help="comma-separated; default every preset")
    parser.add_argument("--table-only", action="store_true", help="only read runs/presets/*")
    parser.add_argument("--variant", action="append", default=[],
                        help="LABEL=NAME:key=value,key=value: the preset NAME with those keys, as a row")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = {}
    for v in args.variant:
        label, _, rest = v.partition("=")
        name, _, keys = rest.partition(":")
        if name not in ALGORITHMS:
            raise SystemExit(f"--variant {v}: {name!r} is not a preset ({', '.join(ALGORITHMS)})")
        if label in ALGORITHMS:   # its runs would overwrite the preset's own
            raise SystemExit(f"--variant {v}: the label {label!r} is a preset's name; choose another")
        variants[label] = (name, [k for k in keys.split(",") if k])
    names = (args.presets.split(",") if args.presets else list(ALGORITHMS)) + list(variants)
    seconds: dict = {}
    if not args.table_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            seconds = dict(pool.map(lambda job: run(job[0], job[1], args.overrides, variants),
                                    [(n, s) for n in names for s in seeds]))
    print(table(seeds, seconds, variants))


if __name__ == "__main__":
    main()
