"""Nothing lost: checkpoints hold the whole run, SIGKILL at any point resumes exactly, SIGTERM stops
cleanly, a full disk or a corrupted checkpoint leaves the last good one usable."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from grpo.run import checkpoint
from grpo.run.checkpoint import CheckpointError, verify
from grpo.config import ConfigError, build_config
from grpo.train import train

ARGS = ["sft_steps=3", "prompts_per_step=4", "group_size=4", "max_new_tokens=6", "steps=8",
        "eval_every=4", "eval_size=8", "save_every=2", "keep_last=2", "num_iterations=2",
        "beta=0.04", "lr=1e-3", "threads=1", "seed=3"]


def launch(args, run_dir, fault: str = "", resume: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_FAULT_KILL_AT": fault}
    cmd = [sys.executable, "-m", "grpo", "train", *args, f"output_dir={run_dir}"]
    return subprocess.run(cmd + (["resume=auto"] if resume else []), env=env, capture_output=True,
                          text=True, timeout=300)


def without_times(path) -> list[dict]:
    """metrics.jsonl without the wall-clock figures, the only values a resumed run cannot repeat."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens/s"} for r in rows]


def test_sigkill_anywhere_then_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    args = [f"model={tiny_model_dir}", *ARGS]
    whole = launch(args, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    run = tmp_path / "killed"
    # 1. killed while writing its second checkpoint (step 4): files written, no manifest yet
    done = launch(args, run, fault="checkpoint:2")
    assert done.returncode == -signal.SIGKILL
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(names) == 2 and names[0].startswith(".tmp-step-4-") and names[1] == "step-2"
    assert verify(run / "checkpoints" / "step-2") is None
    # 2. resumed from step 2, killed after step 7's update, before its metrics were written
    done = launch(args, run, fault="step:5", resume=True)
    assert done.returncode == -signal.SIGKILL
    assert "resuming from" in done.stdout and "step-2 at step 3/8" in done.stdout
    # 3. resumed from step 6; killed from outside as soon as step 7's metrics line appears
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}",
                             "resume=auto"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        if any(json.loads(line)["step"] == 7 for line in lines if line.endswith("}")):
            proc.kill()
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # 4. resumed from step 6 again; runs to the end
    done = launch(args, run, resume=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step-6 at step 7/8" in done.stdout
    # Bit for bit: the same weights, metrics (but wall-clock times) and samples.
    a, b = load_file(tmp_path / "whole" / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert without_times(run / "metrics.jsonl") == without_times(tmp_path / "whole" / "metrics.jsonl")
    assert (run / "samples.jsonl").read_text() == (tmp_path / "whole" / "samples.jsonl").read_text()
    # keep_last=2: only the two newest checkpoints remain
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-6", "step-8"]


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_says_how_to_resume(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = [f"model={tiny_model_dir}", *[a for a in ARGS if not a.startswith(("steps", "save_every"))],
            "steps=500", "save_every=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (
            (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    saved = run / "checkpoints" / f"step-{last}"
    assert f"stopped by SIGTERM after step {last}/500" in err
    assert str(saved) in err and "resume=auto" in err
    assert verify(saved) is None
    assert torch.load(saved / "trainer_state.pt", weights_only=False)["step"] == last


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_cold_start_stopped_by_a_signal_keeps_its_model_and_says_what_is_lost(tiny_model_dir, tmp_path,
                                                                                  signum):
    from transformers import AutoModelForCausalLM
    from grpo.commands.cli import main
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}",
                             "sft_steps=5000", "sft_batch_size=4", "threads=1", f"output_dir={run}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("cold start 20/5000"):
            break
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-2000:]
    name = signal.Signals(signum).name
    message = err.strip().splitlines()[-1]
    done = int(message.split("after cold-start step ")[1].split("/")[0])
    assert 20 <= done < 5000
    assert message.startswith(f"grpo train: stopped by {name} after cold-start step {done}/5000")
    kept = run / "cold_start"
    assert f"is in {kept}; AdamW's state and the other {5000 - done} steps are not kept" in message
    assert f"model={kept} sft_steps={5000 - done}" in message
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    tuned = AutoModelForCausalLM.from_pretrained(kept).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(tuned[k], base[k]) for k in base)      # the steps it took are kept
    # the way on that the message gives works
    assert main(["sft", f"model={kept}", "sft_steps=2", "sft_batch_size=4", "threads=1",
                 f"output_dir={tmp_path / 'on'}"]) == 0
    assert (tmp_path / "on" / "final" / "model.safetensors").is_file()


def small_config(tiny_model_dir, run_dir, **overrides):
    values = {"model": str(tiny_model_dir), "sft_steps": 0, "prompts_per_step": 2, "group_size": 2,
              "max_new_tokens": 4, "steps": 3, "eval_every": 0, "save_every": 1, "keep_last": 0,
              "threads": 1, "output_dir": str(run_dir)}
    return build_config({**values, **overrides})


# torch.save's own error when its C++ writer comes short: no errno, no word of a full disk
TORCH_SHORT_WRITE = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
                     "file data/0: file write failed")


@pytest.mark.parametrize("error, reason", [
    ("python", "the disk is full"),
    ("torch", "the disk is full"),
    ("torch with room", f"torch's write failed ({TORCH_SHORT_WRITE})")])
def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch,
                                                                       capsys, error, reason):
    # torch.save on a full disk raises a RuntimeError that says neither that the disk is full nor
    # which checkpoint is intact: it was a traceback. The free space measured then tells.
    from grpo.commands.cli import main
    real_save = torch.save

    def save(obj, path, *a, **kw):
        if str(path).endswith("trainer_state.pt") and "step-2" in str(path):
            if error == "python":
                raise OSError(errno.ENOSPC, "No space left on device")
            if error == "torch":
                monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 0)   # as the disk is then
            raise RuntimeError(TORCH_SHORT_WRITE)
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", save)
    assert main(["train", f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=2", "group_size=2",
                 "max_new_tokens=4", "steps=3", "eval_every=0", "save_every=1", "keep_last=0",
                 "threads=1", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"grpo train: error: cannot write {tmp_path / 'checkpoints' / 'step-2'}: {reason}; the previous "
        f"checkpoint {tmp_path / 'checkpoints' / 'step-1'} is intact. Free space, then continue with "
        "resume=auto")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]   # no temporary left
    assert verify(tmp_path / "checkpoints" / "step-1") is None
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_auto_skips_a_corrupted_checkpoint_and_a_named_one_is_an_error(tiny_model_dir, tmp_path):
    train(small_config(tiny_model_dir, tmp_path), log=lambda line: None)
    newest = tmp_path / "checkpoints" / "step-3"
    data = bytearray((newest / "optimizer.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(ConfigError) as e:
        train(small_config(tiny_model_dir, tmp_path, resume=str(newest), steps=4), log=lambda line: None)
    assert f"{newest}/optimizer.pt: checksum differs" in str(e.value)
    lines = []
    result = train(small_config(tiny_model_dir, tmp_path, resume="auto", steps=4), log=lines.append)
    assert any("skipping checkpoint step-3" in line and "optimizer.pt" in line for line in lines)
    assert any("resuming from" in line and "step-2 at step 3/4" in line for line in lines)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4] and result.history[0]["step"] == 3


def run_files(run_dir) -> dict:
    """What a run leaves that a resumed run must repeat: metrics (but wall-clock times), samples,
    the evaluations' rows and which checkpoints are kept."""
    return {"metrics": without_times(run_dir / "metrics.jsonl"),
            "samples": (run_dir / "samples.jsonl").read_text(),
            "eval": {p.name: p.read_text() for p in sorted((run_dir / "eval").iterdir())},
            "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").iterdir())}


