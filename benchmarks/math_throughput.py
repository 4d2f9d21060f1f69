"""Verified math answers per second through `math_accuracy` (worker processes with deadlines).

    python benchmarks/math_throughput.py [--kind gsm8k|competition] [--n 512] [--repeats 5]

`gsm8k`: sums with `#### n` golds, half right, in three answer forms. `competition`: the MATH-style
worked solutions of tests/data/math.jsonl (a fraction, an interval, a text answer, a matrix),
answered right and wrong in turn.

Prints one JSON line: the median answers per second over the repeats (the pool's start-up is paid
once, before the timed repeats), with the fastest and slowest repeat.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from timing import per_second

from grpo.rewards import math_accuracy
from grpo.rewards.answers import MATH_WORKERS, verifier_pool


def gsm8k(n: int) -> tuple[list[str], list[str]]:
    rng = random.Random(0)
    golds, completions = [], []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        golds.append(f"#### {a + b}")
        answer = a + b if rng.random() < 0.5 else a + b + 1
        completions.append(rng.choice([f"so \\boxed{{{answer}}}", f"The answer is {answer}.",
                                       f"\\boxed{{\\frac{{{2 * answer}}}{{2}}}}"]))
    return golds, completions


COMPETITION = [("\\boxed{\\frac{10}{12}}", "\\boxed{\\frac{5}{7}}"),
               ("\\boxed{(2, 3)}", "\\boxed{[2, 3]}"),
               ("The answer is Monday.", "\\boxed{\\text{Sunday}}"),
               ("\\boxed{\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}}",
                "\\boxed{\\begin{pmatrix}2&0\\\\0&1\\end{pmatrix}}")]


def competition(n: int) -> tuple[list[str], list[str]]:
    path = Path(__file__).resolve().parent.parent / "tests" / "data" / "math.jsonl"
    solutions = [json.loads(line)["solution"] for line in path.read_text().splitlines()]
    golds, completions = [], []
    for k in range(n):
        golds.append(solutions[k % len(solutions)])
        completions.append(COMPETITION[k % len(solutions)][(k // len(solutions)) % 2])
    return golds, completions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kind", choices=["gsm8k", "competition"], default="gsm8k")
    args = parser.parse_args()
    golds, completions = (gsm8k if args.kind == "gsm8k" else competition)(args.n)
    verifier_pool()                      # start the workers outside the timing
    math_accuracy(["q"], ["\\boxed{1}"], answer=["1"])
    rate, scores = per_second(lambda: math_accuracy(["q"] * args.n, completions, answer=golds),
                              args.n, args.repeats)
    print(json.dumps({"math_answers_per_s_median": rate["median"], "min": rate["min"],
                      "max": rate["max"], "n": args.n, "repeats": args.repeats,
                      "workers": MATH_WORKERS, "kind": args.kind, "scored_correct": sum(s == 1.0 for s in scores)}))

if __name__ == "__main__":
    main()
