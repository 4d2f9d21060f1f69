"""Crash-safe directories: written into a temporary sibling, flushed, checksummed, renamed into place.

    checkpoints/step-N/      one training checkpoint (what is in it: `resume.py`)
        manifest.json        {"files": {name: {"sha256": ..., "bytes": ...}}} of every other file

A crash or a full disk mid-write leaves the previous directories whole and at most a `.tmp-*`
directory behind, which the next write clears. A directory counts only when its manifest verifies:
every file listed is there with its size and SHA-256.

    OUTPUT_DIR/.grpo-run.lock   held by the one run that writes OUTPUT_DIR (`RunLock`), naming it
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from grpo.run import distributed
from grpo.config import ConfigError

MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
LOCK = ".grpo-run.lock"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the directory and file."""


# ---------------------------------------------------------------- what a failed write says

# errno -> (what is wrong with the storage, what to do before going on)
STORAGE_FAULTS = {errno.ENOSPC: ("the disk is full", "Free space"),
                  errno.EDQUOT: ("the disk quota is used up", "Free space or raise the quota"),
                  errno.EROFS: ("the file system is read-only", "Make it writable")}
# the same faults as libraries other than Python's own I/O word them (safetensors: "I/O error:
# No space left on device (os error 28)")
STORAGE_TEXTS = {os.strerror(n): n for n in STORAGE_FAULTS} | {f"os error {n}": n for n in STORAGE_FAULTS}
# torch.save's C++ writer says only that a write came short ("unexpected pos 576 vs 534", "file
# write failed"), with no errno, even on a full disk; the free space measured then tells
TORCH_WRITER = ("PytorchStreamWriter", "inline_container.cc")
FULL_BELOW = 1 << 20   # bytes free under which a write that came short is a full disk's doing


def free_bytes(path: str | Path) -> int:
    """Bytes that can still be written on the file system holding `path` (or its nearest parent
    that exists); -1 when that cannot be known."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return -1


def storage_fault(e: BaseException, where: str | Path | None = None) -> tuple[str, str] | None:
    """(what is wrong, what to do) when `e`, or an error it was raised from, is the storage's
    fault: a full disk, a used-up quota, a read-only file system; None when it is not. `where`
    (a path on the file system written to, measured before anything written is removed) lets a
    torch writer's failure, which carries no errno, be told for a full disk."""
    chain, seen = [], e
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for x in chain:
        if isinstance(x, OSError) and x.errno in STORAGE_FAULTS:
            return STORAGE_FAULTS[x.errno]
        for words, number in STORAGE_TEXTS.items():
            if words in str(x):
                return STORAGE_FAULTS[number]
    if where is not None and any(w in str(x) for x in chain for w in TORCH_WRITER) \
            and 0 <= free_bytes(where) < FULL_BELOW:
        return STORAGE_FAULTS[errno.ENOSPC]
    return None


@contextmanager
def writing(path: str | Path):
    """An OSError inside names `path`: a failed write() or flush() of an open file carries no
    file name, so a full disk would not say which file it stopped."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


# ---------------------------------------------------------------- one run per directory

_HELD: set[int] = set()   # descriptors of the run locks this process holds


def _forget_held_locks() -> None:
    """In a forked child (rollout workers, reward and sandbox workers): close the inherited
    descriptors, so a child that outlives its run does not keep the run's directory locked (a
    flock lock lasts while any descriptor of it is open). The parent's lock is untouched."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