def test_a_run_killed_before_its_first_checkpoint_resumes_as_if_never_stopped(tiny_model_dir, tmp_path):
    # Killed after the step-0 evaluation was logged and before any checkpoint, resume=auto had
    # nothing to resume from and started over, appending a second step-0 evaluation to the
    # first. Starting over now cuts what step 0 writes again.
    args = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=2", "group_size=2",
            "max_new_tokens=4", "steps=4", "eval_every=2", "eval_size=4", "save_every=3",
            "keep_last=2", "threads=1", "seed=3"]
    whole = launch(args, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = run_files(tmp_path / "whole")
    run = tmp_path / "killed"
    # after step 2's update, before its metrics: step 0's evaluation and step 1 are written
    done = launch(args, run, fault="step:2")
    assert done.returncode == -signal.SIGKILL
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert not (run / "checkpoints").exists()
    done = launch(args, run, resume=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no valid checkpoint" in done.stdout and "starting from step 0" in done.stdout
    assert run_files(run) == expected
    # TensorBoard shows each evaluation once: the new start's events purge the earlier ones
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0, 2, 4]


def test_a_run_whose_every_checkpoint_is_corrupt_starts_over_as_if_never_stopped(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    from grpo.run import resume
    config = dict(steps=4, eval_every=2, eval_size=4, save_every=1, keep_last=2, seed=3)
    train(small_config(tiny_model_dir, tmp_path / "whole", **config), log=lambda line: None)
    expected = run_files(tmp_path / "whole")
    run = tmp_path / "run"
    train(small_config(tiny_model_dir, run, **config), log=lambda line: None)
    shutil.rmtree(run / "final")       # as if killed after its last checkpoint, before final/
    for name in ("step-3", "step-4"):
        (run / "checkpoints" / name / "optimizer.pt").write_bytes(b"torn")
    kept, real_prune = [], resume.prune

    def prune(parent, keep_last, **upto):
        real_prune(parent, keep_last, **upto)
        kept.append([p.name for p in sorted(parent.iterdir()) if checkpoint.verify(p) is None])

    monkeypatch.setattr(resume, "prune", prune)
    lines = []
    train(small_config(tiny_model_dir, run, resume="auto", **config), log=lines.append)
    assert any("skipping checkpoint step-4" in line for line in lines)
    assert any("no valid checkpoint" in line for line in lines)
    assert run_files(run) == expected
    # the checkpoints the new start writes are kept, not pruned for the corrupt ones of later steps
    assert kept == [["step-1"], ["step-1", "step-2"], ["step-2", "step-3"], ["step-3", "step-4"]]


def test_a_resume_on_changed_data_is_refused_and_changed_keys_are_said(tiny_model_dir, tmp_path, capsys):
    # A dataset truncated between the stop and resume=auto gave an IndexError's traceback (the
    # data position pointed past its end), and a changed row resumed silently on other data.
    from grpo.commands.cli import main
    data, run = tmp_path / "d.jsonl", tmp_path / "run"
    lines = [json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) + "\n" for i in range(12)]
    data.write_text("".join(lines))
    common = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=2", "group_size=2",
              "max_new_tokens=4", "eval_every=0", "save_every=1", "threads=1", f"output_dir={run}"]
    args = [f"dataset={data}", *common]
    assert main(["train", *args, "steps=2"]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    way_out = "resume on the data it was trained on, or start a new run in another output_dir"
    truncated, edited = "".join(lines[:9]), "".join(lines).replace('"answer": "5"', '"answer": "6"')
    for changed, rows in ((truncated, 9), (edited, 12)):
        data.write_text(changed)
        assert main(["train", *args, "steps=3", "resume=auto"]) == 2
        err = capsys.readouterr().err
        assert err == (f"grpo train: error: the dataset {data} has changed since the checkpoint at step 2 "
                       f"(rows: 12 then, {rows} now; its fingerprint differs): {way_out}\n")
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # the same data, moved: keys a resumed run may change are accepted and said in one line
    moved = tmp_path / "moved.jsonl"
    moved.write_text("".join(lines))
    assert main(["train", f"dataset={moved}", *common, "steps=3", "log_every=2", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert (f"resuming with dataset {str(data)!r} -> {str(moved)!r}, steps 2 -> 3, log_every 1 -> 2 "
            "(keys a resumed run may change)") in out
    assert "changed keys" not in out
    assert f"resuming from {run / 'checkpoints' / 'step-2'} at step 3/3" in out
    # a checkpoint written before fingerprints were recorded resumes, saying what was not checked
    old = run / "checkpoints" / "step-3"
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"]["data.json"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / "data.json").unlink()
    assert main(["train", f"dataset={moved}", *common, "steps=4", "lr=1e-4", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert (f"resume: checkpoint {old} records no fingerprint of its data (written by an older "
            "grpo), so whether dataset changed since could not be checked") in out
    assert "resuming with changed keys: lr 0.0005 -> 0.0001 (from here the run trains otherwise" in out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2, 3, 4]


def test_a_fresh_run_refuses_a_directory_that_holds_one(tiny_model_dir, tmp_path):
    train(small_config(tiny_model_dir, tmp_path, steps=1), log=lambda line: None)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run .*resume=auto"):
        train(small_config(tiny_model_dir, tmp_path, steps=1), log=lambda line: None)
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_write_dir_removes_its_temporary_on_error_and_verify_names_the_bad_file(tmp_path):
    def write(tmp):
        (tmp / "a.bin").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match="the disk is full"):
        checkpoint.write_dir(tmp_path / "step-1", write)
    assert list(tmp_path.iterdir()) == []
    good = checkpoint.write_dir(tmp_path / "step-2", lambda tmp: (tmp / "a.bin").write_bytes(b"abc"))
    assert verify(good) is None
    (good / "a.bin").write_bytes(b"abd")
    assert verify(good) == f"{good / 'a.bin'}: checksum differs from the manifest (the file is corrupted)"
    (good / "a.bin").unlink()
    assert verify(good) == f"{good / 'a.bin'}: missing"
    shutil.rmtree(good)


def test_a_second_ctrl_c_stops_at_once():
    from grpo.run.resume import StopOnSignal
    from grpo.run.distributed import World
    lines, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal(lines.append) as stop:
            os.kill(os.getpid(), signal.SIGINT)     # the first asks for a checkpoint at step end
            assert stop.requested(World()) == signal.SIGINT
            assert "SIGINT: finishing this step, then writing a checkpoint" in lines[0]
            os.kill(os.getpid(), signal.SIGINT)     # the second does not wait
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) == before   # the caller's handler is back


def test_the_last_step_is_checkpointed_a_finished_run_says_so_and_more_steps_go_on(tiny_model_dir,
                                                                                  tmp_path, capsys):
    from grpo.commands.cli import main
    run = tmp_path / "run"
    args = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=2", "group_size=2",
            "max_new_tokens=4", "eval_every=0", "save_every=2", "keep_last=5", "threads=1", "seed=3",
            f"output_dir={run}"]
    assert main(["train", *args, "steps=3"]) == 0
    # save_every=2 over 3 steps: step 2, and the last step, 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3"]
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    metrics_before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    # resuming the finished run: said, nothing trained or written, exit 0
    assert main(["train", *args, "steps=3", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert (f"resume: the run in {run} is finished: its checkpoint step-3 is at step 3 of steps=3; "
            "nothing to do. Set steps= above 3 to train on from it") in out
    assert "step 1/3" not in out and "resuming from" not in out
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    assert (run / "metrics.jsonl").read_text() == metrics_before
    # killed between its last checkpoint and final/: not finished; resuming writes final/ alone
    shutil.rmtree(run / "final")
    assert main(["train", *args, "steps=3", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert "is finished" not in out and "step 1/3" not in out
    assert (run / "final" / "config.json").is_file()
    assert (run / "metrics.jsonl").read_text() == metrics_before
    # more steps: on from step 3, nothing recomputed
    assert main(["train", *args, "steps=5", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert f"resuming from {run / 'checkpoints' / 'step-3'} at step 4/5" in out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3", "step-4",
                                                                      "step-5"]
    # from Python, the finished run comes back with its metrics and its model
    from grpo.config import load_config
    result = train(load_config(None, [*args, "steps=5", "resume=auto"]), log=lambda line: None)
    assert [m["step"] for m in result.history] == [1, 2, 3, 4, 5]
    assert result.policy is not None and result.tokenizer is not None


def test_resume_auto_on_a_finished_run_without_checkpoints_changes_nothing(tiny_model_dir, tmp_path,
                                                                           capsys):
    # With save_every=0 there was no checkpoint to find, so resume=auto trained the finished run
    # again from step 0, over its own metrics.jsonl and final/.
    from grpo.commands.cli import main
    run = tmp_path / "run"
    args = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=2", "group_size=2",
            "max_new_tokens=4", "eval_every=0", "save_every=0", "threads=1", "steps=2",
            f"output_dir={run}"]
    assert main(["train", *args]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", *args, "resume=auto"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run (final/) and no checkpoint to continue from (save_every=0)" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_disk_too_full_for_the_tiny_models_files_is_one_line(tmp_path):
    """model=tiny writes its model into output_dir/base_model first; on a real tmpfs of 400 KiB
    that write fails: one line saying the disk is full, status 2 (before: safetensors' own error,
    a traceback, status 1)."""
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(full)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        done = subprocess.run([sys.executable, "-m", "grpo", "train", "model=tiny", "steps=2",
                               "sft_steps=0", f"output_dir={full / 'run'}"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 2, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("grpo train: error: ") and "the disk is full" in last, last
        assert "Traceback" not in done.stderr
    finally:
        subprocess.run(["umount", str(full)])


def test_rows_given_in_python_under_an_older_label_are_no_changed_key(tmp_path):
    """Runs before "(N rows given in Python)" recorded "(N rows given to train())": resuming one
    is not told its dataset key changed (the rows' fingerprint is what is checked)."""
    from grpo.config import build_config
    from grpo.run.resume import _changes
    (tmp_path / "config.yaml").write_text("dataset: (6 rows given to train())\nlr: 0.0005\n")
    now = build_config({"dataset": "(6 rows given in Python)"})
    assert _changes(now, tmp_path) == []
    other = build_config({"dataset": "(7 rows given in Python)"})
    assert [change for change, _ in _changes(other, tmp_path)] == \
        ["dataset '(6 rows given to train())' -> '(7 rows given in Python)'"]
