"""Sandboxed programs per second through `code_tests`, on benchmark-format rows.

    python benchmarks/code_throughput.py [--format FORMAT|all] [--n 32] [--repeats 3] [--workers 2]

FORMAT is one of humaneval, mbpp, stdio (APPS stdin/stdout), apps_calls (APPS call-based),
codecontests, livecodebench (its functional and stdin rows). The rows are the hand-written rows of
tests/data/code/, cycled; every other completion is the right program and the rest a wrong one,
each in a fresh sandbox (see docs/sandbox.md). Prints one JSON line per format with the median
programs per second over the repeats and the milliseconds per program that median means.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from timing import per_second

from grpo.rewards.code import CodeTests
from grpo.sandbox.isolate import isolation_level

ROWS = Path(__file__).resolve().parent.parent / "tests" / "data" / "code"


FORMATS = ["humaneval", "mbpp", "stdio", "apps_calls", "codecontests", "livecodebench"]
LIVECODEBENCH_RIGHT = ["class Solution:\n    def countEvens(self, nums):\n        return sum(n % 2 == 0 for n in nums)",
                       "import sys\nn, *xs = map(int, sys.stdin.read().split())\nxs.sort()\nprint(xs[-1] + xs[-2])"]


def workload(fmt: str, n: int) -> tuple[list[str], list[str], dict[str, list]]:
    """(prompts, completions, columns) for n programs in the given format."""
    name = {"stdio": "apps", "apps_calls": "apps"}.get(fmt, fmt)
    rows = [json.loads(line) for line in (ROWS / f"{name}.jsonl").read_text().splitlines()]
    if fmt in ("stdio", "apps_calls"):
        rows = [r for r in rows if ("fn_name" in r["input_output"]) == (fmt == "apps_calls")]
    prompts, completions, picked = [], [], []
    for k in range(n):
        index = (k // 2) % len(rows)
        row = rows[index]
        if fmt == "humaneval":
            right, wrong = row["prompt"] + row["canonical_solution"], row["prompt"] + "    return None\n"
        elif fmt == "mbpp":
            right, wrong = row["code"], row["code"].replace("return", "return None #", 1)
        elif fmt in ("stdio", "apps_calls"):
            right = json.loads(row["solutions"])[0]
            wrong = right.replace("return", "return None #", 1) if fmt == "apps_calls" else "print(0)"
        elif fmt == "codecontests":
            right, wrong = row["solutions"]["solution"][0], "print(0)"
        else:
            right = LIVECODEBENCH_RIGHT[index]
            wrong = right.replace("return", "return -1 #", 1) if "return" in right else "print(0)"
        prompts.append(row.get("prompt", ""))
        completions.append(f"```python\n{right if k % 2 == 0 else wrong}\n```")
        picked.append(row)
    keys = sorted({key for row in picked for key in row})
    return prompts, completions, {key: [row.get(key) for row in picked] for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", choices=FORMATS + ["all"], default="humaneval")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    level = isolation_level()
    reward = CodeTests(workers=args.workers, unsafe_code_execution=level != "full")
    for fmt in FORMATS if args.format == "all" else [args.format]:
        prompts, completions, columns = workload(fmt, args.n)
        rate, scores = per_second(lambda: reward(prompts, completions, **columns), args.n,
                                  args.repeats)
        print(json.dumps({"code_programs_per_s_median": rate["median"], "min": rate["min"],
                          "max": rate["max"], "ms_per_program": round(1000 / rate["median"], 1),
                          "format": fmt, "n": args.n, "repeats": args.repeats,
                          "workers": args.workers, "isolation": level,
                          "passed": sum(s == 1.0 for s in scores)}), flush=True)


if __name__ == "__main__":
    main()