class RunLock:
    """`OUTPUT_DIR/.grpo-run.lock`, flock'ed by the run that writes OUTPUT_DIR for its whole life,
    with the holder's pid, host and start time in it for the error another run gets.

    The kernel releases a flock lock when its process ends, however it ends (SIGKILL and the OOM
    killer included), so a lock file left behind by a dead run blocks nothing: the next run takes
    the lock on it and writes its own name there. A run that ends in Python removes the file."""

    def __init__(self, path: Path, fd: int, created: list[Path]):
        self.path, self.fd, self.created = path, fd, created

    @classmethod
    def take(cls, run_dir: str | Path) -> "RunLock":
        """The lock of `run_dir` (made if missing); a ConfigError naming the holder when another
        run has it, or naming `run_dir` when it is no directory or cannot be written. A refused
        run changes nothing in the directory."""
        run_dir = Path(run_dir)
        created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]   # deepest first
        try:
            if run_dir.exists() and not run_dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(run_dir))
            run_dir.mkdir(parents=True, exist_ok=True)
            path = run_dir / LOCK
            fd = _locked(path)
            _HELD.add(fd)
            lock = cls(path, fd, created)
            holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder.encode() + b"\n", 0)
            except OSError:
                lock.release()
                raise
            return lock
        except ConfigError:
            _remove_empty(created)
            raise
        except OSError as e:
            _remove_empty(created)
            if isinstance(e, (FileExistsError, NotADirectoryError)):
                blocking = next((p for p in (run_dir, *run_dir.parents) if p.exists() and not p.is_dir()),
                                run_dir)
                raise ConfigError(f"config key 'output_dir': {blocking} is a file, not a directory; "
                                  "choose another output_dir") from None
            why, remedy = storage_fault(e) or ((e.strerror or str(e)).lower(), "")
            raise ConfigError(f"config key 'output_dir': cannot write in {run_dir} ({why}); "
                              f"{remedy.lower() + ', or ' if remedy else ''}choose another output_dir") from None

    def release(self) -> None:
        """Remove the lock file (before unlocking: see `_locked`), then unlock; directories `take`
        made are removed again when nothing else was written in them."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        _HELD.discard(self.fd)
        os.close(self.fd)   # closing the last descriptor releases the lock
        self.fd = None
        _remove_empty(self.created)


def _locked(path: Path) -> int:
    """A descriptor of `path` (made if missing) that holds its flock lock; a ConfigError naming
    the holder when another process has it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"output_dir {path.parent} is in use by another grpo run ({holder}); "
                              "wait for it, or choose another output_dir") from None
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                # a file system without flock (some network mounts): run unguarded, and say so
                print(f"warning: output_dir {path.parent} is on a file system without flock "
                      f"({e.strerror or errno.errorcode.get(e.errno)}): this run cannot stop another "
                      "grpo run from writing the same output_dir at once", file=sys.stderr)
                return fd
            os.close(fd)
            raise
        # A holder that ended between our open and our flock removed the file we locked: the
        # lock that counts is on the file the path names now.
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _holder(fd: int) -> str:
    """Who holds a lock, as its file says: "pid 1234 on host h, started 2025-01-02 12:01:02"."""
    try:
        info = json.loads(os.pread(fd, 4096, 0))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on host {info['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has not written its name yet"


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:   # deepest first
        try:
            directory.rmdir()
        except OSError:
            return


@contextmanager
def run_lock(run_dir: str | Path, world: distributed.World = distributed.World(), take: bool = True):
    """Rank 0 holds `run_dir`'s lock (`RunLock`) while the body runs, when `take` (it writes
    files); under torchrun every rank raises the error rank 0 got, so none goes on alone."""
    lock, refusal = None, None
    if take and world.is_main:
        try:
            lock = RunLock.take(run_dir)
        except ConfigError as e:
            refusal = str(e)
    refusal = distributed.gather_objects(refusal, world)[0]
    if refusal is not None:
        raise ConfigError(refusal)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


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
        fault = storage_fault(e, tmp)   # measured before the temporary goes and frees its space
        shutil.rmtree(tmp, ignore_errors=True)
        if fault is not None:
            raise CheckpointError(f"cannot write {target}: {fault[0]}") from e
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write {target}: {e}") from e
        if any(w in str(e) for w in TORCH_WRITER):   # a short write, with room on the disk
            raise CheckpointError(f"cannot write {target}: torch's write failed "
                                  f"({str(e).strip().splitlines()[0]})") from e
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
