"""The vision demo's figures for the README, from a finished `grpo train task=shapes` run:

    python benchmarks/plot_vision_demo.py RUN_DIR [--out docs/vision_demo.png]

Left: reward per step and held-out accuracy at each evaluation. Right: the first eight held-out
pictures (drawn again from the task's held-out seed), each with its true count and the greedy
answers at GRPO step 0 (after the cold start) and at the last evaluation, read from RUN_DIR/eval/.
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="docs/vision_demo.png")
    ap.add_argument("--pictures", type=int, default=8)
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grpo.data.tasks.shapes import ShapesTask

    run = Path(args.run_dir)
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    rewards = [(m["step"], m["reward/mean"]) for m in metrics if "reward/mean" in m]
    evals = [(m["step"], m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    steps = sorted(int(p.stem.split("-")[1]) for p in (run / "eval").glob("step-*.jsonl"))
    before = [json.loads(line) for line in open(run / "eval" / f"step-{steps[0]}.jsonl")]
    after = [json.loads(line) for line in open(run / "eval" / f"step-{steps[-1]}.jsonl")]
    rows = ShapesTask().eval_rows()

    n = args.pictures
    figure = plt.figure(figsize=(12, 4.9))
    grid = figure.add_gridspec(2, 2 + n // 2, width_ratios=[3, 0.3] + [1] * (n // 2))
    curve = figure.add_subplot(grid[:, 0])
    curve.plot(*zip(*rewards), color="#999", lw=0.8, label="reward (sampled, T=1)")
    curve.plot(*zip(*evals), color="#c33", lw=2, marker="o", ms=3, label="held-out accuracy (greedy)")
    curve.set_xlabel("GRPO step")
    curve.set_ylim(0, 1.02)
    curve.axhline(0.25, color="#bbb", ls=":", lw=1)
    curve.legend(loc="lower right", fontsize=8)
    curve.set_title(f"held-out accuracy {evals[0][1]:.2f} -> {evals[-1][1]:.2f}", fontsize=10)
    for i in range(n):
        axis = figure.add_subplot(grid[i // (n // 2), 2 + i % (n // 2)])
        axis.imshow(rows[before[i]["row"]]["images"][0], interpolation="nearest")
        axis.set_xticks([])
        axis.set_yticks([])
        axis.set_title(f"true {before[i]['answer']}\nstep {steps[0]}: {before[i]['answers'][0]}  "
                       f"step {steps[-1]}: {after[i]['answers'][0]}", fontsize=7)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
