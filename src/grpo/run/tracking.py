"""Metrics sinks: `metrics.jsonl` and TensorBoard always; Weights & Biases and MLflow when
installed and asked for (`report_to=[tensorboard,wandb,mlflow]`); a null tracker keeps call sites
plain.

W&B follows its own environment (WANDB_MODE=offline writes under WANDB_DIR/wandb, by default
OUTPUT_DIR/wandb; WANDB_PROJECT names the project, default "grpo"). MLflow logs to
MLFLOW_TRACKING_URI, or else to a local store, OUTPUT_DIR/mlflow.db (`mlflow ui
--backend-store-uri sqlite:///OUTPUT_DIR/mlflow.db` shows it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from grpo.run.checkpoint import writing
from grpo.config import ConfigError

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}   # name -> module
# what installs each: the package itself, or in a clone of grpo its extra (`grpo` on the public
# package index is another project, so an extra is named as a clone installs it)
INSTALL = {"tensorboard": "tensorboard",
           "wandb": "'wandb>=0.19' (in a clone of grpo: pip install -e '.[wandb]')",
           "mlflow": "mlflow-skinny sqlalchemy alembic (in a clone of grpo: pip install -e '.[mlflow]')"}


def check_trackers(report_to: list[str]) -> None:
    """Each tracker asked for is known and installed; the error names the one that is not."""
    import importlib.util
    for name in report_to:
        if name not in TRACKERS:
            raise ConfigError(f"config key 'report_to': unknown tracker {name!r}; choose from "
                              f"{sorted(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ConfigError(f"config key 'report_to' asks for {name}, which is not installed: "
                              f"pip install {INSTALL[name]}")


def _finite(value):
    """`value` with every NaN or infinite float inside it (lists, dicts) turned into None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def strict_json(record: dict, note: bool = True) -> str:
    """One line of strict JSON (RFC 8259 has no NaN): a metric that was not defined this step (a
    NaN: the mean reward of a step where no sample could be scored, say) is written as null, and
    with `note`, `undefined` lists those keys, so their count is its length."""
    undefined = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    out = _finite(record)
    if note and undefined:
        out["undefined"] = undefined
    return json.dumps(out, allow_nan=False)


class NullTracker:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def samples(self, records: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


class RunTracker(NullTracker):
    """Appends one JSON object per `log` to metrics.jsonl and writes TensorBoard scalars."""

    def __init__(self, run_dir: Path, purge_step: int | None = None, report_to: list[str] = (),
                 config: dict | None = None):
        """`purge_step`: the first step this run logs (a resumed run's first step; 0 for a run
        from the start, whose step-0 evaluation an earlier attempt may have logged); TensorBoard
        hides the events from there on that a stopped run had written."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = open(self.run_dir / "metrics.jsonl", "a")
        self.samples_file = open(self.run_dir / "samples.jsonl", "a")
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge_step)
        except ImportError:  # tensorboard is a dependency; this keeps a broken install usable
            self.tb = None
        self.wandb = self.mlflow = None
        if "wandb" in report_to:
            import wandb
            # WANDB_DIR is wandb's own setting; the run directory is only the default
            where = os.environ.get("WANDB_DIR") or str(self.run_dir)
            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "grpo"), name=self.run_dir.name,
                                    dir=where, config=config or {}, reinit="create_new")
        if "mlflow" in report_to:
            import mlflow
            mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI")
                                    or f"sqlite:///{(self.run_dir / 'mlflow.db').resolve()}")
            self.mlflow = mlflow
            self.mlflow_run = mlflow.start_run(run_name=self.run_dir.name)
            if config:
                mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def log(self, metrics: dict, step: int) -> None:
        record = {"step": step, **metrics}
        with writing(self.metrics_file.name):   # a full disk names the file
            self.metrics_file.write(strict_json(record) + "\n")
            self.metrics_file.flush()
        numbers = {k: v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metrics(numbers, step=step)

    def samples(self, records: list[dict]) -> None:
        with writing(self.samples_file.name):
            for record in records:
                self.samples_file.write(strict_json(record, note=False) + "\n")
            self.samples_file.flush()

    def close(self) -> None:
        """Closes every sink, then raises the first file's error (closing flushes what a full
        disk left in a buffer)."""
        failed = []
        for f in (self.metrics_file, self.samples_file):
            try:
                with writing(f.name):
                    f.close()
            except OSError as e:
                failed.append(e)
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        if self.mlflow is not None:
            self.mlflow.end_run()
            self.mlflow = None
        if failed:
            raise failed[0]


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
