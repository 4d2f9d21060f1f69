"""Sandboxed programs per second through `code_tests`.

    python benchmarks/code_throughput.py [--n 32] [--repeats 3] [--workers 2]

Each program defines a function and is checked by two assert tests in a fresh sandbox (see
docs/sandbox.md). Prints one JSON line with the median programs per second over the repeats.
"""

from __future__ import annotations

import argparse
import json

from timing import per_second

from grpo.rewards.code import CodeTests
from grpo.rewards.sandbox import isolation_level


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    level = isolation_level()
    reward = CodeTests(workers=args.workers, unsafe_code_execution=level != "full")
    completions = [f"def f(x):\n    return x * {k % 3}" for k in range(args.n)]
    tests = [["assert f(2) == 4", "assert f(0) == 0"]] * args.n
    rate, scores = per_second(lambda: reward(["q"] * args.n, completions, tests=tests), args.n,
                              args.repeats)
    print(json.dumps({"code_programs_per_s_median": rate["median"], "min": rate["min"],
                      "max": rate["max"], "n": args.n, "repeats": args.repeats,
                      "workers": args.workers, "isolation": level,
                      "passed": sum(s == 1.0 for s in scores)}))

if __name__ == "__main__":
    main()
