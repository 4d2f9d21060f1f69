"""The distillation demo: a student distilled from the trained demo reaches the teacher's held-out
accuracy in fewer steps, and less time, than GRPO alone from the same start.

    grpo train                                   # the teacher: runs/demo/final (about 2 minutes)
    python benchmarks/distill_demo.py            # two seeds x (GRPO alone, distillation)

For each seed, two `grpo train` commands from the same start, the demo's own: the tiny model, a
10-step cold start, the `largest` task, held-out accuracy every 10 steps:

    grpo        the demo's GRPO (its rewards)
    distill     algorithm=distill teacher=runs/demo/final: each token's advantage is the reverse
                KL's, -(log pi - log teacher); the rewards are only logged

It prints, per run, the first evaluated step (and the seconds of training to it) at which held-out
accuracy reaches the teacher's (its last evaluation in runs/demo/metrics.jsonl), and writes the
curves to docs/distill_curves.png and the figures to benchmarks/results/distill_demo.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def curve(run: Path) -> list[tuple[int, float, float]]:
    """(step, held-out accuracy, seconds of training up to that step) at each evaluation."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out, elapsed = [], 0.0
    for m in rows:
        elapsed += m.get("time/step_s", 0.0)
        if "eval/accuracy" in m:
            out.append((m["step"], m["eval/accuracy"], round(elapsed, 1)))
    return out


def reached(points, target: float):
    return next(((step, seconds) for step, acc, seconds in points if acc >= target), (None, None))


def plot(curves: dict, target: float, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    styles = {"grpo": "-", "distill": "--"}
    for (seed, kind), points in sorted(curves.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], styles[kind], marker="o", markersize=3,
                label=f"{'GRPO alone' if kind == 'grpo' else 'distilled from the demo'}, seed {seed}")
    ax.axhline(target, color="grey", lw=0.8, ls=":", label=f"teacher {target:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="runs/demo", help="the trained demo's run directory")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="runs/distill-demo")
    ap.add_argument("--plot-only", action="store_true",
                    help="redraw docs/distill_curves.png from benchmarks/results/distill_demo.json")
    args = ap.parse_args()
    if args.plot_only:
        saved = json.loads(Path("benchmarks/results/distill_demo.json").read_text())
        curves = {tuple(k.split("-seed"))[::-1]: v for k, v in saved["curves"].items()}
        plot(curves, saved["teacher_accuracy"], Path("docs/distill_curves.png"))
        return
    teacher = Path(args.teacher)
    if not (teacher / "final").is_dir():
        raise SystemExit(f"no trained demo in {teacher}: run `grpo train` first (the teacher)")
    target = curve(teacher)[-1][1]
    curves, table = {}, []
    for seed in args.seeds.split(","):
        for kind, more in (("grpo", []), ("distill", ["algorithm=distill", f"teacher={teacher}"])):
            run = Path(args.out) / f"{kind}-seed{seed}"
            print(f"seed {seed}, {kind} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "grpo", "train", f"seed={seed}", f"steps={args.steps}",
                            "eval_every=10", f"output_dir={run}", "resume=auto", *more],
                           check=True, stdout=subprocess.DEVNULL)
            curves[(seed, kind)] = points = curve(run)
            step, seconds = reached(points, target)
            table.append({"seed": int(seed), "run": kind, "start": points[0][1], "end": points[-1][1],
                          "best": max(p[1] for p in points), "steps_to_teacher": step,
                          "seconds_to_teacher": seconds, "seconds_total": points[-1][2]})
            print(json.dumps(table[-1]), flush=True)
    Path("benchmarks/results").mkdir(parents=True, exist_ok=True)
    Path("benchmarks/results/distill_demo.json").write_text(json.dumps(
        {"teacher_accuracy": target, "steps": args.steps, "runs": table,
         "curves": {f"{k}-seed{s}": v for (s, k), v in curves.items()}}, indent=1) + "\n")
    plot(curves, target, Path("docs/distill_curves.png"))
    print(f"teacher {target:.3f}")
    print("| seed | run | start | end | best | first step at the teacher's accuracy | seconds to it |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['seed']} | {r['run']} | {r['start']:.3f} | {r['end']:.3f} | {r['best']:.3f} | "
              f"{r['steps_to_teacher'] or 'not reached'} | {r['seconds_to_teacher'] or '-'} |")


if __name__ == "__main__":
    main()
