"""Trackers: TensorBoard always; W&B (offline) and MLflow (local file store) when asked for."""

import json
import sys
import time

import pytest

from grpo.config import ConfigError, build_config
from grpo.train import train


def short_run(tiny_model_dir, out, report_to):
    config = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 3, "prompts_per_step": 2,
                           "group_size": 2, "max_new_tokens": 4, "eval_every": 0, "save_every": 0,
                           "threads": 1, "output_dir": str(out), "report_to": report_to})
    train(config, log=lambda line: None)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_events_always(tiny_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    metrics = short_run(tiny_model_dir, tmp_path / "run", [])
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert logged == [(m["step"], pytest.approx(m["reward/mean"])) for m in metrics]


def test_wandb_offline_gets_the_same_metrics(tiny_model_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged, real_init = [], wandb.init

    def init(**kwargs):
        run = real_init(**kwargs)
        real_log = run.log
        run.log = lambda data, step=None: (logged.append((step, dict(data))), real_log(data, step=step))[1]
        return run

    monkeypatch.setattr(wandb, "init", init)
    metrics = short_run(tiny_model_dir, tmp_path / "run", ["tensorboard", "wandb"])
    assert [(step, data["reward/mean"]) for step, data in logged] == [(m["step"], m["reward/mean"]) for m in metrics]
    # What reached the offline run file (protobuf records with each value's JSON text)
    (record,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    data = record.read_bytes()
    for m in metrics:
        assert json.dumps(m["kl"]).encode() in data
    assert b"reward/mean" in data and b"group_size" in data


def test_mlflow_local_store_gets_every_step(tiny_model_dir, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    metrics = short_run(tiny_model_dir, tmp_path / "run", ["mlflow"])
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}")
    (run,) = client.search_runs(experiment_ids=[e.experiment_id for e in client.search_experiments()])
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean"))
    assert history == [(m["step"], pytest.approx(m["reward/mean"])) for m in metrics]
    assert run.data.params["group_size"] == "2"


def test_a_tracker_asked_for_but_missing_is_named(tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="'report_to' asks for wandb, which is not installed: pip install 'wandb>=0.19' \\(in a clone of grpo: pip install -e '.\\[wandb\\]'\\)"):
        short_run(tiny_model_dir, tmp_path / "run", ["wandb"])
    with pytest.raises(ConfigError, match="unknown tracker 'comet'"):
        short_run(tiny_model_dir, tmp_path / "run2", ["comet"])
    assert not (tmp_path / "run").exists()


def strict_lines(path) -> list[dict]:
    """A file's JSON lines read as strict RFC 8259 JSON (NaN and Infinity are not JSON)."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_a_step_no_sample_could_score_is_strict_json_null_and_a_warning(tiny_model_dir, tmp_path,
                                                                       monkeypatch, capsys):
    from grpo.commands.cli import main
    (tmp_path / "myreward.py").write_text(
        "def strict(prompts, completions, **columns):\n"
        "    raise RuntimeError('my reward is broken')\n")
    monkeypatch.chdir(tmp_path)
    status = main(["train", f"model={tiny_model_dir}", "rewards=[myreward:strict]", "reward_on_error=skip",
                   "sft_steps=0", "steps=2", "prompts_per_step=2", "group_size=2", "max_new_tokens=4",
                   "eval_every=0", "save_every=0", "threads=1", "output_dir=run"])
    out = capsys.readouterr().out
    assert status == 0
    warnings = [line for line in out.splitlines() if line.startswith("warning: step")]
    assert len(warnings) == 2 and "none of its 4 samples could be scored (no value from strict)" in warnings[0]
    assert "reward_on_error=raise" in warnings[0]
    assert "step 1/2  reward none (no sample scored)" in out
    metrics = strict_lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["reward/mean"] for m in metrics] == [None, None]
    assert metrics[0]["reward/strict/mean"] is None and metrics[0]["reward/unscorable"] == 4
    assert metrics[0]["undefined"] == ["reward/mean", "reward/min", "reward/max", "reward/strict/mean"]
    assert all(s["reward"] is None for s in strict_lines(tmp_path / "run" / "samples.jsonl"))
    assert (tmp_path / "run" / "report.html").is_file()     # the report reads nulls too


def test_strict_json_writes_null_for_every_non_finite_number():
    from grpo.run.tracking import strict_json
    line = strict_json({"step": 3, "a": float("nan"), "b": float("inf"), "c": 1.5, "d": [float("-inf"), 2]})
    assert json.loads(line) == {"step": 3, "a": None, "b": None, "c": 1.5, "d": [None, 2],
                                "undefined": ["a", "b"]}
    assert json.loads(strict_json({"x": float("nan")}, note=False)) == {"x": None}


def test_wandb_dir_is_where_wandb_writes_when_it_is_set(tmp_path, monkeypatch):
    # WANDB_DIR is wandb's own setting; the run directory is only the default when it is unset
    pytest.importorskip("wandb")
    from grpo.run.tracking import RunTracker
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    tracker = RunTracker(tmp_path / "run", report_to=["wandb"], config={"group_size": 8})
    tracker.log({"reward/mean": 0.25}, step=1)
    tracker.close()
    (record,) = (tmp_path / "elsewhere" / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's service process writes the record file; under load it may still be at it when
    # finish() returns (seen: only the 7-byte header), so give it up to 30 s
    deadline = time.monotonic() + 30
    while b"reward/mean" not in record.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"reward/mean" in record.read_bytes()
    assert not (tmp_path / "run" / "wandb").exists()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().startswith('{"step": 1, "reward/mean": 0.25')
