"""Crash-safe directories: written into a temporary sibling, flushed, checksummed, renamed into place.

    checkpoints/step-N/      one training checkpoint (what is in it: `resume.py`)
        manifest.json        {"files": {name: {"sha256": ..., "bytes": ...}}} of every other file

A crash or a full disk mid-write leaves the previous directories whole and at most a `.tmp-*`
directory behind, which the next write clears. A directory counts only when its manifest verifies:
every file listed is there with its size and SHA-256.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the directory and file."""


def fault_point(name: str) -> None:
    """Test hook: with GRPO_FAULT_KILL_AT=NAME:K in the environment, the K-th time this process
    passes the point NAME it kills itself with SIGKILL, as a power cut or the OOM killer would."""
    spec = os.environ.get("GRPO_FAULT_KILL_AT", "")
    if not spec.startswith(f"{name}:"):
        return
    fault_point.seen[name] = fault_point.seen.get(name, 0) + 1
    if fault_point.seen[name] == int(spec.split(":", 1)[1]):
        os.kill(os.getpid(), signal.SIGKILL)


fault_point.seen = {}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_dir(target: str | Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` to fill a temporary directory, add the manifest, flush every file, then
    rename it to `target` (replacing an older one). On any error the temporary directory goes and
    `target`, old or absent, is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".tmp-{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)   # left by a crash during an earlier write
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        write(tmp)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {"files": {str(p.relative_to(tmp)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
                              for p in files}}
        fault_point("checkpoint")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        for p in [*files, tmp / MANIFEST]:
            _fsync(p)
        _fsync(tmp)
        if target.exists():
            old = target.with_name(f".tmp-{target.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
        _fsync(target.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            reason = "the disk is full" if e.errno == errno.ENOSPC else str(e)
            raise CheckpointError(f"cannot write {target}: {reason}") from e
        raise
    return target


def verify(directory: str | Path) -> str | None:
    """None when the directory's manifest verifies, else what is wrong with it."""
    directory = Path(directory)
    try:
        listed = json.loads((directory / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return f"{directory}: no {MANIFEST}"
    except (ValueError, KeyError, TypeError):
        return f"{directory}/{MANIFEST}: not a valid manifest"
    for name, entry in listed.items():
        path = directory / name
        if not path.is_file():
            return f"{path}: missing"
        if path.stat().st_size != entry["bytes"]:
            return f"{path}: {path.stat().st_size} bytes, the manifest says {entry['bytes']}"
        if _sha256(path) != entry["sha256"]:
            return f"{path}: checksum differs from the manifest (the file is corrupted)"
    return None


def step_dirs(parent: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every `step-N` directory under `parent`, oldest first."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in parent.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def newest_valid(parent: str | Path, log: Callable[[str], None] = print) -> Path | None:
    """The newest `step-N` directory whose manifest verifies; each newer one that fails is named."""
    for _, path in reversed(step_dirs(parent)):
        problem = verify(path)
        if problem is None:
            return path
        log(f"skipping checkpoint {path.name}: {problem}")
    return None


def prune(parent: str | Path, keep_last: int, upto: int | None = None) -> None:
    """Delete all but the newest `keep_last` step directories (0 keeps all). With `upto` (the step
    just written) only those up to it count: a later one is an earlier attempt's that did not
    verify, and must not push out the checkpoints of the run that is replacing it."""
    if keep_last <= 0:
        return
    for _, path in [d for d in step_dirs(parent) if upto is None or d[0] <= upto][:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


def save_model_dir(model, tokenizer, target: str | Path, state_dict: dict | None = None) -> Path:
    """A Hugging Face model directory (safetensors) at `target`, written atomically with a
    manifest; `state_dict`, when given, holds the weights (a sharded model's, gathered)."""
    return write_dir(target, lambda tmp: write_model_files(tmp, model, tokenizer, state_dict))


def write_model_files(directory: Path, model, tokenizer, state_dict: dict | None = None) -> None:
    """The model's config and safetensors weights (or a peft adapter) and the tokenizer's files
    (a vision-language model's processor's too, so the directory loads as it was trained)."""
    model.save_pretrained(directory, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(directory)
    processor = getattr(tokenizer, "grpo_processor", None)   # a vision-language model's
    if processor is not None:
        processor.save_pretrained(directory)
