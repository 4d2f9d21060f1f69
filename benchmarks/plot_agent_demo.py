"""The README's agent-demo figure from a run's metrics.jsonl: held-out accuracy, and the share of
episodes that call the calculator (training episodes each step, held-out ones at each evaluation).

    grpo train examples/agent-calculator.yaml
    python benchmarks/plot_agent_demo.py runs/agent-calculator docs/agent_curves.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run_dir: str, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    series = lambda key: [(m["step"], m[key]) for m in rows if key in m]   # noqa: E731
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4), dpi=100)
    for ax, key, label in ((left, "eval/accuracy", "held-out accuracy (greedy)"),
                           (right, "episode/tool_use_frac", "training episodes calling the tool"),
                           (right, "eval/tool_use_frac", "held-out episodes calling the tool")):
        points = series(key)
        ax.plot([s for s, _ in points], [v for _, v in points],
                marker="o" if key.startswith("eval/") else None, label=label)
    for ax, title in ((left, "Held-out accuracy"), (right, "Tool use (fraction of episodes)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)
    print(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
