"""One run writes a directory at a time, and a directory that cannot be written is said in one
line: output_dir's lock (checkpoint.RunLock), a file or a read-only place as output_dir, a disk
that fills between checkpoints or under torch.save."""

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from grpo.run import checkpoint
from grpo.run.checkpoint import LOCK, RunLock
from grpo.commands.cli import main

ARGS = ["sft_steps=0", "prompts_per_step=2", "group_size=2", "max_new_tokens=4", "eval_every=0",
        "save_every=1", "keep_last=0", "beta=0", "threads=1", "seed=3"]

# A reward that holds the run (its lock taken) until the test opens the gate, a file, and says
# that it waits (waiting-PID); the start's dry call of a user's reward runs it first, once the
# model is loaded.
GATE = '''
import os, time

def wait(prompts, completions, **columns):
    open(f"waiting-{os.getpid()}", "w").close()
    deadline = time.time() + 300
    while not os.path.exists(os.environ["GRPO_TEST_GATE"]) and time.time() < deadline:
        time.sleep(0.05)
    return [float(len(c) % 2) for c in completions]
'''


def grpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo", "train", *args]


def env_with(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def holder_of(run_dir) -> dict | None:
    try:
        return json.loads((run_dir / LOCK).read_text())
    except (OSError, ValueError):
        return None


def wait_at_the_gate(proc: subprocess.Popen, cwd, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (cwd / f"waiting-{proc.pid}").exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach its reward (exit {proc.poll()}): "
                         f"{proc.stderr.read()[-2000:] if proc.poll() is not None else ''}")


def files_of(directory) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(err: str) -> str:
    """The error line, which must be the last of stderr, with no traceback before it."""
    assert "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("grpo train: error: "), err[-3000:]
    return line


def test_a_second_run_on_a_busy_output_dir_is_refused_naming_the_first(tiny_model_dir, tmp_path):
    # Two `grpo train` on one output_dir both ran: the later one's metrics.jsonl replaced the
    # earlier one's, and both wrote checkpoints there.
    (tmp_path / "gate.py").write_text(GATE)
    gate, run = tmp_path / "open", tmp_path / "run"
    args = [f"model={tiny_model_dir}", *ARGS, "steps=2", "rewards=[gate:wait]", f"output_dir={run}"]
    first = subprocess.Popen(grpo(*args), cwd=tmp_path, env=env_with(GRPO_TEST_GATE=str(gate)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_at_the_gate(first, tmp_path)
        before = files_of(run)
        # a second run, and a resume of the running one (their gate open): refused, and nothing
        # in the directory changes
        for extra in ([], ["resume=auto"]):
            second = subprocess.run(grpo(*args, *extra), cwd=tmp_path, capture_output=True, text=True,
                                    env=env_with(GRPO_TEST_GATE=str(tmp_path)), timeout=300)
            assert second.returncode == 2, second.stderr[-3000:]
            holder = holder_of(run)
            assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
            assert one_line_error(second.stderr) == (
                f"grpo train: error: output_dir {run} is in use by another grpo run (pid {first.pid} on "
                f"host {holder['host']}, started {started}); wait for it, or choose another output_dir")
            assert files_of(run) == before
        assert first.poll() is None          # the first run goes on
        gate.touch()
        out, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, err[-3000:]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert not (run / LOCK).exists()         # a run that ends removes its lock file


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tiny_model_dir, tmp_path):
    (tmp_path / "gate.py").write_text(GATE)
    gate, run = tmp_path / "open", tmp_path / "run"
    args = [f"model={tiny_model_dir}", *ARGS, "steps=2", "rewards=[gate:wait]", f"output_dir={run}"]
    env = env_with(GRPO_TEST_GATE=str(gate))
    killed = subprocess.Popen(grpo(*args), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_at_the_gate(killed, tmp_path)
    finally:
        killed.kill()
        killed.communicate()
    holder = holder_of(run)
    assert holder is not None and holder["pid"] == killed.pid   # its lock file stays, naming a dead process
    gate.touch()
    done = subprocess.run(grpo(*args, "resume=auto"), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not (run / LOCK).exists()


def test_under_torchrun_every_process_stops_with_rank_0s_refusal(tiny_model_dir, tmp_path):
    # Rank 0 alone takes the lock; the others hear its answer, so none trains on alone or waits
    # for a rank that has stopped.
    run = tmp_path / "run"
    held = RunLock.take(run)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               f"--master-port={port}", "-m", "grpo", "train", f"model={tiny_model_dir}",
                               *ARGS, "steps=1", f"output_dir={run}"],
                              cwd=tmp_path, env=env_with(), capture_output=True, text=True, timeout=300)
    finally:
        held.release()
    refusal = f"grpo train: error: output_dir {run} is in use by another grpo run (pid {os.getpid()}"
    assert done.returncode != 0
    assert done.stderr.count(refusal) == 2, done.stderr[-3000:]   # rank 0's line, and rank 1's
    assert not run.exists()


def test_grpo_sft_holds_the_lock_too(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    held = RunLock.take(run)
    try:
        assert main(["sft", f"model={tiny_model_dir}", "sft_steps=2", "threads=1", f"output_dir={run}"]) == 2
    finally:
        held.release()
    assert f"output_dir {run} is in use by another grpo run (pid {os.getpid()}" in capsys.readouterr().err


def test_an_output_dir_that_is_a_file_is_one_line(tiny_model_dir, tmp_path, capsys):
    # It was a traceback (FileExistsError from mkdir).
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for output_dir in (a_file, a_file / "run"):
        assert main(["train", f"model={tiny_model_dir}", *ARGS, "steps=1", f"output_dir={output_dir}"]) == 2
        assert one_line_error(capsys.readouterr().err) == (
            f"grpo train: error: config key 'output_dir': {a_file} is a file, not a directory; "
            "choose another output_dir")
    assert a_file.read_text() == "mine"


def read_only_runner(directory) -> list[str] | None:
    """A command prefix under which `directory` is read-only for real: a read-only bind mount in
    a mount namespace of its own (root, or a user namespace), else None."""
    for flags in (["-m"], ["-U", "-r", "-m"]):
        probe = subprocess.run(["unshare", *flags, "sh", "-c",
                                f"mount --bind -o ro '{directory}' '{directory}' && ! touch '{directory}/x'"],
                               capture_output=True)
        if probe.returncode == 0:
            return ["unshare", *flags, "sh", "-c",
                    f"mount --bind -o ro '{directory}' '{directory}' && exec \"$@\"", "sh"]
    return None


def test_an_output_dir_in_a_read_only_place_is_one_line(tiny_model_dir, tmp_path):
    # It was a traceback (OSError: read-only file system, or PermissionError).
    place = tmp_path / "place"
    (place / "old").mkdir(parents=True)
    (place / "old" / "metrics.jsonl").write_text('{"step": 1}\n')
    before = files_of(place)
    prefix = read_only_runner(place) if shutil.which("unshare") else None
    if prefix is None:
        if os.geteuid() == 0:
            pytest.skip("no mount namespace to make a read-only place, and root writes through chmod")
        place.chmod(0o555)
        prefix, why = [], "permission denied"
    else:
        why = "the file system is read-only"
    try:
        for run, resume in ((place / "new", []), (place / "old", ["resume=auto"])):
            done = subprocess.run(prefix + grpo(f"model={tiny_model_dir}", *ARGS, "steps=1",
                                                f"output_dir={run}", *resume),
                                  cwd=tmp_path, env=env_with(), capture_output=True, text=True, timeout=300)
            assert done.returncode == 2, done.stderr[-3000:]
            assert one_line_error(done.stderr).startswith(
                f"grpo train: error: config key 'output_dir': cannot write in {run} ({why}); ")
            assert "choose another output_dir" in done.stderr
    finally:
        place.chmod(0o755)
    assert files_of(place) == before


# ---------------------------------------------------------------- a disk that fills

class FullAfter:
    """A file whose writes fail as a full disk's do (OSError 28, no file name) once a line of
    step `step` comes."""

    def __init__(self, f, step: int):
        self.f, self.step, self.full = f, step, False

    def write(self, text: str) -> int:
        if f'"step": {self.step},' in text:
            self.full = True
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("name", ["metrics.jsonl", "samples.jsonl"])
def test_a_disk_full_between_checkpoints_is_one_line_naming_the_file(tiny_model_dir, tmp_path,
                                                                     monkeypatch, capsys, name):
    # It was a traceback (OSError: [Errno 28] No space left on device).
    from grpo.run import tracking
    run = tmp_path / "run"
    args = ["train", f"model={tiny_model_dir}", *ARGS, "save_every=2", "steps=4", f"output_dir={run}"]

    def full_open(path, *a, **kw):
        f = open(path, *a, **kw)
        return FullAfter(f, 3) if str(path).endswith(name) else f

    monkeypatch.setattr(tracking, "open", full_open, raising=False)
    assert main(args) == 2
    line = one_line_error(capsys.readouterr().err)
    saved = run / "checkpoints" / "step-2"
    assert line == (f"grpo train: error: cannot write {run / name}: the disk is full; the newest "
                    f"checkpoint, {saved}, is intact. Free space, then continue with the same command "
                    "and resume=auto")
    assert checkpoint.verify(saved) is None
    monkeypatch.undo()
    # as it says: the run goes on from step 2, and its files read as if it never stopped
    assert main([*args, "resume=auto"]) == 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert sorted({json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()}) == [1, 2, 3, 4]


def test_the_curves_on_a_full_disk_say_the_run_is_done(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import matplotlib.figure
    run = tmp_path / "run"
    real = matplotlib.figure.Figure.savefig

    def savefig(self, path, *a, **kw):
        if str(path).endswith("curves.png"):
            with open(path, "wb"):   # as a real full disk: the file is opened, its write fails
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    assert main(["train", f"model={tiny_model_dir}", *ARGS, "steps=1", f"output_dir={run}"]) == 2
    assert one_line_error(capsys.readouterr().err) == (
        f"grpo train: error: cannot write {run / 'curves.png'}: the disk is full; the run is done and "
        f"{run / 'final'} is written. Free space, then write the report with `grpo report {run}`")
    assert (run / "final" / "model.safetensors").is_file()


FILL = '''
import os, shutil

def fill(prompts, completions, **columns):
    """Once the first checkpoint is written, fill the disk but for the room the next checkpoint's
    model files take and half of its optimizer state: torch.save then fails on it."""
    run = os.environ["GRPO_TEST_RUN"]
    first, filler = os.path.join(run, "checkpoints", "step-1"), os.path.join(run, "..", "filler")
    if os.path.isdir(first) and not os.path.exists("filled"):   # once: not in the resumed run
        open("filled", "w").close()
        sizes = {name: os.path.getsize(os.path.join(first, name)) for name in os.listdir(first)}
        pages = lambda n: -(-n // 4096) * 4096
        model = sum(pages(n) for name, n in sizes.items() if not name.endswith(".pt"))
        keep = model + (64 << 10) + sizes["optimizer.pt"] // 2
        size = shutil.disk_usage(run).free - keep
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        os.posix_fallocate(fd, 0, size)
        os.close(fd)
    return [float(len(c) % 2) for c in completions]
'''

DRIVER = '''
import json, os, subprocess, sys
disk, cmd = sys.argv[1], sys.argv[2:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk], check=True)
results = []
for resume in ([], ["resume=auto"]):
    done = subprocess.run(cmd + resume, capture_output=True, text=True)
    results.append({"rc": done.returncode, "err": done.stderr,
                    "checkpoints": sorted(os.listdir(os.path.join(disk, "run", "checkpoints")))})
    if os.path.exists(os.path.join(disk, "filler")):
        os.remove(os.path.join(disk, "filler"))    # space freed, as the message asks
results.append({"metrics": open(os.path.join(disk, "run", "metrics.jsonl")).read()})
print(json.dumps(results))
'''


def test_a_real_full_disk_under_torch_save_is_one_line_and_resume_goes_on(tiny_model_dir, tmp_path):
    # On a full disk torch.save raises its own RuntimeError ("[enforce fail at inline_container.cc]
    # . unexpected pos 576 vs 534"), which says neither that the disk is full nor which
    # checkpoint is intact; the command printed it as a traceback.
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("a small disk of its own needs a mount namespace (unshare -m)")
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "fill.py").write_text(FILL)
    (tmp_path / "driver.py").write_text(DRIVER)
    run = disk / "run"
    cmd = grpo(f"model={tiny_model_dir}", *ARGS, "steps=3", "rewards=[fill:fill]", f"output_dir={run}")
    done = subprocess.run(["unshare", "-m", sys.executable, "driver.py", str(disk), *cmd], cwd=tmp_path,
                          env=env_with(GRPO_TEST_RUN=str(run)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    full, resumed, files = json.loads(done.stdout.strip().splitlines()[-1])
    assert full["rc"] == 2, full["err"][-3000:]
    assert one_line_error(full["err"]) == (
        f"grpo train: error: cannot write {run / 'checkpoints' / 'step-2'}: the disk is full; the "
        f"previous checkpoint {run / 'checkpoints' / 'step-1'} is intact. Free space, then continue "
        "with resume=auto")
    assert full["checkpoints"] == ["step-1"]              # no temporary left
    assert resumed["rc"] == 0, resumed["err"][-3000:]
    assert resumed["checkpoints"] == ["step-1", "step-2", "step-3"]
    assert [json.loads(line)["step"] for line in files["metrics"].splitlines()] == [1, 2, 3]


def test_a_file_system_without_flock_runs_unguarded_and_says_so(tmp_path, monkeypatch, capsys):
    """Some network mounts answer flock with ENOLCK: the run goes on without the lock's guard,
    and says so in one line naming output_dir (before: silently)."""
    import errno
    import fcntl

    from grpo.run.checkpoint import RunLock

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = RunLock.take(tmp_path / "run")
    try:
        said = capsys.readouterr().err.strip().splitlines()
        assert said == [f"warning: output_dir {tmp_path / 'run'} is on a file system without flock "
                        "(No locks available): this run cannot stop another grpo run from writing "
                        "the same output_dir at once"]
    finally:
        lock.release()
