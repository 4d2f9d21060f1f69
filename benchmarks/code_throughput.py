"""Sandboxed programs per second through `code_tests`.

    python benchmarks/code_throughput.py [--n 32] [--repeats 3] [--workers 2]

Each program defines a function and is checked by two assert tests in a fresh sandbox (see
docs/sandbox.md). Prints one JSON line with the median programs per second over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from grpo.sandbox import CodeTests, isolation_level


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
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        scores = reward(["q"] * args.n, completions, tests=tests)
        rates.append(args.n / (time.perf_counter() - start))
    print(json.dumps({"code_programs_per_s_median": round(statistics.median(rates), 1),
                      "min": round(min(rates), 1), "max": round(max(rates), 1), "n": args.n,
                      "repeats": args.repeats, "workers": args.workers, "isolation": level,
                      "passed": sum(s == 1.0 for s in scores)}))


if __name__ == "__main__":
    main()
