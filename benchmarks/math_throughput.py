"""Verified math answers per second through `math_accuracy` (worker processes with deadlines).

    python benchmarks/math_throughput.py [--kind gsm8k|competition] [--n 512] [--repeats 5]
    python benchmarks/math_throughput.py --kind adversarial [--sizes 10000,100000,1000000]
                                         [--n 16] [--repeats 3]

`gsm8k`: sums with `#### n` golds, half right, in three answer forms. `competition`: the MATH-style
worked solutions of tests/data/math.jsonl (a fraction, an interval, a text answer, a matrix),
answered right and wrong in turn. Prints one JSON line: the median answers per second over the
repeats (the pool's start-up is paid once, before the timed repeats), with the fastest and slowest
repeat.

`adversarial`: completions of each size (characters) in several shapes built to make reading the
answer or verifying it slow (`\\boxed{` floods, newlines, nested braces, long digit strings, a
mix), and a worked solution padded with prose for comparison. Prints a table: the median time per
answer at each size, the cause counted for the shape (rewards/faults.py), and the ratio of the
times per 10x of size: about 10 when the time grows linearly with the length, 100 when it grows
with its square.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from timing import per_second

from grpo.rewards import faults, math_accuracy
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


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _ending(tail: str, text: str) -> str:
    return text[:len(text) - len(tail)] + tail


# shape -> a completion of `size` characters (the `k`-th of a batch differs a little from the rest)
SHAPES = {
    "boxed flood": lambda size, k: _fill("\\boxed{", size - 1) + str(k % 10),
    "newlines": lambda size, k: str(k % 10) + "\n" * (size - 1),
    "nested braces": lambda size, k: ("\\boxed{" + "{" * ((size - 9) // 2) + str(k % 10)
                                      + "}" * ((size - 9) // 2) + "}").ljust(size),
    "digits": lambda size, k: str(k % 10) + "7" * (size - 1),
    "mixed": lambda size, k: _ending("\n\\boxed{9^{9^{9}}}", _fill(
        "\\boxed{{{9^{9^{" + str(k % 10) + "\n\n<answer>((the answer is 12, 34", size)),
    "worked solution": lambda size, k: _ending(f" so \\boxed{{{40 + k % 3}}}.",
                                               _fill("We add the numbers one by one.", size)),
}


def adversarial(sizes: list[int], n: int, repeats: int) -> None:
    import statistics
    import time
    verifier_pool()                      # start the workers outside the timing
    math_accuracy(["q"], ["\\boxed{1}"], answer=["1"])
    head = f"{'shape':<16} {'cause counted':<18}" + "".join(f"{_size(s):>11}" for s in sizes)
    print(f"math_accuracy on adversarial completions: time per answer, median of {repeats} "
          f"repeat(s) of {n} answers, {MATH_WORKERS} workers")
    print(head + "   x per 10x")
    for shape, make in SHAPES.items():
        per_answer, causes = [], set()
        math_accuracy(["q"] * n, [make(sizes[0], k) for k in range(n)], answer=["42"] * n)
        for size in sizes:                  # (the line above warms the workers' caches, untimed)
            completions = [make(size, k) for k in range(n)]
            assert all(len(c) == size for c in completions), shape
            times = []
            with faults.counting() as counts:
                for _ in range(repeats):
                    start = time.perf_counter()
                    scores = math_accuracy(["q"] * n, completions, answer=["42"] * n)
                    times.append((time.perf_counter() - start) / n)
            assert all(isinstance(x, float) for x in scores), (shape, size, scores)
            causes.update(name.rsplit("/", 1)[1] for name in counts.metrics())
            per_answer.append(statistics.median(times))
        # the growth of the time over a 10x growth of the size, between each two sizes
        ratios = [(later / earlier) ** (1 / math.log10(b / a))
                  for a, b, earlier, later in zip(sizes, sizes[1:], per_answer, per_answer[1:])]
        print(f"{shape:<16} {', '.join(sorted(causes)) or 'none (verified)':<18}"
              + "".join(f"{_ms(t):>11}" for t in per_answer)
              + "   " + ", ".join(f"{r:.1f}" for r in ratios))
    print("A time that grows linearly with the length gives about 10 per 10x of size; one that "
          "grows with its square, 100.")


def _size(chars: int) -> str:
    return f"{chars / 1e6:g} MB" if chars >= 10 ** 6 else f"{chars / 1e3:g} KB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=None, help="answers per repeat (512; 16 adversarial)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (5; 3 adversarial)")
    parser.add_argument("--kind", choices=["gsm8k", "competition", "adversarial"], default="gsm8k")
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="adversarial: completion lengths in characters, comma-separated")
    args = parser.parse_args()
    if args.kind == "adversarial":
        adversarial([int(s) for s in args.sizes.split(",")], args.n or 16, args.repeats or 3)
        return
    args.n, args.repeats = args.n or 512, args.repeats or 5
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
