"""Whole-run checkpoints, exact resume, and stopping cleanly on SIGTERM or Ctrl-C.

    checkpoints/step-N/
        config.json, model.safetensors, tokenizer files   the policy, a Hugging Face model directory
                                  (with LoRA: the adapter, as peft writes it)
        reference.safetensors     the reference model, when it is a separate copy (beta > 0, no LoRA)
        optimizer.pt              AdamW's state keyed by parameter name, whole (not per shard)
        trainer_state.pt          step, scheduler, data position, skipped-update counters, last
                                  accuracy, and the Python/NumPy/torch random states of every rank
        config.yaml               the resolved config the run had
        data.json                 the fingerprint of each dataset it was trained on (data.fingerprint)
        manifest.json             sizes and SHA-256 of all of the above (`checkpoint.py`)

Weights and optimizer state are stored whole, so a checkpoint written by N processes, sharded
(FSDP2) or not, loads into any number of processes. `resume=auto` continues from the newest
checkpoint whose manifest verifies, falling back to older ones; metrics.jsonl and samples.jsonl
are cut back to that step, so a resumed run's files read as if it had never stopped. A resumed
run on other data than its checkpoint's is refused (`check_data`); keys changed since are said.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from grpo.run import distributed
from grpo.run.checkpoint import (CheckpointError, newest_valid, prune, step_dirs, verify, write_dir,
                                 write_model_files)
from grpo.config import ConfigError, TrainConfig, to_yaml
from grpo.data import GIVEN, DataError

# Keys that may change between a run and its resumption without changing what it computes; a
# dataset's path among them, as its rows are checked (`check_data`).
FREE_TO_CHANGE = {"steps", "save_every", "keep_last", "resume", "eval_every", "output_dir", "threads",
                  "rollout_workers", "transfer_timeout_s", "worker_restarts", "trainer_threads", "worker_threads",
                  "log_every", "report_to", "push_to_hub", "dataset", "eval_dataset",
                  "vllm_url", "vllm_timeout_s", "vllm_weights_dir"}   # a server's address is free to change
DATA_FILE = "data.json"


class Stopped(RuntimeError):
    """The run stopped on a signal after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @classmethod
    def after(cls, signum: int, step: int, steps: int, run_dir: Path) -> "Stopped":
        return cls(f"stopped by {signal.Signals(signum).name} after step {step}/{steps}; checkpoint "
                   f"{run_dir / 'checkpoints' / f'step-{step}'}. Continue with the same command and "
                   "resume=auto", signum)


# ---------------------------------------------------------------- writing

