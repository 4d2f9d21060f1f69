"""Plots of a run: reward and held-out accuracy curves as a PNG."""

from __future__ import annotations

from pathlib import Path

from grpo.tracking import read_metrics


def write_report(run_dir: str | Path) -> Path:
    """Write `curves.png` (reward/mean per step, eval/accuracy per evaluation); return its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    train = [m for m in metrics if "reward/mean" in m]
    evals = [m for m in metrics if "eval/accuracy" in m]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([m["step"] for m in train], [m["reward/mean"] for m in train], label="reward/mean (train)",
            color="tab:blue", alpha=0.8)
    ax.plot([m["step"] for m in evals], [m["eval/accuracy"] for m in evals], "o-",
            label="eval/accuracy (held-out, greedy)", color="tab:orange")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"GRPO run: {run_dir.name}")
    fig.tight_layout()
    path = run_dir / "curves.png"
    fig.savefig(path)
    plt.close(fig)
    return path
