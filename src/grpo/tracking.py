"""Metrics sinks: `metrics.jsonl` and TensorBoard always; a null tracker keeps call sites plain."""

from __future__ import annotations

import json
import math
from pathlib import Path


class NullTracker:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def samples(self, records: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


class RunTracker(NullTracker):
    """Appends one JSON object per `log` to metrics.jsonl and writes TensorBoard scalars."""

    def __init__(self, run_dir: Path, purge_step: int | None = None):
        """`purge_step`: a resumed run's first step; TensorBoard hides events from there on that
        the stopped run had written."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = open(self.run_dir / "metrics.jsonl", "a")
        self.samples_file = open(self.run_dir / "samples.jsonl", "a")
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge_step)
        except ImportError:  # tensorboard is a dependency; this keeps a broken install usable
            self.tb = None

    def log(self, metrics: dict, step: int) -> None:
        record = {"step": step, **metrics}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)

    def samples(self, records: list[dict]) -> None:
        for record in records:
            self.samples_file.write(json.dumps(record) + "\n")
        self.samples_file.flush()

    def close(self) -> None:
        self.metrics_file.close()
        self.samples_file.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