def _full_optimizer_state(policy, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    return get_optimizer_state_dict(policy, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class Position:
    """A data position to save: what `stream.state_dict()` would return (with async_steps, the
    rollout workers' position after the groups queued in the checkpoint)."""

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self) -> dict:
        return self.state


def save(run_dir: Path, c: TrainConfig, learner, tokenizer, stream, step: int, accuracy: float,
         write_files: bool, pipeline: dict | None = None,
         fingerprints: dict | None = None) -> Path | None:
    """Write checkpoints/step-`step`/ (rank 0; every rank takes part in gathering shards). With
    async_steps, `pipeline` (each rank's groups already sampled for the next steps) goes to
    pipeline.pt, so a resumed run trains on exactly those. `fingerprints` (build.Data's) go to
    data.json, for `check_data`."""
    world = learner.world
    sharded = distributed.is_sharded(learner.policy)
    policy_state = distributed.full_state_dict(learner.policy) if sharded else None
    ref_state = distributed.full_state_dict(learner.ref) if learner.ref is not None else None
    optimizer_state = _full_optimizer_state(learner.policy, learner.optimizer)
    rng = distributed.gather_objects({"python": random.getstate(), "numpy": np.random.get_state(),
                                      "torch": torch.get_rng_state()}, world)
    pipelines = distributed.gather_objects(pipeline, world) if pipeline is not None else None
    if not write_files:
        return None
    state = {"step": step, "world_size": world.size, "scheduler": learner.scheduler.state_dict(),
             "stream": stream.state_dict(), "skipped_in_a_row": learner.skipped_in_a_row,
             "skipped_total": learner.skipped_total, "accuracy": accuracy, "rng": rng}

    def write(tmp: Path) -> None:
        write_model_files(tmp, learner.policy, tokenizer, policy_state)
        if ref_state is not None:
            save_file({k: v.contiguous() for k, v in ref_state.items()}, tmp / "reference.safetensors")
        torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(state, tmp / "trainer_state.pt")
        if pipelines is not None:
            torch.save(pipelines, tmp / "pipeline.pt")
        (tmp / "config.yaml").write_text(to_yaml(c))
        if fingerprints is not None:
            (tmp / DATA_FILE).write_text(json.dumps(fingerprints, indent=1))

    parent = run_dir / "checkpoints"
    before = [p for _, p in step_dirs(parent)]
    try:
        path = write_dir(parent / f"step-{step}", write)
    except CheckpointError as e:
        kept = f"the previous checkpoint {before[-1]} is intact" if before else "no earlier checkpoint exists"
        raise CheckpointError(f"{e}; {kept}. Free space, then continue with resume=auto") from e.__cause__
    prune(parent, c.run.keep_last, upto=step)
    return path


# ---------------------------------------------------------------- reading

def find(c: TrainConfig, log: Callable[[str], None]) -> Path | None:
    """The checkpoint `resume` names: none, the newest valid one (`auto`), or a directory."""
    run_dir = Path(c.run.output_dir)
    if not c.run.resume:
        existing = [p.name for p in (run_dir / "metrics.jsonl", run_dir / "checkpoints") if p.exists()]
        if existing:
            raise ConfigError(
                f"output_dir {run_dir} already holds a run ({', '.join(existing)}); continue it with "
                "resume=auto, or choose another output_dir (nothing there was changed)")
        return None
    if c.run.resume == "auto":
        path = newest_valid(run_dir / "checkpoints", log)
        final = run_dir / "final"
        if path is None and final.is_dir() and any(final.iterdir()):
            # A run that ended (final/ is written last) with no checkpoint (save_every=0): starting
            # from step 0 would train it again over its own files.
            raise ConfigError(
                f"resume=auto: {run_dir} holds a finished run (final/) and no checkpoint to continue "
                f"from (save_every=0); nothing was changed. To train on from its weights, start a "
                f"new run with model={final} and another output_dir")
        if path is None:
            log(f"resume=auto: no valid checkpoint in {run_dir / 'checkpoints'}; starting from step 0")
        return path
    path = Path(c.run.resume)
    if not path.is_dir():
        raise ConfigError(f"config key 'resume': {path} is not a directory (use auto or a "
                          "checkpoints/step-N directory)")
    problem = verify(path)
    if problem:
        raise ConfigError(f"config key 'resume': checkpoint {path} cannot be used: {problem}")
    return path


def found_everywhere(checkpoint: Path | None, world: distributed.World) -> None:
    """Under torchrun every process reads the checkpoint it continues from (`find`): where one
    finds another than rank 0's, or none (machines that do not share `output_dir`), every process
    stops before training, rather than training from another step than the rest."""
    if world.size > 1:
        problem = unshared_checkpoint(distributed.gather_objects(
            None if checkpoint is None else str(checkpoint), world))
        if problem:
            raise ConfigError(problem)


def unshared_checkpoint(found: list[str | None]) -> str | None:
    """What is wrong when the processes (in rank order) found other checkpoints; None if none is."""
    differing = [rank for rank, path in enumerate(found) if path != found[0]]
    if not differing:
        return None
    rank = differing[0]
    first, other = (path or "none (step 0)" for path in (found[0], found[rank]))
    return (f"config key 'resume': process 0 continues from {first}, process {rank} from {other}: "
            "every process reads the checkpoint, so on several machines output_dir must be on a "
            "file system they share")


def step_of(path: Path) -> int:
    """The step a checkpoint was written after (its trainer state, else its step-N name)."""
    state = path / "trainer_state.pt"
    if state.is_file():
        return int(torch.load(state, weights_only=False)["step"])
    return int(path.name.removeprefix("step-"))


def finished(path: Path, steps: int, run_dir: Path) -> bool:
    """True when checkpoint `path` is at (or past) `steps` and the run's final/ was written after
    it: a run killed between its last checkpoint and final/ is not finished (resuming writes it)."""
    final = run_dir / "final"
    written = [f.stat().st_mtime_ns for f in final.iterdir() if f.is_file()] if final.is_dir() else []
    return (step_of(path) >= steps and bool(written)
            and max(written) >= (path / "manifest.json").stat().st_mtime_ns)


def _changes(c: TrainConfig, path: Path) -> list[tuple[str, bool]]:
    """("key then -> now", free to change) for each key whose value differs from the checkpoint's
    config (`resume` itself aside)."""
    import yaml
    saved = yaml.safe_load((path / "config.yaml").read_text()) or {}
    now = c.flat()
    return [(f"{k} {saved[k]!r} -> {now[k]!r}", k in FREE_TO_CHANGE) for k in now
            if k != "resume" and k in saved and saved[k] != now[k]
            and not _same_given_rows(saved[k], now[k])]


def _same_given_rows(then, now) -> bool:
    """Two labels of the same number of rows given in Python (data.GIVEN), an older grpo's
    "(N rows given to train())" and "(N rows given in Python)": the rows themselves are checked
    by their fingerprint (check_data)."""
    found = [GIVEN.fullmatch(v) if isinstance(v, str) else None for v in (then, now)]
    return all(found) and found[0].group(1) == found[1].group(1)


def changes_said(c: TrainConfig, path: Path) -> list[str]:
    """The keys changed since checkpoint `path`, in at most two lines: those a resumed run may
    change (`FREE_TO_CHANGE`: it goes on as the run would have), and the others (it goes on, but
    trains otherwise than the run it continues)."""
    changes = _changes(c, path)
    free = [change for change, is_free in changes if is_free]
    other = [change for change, is_free in changes if not is_free]
    lines = []
    if free:
        lines.append(f"resuming with {', '.join(free)} (keys a resumed run may change)")
    if other:
        lines.append(f"resuming with changed keys: {', '.join(other)} (from here the run trains "
                     "otherwise than the one it continues)")
    return lines


def check_data(checkpoint: Path, fingerprints: dict, log: Callable[[str], None]) -> None:
    """The datasets a resumed run loaded (build.Data.fingerprints) are those its checkpoint was
    trained on; a DataError naming the one that is not. A checkpoint from before fingerprints
    were recorded resumes, with a line saying the data could not be checked."""
    recorded = checkpoint / DATA_FILE
    if not recorded.is_file():
        if fingerprints:
            log(f"resume: checkpoint {checkpoint} records no fingerprint of its data (written by "
                f"an older grpo), so whether {' and '.join(sorted(fingerprints))} changed since "
                "could not be checked")
        return
    then, step = json.loads(recorded.read_text()), step_of(checkpoint)
    way_out = "resume on the data it was trained on, or start a new run in another output_dir"
    for key in sorted(set(then) | set(fingerprints)):
        old, new = then.get(key), fingerprints.get(key)
        if new is None:
            raise DataError(f"the checkpoint at step {step} was trained with {key}={old['source']} "
                            f"({old['rows']} rows), which is not set now: {way_out}")
        if old is None:
            raise DataError(f"{key}={new['source']} was not part of the run the checkpoint at step "
                            f"{step} was trained on: {way_out}")
        if old["sha256"] != new["sha256"]:
            moved = f"; it was {old['source']}" if old["source"] != new["source"] else ""
            raise DataError(f"the {key} {new['source']} has changed since the checkpoint at step "
                            f"{step} (rows: {old['rows']} then, {new['rows']} now{moved}; its "
                            f"fingerprint differs): {way_out}")


def load_weights(policy, path: Path) -> None:
    """The checkpoint's policy weights into a model built from the same base (before sharding)."""
    if hasattr(policy, "peft_config"):
        from peft import set_peft_model_state_dict
        set_peft_model_state_dict(policy, load_file(path / "adapter_model.safetensors"))
        return
    state = _model_names(policy, load_file(path / "model.safetensors"))
    missing, unexpected = policy.load_state_dict(state, strict=False)
    tied = set(getattr(policy, "all_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise CheckpointError(f"{path}/model.safetensors does not fit the model: missing "
                              f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")


def _model_names(model, state: dict) -> dict:
    """Saved weights under the model's own parameter names. save_pretrained writes some models'
    weights under their checkpoints' older names (transformers 5 renames LLaVA's, Qwen-VL's and
    others' when loading, and back when saving); a rename is matched through the tensors that
    reverting the model's own state dict maps each name to."""
    own = model.state_dict()
    if set(state) <= set(own):
        return state
    try:
        from transformers.core_model_loading import revert_weight_conversion
        reverted = revert_weight_conversion(model, dict(own))
    except (ImportError, AttributeError, TypeError):
        return state
    by_tensor = {id(t): name for name, t in own.items()}
    rename = {saved: by_tensor[id(t)] for saved, t in reverted.items() if id(t) in by_tensor}
    return {rename.get(name, name): t for name, t in state.items()}


def cold_start_under(policy, path: Path) -> str | None:
    """The adapter directory under a LoRA checkpoint's adapter that the policy as loaded lacks:
    the run's cold_start/, which assembly.resume_or_cold_start merged into the base before GRPO;
    None when the checkpoint's adapter was trained on the policy's own base."""
    from grpo.models import adapter_base, is_adapter_dir
    if not hasattr(policy, "peft_config") or not (path / "adapter_config.json").is_file():
        return None
    base = adapter_base(path)
    own = policy.get_base_model().name_or_path
    if not is_adapter_dir(base) or Path(base).resolve() == Path(own).resolve():
        return None
    return base


def reference_state(path: Path | None) -> dict | None:
    if path is None or not (path / "reference.safetensors").is_file():
        return None
    return load_file(path / "reference.safetensors")


def pipeline_state(path: Path | None, world: distributed.World) -> dict | None:
    """This rank's part of a checkpoint's pipeline.pt (None: not an async_steps checkpoint)."""
    if path is None or not (path / "pipeline.pt").is_file():
        return None
    ranks = torch.load(path / "pipeline.pt", weights_only=False)
    if len(ranks) != world.size:
        raise ConfigError(f"checkpoint {path} was written by {len(ranks)} trainer processes with "
                          f"async_steps; resume it with {len(ranks)}, not {world.size}")
    return ranks[world.rank]


def write_timeline(run_dir: Path, timeline: list[dict]) -> None:
    """pipeline.jsonl: per step, when the trainer waited for its groups and when each worker
    waited for weights and worked (seconds since the epoch; `grpo report` draws it)."""
    with open(run_dir / "pipeline.jsonl", "a") as f:
        for row in timeline:
            f.write(json.dumps(row) + "\n")


def restore(learner, stream, path: Path) -> dict:
    """Optimizer, scheduler, data position, counters and random states from `path`; returns the
    trainer state (its `step` is the last step done)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=False)
    set_optimizer_state_dict(learner.policy, learner.optimizer, optimizer_state,
                             options=StateDictOptions(full_state_dict=True))
    learner.scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    learner.skipped_in_a_row, learner.skipped_total = state["skipped_in_a_row"], state["skipped_total"]
    rank = learner.world.rank if state["world_size"] == learner.world.size else 0
    rng = state["rng"][rank]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state


def cut_run_files(run_dir: Path, step: int) -> None:
    """Drop the lines of metrics.jsonl, samples.jsonl and pipeline.jsonl written after `step`
    (and a torn last line), atomically, so the resumed run appends where the checkpoint was taken.
    A run that starts from step 0 over an earlier attempt's files (none had a checkpoint, or none
    verifies) passes -1: step 0's evaluation is written again, so nothing stays."""
    for name in ("metrics.jsonl", "samples.jsonl", "pipeline.jsonl"):
        path = run_dir / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        tmp.replace(path)


# ---------------------------------------------------------------- signals

class StopOnSignal:
    """SIGTERM or SIGINT asks the run to finish its step, write a checkpoint and stop; a second
    SIGINT stops at once (KeyboardInterrupt). Handlers are restored on exit."""

    def __init__(self, log: Callable[[str], None], then: str = "writing a checkpoint"):
        self.log, self.then, self.signum, self.previous = log, then, 0, {}

    def __enter__(self) -> "StopOnSignal":
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        self.log(f"{signal.Signals(signum).name}: finishing this step, then {self.then} "
                 "(Ctrl-C again stops at once)")

    def requested(self, world: distributed.World) -> int:
        """The signal number any rank received, or 0."""
        return distributed.max_over(self.signum, world)
