"""Sandboxed programs per second through `code_tests`, on benchmark-format rows.

    python benchmarks/code_throughput.py [--format humaneval|mbpp|stdio] [--n 32] [--repeats 3] [--workers 2]

The rows are the hand-written HumanEval, MBPP and APPS rows of tests/data/code/, cycled; every
other completion is the right program and the rest a wrong one, each in a fresh sandbox (see
docs/sandbox.md). Prints one JSON line with the median programs per second over the repeats.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from timing import per_second

from grpo.rewards.code import CodeTests
from grpo.rewards.sandbox import isolation_level

ROWS = Path(__file__).resolve().parent.parent / "tests" / "data" / "code"


def workload(fmt: str, n: int) -> tuple[list[str], list[str], dict[str, list]]:
    """(prompts, completions, columns) for n programs in the given format."""
    name = {"humaneval": "humaneval", "mbpp": "mbpp", "stdio": "apps"}[fmt]
    rows = [json.loads(line) for line in (ROWS / f"{name}.jsonl").read_text().splitlines()]
    if fmt == "stdio":
        rows = [r for r in rows if "fn_name" not in r["input_output"]]
    prompts, completions, picked = [], [], []
    for k in range(n):
        row = rows[k % len(rows)]
        if fmt == "humaneval":
            right, wrong = row["prompt"] + row["canonical_solution"], row["prompt"] + "    return None\n"
        elif fmt == "mbpp":
            right, wrong = row["code"], row["code"].replace("return", "return None #", 1)
        else:
            right, wrong = json.loads(row["solutions"])[0], "print(0)"
        prompts.append(row.get("prompt", ""))
        completions.append(f"```python\n{right if k % 2 == 0 else wrong}\n```")
        picked.append(row)
    keys = sorted({key for row in picked for key in row})
    return prompts, completions, {key: [row.get(key) for row in picked] for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", choices=["humaneval", "mbpp", "stdio"], default="humaneval")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    level = isolation_level()
    reward = CodeTests(workers=args.workers, unsafe_code_execution=level != "full")
    prompts, completions, columns = workload(args.format, args.n)
    rate, scores = per_second(lambda: reward(prompts, completions, **columns), args.n, args.repeats)
    print(json.dumps({"code_programs_per_s_median": rate["median"], "min": rate["min"],
                      "max": rate["max"], "format": args.format, "n": args.n,
                      "repeats": args.repeats, "workers": args.workers, "isolation": level,
                      "passed": sum(s == 1.0 for s in scores)}))


if __name__ == "__main__":
    main()
