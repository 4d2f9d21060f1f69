"""Verified math answers per second through `math_accuracy` (worker processes with deadlines).

    python benchmarks/math_throughput.py [--n 512] [--repeats 5]

Prints one JSON line: the median answers per second over the repeats (the pool's start-up is paid
once, before the timed repeats), with the fastest and slowest repeat.
"""

from __future__ import annotations

import argparse
import json
import random

from timing import per_second

from grpo.rewards import math_accuracy
from grpo.rewards.answers import MATH_WORKERS, verifier_pool


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    golds, completions = [], []
    for _ in range(args.n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        golds.append(f"#### {a + b}")
        answer = a + b if rng.random() < 0.5 else a + b + 1
        completions.append(rng.choice([f"so \\boxed{{{answer}}}", f"The answer is {answer}.",
                                       f"\\boxed{{\\frac{{{2 * answer}}}{{2}}}}"]))
    verifier_pool()                      # start the workers outside the timing
    math_accuracy(["q"], ["\\boxed{1}"], answer=["1"])
    rate, scores = per_second(lambda: math_accuracy(["q"] * args.n, completions, answer=golds),
                              args.n, args.repeats)
    print(json.dumps({"math_answers_per_s_median": rate["median"], "min": rate["min"],
                      "max": rate["max"], "n": args.n, "repeats": args.repeats,
                      "workers": MATH_WORKERS, "scored_correct": sum(s == 1.0 for s in scores)}))

if __name__ == "__main__":
    main()
